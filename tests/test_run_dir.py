"""Run directories: `run --out` never mixes two runs (--force replaces), `report RUN_DIR` re-diagnoses one."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfdoctor.collect.rundir import claim, is_run_dir
from perfdoctor.errors import PerfdoctorError

# A tiny CPU training loop: a DataLoader whose batches cost CPU on the trainer thread (num_workers=0),
# so the run has steps, a trace window, and a couple of seconds of system samples.
TINY = textwrap.dedent("""
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset
    print("tiny:", sys.argv[1:], flush=True)

    class Slow(Dataset):
        def __len__(self):
            return 10 ** 6
        def __getitem__(self, i):
            t = time.perf_counter()
            while time.perf_counter() - t < 0.004:
                pass
            return torch.randn(32), i % 4

    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    time.sleep(0.5)                          # set-up before the loop (run.first_step_s)
    for step, (x, y) in enumerate(DataLoader(Slow(), batch_size=8)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if step + 1 == int(sys.argv[1]):
            break
""")


def prun(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "perfdoctor", "run", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# -- claim (no subprocess) -------------------------------------------------------------------

def test_claim_refuses_a_run_and_force_removes_only_its_files(tmp_path):
    d = tmp_path / "r"
    claim(d)                                   # new: created
    assert d.is_dir() and not is_run_dir(d)
    claim(d)                                   # empty or foreign files: fine
    (d / "steps.jsonl").write_text("{}\n")
    (d / "trace").mkdir()
    (d / "trace" / "h_1.pt.trace.json.gz").write_bytes(b"x")
    (d / "mine.txt").write_text("keep")
    assert is_run_dir(d)
    with pytest.raises(PerfdoctorError, match=r"already holds a run \(steps.jsonl, trace/\).*--force") as e:
        claim(d)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert (d / "steps.jsonl").is_file() and (d / "trace" / "h_1.pt.trace.json.gz").is_file()
    claim(d, force=True)
    assert sorted(p.name for p in d.iterdir()) == ["mine.txt"]
    (tmp_path / "f").write_text("")
    with pytest.raises(PerfdoctorError, match="is a file"):
        claim(tmp_path / "f", force=True)


# -- real runs ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    pytest.importorskip("torch", reason="perfdoctor run tests need torch (test dependency)")
    root = tmp_path_factory.mktemp("rundir")
    script = root / "tiny.py"
    script.write_text(TINY)
    out = root / "run"
    r = prun("--skip-steps", "3", "--trace-steps", "3", "--out", out, script, "100")
    assert r.returncode == 0, r.stderr
    return script, out


def test_out_refuses_an_existing_run_and_force_replaces_it(tiny_run, tmp_path):
    script, first = tiny_run
    out = tmp_path / "run"
    shutil.copytree(first, out)                          # a whole run of 100 steps, trace and report
    n_old = len((out / "steps.jsonl").read_text().splitlines())
    (out / "mine.txt").write_text("keep")
    before = _snapshot(out)
    old_trace = [p.name for p in (out / "trace").iterdir()]
    # refused: exit 2, one line, the script never ran, nothing touched
    r = prun("--out", out, script, "8")
    assert r.returncode == 2
    assert r.stdout == ""
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("perfdoctor: error: --out ") and "--force" in err[0], r.stderr
    assert _snapshot(out) == before
    # --force: the old run's files go first; the new run is all there is
    r = prun("--force", "--skip-steps", "2", "--trace-steps", "2", "--out", out, script, "8")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "tiny: ['8']\n"
    traces = [p.name for p in (out / "trace").iterdir()]
    assert len(traces) == 1 and traces != old_trace          # the trace file is named by the new pid
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert n_old >= 99 and len(steps) <= 8              # 100 and 8 optimizer steps: no line of the old run
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["steps"] == len(steps) and doc["run"]["command"].endswith("tiny.py 8")
    assert (out / "mine.txt").read_text() == "keep"


# -- report RUN_DIR ----------------------------------------------------------------------------

NO_TORCH = """
import json, sys
from perfdoctor.cli import main
try:
    main(["report", sys.argv[1], "--format", "json", "-o", sys.argv[2]])
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))
"""


def test_report_run_dir_gives_what_run_gave(tiny_run, tmp_path):
    _, out = tiny_run
    live = json.loads((out / "report.json").read_text())
    before = _snapshot(out)
    r = subprocess.run([sys.executable, "-c", NO_TORCH, str(out), str(tmp_path / "again.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []                      # report never imports torch
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["verdict"] == live["verdict"]
    assert again["findings"] == live["findings"] and again["flags"] == live["flags"]
    assert again["traces"][0]["metrics"] == live["traces"][0]["metrics"]
    assert again["run"] == live["run"]
    m = live["traces"][0]["metrics"]
    assert m["run.steps"] >= 95 and m["steps.source"] == "ProfilerStep" and m["steps.count"] == 3
    assert m["run.data_wait_share"] > 0.3                   # 8 x 4 ms of busy loading in each step
    # the set-up before the first step: the import, the model, the 0.5 s sleep; within the run
    assert 0.5 <= m["run.first_step_s"] < live["run"]["wall_s"], (m["run.first_step_s"], live["run"]["wall_s"])
    assert _snapshot(out) == before                         # re-diagnosing writes nothing into the run
    # the terminal report names the run, as `run` printed it
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(out)], capture_output=True, text=True,
                       timeout=120)
    # its badge: the verdict's title need not be in the summary (PD117's, when a loaded machine
    # made the traced steps wait less than the steady ones, is not)
    from perfdoctor.report.labels import bound_title
    assert r.returncode == 0 and "perfdoctor run" in r.stdout and bound_title(live["verdict"]["bound"], m) in r.stdout
    # the header says when the first step came where the set-up took a fifth of the run or more
    first = f" s run (the first after {m['run.first_step_s']:.1f} s): "
    shown = m["run.first_step_s"] >= 0.2 * live["run"]["wall_s"]
    assert (first in r.stdout) == shown, r.stdout[:400]
    # the HTML and markdown reports say it too, in their own words
    from perfdoctor.report import html, markdown
    said = f"the first step {m['run.first_step_s']:.1f} s into a {live['run']['wall_s']:.1f} s run"
    assert (said in html.render(live)) == shown and (said in markdown.report(live)) == shown


def test_report_run_dir_without_trace_or_launcher_record(tiny_run, tmp_path):
    """A run killed before run.json was written, its trace lost: steps and samples still diagnose."""
    _, out = tiny_run
    d = tmp_path / "partial"
    d.mkdir()
    for name in ("child.json", "steps.jsonl", "samples.json"):
        (d / name).write_bytes((out / name).read_bytes())
    from perfdoctor.diagnose.offline import diagnose_path
    doc = diagnose_path(str(d))
    assert doc["run"]["exit_code"] == 0 and doc["run"]["wall_s"] is None and doc["run"]["trace"] == []
    assert doc["traces"][0]["metrics"]["run.steps"] == json.loads((out / "report.json").read_text())["run"]["steps"]
    assert any("no trace was recorded" in n for n in doc["run"]["notes"])


H100_BOUNDS = {"alloc": "device", "compute": "device", "sync": "device", "launch": "host",
               "launch_compiled": "host", "hf": "host", "lightning": "host", "loader": "input_cpu"}


def test_report_every_h100_run_dir(shared_traces):
    from perfdoctor.diagnose.offline import diagnose_path

    root = shared_traces / "h100"
    if not root.is_dir():
        pytest.skip(f"integration data absent: {root}")
    dirs = sorted(p for p in root.iterdir() if p.is_dir())
    assert {p.name for p in dirs} >= set(H100_BOUNDS)
    for d in dirs:
        doc = diagnose_path(str(d))
        steps = [json.loads(x) for x in (d / "steps.jsonl").read_text().splitlines() if x.strip()]
        m = doc["traces"][0]["metrics"]
        assert doc["run"]["steps"] == len(steps) == m["run.steps"], d.name
        assert doc["run"]["trace"] and m["trace.platform"] == "cuda" and m["steps.count"] == 5, d.name
        sampling = doc["run"]["sampling"]
        assert m["gpu.util_mean"] is not None and m["system.samples"] == sampling["samples"] >= 4, d.name
        if steps[-1]["end"] - steps[0]["end"] >= 2.5:           # 5+ samples at 0.5 s: the steps' window
            assert sampling["window"] == "steps", d.name
        else:                                                   # launch_compiled: 400 steps in 1.5 s
            assert sampling["window"] == "whole run", d.name
            assert any("over the whole run" in n for n in doc["run"]["notes"]), d.name
        if d.name in H100_BOUNDS:
            assert doc["verdict"]["bound"] == H100_BOUNDS[d.name], (d.name, doc["verdict"]["summary"])
    # the same trace, as a plain directory of traces, still reads as before (no run section)
    plain = diagnose_path(str(root / "loader" / "trace"))
    assert "run" not in plain and plain["traces"][0]["metrics"]["steps.count"] == 5


# -- damaged run files: a one-line warning each, and unknown where the file no longer tells -------

def _hand_run(d: Path, n: int = 30) -> Path:
    """A run directory as `run --no-trace` writes it, without samples: n steps of 100 ms, 10 ms waits."""
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"argv": ["train.py", "--lr", "0.1"], "module": None, "exit_code": 0,
                                            "signal": None, "wall_s": 4.0, "stopped_by": None,
                                            "forwarded_signals": [], "notes": [], "config": {}}))
    (d / "child.json").write_text(json.dumps({"outcome": "completed", "exit_code": 0, "error": None, "steps": n,
                                              "mode": "optimizer", "step_source": "optimizer steps",
                                              "profiler": "off", "trace_enabled": False, "notes": [],
                                              "torch_imported": True, "cuda_available": False}))
    (d / "steps.jsonl").write_text("".join(
        json.dumps({"step": i, "end": 1.7e9 + 0.1 * i, "dur": 0.1, "wait": 0.01, "batches": 1, "mode": "optimizer",
                    "profiled": False, "perturbed": False, "cpu": 0.09, "runq": 0.0}) + "\n" for i in range(1, n + 1)))
    return d


def _report(d: Path) -> tuple[dict, str]:
    from perfdoctor.diagnose.offline import diagnose_path
    term = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(d)], capture_output=True, text=True,
                          timeout=60)
    assert term.returncode == 0, term.stderr
    return diagnose_path(str(d)), term.stdout


def test_damaged_child_json_is_warned_and_the_ending_unknown(tmp_path):
    doc, term = _report(_hand_run(tmp_path / "intact"))
    assert doc["traces"][0]["warnings"] == [] and doc["run"]["outcome"] == "completed"
    d = _hand_run(tmp_path / "run")
    (d / "child.json").write_bytes(b"\x00\xff garbage")
    doc, term = _report(d)
    assert doc["traces"][0]["warnings"] == ["child.json is not JSON (Expecting value): how the script ended is unknown"]
    assert doc["run"]["outcome"] == "unknown" and doc["run"]["exit_code"] == 0      # run.json still says 0
    assert "outcome unknown · exit code 0" in term and "killed" not in term
    assert "warning: child.json is not JSON" in term
    (d / "child.json").write_text("[1, 2]")
    assert _report(d)[0]["traces"][0]["warnings"] == [
        "child.json holds a JSON list, not an object: how the script ended is unknown"]
    # a kill leaves no child.json, and run.json knows the signal: killed, and nothing to warn about
    (d / "child.json").unlink()
    (d / "run.json").write_text(json.dumps({"argv": ["train.py"], "exit_code": 137, "signal": 9}))
    doc, term = _report(d)
    assert doc["run"]["outcome"] == "killed" and doc["traces"][0]["warnings"] == []


def test_steps_jsonl_cut_mid_line_is_warned(tmp_path):
    d = _hand_run(tmp_path / "run")
    text = (d / "steps.jsonl").read_text()
    (d / "steps.jsonl").write_text(text[:-40])                        # the last line cut inside its JSON
    doc, term = _report(d)
    assert doc["run"]["steps"] == 29
    assert doc["traces"][0]["warnings"] == ["steps.jsonl: its last line is cut short (not JSON); that step is left out"]
    assert "warning: steps.jsonl: its last line is cut short" in term
    lines = text.splitlines(keepends=True)
    (d / "steps.jsonl").write_text("".join(lines[:5]) + "{not json\n" + '{"step": 6}\n' + "".join(lines[5:]))
    doc, _ = _report(d)
    assert doc["run"]["steps"] == 30
    assert doc["traces"][0]["warnings"] == [
        "steps.jsonl: 2 line(s) are not step records (not JSON, or no duration and data wait); left out"]


def test_empty_run_json_says_unknown_not_none(tmp_path):
    d = _hand_run(tmp_path / "run")
    (d / "run.json").write_text("{}")
    doc, term = _report(d)
    assert doc["run"]["command"] is None and doc["run"]["exit_code"] == 0       # child.json's exit code
    assert doc["traces"][0]["warnings"] == ["run.json lacks argv, exit_code: the command and the exit code are unknown"]
    assert "perfdoctor run (command unknown) · the script finished · exit code 0" in term
    d = tmp_path / "bare"                                             # the user trial's: run.json `{}` alone
    d.mkdir()
    (d / "run.json").write_text("{}")
    doc, term = _report(d)
    assert doc["run"]["exit_code"] is None and doc["run"]["outcome"] == "unknown"
    assert doc["verdict"]["bound"] == "inconclusive"
    assert doc["verdict"]["summary"].startswith("No step was recorded, and how the script ended is unknown "
                                                "(exit code unknown)")
    assert "exit code unknown" in term and "None" not in term and "killed" not in term and "failed" not in term
    (d / "run.json").write_text('{"argv": "train.py", "exit_code": "0"}')
    assert _report(d)[0]["traces"][0]["warnings"] == ["run.json: argv, exit_code of the wrong type, read as unknown"]


@pytest.mark.parametrize("name", ["run.json", "child.json", "steps.jsonl"])
def test_numbers_beyond_a_float_are_unknown_not_a_crash(tmp_path, name):
    """A 401-digit integer (float() refuses it: this was an internal error) or a 5000-digit one
    (Python's json refuses it) in a run file: those fields are read as unknown and warned about."""
    for digits in (401, 5000):
        d = _hand_run(tmp_path / f"run{digits}")
        text = (d / name).read_text()
        (d / name).write_text(re.sub(r'(": )\d+(?:\.\d+)?', lambda m: m.group(1) + "9" * digits, text))
        doc, term = _report(d)
        warnings = doc["traces"][0]["warnings"]
        assert len(warnings) == 1 and warnings[0].startswith(name), warnings
        assert "internal error" not in term
        if name == "steps.jsonl":
            assert doc["run"]["steps"] in (0, None)
        else:
            assert "wrong type" in warnings[0]


def test_the_note_shown_by_default_is_the_one_that_could_change_the_advice():
    """The terminal shows one run note by default: the stacks not recorded come before the notes
    about the run, which come before what only describes the machine or the sampling."""
    from perfdoctor.collect.gpu_counters import NO_GPU_NOTE
    from perfdoctor.collect.samplers import DELAYACCT_NOTE
    from perfdoctor.collect.stacks import skipped_note
    from perfdoctor.collect.optsteps import RATES_NOTE
    from perfdoctor.diagnose.live import _note_rank

    run = "2 of 20 steady steps drew more DataLoader batches than the usual 1"
    notes = [NO_GPU_NOTE.capitalize(), DELAYACCT_NOTE, run, skipped_note(0.0, 2)]
    assert sorted(notes, key=_note_rank) == [skipped_note(0.0, 2), run, NO_GPU_NOTE.capitalize(), DELAYACCT_NOTE]
    # what a step is leads even those: a WGAN's critic stepping 5 times an iteration read "6.95
    # ms/step" as the iteration's time, the note saying otherwise under --details only
    rates = f"{RATES_NOTE}: a step is one step of the first to step (RMSprop of 402,433 parameters, 300 steps)"
    assert sorted([*notes, rates], key=_note_rank)[0] == rates


def test_damaged_samples_json_is_warned(tmp_path):
    """samples.json that is not JSON, nested 10000 deep or a list was dropped without a word (the
    IO/CPU split and the machine's numbers silently unknown); a missing one is no fault."""
    for i, (content, warning) in enumerate([
            (b"\x00\xffjunk", "samples.json is not JSON (Expecting value)"),
            (b"[" * 10000 + b"]" * 10000, "samples.json is not JSON (RecursionError)"),
            (b"[1, 2]", "samples.json holds a JSON list, not an object"),
            (b'{"samples": {}}', "samples.json holds no list of samples")]):
        d = _hand_run(tmp_path / f"run{i}")
        (d / "samples.json").write_bytes(content)
        doc, term = _report(d)
        assert doc["traces"][0]["warnings"] == [warning + ": the system samples (CPU, IO, memory) are unknown"]
        assert f"warning: {warning}" in term
    assert _report(_hand_run(tmp_path / "none"))[0]["traces"][0]["warnings"] == []


def test_a_fifo_or_a_damaged_trace_in_the_run_directory(tmp_path):
    """trace/ holding a FIFO named like a trace hung `report RUN_DIR` forever (the loader opened
    it); a trace that is not JSON ended it with exit 2 and a message naming no file. The FIFO is
    skipped, the damaged trace named, and the run diagnosed from its steps, as a run without a
    trace is."""
    import os
    import tracegen as tg
    d = _hand_run(tmp_path / "fifo")
    (d / "trace").mkdir()
    tg.write(tg.TraceSpec(steps=[tg.StepSpec()] * 4, device="cpu"), d / "trace" / "h_1.pt.trace.json")
    os.mkfifo(d / "trace" / "h_0.pt.trace.json")
    doc, term = _report(d)
    assert doc["traces"][0]["warnings"] == [
        "skipped trace/h_0.pt.trace.json: not a regular file (a FIFO, socket or device)"]
    assert doc["traces"][0]["metrics"]["steps.count"] == 4         # the real trace next to it is read
    d = _hand_run(tmp_path / "junk")
    (d / "trace").mkdir()
    (d / "trace" / "h_1.pt.trace.json").write_text("garbage")
    doc, term = _report(d)
    (w,) = doc["traces"][0]["warnings"]
    assert w.startswith("trace/h_1.pt.trace.json is unusable (not a JSON trace") and "step timings" in w
    assert doc["run"]["steps"] == 30 and doc["traces"][0]["metrics"]["run.step_time_ms"] == pytest.approx(100, rel=0.01)
    assert any("no trace (its trace file is unusable)" in n for n in doc["verdict"]["notes"]), doc["verdict"]["notes"]
    assert "None" not in term


def test_compare_and_gate_say_which_step_records_they_left_out(tmp_path):
    """A run whose steps.jsonl holds junk lines was compared on the rest without a word (the
    damage only `report RUN_DIR` named); compare and gate now note it, with or without a
    report.json in the directory."""
    from perfdoctor.gate.load import load_run
    base = _hand_run(tmp_path / "base")
    d = _hand_run(tmp_path / "junk")
    with (d / "steps.jsonl").open("ab") as f:
        f.write(b"\x00\xff\x1b[2J junk\n")
    note = "steps.jsonl: 1 line(s) are not step records (not JSON, or no duration and data wait); left out"
    assert note in load_run(d).read_note and load_run(base).read_note == f"{base}: no report.json, diagnosed again " \
                                                                         "from its run files"
    (d / "report.json").write_text(json.dumps(_report(d)[0]))
    assert load_run(d).read_note == f"{d}: {note}"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "compare", str(base), str(d)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and note in " ".join(r.stdout.split())


def test_step_records_read_in_bulk_as_line_by_line():
    """steps.jsonl is decoded as one array and conformed by a flat reader (a run of hours has
    hundreds of thousands of lines); on every kind of line, good or damaged, the records and the
    count of lines left out are those of json.loads and conform line by line."""
    import random

    from perfdoctor.diagnose import runfiles as rf

    good = ['{"step": 3, "end": 12.5, "dur": 0.02, "wait": 0.001, "batches": 1, "mode": "train", "profiled": false}',
            '{"step": 4, "end": 12.52, "dur": 0.021, "wait": 0, "batches": 1.0, "extra": [1, {"a": null}]}',
            '{"step": 5, "dur": 1e-3, "wait": 2E-4, "save": null, "nfirst": 2, "peek_order": 7}']
    odd = ['{"step": 9999999999999999999, "dur": 0.02, "wait": 0}', '{"step": 6, "dur": 123456789012345678901234, "wait": 0}',
           '{"step": 6, "dur": ' + "9" * 401 + ', "wait": 0}', '{"step": 6, "dur": NaN, "wait": 0}',
           '{"step": 6, "dur": Infinity, "wait": 0}', '{"step": 6, "dur": 1e400, "wait": 0}', '{"step": true, "dur": 1, "wait": 0}',
           '{"step": 2.0, "dur": 1, "wait": 0}', '{"dur": "1", "wait": 0}', '{"dur": -1, "wait": 0}', '{"dur": 1}',
           '{"dur": 1, "wait": 0, "profiled": 1, "mode": 3, "!": 1, "=": {}}', '{"dur": 1, "wait": 0, "dur": 2}',
           '[1, 2]', '7', '"x"', 'null', '{not json', '1, 2', '{"a": 1}, {"b": 2}', ']', '[' * 5000 + ']' * 5000,
           '{"dur": 1e300, "wait": 1e-300}', '{"dur": -0.0, "wait": -0}', '\ufeff{"dur": 1, "wait": 0}',
           '{"dur": 1, "wait": 0, "cpu": ' + "9" * 30 + ', "x": [' + "9" * 400 + ']}', '{"dur": 0.1234567890123456789012, "wait": 0}']

    def by_line(lines):
        recs, out = [rf._json_line(x) for x in lines], []
        for r in recs:
            c = rf.conform(r, rf.STEP)
            if isinstance(c, dict) and all(isinstance(c.get(k), (int, float)) and c[k] >= 0 for k in ("dur", "wait")):
                out.append(c)
        return out, len(recs) - len(out)

    def same(a, b):
        return json.dumps(a, sort_keys=True, default=repr) == json.dumps(b, sort_keys=True, default=repr)

    rng = random.Random(0)
    sets = [good * 3, *([*good, x] for x in odd)]
    sets += [rng.sample(good * 4 + odd, 12) for _ in range(40)]
    for lines in sets:
        bulk = rf.steps(rf._json_lines(lines))
        assert same(bulk, by_line(lines)), lines
    assert rf.steps(rf._json_lines(good))[0][0] == json.loads(good[0])     # the common case: as written


def test_the_rnn_census_fields_of_child_json_are_conformed():
    """child.json's root_calls carries the RNN layer the step called most (collect/chainedcalls.py):
    a field of the wrong type (a hand edit, another writer) is read as unknown, so its metrics are
    unknown, and a layer without its kind is left out; intact fields give their shares."""
    from perfdoctor.analyze.rnnsequence import layer_call_metrics
    from perfdoctor.diagnose import runfiles as rf
    good = {"outcome": "completed", "root_calls": {
        "module": "Seq2Seq", "calls": 1, "chained": 0, "sliced": 0, "rnn_module": "GRU",
        "rnn": {"kind": "GRU", "input_size": 8, "hidden_size": 16, "input_shape": [4, 1, 8]},
        "rnn_calls": 11, "rnn_chained": 10, "rnn_fed_sliced": 9, "rnn_fed_back": 0,
        "rnn_layers": [{"kind": "Embedding", "opts": {"num_embeddings": 10}}, {"opts": {}}]}}
    rc = rf.record(good, rf.CHILD)["root_calls"]
    assert rc["rnn_layers"] == [{"kind": "Embedding", "opts": {"num_embeddings": 10}}]
    m = layer_call_metrics(rc)
    assert (m["rnn.layer_kind"], m["rnn.layer_calls_per_step"], m["rnn.layer_chained_share"],
            m["rnn.layer_fed_sliced_share"], m["rnn.layer_fed_back_share"]) == ("GRU", 11, 1.0, 0.9, 0.0)
    bad = json.loads(json.dumps(good))
    bad["root_calls"].update(rnn_calls="11", rnn_fed_back=True, rnn={"kind": 3}, chained=1.5)
    rc = rf.record(bad, rf.CHILD)["root_calls"]
    assert "rnn_calls" not in rc and "rnn_fed_back" not in rc and "chained" not in rc and rc["rnn"] == {}
    assert set(layer_call_metrics(rc).values()) == {None}
