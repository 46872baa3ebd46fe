"""tune's traced baseline runs on until enough steps follow its trace window (collect/launcher.py
_DurationClock, steprecord.steps_after_trace): a script of long steps had too few left once the
profiled ones were left out, and tune ran it again without a trace."""

from __future__ import annotations

import json
import time

import pytest

from perfdoctor.collect.launcher import TAIL_WAIT, RunConfig, _DurationClock
from perfdoctor.collect.steprecord import steps_after_trace


def _write(path, flags):
    with open(path, "a") as f:
        for i, (prof, pert) in enumerate(flags):
            f.write(json.dumps({"step": i, "end": time.time(), "dur": 0.1, "wait": 0.0, "profiled": prof,
                                "perturbed": pert, "cpu": 0.1}) + "\n")


def test_steps_after_the_last_disturbed_one_are_counted_from_the_files_tail(tmp_path):
    p = tmp_path / "steps.jsonl"
    assert steps_after_trace(p, 5) == 0                      # no file yet
    _write(p, [(False, False)] * 3)
    assert steps_after_trace(p, 5) == 5                      # no trace window yet: nothing to wait for
    _write(p, [(False, False)] * 3000 + [(True, False)] * 5 + [(False, True)] + [(False, False)] * 3)
    assert steps_after_trace(p, 5) == 3
    with open(p, "a") as f:
        f.write('{"step": 9999, "end": 1, "dur"')         # a line being written is no step yet
    assert steps_after_trace(p, 5) == 3
    with open(p, "a") as f:
        f.write(', "wait": 0.0}\n')
    _write(p, [(False, False)] * 40)
    assert steps_after_trace(p, 5) == 5 and steps_after_trace(p, 30) == 30


class _Clock:
    """time.monotonic for the launcher's clock: moved by hand, never by a busy machine."""
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def test_the_duration_stop_waits_for_the_steps_after_the_trace_then_gives_up(tmp_path, monkeypatch):
    import perfdoctor.collect.launcher as launcher
    clock_time = _Clock()
    monkeypatch.setattr(launcher, "time", clock_time)
    p = tmp_path / "steps.jsonl"
    _write(p, [(False, False)] * 2 + [(True, False)] * 3 + [(False, False)] * 2)
    cfg = RunConfig(argv=["x.py"], duration=10.0, trace_tail=4)
    clock = _DurationClock(cfg, p, clock_time.now)
    assert clock.due() is None                                # the first step starts the clock
    clock_time.now += 9.0
    assert clock.due() is None and clock.tail_s == 0.0        # within the duration
    clock_time.now += 2.0
    assert clock.due() is None                                # 2 of the 4 steps after the trace
    assert clock.tail_s == pytest.approx(1.0)                 # past the duration, for tune's budget
    _write(p, [(False, False)] * 2)
    assert clock.due() == ""
    # without a trace, or without trace_tail, the duration alone decides
    for k, other in enumerate((RunConfig(argv=["x.py"], duration=10.0, trace_tail=4, trace=False),
                               RunConfig(argv=["x.py"], duration=10.0))):
        q = tmp_path / f"{k}.jsonl"
        _write(q, [(True, False)] * 3)
        c = _DurationClock(other, q, clock_time.now)
        assert c.due() is None
        clock_time.now += 10.0
        assert c.due() == ""
    # at most TAIL_WAIT durations: a script whose steps never come still stops
    q = tmp_path / "stuck.jsonl"
    _write(q, [(True, False)] * 3)
    c = _DurationClock(cfg, q, clock_time.now)
    assert c.due() is None
    clock_time.now += 10.0 * TAIL_WAIT - 0.5
    assert c.due() is None
    clock_time.now += 0.5
    assert c.due() == ""


SLOW_STEPS = """
import time, torch
m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.01)
for _ in range(400):
    opt.zero_grad(); m(torch.randn(4, 8)).sum().backward(); opt.step()
    time.sleep(0.15)
"""


@pytest.mark.slow
def test_tunes_traced_baseline_of_long_steps_is_measurable(tmp_path):
    """Steps of 0.15 s and 2 s runs: ~13 steps, 10 of them the trace window and the steps before
    it. The traced run goes on until 20 follow the trace, and is measured."""
    pytest.importorskip("torch")
    from perfdoctor.tune.measure import TRACE_TAIL, run_once
    script = tmp_path / "slow.py"
    script.write_text(SLOW_STEPS)
    res: list = []
    m = run_once([str(script)], None, tmp_path / "b", {}, run_s=2.0, max_steps=None, trace=True, result=res,
                 output=tmp_path / "out.log")
    assert m.error is None, m.error
    steps = m.steps
    last = max(i for i, s in enumerate(steps) if s.get("profiled") or s.get("perturbed"))
    assert len(steps) - 1 - last >= TRACE_TAIL, len(steps)
    assert m.estimate.conclusive and m.estimate.n >= 10
    assert res[0].stopped_by == "duration" and res[0].tail_s > 0.5     # tune's budget leaves this out
