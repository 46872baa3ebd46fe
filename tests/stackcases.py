"""py-spy recordings built by hand for analyze/stacks.py's tests: begin/end events of Python frames
on the trainer's main thread, attributed over ten steady steps of 100 ms."""

from __future__ import annotations

from perfdoctor.analyze.stacks import StackReport, attribute

T0 = 1000.0     # the recording's start, Unix seconds


def frame(ph: str, ts: int, name: str, file: str, line: int, pid: int = 1, tid: int = 7) -> dict:
    return {"ph": ph, "ts": ts, "name": name, "pid": pid, "tid": tid, "args": {"filename": file, "line": line}}


def ten_steps(events: list[dict]) -> StackReport:
    """`events` (microseconds from T0) attributed over ten 100 ms steps from T0, sampled at 100 Hz."""
    steps = [{"step": k + 1, "end": T0 + (k + 1) * 0.1, "dur": 0.1, "wait": 0.0, "mode": "optimizer",
              "profiled": False} for k in range(10)]
    return attribute([{"pid": 1, "role": "trainer", "t0_unix": T0, "events": events}], {"pid": 1, "rate_hz": 100},
                     steps, source=lambda f, n: "")
