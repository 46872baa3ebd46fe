"""The command line: output formats, exit codes, one-line errors, no torch on the report path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tracegen as tg
from perfdoctor.analyze import registry

S = tg.StepSpec


def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "perfdoctor", *map(str, args)], capture_output=True,
                          text=True, timeout=120, **kw)


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "w.pt.trace.json.gz"
    tg.write(tg.TraceSpec(steps=[S(data_wait_us=4000, pageable_h2d=1)] * 4), p)
    return p


def test_terminal_report(trace):
    r = run("report", trace)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "INPUT-BOUND" in out and "Step breakdown" in out and "data loading" in out
    assert "DataLoader runs with num_workers=0" in out
    assert "Largest idle-GPU gaps" not in out and "--details" in out     # one screen by default
    full = run("report", trace, "--details")
    assert full.returncode == 0 and "Largest idle-GPU gaps" in full.stdout and "evidence (" in full.stdout


def test_an_output_file_named_html_or_md_gets_that_format(trace, tmp_path):
    """`report -o report.html` wrote the JSON document into report.html with no word (a user
    trial): with the default format, the file's name says its format; any other name keeps the
    JSON beside the screen, and an explicit --format wins."""
    from perfdoctor.report.outputs import format_for
    page, notes, other, forced = (tmp_path / n for n in ("r.html", "r.md", "r.out", "f.html"))
    r = run("report", trace, "-o", page)
    assert r.returncode == 0 and r.stdout == "", r.stderr           # as -f html -o r.html
    assert page.read_text().lstrip().lower().startswith("<!doctype html")
    r = run("report", trace, "-o", notes)
    assert r.returncode == 0 and notes.read_text().startswith("### perfdoctor: INPUT-BOUND"), notes.read_text()[:80]
    r = run("report", trace, "-o", other)
    assert r.returncode == 0 and "INPUT-BOUND" in r.stdout and json.loads(other.read_text())["schema_version"] == 2
    r = run("report", trace, "-f", "json", "-o", forced)
    assert r.returncode == 0 and json.loads(forced.read_text())["schema_version"] == 2
    assert format_for("terminal", Path("x.MD"), ("markdown",)) == "markdown"       # tune: markdown or json
    assert format_for("terminal", Path("x.html"), ("markdown",)) == "terminal"
    assert format_for("terminal", None) == "terminal" and format_for("json", Path("x.html")) == "json"


def test_a_compute_bound_cpu_run_is_not_called_device_bound(tmp_path):
    """On a CPU-only trace the model's own ops bound the step: the badge says COMPUTE-BOUND (CPU)
    in every format (no GPU is involved); a GPU trace bound by its kernels stays DEVICE-BOUND."""
    cpu, gpu = tmp_path / "cpu.pt.trace.json", tmp_path / "gpu.pt.trace.json"
    tg.write(tg.TraceSpec(steps=[S(cpu_ops_us=20000)] * 4, device="cpu"), cpu)
    tg.write(tg.TraceSpec(steps=[S(kernels=4, kernel_us=20000)] * 4), gpu)
    assert json.loads(run("report", cpu, "--format", "json").stdout)["verdict"]["bound"] == "device"
    for fmt in ("terminal", "markdown", "html"):
        r = run("report", cpu, "--format", fmt)
        assert r.returncode == 0 and "COMPUTE-BOUND (CPU)" in r.stdout and "DEVICE-BOUND" not in r.stdout, fmt
        g = run("report", gpu, "--format", fmt)
        assert g.returncode == 0 and "DEVICE-BOUND" in g.stdout and "COMPUTE-BOUND" not in g.stdout, fmt


def test_json_schema(trace, tmp_path):
    r = run("report", trace, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 2 and doc["tool"].startswith("perfdoctor ")
    assert set(doc) == {"schema_version", "tool", "input", "verdict", "flags", "findings", "traces", "cross_rank", "units"}
    assert doc["verdict"]["bound"] == "input" and doc["verdict"]["confidence_label"] in ("high", "medium", "low")
    t = doc["traces"][0]
    assert set(t["metrics"]) == set(registry.REGISTRY) == set(doc["units"])
    assert len(t["steps"]) == 4 and set(t["steps"][0]["breakdown_ms"]) >= {"kernel", "data_loading", "other"}
    assert sum(t["steps"][0]["breakdown_ms"].values()) == pytest.approx(t["steps"][0]["duration_ms"], rel=1e-4)
    assert {f["slug"] for f in doc["flags"]} >= {"num-workers-zero", "pageable-copies"}
    assert all(set(f) == {"id", "slug", "title", "severity", "summary", "evidence", "source", "traces"} for f in doc["flags"])
    top = doc["findings"][0]
    assert top["slug"] == "loader-workers" and top["ranked"]
    share = doc["verdict"]["evidence"]["share.input"]
    assert 1.0 < top["gain"]["expected"] <= top["gain"]["ceiling"] <= (1 / (1 - share)) * (1 + 1e-4)   # 6-digit rounding
    assert set(top) >= {"id", "slug", "kind", "title", "summary", "evidence", "gain", "fix", "source", "traces", "on_bottleneck"}
    assert top["on_bottleneck"]
    # -o writes the same document; with --format json nothing goes to stdout
    out = tmp_path / "r.json"
    r2 = run("report", trace, "-f", "json", "-o", out)
    assert r2.returncode == 0 and r2.stdout == "" and json.loads(out.read_text())["verdict"] == doc["verdict"]
    r3 = run("report", trace, "-o", out)
    assert "INPUT-BOUND" in r3.stdout and json.loads(out.read_text())["schema_version"] == 2


def test_directory_of_ranks(tmp_path):
    for r, dw in ((0, 4000), (1, 6000)):
        tg.write(tg.TraceSpec(steps=[S(data_wait_us=dw)] * 4, rank=r, world_size=2), tmp_path / f"rank{r}.json")
    doc = json.loads(run("report", tmp_path, "-f", "json").stdout)
    assert [t["label"] for t in doc["traces"]] == ["rank 0", "rank 1"]
    cr = doc["cross_rank"]
    assert cr["count"] == 2 and cr["slowest"] == "rank 1" and cr["spread"] > 0.1
    assert doc["verdict"]["summary"].startswith("[2/2 ranks; figures of rank 1]")   # the slowest rank's
    assert doc["verdict"]["figures_of"] == "rank 1"
    out = run("report", tmp_path).stdout
    assert "Across 2 traces" in out
    # the header and the breakdown are that trace's too (they were the first trace's: two runs'
    # figures on one screen)
    assert "Step breakdown (rank 1, mean of 4 step(s))" in out
    from perfdoctor.report import html, markdown
    assert "Step breakdown (rank 1, 4 step(s))" in html.render(doc)
    assert markdown.report(doc) == markdown.report({**doc, "traces": doc["traces"][::-1]})


def test_traces_without_ranks_are_not_called_ranks_and_a_stub_is_not_compared(tmp_path):
    """Two profiler windows of one process (no distributedInfo) and the one-step stub torch writes
    when the profiler stops mid-cycle: 'traces', not 'ranks'; the stub is listed, left out of the
    comparison (it made 'step time differs by 7588%')."""
    for k, dw in ((0, 4000), (1, 4400)):
        tg.write(tg.TraceSpec(steps=[S(data_wait_us=dw)] * 4), tmp_path / f"w{k}.json")
    (tmp_path / "w2.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": [      # as torch writes it
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "ts": 1e6, "args": {"name": "python"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#9", "pid": 7, "tid": 7, "ts": 1e6, "dur": 21}]}))
    doc = json.loads(run("report", tmp_path, "-f", "json").stdout)
    v = doc["verdict"]
    assert v["summary"].startswith("[2/2 traces; figures of w") and "ranks" not in v["summary"]
    assert any(n.startswith("the traces do not all carry a rank") for n in v["notes"])
    assert "left out of the comparison (too little traced to judge: a stub trace?): w2.json" in v["notes"]
    assert doc["cross_rank"]["count"] == 2 and not any("7" in n and "differs" in n and "w2" in n for n in v["notes"])


def test_a_stub_beside_one_judged_trace_is_not_the_one_shown(tmp_path):
    """One judged trace and the stub torch writes when the profiler stops mid-cycle, named so
    that it comes first: the header and breakdown are the judged trace's, not the stub's."""
    tg.write(tg.TraceSpec(steps=[S(data_wait_us=4000)] * 4), tmp_path / "w.json")
    (tmp_path / "a.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#9", "pid": 7, "tid": 7, "ts": 1e6, "dur": 21}]}))
    doc = json.loads(run("report", tmp_path, "-f", "json").stdout)
    assert [t["label"] for t in doc["traces"]][0] == "a.json" and doc["verdict"]["figures_of"] == "w.json"
    out = run("report", tmp_path).stdout
    assert "Step breakdown (w.json, mean of 4 step(s))" in out and " [w.json]" not in out


def test_fixes_of_another_trace_than_the_one_shown_name_it(tmp_path):
    """Unrelated traces in one folder (a CUDA one with pageable copies, a CPU-only one that
    waits for data): the header and breakdown are one trace's, so a fix or flag only the other
    trace has names the trace it comes from."""
    tg.write(tg.TraceSpec(steps=[S(pageable_h2d=4, syncs=2)] * 4), tmp_path / "gpu.json")
    tg.write(tg.TraceSpec(steps=[S(data_wait_us=20000)] * 4, device="cpu"), tmp_path / "cpu.json")
    doc = json.loads(run("report", tmp_path, "-f", "json").stdout)
    shown = doc["verdict"]["figures_of"]
    out = run("report", tmp_path).stdout
    lines = [x for x in out.splitlines() if re.match(r" \d+\. |  \[(high|medium|low)\] ", x)]
    assert lines
    for item in doc["findings"] + doc["flags"]:
        line = next((x for x in lines if f" {item['id']} " in x), None)
        if line is None:                          # not on the first screen
            continue
        assert (f" {item['id']} [{', '.join(item['traces'])}] " in line) == (shown not in item["traces"]), line
    assert any(shown not in i["traces"] for i in doc["findings"] + doc["flags"])
    from perfdoctor.report import html, markdown
    from perfdoctor.report.sanitize import html as H
    page, md = html.render(doc), markdown.report(doc)
    for item in doc["findings"] + doc["flags"]:
        theirs = shown not in item["traces"]
        assert (f"(from {', '.join(item['traces'])})" in page.split(H(item["title"]), 1)[1][:200]) == theirs
        if item in doc["flags"] or (item in doc["findings"][:3] and item["ranked"]):
            assert (f"({item['id']}; from {', '.join(item['traces'])})" in md) == theirs, md


def test_unrelated_traces_in_one_folder_are_said_to_be_different_jobs(tmp_path):
    """A folder of traces from different experiments (found on GitHub: an A100 GEMM test beside a
    CPU-only 0.15 ms step and an 11.8 s one) read 'step-time spread 7723650.0%' with a majority
    verdict, and named a CPU's compute-bound verdict "device" in the table. Now: a note says they
    cannot be one job's and why; the spread from twice the fastest on is the ratio; a CPU trace's
    verdict is compute (CPU). Two windows of one process (4.0 and 4.4 ms waits) stay unflagged."""
    tg.write(tg.TraceSpec(steps=[S(cpu_ops_us=300)] * 4, device="cpu"), tmp_path / "small.json")
    tg.write(tg.TraceSpec(steps=[S(cpu_ops_us=90_000)] * 4, device="cpu", pid=5), tmp_path / "big.json")
    tg.write(tg.TraceSpec(steps=[S(data_wait_us=2000, kernels=4, kernel_us=1500)] * 4, pid=6), tmp_path / "gpu.json")
    doc = json.loads(run("report", tmp_path, "-f", "json").stdout)
    notes = doc["verdict"]["notes"]
    apart = next(n for n in notes if n.startswith("these traces look like different jobs"))
    assert "cpu and cuda traces" in apart and "steps of 0.3" in apart and "read each trace's own report" in apart
    assert not any(n.startswith("the traces do not all carry a rank") for n in notes)
    ratio = doc["cross_rank"]["spread"] + 1
    assert ratio > 100
    out = run("report", tmp_path).stdout
    assert re.search(r"Across 3 traces \(step-time spread \d+x\)", out), out
    big = next(x for x in out.splitlines() if x.strip().startswith("big.json"))
    assert "compute (CPU)" in big and "device" not in big
    from perfdoctor.analyze.ranks import spread_text
    assert [spread_text(s) for s in (0.031, 0.999, 1.5, 76_999.2)] == ["3.1%", "99.9%", "2.50x", "77000x"]
    (tmp_path / "one").mkdir()
    for k, dw in ((0, 4000), (1, 4400)):
        tg.write(tg.TraceSpec(steps=[S(data_wait_us=dw)] * 4), tmp_path / "one" / f"w{k}.json")
    notes = json.loads(run("report", tmp_path / "one", "-f", "json").stdout)["verdict"]["notes"]
    assert not any(n.startswith("these traces look like") for n in notes)
    assert any(n.startswith("the traces do not all carry a rank") for n in notes)


def test_directory_of_rank_traces_names_the_straggler_and_what_bounds_it(tmp_path):
    """One trace per rank of a synchronous job: rank 1 waits 8 ms a step for its batches, rank 0
    waits as long in the all-reduce. Merged as a multi-rank run's ranks are (diagnose/ranks.py)."""
    for r, (dw, nccl) in ((0, (0, 8000)), (1, (8000, 300))):
        tg.write(tg.TraceSpec(steps=[S(data_wait_us=dw, nccl_kernels=1, nccl_us=nccl)] * 5, rank=r, world_size=2),
                 tmp_path / f"rank{r}.json")
    doc = json.loads(run("report", tmp_path, "-f", "json").stdout)
    sec = doc["ranks"]
    assert sec["wait_cause"] == "straggler" and sec["slowest_rank"] == 1 and sec["pace_rank"] == 1
    assert doc["verdict"]["rule"] == "PD115" and doc["verdict"]["bound"] == "input"
    assert doc["verdict"]["secondary"] == ["communication"] and "Rank 1 itself: Input-bound" in doc["verdict"]["summary"]
    r0, r1 = sec["per_rank"]
    assert r0["collective_wait_ms"] == pytest.approx(7.6, abs=0.05) and r1["busy_ms"] == pytest.approx(8.76, abs=0.05)
    assert r1["data_wait_share"] > 0.8 and r0["verdict"] == "communication" and r1["verdict"] == "input"
    assert [t["label"] for t in doc["traces"]] == ["rank 1", "rank 0"]
    assert any(f["id"] == "PD360" for f in doc["findings"])
    assert "Across 2 rank(s)" in run("report", tmp_path).stdout


def _two_ranks(d, world=2):
    for r, (dw, nccl) in ((0, (0, 8000)), (1, (8000, 300))):
        tg.write(tg.TraceSpec(steps=[S(data_wait_us=dw, nccl_kernels=1, nccl_us=nccl)] * 5, rank=r, world_size=world),
                 d / f"rank{r}.json")


def test_a_trace_without_a_rank_beside_ranks_is_left_out_of_the_merge_not_the_merge_dropped(tmp_path):
    """A stub without distributedInfo had switched the merge off: the straggler went unnamed and
    the figures were those of the rank that waits."""
    _two_ranks(tmp_path)
    tg.write(tg.TraceSpec(steps=[S()]), tmp_path / "stub.json")
    doc = json.loads(run("report", tmp_path, "-f", "json").stdout)
    assert doc["ranks"]["slowest_rank"] == 1 and doc["verdict"]["rule"] == "PD115"
    assert any(n.endswith("(no rank in the trace: a stub, or another process's trace?): stub.json")
               for n in doc["verdict"]["notes"])


@pytest.mark.parametrize("second,why", [
    ("rank0", "2 traces hold rank 0 (rank0-again.json, rank0.json): traces of different jobs or runs"),
    ("world", "the traces come from jobs of different sizes (world size 2, 128)"),
    # a world of 2 has no rank 7 (a user's trace relabelled: merged as "Across 2 rank(s)", rows 0 and 7)
    ("outside", "rank 7 is outside the job's ranks (world size 2: ranks 0 to 1)")])
def test_traces_of_different_jobs_are_not_merged_and_the_report_says_why(tmp_path, second, why):
    _two_ranks(tmp_path)
    if second == "rank0":
        (tmp_path / "rank1.json").rename(tmp_path / "rank0-again.json")
        text = (tmp_path / "rank0-again.json").read_text().replace('"rank": 1', '"rank": 0')
        (tmp_path / "rank0-again.json").write_text(text)
    elif second == "world":
        tg.write(tg.TraceSpec(steps=[S(nccl_kernels=1, nccl_us=300)] * 5, rank=1, world_size=128), tmp_path / "rank1.json")
    else:
        tg.write(tg.TraceSpec(steps=[S(nccl_kernels=1, nccl_us=300)] * 5, rank=7, world_size=2), tmp_path / "rank1.json")
    doc = json.loads(run("report", tmp_path, "-f", "json").stdout)
    assert "ranks" not in doc and doc["verdict"]["notes"][0].startswith(why), doc["verdict"]["notes"]


def test_a_damaged_file_among_traces_is_skipped_and_named(tmp_path):
    """A 0-byte trace of a killed rank beside a good one: the good one is diagnosed, the warning
    names the other; only damaged files: one line naming each; one file alone: its path."""
    tg.write(tg.TraceSpec(steps=[S()] * 5), tmp_path / "rank0.json")
    (tmp_path / "rank1.json").write_bytes(b"")
    (tmp_path / "rank2.json").write_bytes(b"\x00\x01")
    r = run("report", tmp_path, "-f", "json")
    assert r.returncode == 0, r.stderr
    warnings = [w for t in json.loads(r.stdout)["traces"] for w in t["warnings"]]
    assert "skipped rank1.json: empty file" in warnings and any(w.startswith("skipped rank2.json: not a JSON") for w in warnings)
    (tmp_path / "rank0.json").write_bytes(b"")
    r = run("report", tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "could be read: " in r.stderr and "skipped rank0.json: empty file" in r.stderr
    r = run("report", tmp_path / "rank1.json")
    assert r.returncode == 2 and r.stderr.strip() == f"perfdoctor: error: {tmp_path / 'rank1.json'}: empty file"
    # a file cut short among several: its warning names it (it did not: which of them?)
    for f in ("rank1.json", "rank2.json"):
        (tmp_path / f).unlink()
    tg.write(tg.TraceSpec(steps=[S()] * 5), tmp_path / "rank0.json")
    tg.write(tg.TraceSpec(steps=[S()] * 5), tmp_path / "rank1.json", truncate_at=0.6)
    warnings = [w for t in json.loads(run("report", tmp_path, "-f", "json").stdout)["traces"] for w in t["warnings"]]
    assert any(w.startswith("rank1.json: trace is truncated") for w in warnings), warnings


def test_thousands_of_damaged_traces_are_one_short_line(tmp_path):
    """2,000 files of `{}`: the error named every one, a 135 KB line; it names the first three and
    counts the rest."""
    for i in range(2000):
        (tmp_path / f"t{i:04d}.json").write_text("{}")
    r = run("report", tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and len(r.stderr) < 500, r.stderr[:600]
    assert "skipped t0000.json: JSON object has no 'traceEvents' array (an empty object)" in r.stderr
    assert r.stderr.rstrip().endswith("; and 1,997 more file(s) skipped")


def test_a_trace_without_timed_events_among_traces_is_skipped_and_named(tmp_path):
    """A metadata-only trace (or one whose X events all lack a duration) beside good ones aborted
    the whole directory with exit 2, where an empty file is skipped: it is skipped and named too;
    with only such files, one line naming each; one file alone: its path."""
    tg.write(tg.TraceSpec(steps=[S(data_wait_us=2000)] * 5), tmp_path / "rank0.json")
    meta = {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "p"}},
                            {"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": 5}]}
    (tmp_path / "onlymeta.json").write_text(json.dumps(meta))
    nodur = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10 * i}
                             for i in range(20)]}
    (tmp_path / "nodur.json").write_text(json.dumps(nodur))
    (tmp_path / "empty.json").write_bytes(b"")
    r = run("report", tmp_path, "-f", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["traces"]) == 1 and doc["traces"][0]["metrics"]["steps.count"] == 5
    warnings = doc["traces"][0]["warnings"]
    assert "skipped onlymeta.json: no timed (complete 'X') events to analyse" in warnings
    assert "skipped nodur.json: no timed (complete 'X') events to analyse" in warnings
    assert "skipped empty.json: empty file" in warnings
    (tmp_path / "rank0.json").unlink()
    r = run("report", tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "could be analysed: " in r.stderr
    assert "skipped onlymeta.json: no timed" in r.stderr and "skipped nodur.json: no timed" in r.stderr
    r = run("report", tmp_path / "onlymeta.json")
    assert r.returncode == 2 and r.stderr.strip() == (
        f"perfdoctor: error: {tmp_path / 'onlymeta.json'}: no timed (complete 'X') events to analyse")


@pytest.mark.parametrize("setup,message", [
    (lambda p: None, "no such file"),
    (lambda p: p.write_text("not json"), "not a JSON trace"),
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.write_text('{"a": 1}'), "no 'traceEvents'"),
    # report.json from a run, or --format json: said as such (it had listed the report's keys)
    (lambda p: p.write_text('{"schema_version": 2, "tool": "perfdoctor 0.1.0", "verdict": {}}'),
     "this is a perfdoctor report, not a trace"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, setup, message):
    p = tmp_path / "x.json"
    setup(p)
    r = run("report", p)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("perfdoctor: error:") and message in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_usage_errors_exit_2(trace):
    assert run("report").returncode == 2
    assert run("report", trace, "--format", "yaml").returncode == 2
    assert run("frobnicate").returncode == 2


@pytest.mark.parametrize("cmd,given,near", [("run", "--steps", "--max-steps"), ("run", "--trace-step=3", "--trace-steps"),
                                             ("tune", "--bugdet", "--budget"), ("run", "--xyz", None),
                                             ("run", "--bogus", None), ("run", "--run-dir", "--out"),
                                             ("tune", "--output-dir", "--out"), ("run", "--warmup", "--skip-steps")])
def test_an_unknown_option_before_the_script_is_named_not_opened(tmp_path, cmd, given, near):
    """An option perfdoctor does not know lands where the script goes (everything from the script on
    is the script's): the error names the option and the nearest real one, not a missing file."""
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('never run')\n")
    r = run(cmd, given, "5", script)
    flag = given.split("=")[0]
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"perfdoctor: error: no such option: {flag}") and "never run" not in r.stderr
    assert (f"(did you mean {near}?)" in r.stderr) if near else "did you mean" not in r.stderr


def test_unwritable_output_is_a_clean_error(trace, tmp_path):
    r = run("report", trace, "-o", tmp_path / "missing-dir" / "r.json")
    assert r.returncode == 2 and "cannot write" in r.stderr and "Traceback" not in r.stderr


def test_run_refuses_an_output_it_cannot_write_before_the_script_runs(tmp_path):
    """`run -o` into a missing directory was found out after the whole training: the script ran,
    then perfdoctor printed one error and no report. It is refused at once; the script never runs."""
    script = tmp_path / "train.py"
    script.write_text("open(__file__ + '.ran', 'w').close()\n")
    bad = tmp_path / "missing" / "r.json"
    r = run("run", "-o", bad, "--out", tmp_path / "d", script)
    assert r.returncode == 2 and r.stderr == f"perfdoctor: error: cannot write {bad}: No such file or directory\n"
    assert not (tmp_path / "train.py.ran").exists() and not (tmp_path / "d").exists()


def test_an_output_over_an_input_is_refused_and_the_input_kept(trace, tmp_path):
    """`report t.json -f json -o t.json` replaced the trace with its report (exit 0), `--annotate`
    onto the trace replaced it with the copy, `-o RUN/steps.jsonl` a run file, and `run -o
    train.py train.py` the script after its training. Each is refused before anything is read or
    run (exit 2, one line); a run directory's own report.json may be written anew."""
    before = trace.read_bytes()
    for args in (["-f", "json", "-o", trace], ["--annotate", trace], ["-o", str(trace.parent) + "/./" + trace.name]):
        r = run("report", trace, *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "an input of this command (the output would replace it)" in r.stderr
        assert trace.read_bytes() == before
    d = tmp_path / "r"
    (d / "trace").mkdir(parents=True)
    (d / "trace" / "h_1.pt.trace.json.gz").write_bytes(before)
    (d / "steps.jsonl").write_text(json.dumps({"step": 1, "end": 1.7e9, "dur": 0.1, "wait": 0.0}) + "\n")
    for target in (d / "steps.jsonl", d / "trace" / "h_1.pt.trace.json.gz"):
        r = run("report", d, "-f", "json", "-o", target)
        assert r.returncode == 2 and f"cannot write {target}: an input of this command" in r.stderr, r.stderr
    assert (d / "trace" / "h_1.pt.trace.json.gz").read_bytes() == before
    r = run("report", d, "-f", "json", "-o", d / "report.json")
    assert r.returncode == 0 and json.loads((d / "report.json").read_text())["schema_version"] == 2
    script = tmp_path / "train.py"
    script.write_text("open(__file__ + '.ran', 'w').close()\n")
    r = run("run", "-o", script, "--out", tmp_path / "d", script)
    assert r.returncode == 2 and "cannot write" in r.stderr and "an input of this command" in r.stderr
    assert not (tmp_path / "train.py.ran").exists() and script.read_text().startswith("open(")


def test_version_and_help():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("perfdoctor ")
    h = run("--help")
    assert h.returncode == 0 and "report" in h.stdout


@pytest.mark.parametrize("cmd, sentence", [
    (["run"], "or start `perfdoctor run` once per rank with your own launcher"),
    (["tune"], "1 the baseline run of the script failed; 2 usage error"),
    ([], "CUDA flags...) on the unmodified script, each in a fresh run"),     # the command list
])
def test_help_paragraphs_are_wrapped_by_the_terminal_not_the_source(cmd, sentence):
    """A docstring's source line breaks do not reach `--help`: on a terminal wide enough, each
    of these sentences (which span two lines in cli.py) is on one line."""
    import os
    h = run(*cmd, "--help", env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1"})
    assert h.returncode == 0, h.stderr
    assert any(sentence in line for line in h.stdout.splitlines()), h.stdout


def test_report_path_never_imports_torch(trace):
    code = ("import sys; from perfdoctor.cli import main\n"
            "try:\n    main(['report', sys.argv[1], '-f', 'json'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nprint('ok', file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True, text=True, timeout=60)
    assert r.stderr.strip().endswith("ok"), r.stderr


@pytest.mark.parametrize("given", [["--nproc-per-node", "0"], ["--nproc-per-node", "-1"], ["--nproc-per-node", "abc"],
                                   ["--nproc-per-node", "2", "--nnodes", "0"]])
def test_a_rank_count_torchrun_would_refuse_is_one_line_and_starts_nothing(tmp_path, given):
    """torchrun answered these with its traceback, exit 1 and a run directory holding only
    ranks.json; now one line, exit 2, and no directory."""
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", *given, str(script)], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("perfdoctor: error: --n") and "never run" not in r.stdout
    assert not (tmp_path / "perfdoctor-runs").exists()


def test_the_run_report_starts_on_a_line_of_its_own_in_a_terminal(monkeypatch):
    """A script whose last print has no newline left the cursor mid-line, and the report's first
    line was glued to it (a user trial): in a terminal, the width less one in spaces and a
    carriage return wrap to a fresh line only from mid-line; nothing is written to a pipe."""
    import io
    import shutil

    from perfdoctor.run_flow import fresh_line

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(shutil, "get_terminal_size", lambda *a, **k: os.terminal_size((80, 24)))
    tty, pipe = Tty(), io.StringIO()
    fresh_line(tty)
    fresh_line(pipe)
    assert tty.getvalue() == " " * 79 + "\r" and pipe.getvalue() == ""


def test_the_run_report_starts_on_a_line_of_its_own_in_a_file(tmp_path):
    """`2> log`: a script whose stderr ended on a `\r` progress bar had the report's first line
    glued to it in the file (a user trial); a newline goes in first then, and only then."""
    from perfdoctor.run_flow import fresh_line
    for before, after in ((b"progress 40/40\r", b"progress 40/40\r\n"), (b"done\n", b"done\n"), (b"", b"")):
        log = tmp_path / "log"
        log.write_bytes(b"")
        with open(log, "a", encoding="utf-8") as f, open(log, "ab") as script:   # `2>>`: O_APPEND, write-only
            script.write(before)            # another description's writes: only the file's end tells
            script.flush()
            fresh_line(f)
        assert log.read_bytes() == after, before
    with open(log, "w", encoding="utf-8") as f:        # `2> log`, the script's bytes through its own fd
        os.write(f.fileno(), b"step 3 \xff")
        fresh_line(f)
    assert log.read_bytes() == b"step 3 \xff\n"


@pytest.mark.parametrize("cmd,args,told", [("tune", ["--budget", "120"], "--budget"),
                                           ("run", ["--max-steps=3", "--lr", "1"], "--max-steps=3"),
                                           ("run", ["--lr", "1"], None)])
def test_an_own_option_after_the_script_is_told_it_goes_to_the_script(tmp_path, capsys, cmd, args, told):
    """`perfdoctor tune train.py --budget 120` (as a new user wrote it) passed --budget to the script,
    which ignored it, and tuned with the default 300 s budget without a word: a note says where it went
    and where perfdoctor's options go; the script's own options get none."""
    from perfdoctor import cli
    from perfdoctor.script_argv import script_argv

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert script_argv(cmd, getattr(cli, cmd), [str(script), *args], None) == [str(script), *args]
    err = capsys.readouterr().err
    if told is None:
        assert err == ""
    else:
        assert err.startswith(f"perfdoctor: note: {told} after {script} is passed to the script")
        assert f"put it before the script: perfdoctor {cmd} [OPTIONS] {script} [ARGS]" in err
    # a module's line keeps its -m: without it the command it shows cannot open the module as a file
    assert script_argv(cmd, getattr(cli, cmd), args, "mypkg.train") == ["mypkg.train", *args]
    err = capsys.readouterr().err
    if told is not None:
        assert f"put it before the script: perfdoctor {cmd} [OPTIONS] -m mypkg.train [ARGS]" in err


def test_the_arguments_after_a_module_are_the_modules(monkeypatch, capsys):
    """`perfdoctor run -m mytrain --max-steps 150 --trace-steps 2 -o out.pt` (a package whose argparse
    has options named like ours): -m is an option of ours, so the parser read on, stopped the script
    at 150 steps, traced 2, wrote the report over out.pt and gave the module no arguments. As after
    a script and as with `python -m`, they are the module's; ours before -m stay ours."""
    from perfdoctor import cli, run_flow

    seen = {}

    def fake_run_script(cfg, report_to, *rest):
        seen.update(cfg=cfg, output=report_to)
        return 0

    monkeypatch.setattr(run_flow, "run_script", fake_run_script)
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--skip-steps", "3", "-m", "mytrain", "--max-steps", "150", "--trace-steps", "2", "-o", "out.pt"])
    assert exc.value.code == 0
    cfg = seen["cfg"]
    assert cfg.argv == ["mytrain", "--max-steps", "150", "--trace-steps", "2", "-o", "out.pt"]
    assert (cfg.module, cfg.max_steps, cfg.active, cfg.skip) == ("mytrain", None, 5, 3)
    assert seen["output"].file is None
    assert "--max-steps, --trace-steps after mytrain is passed to the script" in capsys.readouterr().err
    for given, argv, steps in ((["run", "--max-steps", "7", "-mmytrain", "--lr", "1"], ["mytrain", "--lr", "1"], 7),
                               (["run", "-o", "r.json", "-m", "mytrain", "--", "-x"], ["mytrain", "-x"], None),
                               (["run", "-m", "mytrain"], ["mytrain"], None)):
        with pytest.raises(SystemExit):
            cli.main(given)
        assert (seen["cfg"].argv, seen["cfg"].max_steps) == (argv, steps), given


@pytest.mark.parametrize("fmt", ["terminal", "json"])
def test_a_reader_that_goes_away_is_not_a_failure_code(trace, fmt):
    """`perfdoctor report T | head -1`: rich (terminal) and click (json) answered the closed
    pipe with exit 1, which `gate` uses for a regression. It is 141 (128 + SIGPIPE), silent."""
    r, w = os.pipe()
    os.close(r)                 # the reader has gone before the report writes a byte
    try:
        p = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(trace), "--details", "-f", fmt],
                           stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == 141, p.stderr
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr


@pytest.mark.parametrize("args,says", [(["report", "t.json", "--format", "bogus"], "Invalid value for '--format'"),
                                       (["report", "--bogus", "t.json"], "No such option: --bogus"),
                                       (["report"], "Missing argument"),
                                       (["gate"], "Missing argument 'CURRENT'"),
                                       (["tune", "--budget", "-5", "x.py"], "not in the range"),
                                       (["tune", "--budget", "nan", "x.py"], "'--budget': nan is not a number"),
                                       (["run", "--duration", "NaN", "x.py"], "'--duration': nan is not a number"),
                                       (["gate", "a", "-b", "b", "--min-effect", "nan"], "'--min-effect': nan is not"),
                                       (["gate", "a", "-b", "b", "--noise-k", "nan"], "'--noise-k': nan is not"),
                                       (["nosuchcommand"], "No such command")])
def test_usage_errors_are_one_line_with_exit_2(args, says):
    """click and typer print a usage block and a boxed message for a bad option, value or missing
    argument; perfdoctor's errors are one line on stderr (docs/exit-codes.md)."""
    r = run(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stdout == "", r.stderr
    assert r.stderr.startswith("perfdoctor: error: ") and says in r.stderr and "--help`)" in r.stderr
    assert "╭" not in r.stderr and "Usage:" not in r.stderr


def test_a_tune_file_is_read_whatever_the_format(trace, tmp_path):
    """--tune with the terminal or JSON format was never opened: a missing file passed silently and
    a good one was ignored without a word. It is read first (exit 2 before the load), and the
    format that does not show it (JSON) says so."""
    r = run("report", trace, "--tune", tmp_path / "missing.json")
    assert r.returncode == 2 and r.stderr == f"perfdoctor: error: --tune {tmp_path / 'missing.json'}: no such file\n"
    good = tmp_path / "tune.json"
    good.write_text('{"trials": []}')
    r = run("report", trace, "--tune", good, "-f", "json")
    assert r.returncode == 0 and "--tune's measured gains are not in the JSON report" in r.stderr
    for fmt in ("terminal", "markdown", "html"):
        r = run("report", trace, "--tune", good, "-f", fmt)
        assert r.returncode == 0 and "--tune" not in r.stderr, fmt


def test_the_terminal_shows_what_tune_measured_under_each_fix(trace, tmp_path):
    """`report --tune` in the terminal (the format most read) said the measured gains were in html
    and markdown only: each fix tune measured has its measurement under it, on the one screen and
    with --details, ranked or worth a look; tune's command to measure them is then left out."""
    from perfdoctor.diagnose.offline import diagnose_path
    findings = diagnose_path(str(trace))["findings"]
    ranked = [f["id"] for f in findings if f["ranked"]]
    assert len(ranked) >= 2, [f["id"] for f in findings]
    title = {f["id"]: f["title"] for f in findings}
    trials = [{"rule": ranked[0], "speedup": 1.52, "ci95": [1.31, 1.77], "status": "faster", "label": "a"},
              {"rule": ranked[0], "speedup": 1.10, "ci95": [1.0, 1.2], "status": "inconclusive", "label": "b"},
              {"rule": ranked[1], "speedup": 0.91, "ci95": [0.85, 0.97], "status": "slower", "label": "c"}]
    tune = tmp_path / "tune.json"
    tune.write_text(json.dumps({"trials": trials}))
    env = {**os.environ, "COLUMNS": "200"}
    plain, short, full = (run("report", trace, *more, env=env) for more in ((), ("--tune", tune),
                                                                              ("--tune", tune, "--details")))
    assert plain.returncode == short.returncode == full.returncode == 0, short.stderr
    assert "measured by tune" not in plain.stdout
    for out in (short.stdout, full.stdout):       # the best trial of each rule, under that fix
        lines = out.splitlines()
        for rid, want in ((ranked[0], "1.52x (95% CI 1.31-1.77; faster)"),
                          (ranked[1], "0.91x (95% CI 0.85-0.97; slower)")):
            at = next(i for i, x in enumerate(lines) if x.rstrip().endswith(title[rid]))
            below = next(x for x in lines[at:] if "measured by tune" in x)
            assert below.strip() == f"measured by tune: {want}", (rid, below)
        assert out.count("measured by tune") == 2 and "1.10x" not in out
    assert "perfdoctor tune" not in short.stdout


def test_a_fix_tune_measured_below_the_top_ones_is_shown_with_its_place(trace, tmp_path):
    """A nanoGPT tune: the one fix measured faster ranked 4th (a larger ceiling above it), and the
    one screen hid it under "+1 more". It is shown after the top ones, with its place."""
    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.report.terminal_fixes import TOP
    findings = diagnose_path(str(trace))["findings"]
    order = [f for f in findings if f["ranked"]] + [f for f in findings if not f["ranked"]]
    assert len(order) > TOP, [f["id"] for f in order]
    last = order[-1]
    tune = tmp_path / "tune.json"
    tune.write_text(json.dumps({"trials": [{"rule": last["id"], "speedup": 1.3, "ci95": [1.2, 1.4],
                                            "status": "faster", "label": "a"}]}))
    env = {**os.environ, "COLUMNS": "200"}
    plain, short = run("report", trace, env=env), run("report", trace, "--tune", tune, env=env)
    assert last["title"] not in plain.stdout and "measured by tune" not in plain.stdout
    lines = short.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.rstrip().endswith(last["title"]))
    assert lines[at - 1].strip() == "measured faster by tune, further down the ranking:", lines[at - 1]
    assert lines[at].lstrip().startswith(f"{len(order)}. ") and last["id"] in lines[at], lines[at]
    assert lines[at + 1].strip() == "measured by tune: 1.30x (95% CI 1.20-1.40; faster)"
    rest = len(order) - TOP - 1
    assert (f"+ {rest} more" in short.stdout) == (rest > 0) and f"+ {rest + 1} more" in plain.stdout
    # slower or inconclusive: under --details only (the one screen keeps its length)
    tune.write_text(json.dumps({"trials": [{"rule": last["id"], "speedup": 1.1, "ci95": [0.9, 1.3],
                                            "status": "inconclusive", "label": "a"}]}))
    again = run("report", trace, "--tune", tune, env=env)
    assert last["title"] not in again.stdout and "further down" not in again.stdout
    assert "measured by tune" not in again.stdout


def test_report_of_a_tune_directory_is_its_baselines_with_the_measured_gains(mlp_run, tmp_path):
    """`report TUNE_DIR` (a user's guess after a tune) read tune.json as a trace and exited 2: it is
    the report of the tune's baseline run with the gains measured; tune's JSON under another name
    given as a trace says what it is, in one line (exit 2). Where tune timed the baseline again
    (baseline-2/, no trace: its first run had too few steady steps), the report is the traced run's,
    whose fixes tune measured (a user trial on nanoGPT got baseline-2's, with no fix and no gain)."""
    import shutil
    tuned = tmp_path / "tuned"
    shutil.copytree(mlp_run("a"), tuned / "baseline")
    doc = json.loads((tuned / "baseline" / "report.json").read_text())
    rid = doc["findings"][0]["id"]
    result = {"tool": "perfdoctor 0.1.0", "command": "x.py", "baseline": {"dir": str(tuned / "baseline")},
              "trials": [{"rule": rid, "speedup": 1.21, "ci95": [1.1, 1.3], "status": "faster", "label": "x",
                          "dir": str(tuned / "01-x")}]}
    (tuned / "tune.json").write_text(json.dumps(result))
    env = {**os.environ, "COLUMNS": "200"}
    base = run("report", tuned / "baseline", "--tune", tuned / "tune.json", env=env)
    for given, what in ((tuned, "a tune directory"), (tuned / "tune.json", "a tune's result")):
        r = run("report", given, env=env)
        assert r.returncode == 0 and r.stdout == base.stdout, r.stderr
        assert r.stderr == (f"perfdoctor: note: {given} is {what}: the report of its baseline run "
                            f"({tuned / 'baseline'}), with the gains the tune measured under the fixes\n")
    assert "measured by tune: 1.21x (95% CI 1.10-1.30; faster)" in base.stdout
    shutil.copytree(mlp_run("b"), tuned / "baseline-2")
    for diagnosed in ({"report_dir": str(tuned / "baseline")}, {}):         # a tune.json of before report_dir
        again = {**result, "baseline": {"dir": str(tuned / "baseline-2"), "step_time_s": 0.0123, **diagnosed}}
        (tuned / "tune.json").write_text(json.dumps(again))
        r = run("report", tuned, env=env)
        assert r.returncode == 0 and r.stdout == base.stdout, r.stderr
        assert r.stderr.endswith(f"({tuned / 'baseline'}), with the gains the tune measured under the fixes; that "
                                 "run had too few steady steps for a step time, and tune timed the baseline again "
                                 "without a trace: 12 ms/step (baseline-2)\n"), r.stderr
    md = run("report", tuned, "-f", "markdown")
    assert "measured by tune: **1.21x \\(95% CI 1.10-1.30; faster\\)**" in md.stdout
    shutil.copy(tuned / "tune.json", tmp_path / "result.json")
    r = run("report", tmp_path / "result.json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "the result of `perfdoctor tune`, not a trace" in r.stderr
    # -o may not replace tune's JSON, which the report reads (refused before the load, exit 2)
    r = run("report", tuned, "-f", "json", "-o", tuned / "tune.json")
    assert r.returncode == 2 and "cannot write" in r.stderr and "an input of this command" in r.stderr
    # a tune that failed (no baseline measured, no trial): its baseline run's report, and nothing measured
    (tuned / "tune.json").write_text(json.dumps({"tool": "perfdoctor 0.1.0", "baseline": None, "trials": []}))
    r = run("report", tuned, env=env)
    assert r.returncode == 0 and r.stderr.endswith(f"({tuned / 'baseline'}), the tune measured no fix\n"), r.stderr
    # a tune.json that is not tune's (a script's settings) is no tune; a tune whose baseline run is gone says so
    (tuned / "tune.json").write_text(json.dumps({"lr": 0.1, "baseline": "x"}))
    assert "is a tune" not in run("report", tuned).stderr
    (tuned / "tune.json").write_text(json.dumps(again))
    shutil.rmtree(tuned / "baseline")
    r = run("report", tuned)
    assert r.returncode == 2 and r.stderr == (f"perfdoctor: error: {tuned}: a tune whose baseline run "
                                              f"{tuned / 'baseline'} is not there (moved or deleted): give "
                                              "`perfdoctor report` that run\n")
    r = run("compare", tuned, tuned / "baseline-2")        # compare and gate take runs: its runs are named
    assert r.returncode == 2 and r.stderr == (f"perfdoctor: error: {tuned}: a tune directory, not a run: give one of "
                                              f"its runs (baseline-2 in {tuned})\n")


def test_a_tune_file_with_fields_of_other_types_is_read_as_unknown(trace, tmp_path):
    """tune's trials read as tune wrote them: a trial that is not an object, a speed-up as a string
    (compared with a number, formatted with :.2f), a rule as a list, a model check as a string were
    exit 70 in html and markdown. Such fields read as unknown; a good trial beside them is shown."""
    from perfdoctor.diagnose.offline import diagnose_path
    rid = next(f["id"] for f in diagnose_path(str(trace))["findings"] if f["ranked"])
    trials = [1, "x", None, {"rule": rid, "speedup": "fast"}, {"rule": [rid], "speedup": 3.0},
              {"rule": rid, "speedup": 2.0, "label": "<b>w</b>", "model_check": "agrees", "ci95": [1.5, "x"]},
              {"rule": rid, "speedup": 1e308}]
    tune = tmp_path / "tune.json"
    tune.write_text(json.dumps({"trials": trials}))
    for fmt in ("html", "markdown"):
        out = tmp_path / f"r.{fmt}"
        r = run("report", trace, "--tune", tune, "-f", fmt, "-o", out)
        assert r.returncode == 0, r.stderr
        assert "measured by tune: " in out.read_text() and "2.00x" in out.read_text()
    # the interval and tune's status go with the speed-up (the markdown had shown a bare **1.03x**
    # for a trial tune called inconclusive)
    tune.write_text(json.dumps({"trials": [{"rule": rid, "speedup": 1.03, "ci95": [0.23, 4.55], "status": "inconclusive",
                                            "label": "w"}]}))
    for fmt in ("html", "markdown"):
        out = tmp_path / f"s.{fmt}"
        assert run("report", trace, "--tune", tune, "-f", fmt, "-o", out).returncode == 0
        assert "1.03x" in out.read_text() and "95% CI 0.23-4.55; inconclusive" in out.read_text(), fmt


def test_md_is_markdown_as_the_file_suffix_names_it(trace):
    """`--format md` (a user's first guess, as `-o report.md` names it) was refused."""
    md, markdown = run("report", "--format", "md", trace), run("report", "-f", "markdown", trace)
    assert md.returncode == markdown.returncode == 0 and md.stdout == markdown.stdout
    assert md.stdout.startswith("### perfdoctor: ")


def test_debug_adds_the_traceback_and_keeps_the_documented_exit_code(tmp_path):
    """PERFDOCTOR_DEBUG=1 on bad input: the traceback, then the same one line and exit 2 (it had
    re-raised, and Python's exit 1 read as a gate regression in a CI script that branches on 2)."""
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": "not a trace"}')
    runs = {}
    for debug in ("0", "1"):
        p = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(bad)], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PERFDOCTOR_DEBUG": debug})
        runs[debug] = p
    assert runs["0"].returncode == runs["1"].returncode == 2
    line = runs["0"].stderr.strip()
    assert line.startswith("perfdoctor: error: ") and "Traceback" not in line
    assert "Traceback (most recent call last)" in runs["1"].stderr and runs["1"].stderr.rstrip().endswith(line)


def test_a_fix_without_a_modelled_gain_shows_what_tune_measured(trace, tmp_path):
    """`report --tune`: tune measured PD306 (preprocess once) at 10.45x, a fix with no modelled
    gain, listed among those worth a look; neither the markdown nor the HTML said so."""
    from perfdoctor.report import html, markdown
    out = tmp_path / "r.json"
    assert run("report", trace, "-f", "json", "-o", out).returncode == 0
    doc = json.loads(out.read_text())
    rest = [f["id"] for f in doc["findings"] if not f["ranked"]]
    assert rest, [f["id"] for f in doc["findings"]]
    tune = {"trials": [{"rule": rest[0], "speedup": 3.1, "ci95": [2.9, 3.3], "status": "faster"}]}
    line = next(x for x in markdown.report(doc, tune).splitlines() if x.startswith("Also worth a look"))
    assert line.index(f"({rest[0]}") < line.index("measured by tune") and "), measured by tune: **3.10x \\(95% CI 2.90-3.30; faster\\)**" in line, line
    assert "measured by tune" not in markdown.report(doc, None)
    assert "measured by tune: <b>3.10x (95% CI 2.90-3.30; faster)</b>" in html.render(doc, tune)
