"""Strings from input never carry control sequences or markup into any output (issue 12).

A trace, a script, a run directory and a user rule file whose names hold an OSC 52 clipboard
write, a screen clear, CSI colours, C1 controls, a bidi override, rich markup (`[bold red]`,
`[link=...]`), an emoji code, newlines and `::error::` go through `report` (terminal, JSON),
`run`, `compare`, `gate` (terminal, markdown, JUnit, GitHub commands), `rules show/list` and the
one-line errors. Every output is checked byte by byte: no ESC/C0/C1/bidi character except the
newlines and (with colour forced) the SGR colour codes perfdoctor itself writes, and the hostile
names shown escaped (`\\x1b]52`, `[bold red]x[/]` printed literally)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

import tracegen as tg
from perfdoctor.report import sanitize

REPO = Path(__file__).resolve().parent.parent
OSC52 = "\x1b]52;c;cHduZWQ=\x07"
HOSTILE = (OSC52 + "\x1b[2J\x1b[31mred\x1b[0m\x9b31m [bold red]x[/] [link=https://evil.example]click[/link]"
           " :smile:\n::error::pwned \u202eevil\r")
HOSTILE_DIR = "dir\x1b[2J[bold]x\x07"
SGR = re.compile(r"\x1b\[[0-9;]*m")
BAD = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def clean(out: str, *, colour: bool = False) -> str:
    """Assert `out` holds no control character but newlines (and, with colour, SGR codes)."""
    body = SGR.sub("", out) if colour else out
    bad = BAD.findall(body)
    assert not bad, f"control characters reach the output: {sorted(set(bad))!r}"
    assert "\x1b]" not in out and "\x1b[2J" not in out and "\x07" not in out
    return body


def shows_escaped(out: str) -> None:
    flat = " ".join(out.split())          # rich wraps long lines
    assert "\\x1b]52;c;cHduZWQ=\\x07" in flat
    assert "\\u202eevil" in flat
    assert "[bold red]x[/]" in flat and "[link=https://evil.example]click[/link]" in flat
    assert ":smile:" in flat and "😄" not in out
    assert "\\n::error::pwned" in flat      # one line: the newline is shown, never taken


def cli(args, env=None, cwd=None, timeout=240) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "perfdoctor", *map(str, args)], capture_output=True,
                          timeout=timeout, env=e, cwd=cwd)


@pytest.fixture(scope="module")
def hostile_trace(tmp_path_factory) -> Path:
    spec = tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=3000, kernels=4, syncs=1) for _ in range(6)], device="cuda")
    doc, _ = tg.build(spec)
    for e in doc["traceEvents"]:
        n = e.get("name", "")
        if e.get("cat") in ("cpu_op", "kernel", "user_annotation", "cuda_runtime") and not n.startswith("ProfilerStep"):
            e["name"] = HOSTILE + n if "DataLoader" in n else n + HOSTILE
        if e.get("ph") == "M" and n == "thread_name":
            e["args"]["name"] = HOSTILE
    doc["deviceProperties"][0]["name"] += HOSTILE
    d = tmp_path_factory.mktemp("hostile") / HOSTILE_DIR
    d.mkdir()
    (d / "t.json").write_text(json.dumps(doc))
    return d / "t.json"


# --- the sanitiser itself ---------------------------------------------------------------------

def test_each_output_encoding():
    t = sanitize.terminal(HOSTILE)
    assert not BAD.search(t) and "\x1b" not in t and t.startswith("\\x1b]52;c;")
    assert sanitize.terminal("a\nb", keep_newlines=True) == "a\nb"
    assert sanitize.terminal("\udcff") == "\\udcff"                   # an undecodable path byte
    assert sanitize.markup("[bold red]x[/]") == "\\[bold red]x\\[/]"
    h = sanitize.html('<script>"&\'' + OSC52)
    assert h.startswith("&lt;script&gt;&quot;&amp;&#x27;") and "\x1b" not in h
    md = sanitize.markdown("[a](https://e.x) <b>|`x`|*y* www.e.com\n# h" + OSC52)
    assert "\n" not in md and "\x1b" not in md
    unescaped = re.findall(r"(?<!\\)[\[\]()<>|`*#]|www\.|https:", md.replace("\\\\", ""))
    assert not unescaped, unescaped
    assert "\\[a\\]" in md and "\\|" in md and "\\<b\\>" in md
    x = sanitize.xml("a\x00b\x1bc\ufffed\n")
    assert x == "a\\x00b\\x1bc\\ufffed\n"
    assert sanitize.github_data("50%\r\n::error::x") == "50%25%0D%0A::error::x"
    assert sanitize.github_property("a: b, c") == "a%3A b%2C c"


# --- report -----------------------------------------------------------------------------------

def test_report_terminal_escapes_every_name(hostile_trace):
    r = cli(["report", hostile_trace, "--details"])
    assert r.returncode == 0, r.stderr
    out = clean(r.stdout.decode())
    shows_escaped(out)
    assert "Largest idle-GPU gaps" in out and "\\x1b[2J[bold]x\\x07" in out   # gaps, and the path
    shows_escaped(clean(cli(["report", hostile_trace]).stdout.decode()))          # the one-screen report too
    coloured = cli(["report", hostile_trace, "--details"], env={"FORCE_COLOR": "1", "COLUMNS": "200"})
    assert coloured.returncode == 0 and SGR.search(coloured.stdout.decode())     # rich's own colours
    shows_escaped(clean(coloured.stdout.decode(), colour=True))


def test_report_json_keeps_names_as_data(hostile_trace):
    r = cli(["report", hostile_trace, "--format", "json"])
    assert r.returncode == 0, r.stderr
    clean(r.stdout.decode())                                   # JSON escapes them (\u001b)
    doc = json.loads(r.stdout)
    assert HOSTILE in doc["traces"][0]["metrics"]["trace.device_name"]
    assert any(HOSTILE in (g["host_event"] or "") for g in doc["traces"][0]["idle_gaps"])


def test_one_line_errors_escape_the_path(tmp_path):
    r = cli(["report", tmp_path / HOSTILE_DIR / "missing.json"])
    assert r.returncode == 2
    err = clean(r.stderr.decode())
    assert err.count("\n") == 1 and err.startswith("perfdoctor: error:") and "\\x1b[2J" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": "' + "\\u001b]52;c;eA==\\u0007" + '"}')
    r = cli(["report", bad])
    assert r.returncode == 2
    clean(r.stderr.decode())


# --- rules ------------------------------------------------------------------------------------

RULE = '''id = "PD900"
slug = "hostile"
kind = "flag"
title = "{h}"
devices = ["any"]
when = "share.input >= 0.5"
summary = "{h} {{share.input:pct}}"
severity = "low"

[fix]
text = "{h}"
snippet = "{h}"

[source]
article = "{h}"
section = "{h}"
also = ["{h}"]

[[cases]]
name = "fires"
metrics = {{ "share.input" = 0.9 }}
fires = true

[[cases]]
name = "quiet"
metrics = {{ "share.input" = 0.1 }}
fires = false
'''


def toml_str(s: str) -> str:
    return json.dumps(s)[1:-1]          # a TOML basic string takes JSON's escapes


def test_rules_show_and_list_of_a_hostile_user_rule(tmp_path):
    d = tmp_path / "rules"
    d.mkdir()
    (d / "PD900-hostile.toml").write_text(RULE.format(h=toml_str(HOSTILE)))
    r = cli(["rules", "show", "PD900", "--rules", d])
    assert r.returncode == 0, r.stderr
    out = clean(r.stdout.decode())
    shows_escaped(out)
    r = cli(["rules", "list", "--rules", d], env={"COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    shows_escaped(clean(r.stdout.decode()))


def test_report_with_a_hostile_rule_that_fires(hostile_trace, tmp_path):
    d = tmp_path / "rules"
    d.mkdir()
    (d / "PD900-hostile.toml").write_text(RULE.format(h=toml_str(HOSTILE)).replace(">= 0.5", ">= 0"))
    r = cli(["report", hostile_trace, "--rules", d])
    assert r.returncode == 0, r.stderr
    out = clean(r.stdout.decode())
    assert "PD900" in out
    shows_escaped(out)


# --- run, compare, gate -----------------------------------------------------------------------

SCRIPT = '''
import sys
import torch
HOSTILE = {h!r}
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8)
for step in range(14):
    with torch.profiler.record_function(HOSTILE):
        loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("out:", HOSTILE)
raise RuntimeError(HOSTILE)
'''


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    pytest.importorskip("torch", reason="perfdoctor run needs torch (test dependency)")
    root = tmp_path_factory.mktemp("hrun")
    d = root / HOSTILE_DIR
    d.mkdir()
    script = d / "train.py"
    script.write_text(SCRIPT.format(h=HOSTILE))
    bare = subprocess.run([sys.executable, script, "--lr", HOSTILE], capture_output=True, timeout=120)
    r = cli(["run", "--skip-steps", "2", "--trace-steps", "3", "--out", root / "run", script, "--lr", HOSTILE])
    return root, bare, r


@pytest.mark.slow
def test_run_passes_the_scripts_bytes_and_escapes_its_own(hostile_run):
    root, bare, r = hostile_run
    assert r.returncode == bare.returncode == 1
    assert r.stdout == bare.stdout                       # the script's own output: raw, untouched
    err, tb = r.stderr.decode(), bare.stderr.decode()
    assert tb.startswith("Traceback") and tb in err      # its traceback, byte for byte (kineto's lines aside)
    ours = err[err.index(tb) + len(tb):]
    assert "perfdoctor run" in ours
    body = clean(ours)
    flat = " ".join(body.split())
    assert "\\x1b]52;c;cHduZWQ=\\x07" in flat and "[bold red]x[/]" in flat     # command, error


def _hostile_copy(run_dir: Path, dest: Path) -> Path:
    shutil.copytree(run_dir, dest)
    doc = json.loads((dest / "report.json").read_text())
    doc["verdict"]["bound"] = HOSTILE
    doc["findings"] = [{"id": "PD301" + HOSTILE}] + doc["findings"]
    doc["run"]["command"] += " " + HOSTILE
    doc["traces"][0]["metrics"]["trace.device_name"] = HOSTILE
    (dest / "report.json").write_text(json.dumps(doc))
    return dest


@pytest.mark.slow
def test_compare_and_gate_outputs(hostile_run, tmp_path):
    root, _, r = hostile_run
    run_dir = root / "run"
    assert (run_dir / "report.json").is_file(), r.stderr
    base = _hostile_copy(run_dir, tmp_path / ("base" + HOSTILE_DIR))
    cur = _hostile_copy(run_dir, tmp_path / ("cur" + HOSTILE_DIR))
    doc = json.loads((cur / "report.json").read_text())
    doc["traces"][0]["metrics"]["trace.device_name"] = "other " + HOSTILE        # not comparable
    (cur / "report.json").write_text(json.dumps(doc))

    c = cli(["compare", base, cur], env={"COLUMNS": "400"})
    assert c.returncode == 0, c.stderr
    shows_escaped(clean(c.stdout.decode()))

    summary = tmp_path / "summary.md"
    junit = tmp_path / "gate.xml"
    g = cli(["gate", cur, "--baseline", base, "--junit", junit], env={"GITHUB_STEP_SUMMARY": str(summary),
                                                                   "COLUMNS": "400"})
    assert g.returncode in (0, 1, 3), g.stderr
    out = clean(g.stdout.decode())
    cmds = [ln for ln in out.splitlines() if ln.startswith("::")]
    assert cmds and all(ln.startswith(("::warning title=", "::error title=")) for ln in cmds)
    assert not any("pwned" in ln for ln in out.splitlines() if ln.startswith("::error::"))
    assert "\\x1b" in out                                  # the hostile names, escaped, in the table
    md = clean(summary.read_text())
    assert "\\[link=https\\://evil" in md and not re.search(r"(?<!\\)\[link=", md)
    tree = ET.parse(junit)                                 # well-formed XML 1.0
    xml_text = junit.read_text()
    clean(xml_text)
    assert tree.getroot().tag == "testsuite"


def test_ranks_table_of_a_hostile_rank_json(tmp_path):
    """rank.json is any JSON: its strings are shown escaped, a rank, world size or exit code of the
    wrong type is unknown, and the directory's name gives the rank."""
    for r in (0, 1):
        d = tmp_path / "ranks" / f"rank-{r}"
        d.mkdir(parents=True)
        end, lines = 1000.0, []
        for i in range(30):
            end += 0.01 * (1 + r)
            lines.append(json.dumps({"step": i, "end": end, "dur": 0.01 * (1 + r), "wait": 0.001, "mode": "optimizer"}))
        (d / "steps.jsonl").write_text("\n".join(lines) + "\n")
        (d / "run.json").write_text(json.dumps({"argv": ["train.py"], "exit_code": 0, "wall_s": 1.0}))
        (d / "child.json").write_text(json.dumps({"outcome": "finished", "exit_code": 0, "steps": 30}))
        (d / "rank.json").write_text(json.dumps({"rank": HOSTILE, "world_size": "[bold]2", "host": HOSTILE + str(r),
                                                 "exit_code": "[link=x]1", "source": HOSTILE}))
    r = cli(["report", tmp_path], env={"COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    out = clean(r.stdout.decode())
    rows = [line.split() for line in out.splitlines() if line.lstrip().startswith(("0 ", "1 "))]
    assert [row[0] for row in rows] == ["0", "1"]        # the directory's rank, not rank.json's
    assert all(row[1].startswith("\\x1b]52") for row in rows)      # the host, escaped (and shortened)
    assert "[link=x]" not in out and "[bold]2" not in out      # a string exit code or world size: unknown
