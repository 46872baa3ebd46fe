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
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.arrays import unique
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

COMPILE_RANGE_RX = re.compile(r"\(dynamo_timed\)$|^(dynamo|entire_frame_compile|entire_backward_compile|"
                              r"backend_compile|inductor_compile|code_gen)$")
REGION_RX = re.compile(r"^Torch-Compiled Region: (\S+)$")


def compile_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = {"compile.share": None, "compile.steps": None, "compile.region_ids": None}
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
    out.update({"compile.share": float(per_step.sum()) / total,
                "compile.steps": int((per_step > 0).sum()),
                "compile.region_ids": len(ids)})
    return out
