"""Issue 10: the IO vs CPU split of a short run (--max-steps 40) holds: life counters of the
loader processes, faster sampling while the run is young, evidence sized by time covered."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfdoctor.collect.samplers import YOUNG_INTERVAL, YOUNG_S, SystemSampler

EX = Path(__file__).resolve().parent.parent / "examples"


def test_young_run_is_sampled_faster_and_life_counters_are_cumulative():
    p = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass\n"
                                                "time.sleep(5)"])
    try:
        time.sleep(0.3)
        s = SystemSampler(p.pid, interval=0.5).start()
        time.sleep(1.0)
        s.stop()
    finally:
        p.kill()
        p.wait()
    ts = [x["t"] for x in s.samples]
    assert YOUNG_S >= 5 and len(ts) >= 5                        # 0.1 s apart, not 0.5
    assert min(b - a for a, b in zip(ts, ts[1:])) < 2 * YOUNG_INTERVAL
    tr = s.samples[-1]["trainer"]
    # the busy loop ran before the sampler started: the life counter has it, the deltas do not
    assert tr["cpu_life_s"] >= tr["sched_cpu_s"] and tr["cpu_life_s"] > 0.1
    assert tr["runq_life_s"] is not None and tr["runq_life_s"] >= 0


@pytest.mark.quiet
@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 0])
def test_io_bound_run_stopped_after_40_steps_gets_the_io_split(tmp_path, workers):
    pytest.importorskip("torch", reason="perfdoctor run tests need torch (test dependency)")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--max-steps", "40", "--out", str(out),
                        str(EX / "io_bound_loader.py"), "--workers", str(workers), "--size-mb", "256",
                        # 64 images (108 MiB) a step: 40 steps last ~1.7 s, past the 0.5 s the split needs
                        # (batches of 16 on a fast disk: 0.4 s, and the split rightly said unknown)
                        "--batch-size", "64", "--steps", "100000"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    m = doc["traces"][0]["metrics"]
    if m["run.data_wait_share"] is not None and m["run.data_wait_share"] < 0.5:
        pytest.skip("storage is too fast here for an IO-bound loader (page cache or tmpfs)")
    if (m["loader.runnable_share"] or 0) >= 0.5 and any("delay accounting is off" in n for n in doc["run"]["notes"]):
        # without delay accounting the split reads the loader's runnable time: reads served by the
        # page cache are CPU work (a CI run: runnable 65%, split "cpu"), and the storage was not the wait
        pytest.skip(f"the loader ran {m['loader.runnable_share']:.0%} of the time: reads served from the page cache")
    assert m["run.steps"] == 40 and m["steps.source"] == "ProfilerStep"
    assert m["input.split"] == "io", (m["loader.runnable_share"], doc["run"]["notes"])
    assert doc["verdict"]["bound"] == "input_io"
    assert m["gpu.util_mean"] is None and "no NVIDIA GPU found" in " ".join(doc["run"]["notes"])
    # the loader's buffers and the page cache warming up are no leak
    assert m["host.rss_growth_per_step_bytes"] in (0.0, None) and "PD216" not in {f["id"] for f in doc["flags"]}


def test_a_run_that_ended_before_its_trace_says_when_the_trace_opens():
    """4 steps of 7 s: the window opened after 2 warm-up steps and 1 profiler warm-up step, and
    the note had said 'the first step is warm-up and the next one is traced' beside 3 steps."""
    from perfdoctor.collect.launcher import RunResult
    from perfdoctor.diagnose.ending import why_no_trace
    child = {"torch_imported": True, "profiler": "empty", "outcome": "completed",
             "window": {"start_after_steps": 2, "profiler_warmup_steps": 1}}
    res = RunResult(Path("."), 0, None, 30.0, child, None, [])
    assert why_no_trace(res, [{}] * 3) == ("the run ended after 3 step(s), before a whole step was recorded: the "
                                          "trace opens after 2 warm-up step(s) and 1 profiler warm-up step(s); "
                                          "to trace one of so few steps: --skip-steps 1 --trace-steps 1")
    # one step: no flag traces it (the first step only starts the clock)
    assert not why_no_trace(res, [{}]).endswith("--trace-steps 1")


def test_a_run_max_steps_cut_too_short_says_how_many_would_do():
    """--max-steps 20 left 8 steady steps after the trace ("need 10") with no word of what to ask
    for (a user trial): the reason names the --max-steps that leaves enough."""
    from perfdoctor.diagnose.ending import more_steps
    reason = "only 8 steady steps (need 10)"
    assert more_steps(reason, False, 8, "max-steps", 20) == reason + "; --max-steps 22 or more would leave enough"
    assert more_steps(reason, False, 8, None, 20) == reason                  # the script ended by itself
    assert more_steps(reason, False, 8, "duration", None) == reason          # --duration: no step count to name
    assert more_steps(None, True, 40, "max-steps", 80) is None               # enough: nothing to add
    assert more_steps("a drift", False, 12, "max-steps", 80) == "a drift"    # enough steps, another reason


def test_a_run_duration_cut_too_short_by_a_late_first_step_says_what_would_do():
    """run --duration counts from the launch: a torch.compile'd simulation whose first step ended
    26 s after its launch got one step from --duration 8, and "too few for a step time" alone."""
    from perfdoctor.diagnose.ending import late_start_hint, more_steps
    steps = [{"dur": 0.2}, {"dur": None}]
    config = {"duration": 8, "duration_from": "launch", "trace": False, "skip": 5, "active": 5}
    hint = late_start_hint(steps, 26.0, config)
    # 1.25 x 26 s of start-up, then 2 warm-up and 10 steady steps at 0.2 s, half as many again
    assert hint == "--duration counts from the launch, and the first step ended 26 s after it: --duration 37 or more " \
                   "would leave enough"
    traced = late_start_hint(steps, 26.0, {**config, "trace": True})     # and the trace's 5 + 5 + 1 steps
    assert traced.endswith("--duration 40 or more would leave enough")
    assert more_steps("no steady steps", False, 0, "duration", None, hint) == f"no steady steps; {hint}"
    assert more_steps("no steady steps", False, 0, None, None, hint) == "no steady steps"   # ended by itself
    assert more_steps(None, True, 40, "duration", None, hint) is None                       # enough steps
    for unknown in ({**config, "duration": None}, {**config, "duration_from": "first-step"}, {}):
        assert late_start_hint(steps, 26.0, unknown) is None       # no duration, or tune's clock
    assert late_start_hint(steps, None, config) is None and late_start_hint([], 26.0, config) is None
    assert late_start_hint(steps, 26.0, {**config, "skip": "5", "trace": True}) is not None     # a damaged field


LATE = """
import sys, time, torch
time.sleep(float(sys.argv[1]))                       # loading, compiling: before the first step
m = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for step in range(400):
    m(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_the_duration_a_late_first_step_is_told_to_ask_for_leaves_enough_steps(tmp_path):
    """A script whose first step ends after --duration's seconds (counted from the launch) stops
    after it; its report names a --duration, and a run with that one has a step time."""
    import re

    from runs import prun
    script = tmp_path / "late.py"
    script.write_text(LATE)
    r = prun("--no-trace", "--duration", "2", script, "3", out=tmp_path / "short")
    assert r.returncode == 0, r.stderr
    said = re.search(r"too few for a step time \(.*--duration counts from the launch, and the first step ended "
                     r"(\d+) s after it: --duration (\d+) or more would leave enough\)", re.sub(r"\s+", " ", r.stderr))
    assert said, r.stderr
    assert int(said[1]) >= 3                 # the sleep, torch's import and the first step
    assert "the profiled ones" not in said[0]          # no trace: no profiled step stood in
    r = prun("--no-trace", "--duration", said[2], script, "3", out=tmp_path / "enough")
    assert r.returncode == 0, r.stderr
    run = json.loads((tmp_path / "enough" / "report.json").read_text())
    m = run["traces"][0]["metrics"]
    if (m["run.first_step_s"] or 0) > 1.25 * int(said[1]) + 1:       # the hint's margin for a slower start-up
        pytest.skip(f"the second run started {m['run.first_step_s']:.0f} s in, the first {said[1]} s (a busy machine)")
    assert m["run.step_time_conclusive"] is True, run["run"]["step_time_reason"]
