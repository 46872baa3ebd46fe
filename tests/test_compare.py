"""`perfdoctor compare`: generated runs with known effects, and two real runs of an example."""

from __future__ import annotations

import json
import re
import shutil
import os
import subprocess
import sys

import numpy as np
import pytest

from perfdoctor.gate.compare import compare_runs
from perfdoctor.gate.load import RunData

FP = {"device": "cpu", "device_count": 0, "torch": "2.13.0+cpu", "cpu_count": 2, "batch_size": None}


def mk(durs, input_shares, verdict="device", fixes=()) -> RunData:
    steps = [{"dur": float(d), "wait": 0.0} for d in durs]
    tsteps = [{"duration_ms": 100.0, "breakdown_ms": {"data_loading": 100 * s, "cpu_exec": 100 * (1 - s)}}
              for s in input_shares]
    m = {"breakdown.data_loading": float(np.mean(input_shares)), "breakdown.cpu_exec": 1 - float(np.mean(input_shares)),
         "breakdown.kernel": None}
    doc = {"schema_version": 1, "verdict": {"bound": verdict}, "findings": [{"id": f} for f in fixes],
           "traces": [{"metrics": m, "steps": tsteps}]}
    r = RunData("x", doc, steps, dict(FP))
    r.steps_durs = np.asarray(durs, dtype=float)
    return r


def test_changes_against_within_run_noise():
    rng = np.random.default_rng(0)
    before = mk(0.1 * np.exp(rng.normal(0, 0.03, 40)), [0.10, 0.11, 0.09, 0.10, 0.10], fixes=["PD319"])
    after = mk(0.12 * np.exp(rng.normal(0, 0.03, 40)), [0.30, 0.32, 0.29, 0.31, 0.30], verdict="input",
               fixes=["PD319", "PD301"])
    doc = compare_runs(before, after)
    rows = {r["metric"]: r for r in doc["rows"]}
    assert list(rows)[:4] == ["step time", "throughput", "step time median", "step time p90"]
    st = rows["step time"]
    assert st["before"] == pytest.approx(1e3 * np.mean(before.steps_durs[2:]))      # steady mean, in ms
    assert st["change"] == pytest.approx(0.2, abs=0.04) and st["beyond_noise"] is True
    assert st["noise"].startswith("CI95 ") and "steady steps 38 / 38" in st["note"]
    assert rows["throughput"]["change"] == pytest.approx(1 / (1 + st["change"]) - 1)
    # the throughput's interval is of its own ratio (after / before), the step time's inverted
    lo, hi = (float(x) for x in st["noise"][5:-1].split("-"))
    tlo, thi = (float(x) for x in rows["throughput"]["noise"][5:-1].split("-"))
    assert (tlo, thi) == (pytest.approx(1 / hi, abs=0.011), pytest.approx(1 / lo, abs=0.011)) and thi < 1
    for secondary in ("step time median", "step time p90"):     # listed, never judged
        assert rows[secondary]["beyond_noise"] is None and rows[secondary]["note"].startswith("secondary")
    dl = rows["breakdown.data_loading"]
    assert dl["change"] == pytest.approx(0.204, abs=1e-6) and dl["beyond_noise"] is True
    assert dl["noise"].endswith(" pts (5/5 traced steps)")      # how few steps the noise rests on
    assert "breakdown.kernel" not in rows                 # unknown on both sides: not listed
    assert doc["verdict"] == {"before": "device", "after": "input", "changed": True}
    # a CPU-only run's "device" reads as its badge does (compare showed "device", a GPU word)
    before.doc["traces"][0]["metrics"]["trace.platform"] = after.doc["traces"][0]["metrics"]["trace.platform"] = "cpu"
    assert compare_runs(before, after)["verdict_titles"] == {"before": "COMPUTE-BOUND (CPU)", "after": "INPUT-BOUND"}
    assert doc["findings"]["added"] == ["PD301"] and doc["findings"]["removed"] == []
    # one run on each side: the interval is the noise within the runs, and the doc says what it leaves out
    assert doc["step_noise"].startswith("one run on each side") and "-b RUN1 -b RUN2 -b RUN3" in doc["step_noise"]


def test_same_distribution_is_within_noise():
    rng = np.random.default_rng(1)
    shares = [0.10, 0.12, 0.08, 0.11, 0.09]
    doc = compare_runs(mk(0.1 * np.exp(rng.normal(0, 0.03, 40)), shares),
                       mk(0.1 * np.exp(rng.normal(0, 0.03, 40)), shares[::-1]))
    rows = {r["metric"]: r for r in doc["rows"]}
    assert rows["step time"]["beyond_noise"] is False
    assert rows["breakdown.data_loading"]["beyond_noise"] is False


def test_bursty_runs_compare_by_time_per_step_not_median():
    """3 workers on 2 cores (bursts: 2 short steps, 1 long) before, 2 workers after: truly ~13%
    faster per step, though the median step grows 5x."""
    rng = np.random.default_rng(2)
    before = mk(np.tile([0.02, 0.02, 0.34], 100) * rng.lognormal(0, 0.1, 300), [0.9] * 5)
    after = mk(np.tile([0.05, 0.17], 150) * rng.lognormal(0, 0.1, 300), [0.9] * 5)
    rows = {r["metric"]: r for r in compare_runs(before, after)["rows"]}
    assert rows["step time median"]["change"] > 2                     # what the median says
    truth = after.steps_durs[2:].mean() / before.steps_durs[2:].mean() - 1
    assert rows["step time"]["change"] == pytest.approx(truth, abs=0.01) and truth < -0.1
    assert rows["step time"]["beyond_noise"] is True and rows["throughput"]["change"] > 0.1


def test_different_commands_are_said_not_refused():
    import io

    from perfdoctor.gate.compare import render_compare
    from perfdoctor.report import markdown
    from perfdoctor.report.sanitize import console

    rng = np.random.default_rng(2)
    before = mk(0.1 * np.exp(rng.normal(0, 0.03, 40)), [0.1] * 5)
    after = mk(0.1 * np.exp(rng.normal(0, 0.03, 40)), [0.1] * 5)
    before.doc["run"], after.doc["run"] = {"command": "train.py --bs 8"}, {"command": "train_amp.py --bs 8"}
    doc = compare_runs(before, after)
    line = "the runs ran different commands: before `python train.py --bs 8` vs after `python train_amp.py --bs 8`"
    assert doc["commands"] == {"before": "train.py --bs 8", "after": "train_amp.py --bs 8", "differ": True,
                               "warning": line}
    assert doc["rows"][0]["before"] is not None and doc["rows"][0]["after"] is not None     # still compared
    c = console(file=io.StringIO())
    render_compare(doc, c)
    assert f"warning: {line}" in c.file.getvalue()
    assert "Warning: the runs ran different commands: before \\`python train.py --bs 8\\` vs after" in markdown.compare(doc)
    after.doc["run"] = {"command": "./train.py --bs 8"}
    assert compare_runs(before, after)["commands"]["differ"] is False


def test_runs_of_two_batch_sizes_compare_samples_per_second_too():
    """A DDP job at batch 32, then 64 (PD385's fix), read step time +15.8% and throughput -13.7%
    "beyond noise" where it did 1.73x the samples per second: where both batch sizes are known and
    differ, a samples/s row follows the throughput, its interval the step time's scaled by the
    batch sizes' ratio; runs of one batch size, or of one not known, have none."""
    rng = np.random.default_rng(5)
    before = mk(0.100 * np.exp(rng.normal(0, 0.03, 40)), [0.1] * 5)
    after = mk(0.116 * np.exp(rng.normal(0, 0.03, 40)), [0.1] * 5)
    before.fingerprint["batch_size"], after.fingerprint["batch_size"] = 32, 64
    rows = {r["metric"]: r for r in compare_runs(before, after)["rows"]}
    assert list(rows)[:3] == ["step time", "throughput", "samples/s"]
    st, sp = rows["step time"], rows["samples/s"]
    assert st["change"] > 0.1 and st["beyond_noise"] is True
    assert sp["before"] == pytest.approx(32e3 / st["before"]) and sp["after"] == pytest.approx(64e3 / st["after"])
    assert sp["change"] == pytest.approx(2 / (1 + st["change"]) - 1) and sp["beyond_noise"] is True
    lo, hi = (float(x) for x in st["noise"][5:-1].split("-"))
    slo, shi = (float(x) for x in sp["noise"][5:-1].split("-"))
    assert (slo, shi) == (pytest.approx(2 / hi, abs=0.011), pytest.approx(2 / lo, abs=0.011)) and slo > 1
    assert sp["note"] == "batch 32 -> 64: batch size / step time"
    from perfdoctor.report.values import value
    assert value(sp["after"], sp["unit"]).endswith(" samples/s")
    for b, a in ((32, 32), (None, 64), (32, None)):
        before.fingerprint["batch_size"], after.fingerprint["batch_size"] = b, a
        assert "samples/s" not in {r["metric"] for r in compare_runs(before, after)["rows"]}


def test_a_thread_count_that_differs_is_told():
    """2 torch threads before, 1 after (PD348's fix on a shared machine): compare says so, and
    the gate notes it and decides all the same; runs that agree, or a side that does not know
    its count (a trace alone), say nothing."""
    import io

    from perfdoctor.gate.compare import render_compare
    from perfdoctor.gate.gate import gate_runs
    from perfdoctor.report.sanitize import console

    rng = np.random.default_rng(3)
    before = mk(0.1 * np.exp(rng.normal(0, 0.03, 40)), [0.1] * 5)
    after = mk(0.05 * np.exp(rng.normal(0, 0.03, 40)), [0.1] * 5)
    before.metrics["machine.torch_threads"], after.metrics["machine.torch_threads"] = 2, 1
    doc = compare_runs(before, after)
    assert doc["settings_differ"] == ["torch threads 2 vs 1"] and doc["environment"]["differs"] == []
    c = console(file=io.StringIO())
    render_compare(doc, c)
    assert "the runs' settings differ: torch threads 2 vs 1 (part of what changed the step time)" in c.file.getvalue()
    res = gate_runs(after, [before])
    assert "the run's settings differ from the baseline's: torch threads 2 vs 1" in " ".join(res.notes)
    assert res.outcome == "improvement"                 # twice as fast: decided as usual
    after.metrics["machine.torch_threads"] = 2
    assert compare_runs(before, after)["settings_differ"] == []
    del after.metrics["machine.torch_threads"]
    assert compare_runs(before, after)["settings_differ"] == []
    assert not any("settings differ" in n for n in gate_runs(after, [before]).notes)


@pytest.mark.parametrize("bad", ["fast", float("nan"), float("inf"), True, -5.0, 0.0])
def test_a_hand_edited_step_time_is_unknown_not_taken(bad):
    """run.step_time_ms edited to a string, NaN, inf, true, a negative or zero time: compare and
    gate both read it as unknown (compare said -116.8% from -5 ms); compare falls back to the
    traced mean and says so."""
    from perfdoctor.gate.gate import _step_s

    b, a = mk([0.1] * 5, [0.1] * 5), mk([0.1] * 5, [0.1] * 5)
    for r, v in ((b, 30.0), (a, bad)):
        r.steps, r.steps_durs = None, None
        r.metrics.update({"run.step_time_ms": v, "steps.time_mean_ms": 33.7})
    row = compare_runs(b, a)["rows"][0]
    assert row["before"] == pytest.approx(30.0) and row["after"] == pytest.approx(33.7)
    assert "x: the traced steps' mean" in row["note"]
    assert _step_s(a) is None and _step_s(b) == pytest.approx(0.030)


@pytest.fixture(scope="module")
def two_runs(mlp_run):
    """The MLP and the same MLP 3x wider, 80 steps each (conftest's mlp_run, shared with the gate tests)."""
    return [mlp_run("a"), mlp_run("wide")]


def pd(*args):
    return subprocess.run([sys.executable, "-m", "perfdoctor", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})


def test_compare_real_runs_json(two_runs):
    a, b = two_runs
    p = pd("compare", a, b, "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    rows = {r["metric"]: r for r in doc["rows"]}
    assert {"step time", "step time median", "step time p90", "throughput"} <= set(rows)
    # CPU runs: the roles either run has, never the GPU's (kernel, memcpy, memset), all at 0%
    shown = {k for k in rows if k.startswith("breakdown.")}
    assert "breakdown.cpu_exec" in shown and not shown & {"breakdown.kernel", "breakdown.memcpy", "breakdown.memset"}
    assert all(max(rows[k]["before"] or 0, rows[k]["after"] or 0) >= 0.0005 for k in shown)
    st = rows["step time"]
    # the MLP 3x wider is ~9x the FLOPs (another process taking a core costs single-threaded
    # torch at most ~2-3x, so the change stays large); whether it is beyond noise is decided
    # unless a window was too short to tell (then None, and the note says why)
    assert st["change"] > 1.0 and st["beyond_noise"] in (True, False, None)
    assert (st["beyond_noise"] is None) == ("too short to tell" in st["note"])
    assert rows["throughput"]["change"] < -0.5
    assert doc["verdict"]["before"] and doc["verdict"]["after"]
    assert isinstance(doc["findings"]["before"], list)
    assert doc["environment"]["differs"] == []


def test_compare_terminal_and_report_files(two_runs):
    a, b = two_runs
    p = pd("compare", a, b)
    assert p.returncode == 0, p.stderr
    for word in ("step time", "step time median", "secondary figure", "throughput", "breakdown.cpu_exec", "verdict",
                 "beyond noise", "findings"):
        assert word in p.stdout
    said = " ".join(p.stdout.split())
    assert re.search(r"throughput \S* [\d.]+ steps/s", said), said            # per what: steps, not "/s"
    assert "note: one run on each side: the step time's interval is the noise within each run" in said
    md = pd("compare", a, b, "--format", "markdown").stdout
    assert "_Note: one run on each side" in md
    # report files: inside their run directories they get the step records too
    p = pd("compare", a / "report.json", b / "report.json", "--format", "json")
    assert json.loads(p.stdout)["rows"][0]["noise"] is not None


def test_compare_input_errors(two_runs, tmp_path):
    p = pd("compare", two_runs[0], tmp_path / "missing")
    assert p.returncode == 2 and p.stderr.startswith("perfdoctor: error:")
    (tmp_path / "x.json").write_text("not json")
    assert pd("compare", tmp_path / "x.json", two_runs[0]).returncode == 2


def test_reports_of_traces_alone_compare_the_traced_mean_and_say_so(tmp_path):
    """Two report.json of traces (no run directory): no steady window, so the step time is the
    traced steps' mean, which the profiler slows: the row's note says so."""
    import tracegen as tg

    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.report.json_out import to_json

    reps = []
    for name, wait in (("a", 3000), ("b", 1000)):
        tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=wait)] * 4), tmp_path / f"{name}.json")
        rep = tmp_path / f"{name}_report.json"
        rep.write_bytes(to_json(diagnose_path(str(tmp_path / f"{name}.json"))))
        reps.append(rep)
    p = subprocess.run([sys.executable, "-m", "perfdoctor", "compare", *map(str, reps), "-f", "json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    row = next(r for r in json.loads(p.stdout)["rows"] if r["metric"] == "step time")
    assert row["before"] > row["after"] and "the traced steps' mean" in row["note"]
    assert json.loads(p.stdout)["step_noise"] is None             # no interval: nothing to qualify


def test_a_report_with_numbers_beyond_a_float_compares_as_unknown(tmp_path):
    """Every number of a report.json replaced by a 401-digit integer (float() refuses it: compare
    and gate ended in an internal error) or a 5000-digit one (Python's json refuses it): its step
    time is unknown, and both commands still answer."""
    import re

    import tracegen as tg

    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.report.json_out import to_json

    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=1000)] * 4), tmp_path / "a.json")
    good = tmp_path / "good_report.json"
    good.write_bytes(to_json(diagnose_path(str(tmp_path / "a.json"))))
    for digits in (401, 5000):
        bad = tmp_path / f"bad{digits}_report.json"
        bad.write_text(re.sub(r'(": )\d+(?:\.\d+)?(?=[,}\]])', lambda m: m.group(1) + "9" * digits, good.read_text()))
        p = pd("compare", bad, good, "-f", "json")
        assert p.returncode == 0, p.stderr
        row = next(r for r in json.loads(p.stdout)["rows"] if r["metric"] == "step time")
        assert row["before"] is None and row["after"] > 0
        g = pd("gate", good, "--baseline", bad)
        assert g.returncode in (0, 3) and "internal error" not in g.stderr, g.stderr


def test_a_report_of_another_schema_version_is_noted(tmp_path):
    """A report.json of schema_version 99 (a newer perfdoctor) or "x" (a hand edit) is compared on
    the fields we know, and compare and gate both say so; our own version says nothing."""
    import tracegen as tg

    from perfdoctor.diagnose.document import SCHEMA_VERSION
    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.report.json_out import to_json

    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=1000)] * 4), tmp_path / "a.json")
    good = tmp_path / "good_report.json"
    good.write_bytes(to_json(diagnose_path(str(tmp_path / "a.json"))))
    p = pd("compare", good, good, "-f", "json")
    assert p.returncode == 0 and json.loads(p.stdout)["notes"] == []
    for version in (99, "x"):
        doc = json.loads(good.read_text())
        doc["schema_version"] = version
        other = tmp_path / f"v{version}_report.json"
        other.write_text(json.dumps(doc))
        p = pd("compare", other, good, "-f", "json")
        assert p.returncode == 0, p.stderr
        notes = json.loads(p.stdout)["notes"]
        assert notes == [f"{other}: report schema_version {version}, not {SCHEMA_VERSION} as this perfdoctor writes: "
                         "compared on the fields it knows"]
        assert f"note: {other}: report schema_version {version}" in pd("compare", other, good).stdout
        g = pd("gate", good, "--baseline", other, "-f", "json")
        assert notes[0] in json.loads(g.stdout)["notes"], g.stdout


def test_compare_and_gate_name_a_new_flag(tmp_path):
    """A change that starts leaking memory (PD216) passed the gate as an IMPROVEMENT and compare
    listed only fixes (a user trial): compare lists the flags, gate notes a new medium one."""
    from perfdoctor.gate.compare import compare_runs
    from perfdoctor.gate.gate import GateOptions, gate_runs
    from perfdoctor.gate.load import load_run

    def report(name, flags):
        d = {"schema_version": 2, "verdict": {"bound": "device"}, "findings": [],
             "flags": [{"id": i, "severity": sev, "title": t} for i, sev, t in flags],
             "traces": [{"metrics": {"run.step_time_ms": 10.0}}], "run": {"command": "train.py"}}
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(d))
        return load_run(f)

    before = report("b", [("PD214", "high", "The training thread waits for a CPU")])
    after = report("a", [("PD216", "medium", "The training job's memory grows every step"),
                         ("PD999", "low", "something minor")])
    doc = compare_runs(before, after)
    assert doc["flags"] == {"before": ["PD214"], "after": ["PD216", "PD999"], "added": ["PD216", "PD999"],
                            "removed": ["PD214"], "unchecked_before": [], "unchecked_after": []}
    res = gate_runs(after, [before], GateOptions())
    assert "new flags in the current run: PD216 (medium: The training job's memory grows every step)" in res.notes
    assert not any("PD999" in n for n in res.notes)                    # a low flag is no news for CI


def test_compare_says_when_other_processes_loaded_a_side(tmp_path):
    """A user's fused-optimizer run took 6.88 ms a step against 0.475 ms: compare said "beyond noise:
    yes" and nothing else, while gate called the same pair inconclusive (other processes used 0.9
    and 1.0 of 2 cores). compare notes it, with gate's threshold."""
    from perfdoctor.gate.compare import compare_runs
    from perfdoctor.gate.load import load_run

    def report(name, other):
        d = {"schema_version": 2, "verdict": {"bound": "device"}, "findings": [],
             "traces": [{"metrics": {"run.step_time_ms": 10.0, "machine.cpu_count": 2, "system.other_cores": other}}],
             "run": {"command": "train.py"}}
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(d))
        return load_run(f)

    quiet, busy = report("q", 0.2), report("b", 0.9)
    notes = compare_runs(busy, report("b2", 1.0))["notes"]
    assert ("the machine was busy with other work (before: 0.9 of 2 cores; after: 1.0 of 2 cores used by other "
            "processes): the step times carry that load (gate calls such runs inconclusive)") in notes, notes
    assert any("(after: 0.9 of 2 cores used" in n for n in compare_runs(quiet, busy)["notes"])
    assert not any("busy with other work" in n for n in compare_runs(quiet, report("q2", 0.4))["notes"])


def test_compare_says_when_a_neighbour_made_a_sides_training_thread_queue(tmp_path):
    """A user trial: a neighbour's half core (below gate's busy threshold) queued the before run's
    training thread 16% of its steps' time, and compare called channels_last's ~1.3x a 2.3x change,
    "beyond noise: yes". The step rows' word says the machine was shared, and a note says which
    side waited; a wait of the script's own threads (no neighbour) is the script's, and not noted."""
    from perfdoctor.gate.compare import compare_runs, render_compare
    from perfdoctor.gate.load import load_run
    from perfdoctor.report.markdown import compare as compare_md
    from perfdoctor.report.sanitize import console

    def report(name, ms, other, runq):
        d = {"schema_version": 2, "verdict": {"bound": "device"}, "findings": [],
             "traces": [{"metrics": {"run.step_time_ms": ms, "machine.cpu_count": 2, "system.other_cores": other,
                                     "run.runq_share": runq}}],
             "run": {"command": "train.py"}}
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(d))
        return load_run(f)

    queued, quiet = report("b", 274.5, 0.46, 0.16), report("a", 117.1, 0.02, 0.005)
    doc = compare_runs(queued, quiet)
    want = ("before: its training thread waited for a CPU 16% of its steps' time while other processes used 0.46 "
            "of 2 cores (PD214): that step time carries the wait, and the change with it; compare runs on a quiet "
            "machine")
    assert want in doc["notes"] and doc["machine_shared"] is True, doc["notes"]
    own = compare_runs(report("o", 274.5, 0.05, 0.16), quiet)        # its own threads queued: no note
    assert own["machine_shared"] is False and not any("waited for a CPU" in n for n in own["notes"])
    busy = compare_runs(report("x", 274.5, 0.9, 0.16), quiet)        # busy: the busy note only
    assert busy["machine_shared"] is True and not any("waited for a CPU" in n for n in busy["notes"])
    # the threshold is PD214's (rules/PD214-cpu-contention.toml), said once more in gate/load.py
    from perfdoctor.gate.load import QUEUED
    from perfdoctor.rules.loader import load_rules
    assert next(r.when for r in load_rules() if r.id == "PD214") == f"run.runq_share >= {QUEUED}"
    # these reports have no step records (noise unknown): the rows as runs with them give them
    for r in doc["rows"]:
        r["beyond_noise"] = True
    c = console(record=True, width=250)
    render_compare(doc, c)
    shown = c.export_text()
    assert shown.count("yes, on a shared machine (note)") == 2, shown         # step time and throughput
    assert compare_md(doc).count("**yes, on a shared machine (note)**") == 2
    doc["machine_shared"] = False
    c = console(record=True, width=250)
    render_compare(doc, c)
    assert "shared machine" not in c.export_text() and "shared machine" not in compare_md(doc)


def test_a_rule_a_run_could_not_evaluate_is_neither_new_nor_gone(tmp_path):
    """A tune trial's run has no trace: compare listed every trace rule of the baseline as "gone"
    (a user trial: "gone: PD338, PD375, PD312, PD317" where only the fused optimizer had changed)."""
    from perfdoctor.gate.compare import compare_runs, render_compare
    from perfdoctor.gate.gate import GateOptions, gate_runs
    from perfdoctor.gate.load import load_run

    def report(name, fixes, flags, skipped):
        d = {"schema_version": 2, "verdict": {"bound": "host"}, "findings": [{"id": i} for i in fixes],
             "flags": [{"id": i, "severity": "medium", "title": "t"} for i in flags],
             "traces": [{"metrics": {"run.step_time_ms": 10.0},
                         "skipped": [{"rule": r, "unknown": ["trace.kernel_share"]} for r in skipped]}],
             "run": {"command": "train.py"}}
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(d))
        return load_run(f)

    traced = report("traced", ["PD338", "PD312", "PD317"], ["PD211"], [])
    untraced = report("untraced", [], [], ["PD312", "PD317", "PD211"])
    doc = compare_runs(traced, untraced)
    assert doc["findings"]["removed"] == ["PD338"] and doc["findings"]["unchecked_after"] == ["PD312", "PD317"]
    assert doc["flags"]["removed"] == [] and doc["flags"]["unchecked_after"] == ["PD211"]
    back = compare_runs(untraced, traced)
    assert back["findings"]["added"] == ["PD338"] and back["findings"]["unchecked_before"] == ["PD312", "PD317"]
    from rich.console import Console
    con = Console(record=True, width=300)
    render_compare(doc, con)
    out = con.export_text()
    assert "gone: PD338; not evaluated after (a metric they need is unknown there): PD312, PD317" in out, out
    # the markdown says as much as the terminal (it had listed no flag and nothing unevaluated)
    from perfdoctor.report import markdown
    def plain(doc):       # markdown escapes the brackets
        return markdown.compare(doc).replace("\\(", "(").replace("\\)", ")")
    md = plain(doc)
    # the noise column, as on the terminal (the markdown had only "beyond noise")
    assert "| metric | before | after | change | noise | beyond noise |" in md
    assert "| step time | 10.0 ms | 10.0 ms | +0.0% | unknown | unknown |" in md, md
    assert "gone: PD338; not evaluated after (a metric they need is unknown there): PD312, PD317" in md, md
    assert "Flags before: PD211; after: none; not evaluated after (a metric they need is unknown there): PD211" in md
    assert "_Environment not fully known (device model" in md and "the script" not in md
    untraced.doc["run"].update(exit_code=3)
    assert "_Note: after: the script exited (exit code 3): its steps cover" in plain(compare_runs(traced, untraced))
    # a report is input: a skipped entry that names no rule, or a list, is left out (the fuzz test's)
    odd = report("odd", [], [], [])
    odd.doc["traces"][0]["skipped"] = [{"rule": ["PD312"]}, {"rule": None}, "PD317", {"rule": "PD338"}]
    assert odd.unevaluated == {"PD338"}
    odd.doc["traces"][0]["skipped"] = {"rule": "PD338"}
    assert odd.unevaluated == set()
    # gate: a flag no baseline could raise is no news in the current run
    assert not any("new flags" in n for n in gate_runs(traced, [untraced], GateOptions()).notes)
    assert any("new flags in the current run: PD211" in n
               for n in gate_runs(traced, [report("clean", [], [], [])], GateOptions()).notes)


def test_inputs_that_are_no_report_say_what_they_are(tmp_path):
    """A .json.gz trace gave compare and gate a raw codec error ("'utf-8' codec can't decode byte
    0x8b"), a FIFO or a symbolic link loop "no such file or directory": each now says what it is,
    in the words `report` uses, one line, exit 2; a trace names the command that makes its report."""
    import gzip

    import tracegen as tg

    from perfdoctor.errors import PerfdoctorError
    from perfdoctor.gate.load import load_run

    trace = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=500)] * 3), trace)
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(trace.read_bytes()))
    (tmp_path / "blob.json.gz").write_bytes(gzip.compress(b"\x00\x01 not json"))
    (tmp_path / "loopA").symlink_to(tmp_path / "loopB")
    (tmp_path / "loopB").symlink_to(tmp_path / "loopA")
    (tmp_path / "gone.json").symlink_to(tmp_path / "nothing.json")
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "latin1.json").write_bytes(b'{"schema_version": 1, "x": "\xe9"}')
    expect = {
        "t.json.gz": f"t.json.gz: a gzip-compressed trace, not a perfdoctor report: diagnose it first "
                     f"(`perfdoctor report {tmp_path / 't.json.gz'} -f json -o report.json`) and give the report",
        "t.json": f"t.json: a trace, not a perfdoctor report: diagnose it first (`perfdoctor report {trace}",
        "blob.json.gz": "blob.json.gz: gzip-compressed, not a perfdoctor report",
        "loopA": f"a dangling or looping symbolic link: {tmp_path / 'loopA'}",
        "gone.json": f"a dangling or looping symbolic link: {tmp_path / 'gone.json'}",
        "fifo.json": "fifo.json is not a regular file or a directory (a FIFO, socket or device): refused",
        "latin1.json": "latin1.json: not a JSON document (not UTF-8 text)",
    }
    for name, words in expect.items():
        with pytest.raises(PerfdoctorError) as err:
            load_run(tmp_path / name)
        assert err.value.exit_code == 2 and words in str(err.value), (name, str(err.value))
    # a trace inside a run directory: that directory, which has the step records, is the one to give
    run = tmp_path / "run"
    (run / "trace").mkdir(parents=True)
    (run / "steps.jsonl").write_text("")
    shutil.copy(trace, run / "trace" / "t.json")
    with pytest.raises(PerfdoctorError, match=r"a trace, not a perfdoctor report: give its run directory \(.*/run\)"):
        load_run(run / "trace" / "t.json")
    for args in (("compare", tmp_path / "t.json.gz", tmp_path / "t.json"),
                 ("gate", tmp_path / "fifo.json", "--baseline", tmp_path / "t.json")):
        p = pd(*args)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert p.stderr.startswith("perfdoctor: error: ") and ("trace, not a perfdoctor report" in p.stderr
                                                               or "a FIFO" in p.stderr)


def test_compare_says_when_a_sides_steps_drift_through_its_run():
    """A user trial: an RL loop whose episodes grew through a 30 s run (3.6x from the first third
    to the last); compare read +20.6% "beyond noise" and did not repeat the run report's warning
    that such a step time depends on how long the run was."""
    rng = np.random.default_rng(3)
    grow = mk(np.linspace(0.04, 0.16, 90) * (1 + 0.02 * rng.standard_normal(90)), [0.0] * 5)
    even = mk(0.1 * (1 + 0.02 * rng.standard_normal(90)), [0.0] * 5)
    doc = compare_runs(grow, even)
    [note] = [n for n in doc["notes"] if "drifts" in n]
    assert note.startswith("before: the steady steps' length drifts: median") and "runs of the same length" in note
    assert not any("drifts" in n for n in compare_runs(even, even)["notes"])
    assert any(n.startswith("after: the steady steps' length drifts") for n in compare_runs(even, grow)["notes"])
