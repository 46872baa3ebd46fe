"""Compilation inside the steps: host time torch.compile spends compiling, not running.

torch.compile compiles a frame the first time it runs and again each time a guard fails (a new
input shape while shapes are static, a changed Python scalar the code branches on, a new
dtype...): a recompile. While it compiles, the host is busy in Dynamo and Inductor and the device
idles. With the profiler on, torch 2.x records that work as host ranges:

- every `dynamo_timed` phase as "<key> (dynamo_timed)" (torch/_dynamo/utils.py; e.g.
  "_compile.compile_inner (dynamo_timed)", "OutputGraph.call_user_compiler (dynamo_timed)",
  "compile_fx_inner (dynamo_timed)", "async_compile.wait (dynamo_timed)"), since torch 2.1;
- the chromium-log phases of the same work under their own names when the profiler is on
  (torch 2.5+: "dynamo", "entire_frame_compile", "entire_backward_compile", "backend_compile",
  "inductor_compile", "code_gen"), which wrap or repeat the dynamo_timed ranges.

They nest (a compile holds its backend compile, which holds Inductor's), and the backward's
compile can run on the autograd thread while the main thread waits in backward(): so the time
counted is the union of all those ranges over the threads, within each step's window: the
outermost ones, nothing twice. The cache lookup ("TorchDynamo Cache Lookup": guard checks) and
the compiled code's own ranges ("Torch-Compiled Region: F/N", "CompiledFunction") are running,
not compiling, and do not count.

"Torch-Compiled Region: F/N" names the frame F and its N-th compile of it (convert_frame.py):
the distinct ids seen in the steps say how many compiled versions the steps ran; a new id every
step is a recompile every step.
A recompile every N steps lands in one traced step of five: compile.long_steps_* say how much of
the traced long steps compiling holds, and compile_run_share takes it at the run's rate.
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.arrays import unique
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.longsteps import long_steps_part
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

COMPILE_RANGE_RX = re.compile(r"\(dynamo_timed\)$|^(dynamo|entire_frame_compile|entire_backward_compile|"
                              r"backend_compile|inductor_compile|code_gen)$")
REGION_RX = re.compile(r"^Torch-Compiled Region: (\S+)$")


NAMES = ("compile.share", "compile.steps", "compile.region_ids", "compile.long_steps_share",
         "compile.long_steps_fraction")


def compile_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = dict.fromkeys(NAMES)
    lo, hi = steps.span
    total = float(steps.duration.sum())
    if total <= 0:
        return out
    ops = k.cpu_op & (t.ts >= lo) & (t.ts < hi)
    rows = np.flatnonzero(ops & t.name_regex(COMPILE_RANGE_RX.pattern))
    s, e = intervals.union(t.ts[rows].astype(float), (t.ts[rows] + t.dur[rows]).astype(float))
    per_step = np.array([intervals.total(*intervals.clip(s, e, a, b)) for a, b in zip(steps.start, steps.end)])
    regions = np.flatnonzero(ops & t.name_regex(REGION_RX.pattern))
    ids = {REGION_RX.match(t.names[c]).group(1) for c in unique(t.name[regions])}
    long_share, fraction = long_steps_part(steps.duration.astype(float), per_step, total)
    out.update({"compile.share": float(per_step.sum()) / total,
                "compile.steps": int((per_step > 0).sum()),
                "compile.region_ids": len(ids),
                "compile.long_steps_share": long_share, "compile.long_steps_fraction": fraction})
    return out


def compile_run_share(m: dict) -> dict:
    """compile.run_share: the compile time at the run's rate (perfdoctor run), where the run's long
    steps recur at a period (loop.long_steps_every) and the trace holds one of them
    (loop.long_steps_traced >= 1): the window's compile in every step plus
    compile.long_steps_fraction of loop.long_steps_share. A recompile every N steps (a shape that
    changes every N steps under static shapes) is one traced step in five, not a compile in two
    steps of the window, and costs the run one step in N. None otherwise."""
    window, in_long = m.get("compile.share"), m.get("compile.long_steps_share")
    fraction, long_share, traced = (m.get("compile.long_steps_fraction"), m.get("loop.long_steps_share"),
                                    m.get("loop.long_steps_traced"))
    if None in (window, in_long, fraction, long_share, traced) or m.get("loop.long_steps_every") is None \
            or traced < 1:
        return {"compile.run_share": None}
    return {"compile.run_share": min(1.0, max(0.0, window - in_long) + fraction * long_share)}
