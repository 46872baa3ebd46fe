"""A Python loop that updates tensors one at a time outside the optimizer (tensorloop.* metrics).

A model's EMA copy (`for e, p in zip(ema.parameters(), model.parameters()): e.mul_(d).add_(p,
alpha=1 - d)`), an RL target network's soft update (`tp.data.copy_(tau * p.data + (1 - tau) *
tp.data)`), a hand-written SGD step (`p -= lr * p.grad`) run a few elementwise ops per tensor,
each paying its dispatch (on a GPU, its kernel launch) and the Python between them for a
sliver of work. torch's multi-tensor ops (torch._foreach_lerp_, _foreach_mul_, _foreach_add_,
_foreach_copy_; torch.optim's foreach and fused steps) take the whole list of tensors in one call.

In the trace the loop is a run of the step's outermost ops (aten::*, on one thread, in time
order) whose names repeat with a short period, MIN_ITERATIONS times or more (sampleloop's
periodic_runs: a model of 16 tensors or more), each period holding an in-place op, and every op
of the run elementwise arithmetic or a copy (UPDATE_OPS), some of it arithmetic: copies alone
are DDP's (its reducer copies each gradient into its bucket, 81 aten::copy_ in a row in HTA's
ResNet traces), a user's copies a state-dict load. Left out: ops inside Optimizer.step
and Optimizer.zero_grad (a for-loop optimizer is PD338's), inside a DataLoader's __next__, and
inside backward nodes (not outermost). A model's forward pass that updates in place (`x +=
block(x)`, ReLU(inplace=True)) holds its layers' ops in each period, which are no UPDATE_OPS.

    tensorloop.share           = host time of those runs (first op's start to last op's end, the
                                 Python between the ops included) / the steps' time; a run of
                                 aten::detach just before one belongs to it: state_dict() walks
                                 (YOLOv5's ModelEMA reads both models' state_dict each step, a
                                 detach per tensor: 40% of its loop, unseen without them)
    tensorloop.gap_share       = the time between the runs' ops / the steps' time: the Python
                                 of the loop (zip, the attribute reads, the call) per tensor
    tensorloop.tensors         = periods (tensors) in the longest run of a step (median)
    tensorloop.ops_per_tensor  = ops in one period of it (median)

Measured on the CPU (bench/bench_tensor_loops.py's model: 98 tensors of a 24-block MLP, its EMA
by mul_/add_ each step): the run was 9-10% of a profiled step, its gaps 4.6-5.2%; in one
process, alternating blocks of steps, the loop against torch._foreach_lerp_ ran 1.067-1.085x.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import median, unique
from perfdoctor.analyze.evalforward import OPTIMIZER_PREFIX
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import contained
from perfdoctor.analyze.sampleloop import MIN_ITERATIONS, periodic_runs, step_ops
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

MOVES = frozenset(("aten::copy_", "aten::zero_", "aten::fill_", "aten::detach"))
UPDATE_OPS = frozenset(f"aten::{n}" for n in (
    "mul", "mul_", "add", "add_", "sub", "sub_", "rsub", "div", "div_", "lerp", "lerp_", "copy_", "addcmul",
    "addcmul_", "addcdiv", "addcdiv_", "zero_", "fill_", "clamp", "clamp_", "neg", "neg_", "detach"))
NAMES = ("tensorloop.share", "tensorloop.gap_share", "tensorloop.tensors", "tensorloop.ops_per_tensor")


def tensor_loop_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = dict.fromkeys(NAMES)
    total = float(steps.duration.sum())
    if len(steps) == 0 or total <= 0:
        return out
    _, top = step_ops(t, k, steps)
    out["tensorloop.share"] = out["tensorloop.gap_share"] = 0.0
    if len(top) < MIN_ITERATIONS:
        return out
    ranges = np.flatnonzero(k.dataloader | (k.cpu_op & t.name_mask(lambda n: n.startswith(OPTIMIZER_PREFIX))))
    top = top[~contained(t, top, ranges)]
    update = t.name_mask(lambda n: n in UPDATE_OPS)
    arith = t.name_mask(lambda n: n in UPDATE_OPS and n not in MOVES)
    detach = t.name_mask(lambda n: n == "aten::detach")
    in_place = t.name_mask(lambda n: n in UPDATE_OPS and n.endswith("_"))
    top_step = steps.index_of(t.ts[top])
    span_us, gap_us, longest = 0.0, 0.0, []
    for si in unique(top_step):
        for tid in unique(t.tid[top[top_step == si]]):
            rows = top[(top_step == si) & (t.tid[top] == tid)]
            rows = rows[np.argsort(t.ts[rows], kind="stable")]
            if len(rows) < MIN_ITERATIONS:
                continue
            runs: list[tuple[int, int]] = []
            covered, _ = periodic_runs(t.name[rows], in_place[rows])
            edge = np.diff(np.concatenate(([0], covered.astype(np.int8), [0])))
            for a, b in zip(np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)):
                r = rows[a:b]
                if not update[r].all() or not arith[r].any():    # a layer's ops: a forward pass
                    continue
                per = _period(t.name[r])
                runs.append((len(r) // per, per))
                while a > 0 and detach[rows[a - 1]]:               # the state_dict() walks before it
                    a -= 1
                r = rows[a:b]
                end = t.ts[r] + t.dur[r]
                span_us += float(end[-1] - t.ts[r[0]])
                gap_us += float(np.clip(t.ts[r[1:]] - end[:-1], 0, None).sum())
            if runs:
                longest.append(max(runs))
    if not longest:
        return out
    out["tensorloop.share"] = min(1.0, span_us / total)
    out["tensorloop.gap_share"] = min(out["tensorloop.share"], gap_us / total)
    out["tensorloop.tensors"] = median([r[0] for r in longest])
    out["tensorloop.ops_per_tensor"] = median([r[1] for r in longest])
    return out


def _period(names: np.ndarray) -> int:
    """The shortest period with which a run's names repeat (its edges may differ a little)."""
    for p in range(1, len(names) // MIN_ITERATIONS + 1):
        if np.mean(names[p:] == names[:-p]) >= 0.9:
            return p
    return max(1, len(names) // MIN_ITERATIONS)
