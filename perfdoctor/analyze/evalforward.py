"""An evaluation run inside every training step, seen in the trace by its no-grad forward ops.

With autograd recording, every op that records a backward node carries Kineto's "Sequence
number" arg (trace column `seq`): the training forward's aten::linear, aten::conv2d, ... A
forward under torch.no_grad() / inference_mode() (or over parameters that need no gradient)
records none, so its ops have no sequence number (torch 2.13, CPU: tests/test_evalforward.py).
That alone does not make it an evaluation: a distillation teacher, a DQN target network or a
GAN's no-grad generator pass run a no-grad forward whose output feeds the loss. Where such a
forward runs after the training forward and before its backward (`out = model(x); with
no_grad: soft = teacher(x)`), its output can feed that loss: not counted. An evaluation's output
feeds no backward; `train_step(); evaluate()` and `evaluate(); train_step()` both run it between
one update (a backward pass) and the next training forward. So:

    evaluation.nograd_forward_share = sum over such gaps of the time from the gap's first no-grad
        compute op (matmul/linear/conv families, outermost, outside backward and the optimizer
        step) to the next training forward op (or the steps' end), less the backward, optimizer
        and DataLoader work in it / the steps' time

The stretch holds the evaluation's Python work too (argmax, .cpu().numpy(), a per-element metric
loop: no op records them), and whatever else runs there (a log line, a checkpoint save: other
rules name those). A teacher or target network run before the training forward (`with no_grad:
soft = teacher(x); out = model(x)`) lands in the same gap and cannot be told from an evaluation
by its place: PD354 words its fix for both. A gap whose update lies before the trace (the first
recorded step of `evaluate(); train_step()`: its no-grad ops have no training forward and no
backward before them in the trace) counts where at least one later gap, after an update in the
trace, holds a no-grad forward too: the same loop, after the update the recorded step began at
(perfdoctor run's steps end at an optimizer step). Alone (an evaluation only in the first
recorded step) it is not counted: a lower bound there. Leaving it out of 5 steps of
`evaluate(); train_step()` read 35% for a GCN (pytorch/examples gcn) whose evaluation takes 45%.

On a GPU the host's stretch is not the evaluation's cost: the host runs ahead of the device, so
the stretch can start while the training's kernels still run (and a .item() in it waits for
them), and the evaluation's own kernels can run on after it. Each stretch is therefore taken on
the device-extended clock: it starts once the device has run everything launched before it
(the training's work is not the evaluation's) and ends when both the host has reached the next
training forward and the device has run everything launched before that forward (the
evaluation's kernels). Removing it saves that stretch whether the step is host- or device-bound.

An evaluation every N steps lengthens the steps it runs in: the window's share is its share of
the traced steps, which may hold it more often than the run does (1 evaluation in 5 traced steps,
1 in 10 in the run). Each stretch is therefore also placed in its steps, and the part only the
long steps hold (at least LONG times the median step, as analyze/longsteps.py) beyond the median
step's no-grad time is evaluation.nograd_long_steps_share, with its fraction of those steps' time
beyond the median step (evaluation.nograd_long_steps_fraction). A no-grad forward in every step
(a teacher) puts as much in each step: none of it is in that part. perfdoctor run takes that part
at the run's rate (analyze/callshares.py).

None where it cannot be read: no backward pass in the steps (pure inference is no training), or a
trace whose training forward ops carry no sequence number (an older Kineto).

A model compiled for training (torch.compile) runs its forward inside one CompiledFunction
autograd node whose ops record no sequence number, and a compile traces the model with ops that
record none either: neither is a no-grad forward (a compiled training loop, recompiling every 10
steps, read 33% "evaluation" and got PD354 "evaluate less often"; it evaluates nothing).
So does any autograd.Function's forward, which runs with grad mode off inside the op of the
Function itself (that op records a sequence number): reentrant activation checkpointing
(CheckpointFunction, torch.utils.checkpoint(use_reentrant=True)), a custom fused op. Its ops are
the training forward's, and the Function's op is where that forward starts (4 checkpointed
transformer blocks read as a 30% "evaluation" and got PD354).
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.compiletime import COMPILE_RANGE_RX
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.longsteps import long_steps_part
from perfdoctor.analyze.nesting import contained, outermost
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.table import EventTable

COMPUTE_RX = re.compile(r"^aten::(linear|matmul|mm|addmm|bmm|baddbmm|einsum|conv[123]d|conv_transpose[123]d|"
                        r"convolution|_convolution|scaled_dot_product_attention)$")
BACKWARD_PREFIX = "autograd::engine::evaluate_function"
OPTIMIZER_PREFIX = ("Optimizer.step#", "Optimizer.zero_grad#")
NAMES = ("evaluation.nograd_forward_share", "evaluation.nograd_long_steps_share",
         "evaluation.nograd_long_steps_fraction")


def nograd_forward_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = dict.fromkeys(NAMES)
    total = float(steps.duration.sum())
    if len(steps) == 0 or total <= 0 or "seq" not in t.args:
        return out
    lo, hi = steps.span
    ops = np.flatnonzero(k.cpu_op)                  # a backward pass before the first step counts too
    backward = ops[t.name_mask(lambda n: n.startswith(BACKWARD_PREFIX))[ops]]
    if not ((t.ts[backward] >= lo) & (t.ts[backward] < hi)).any():
        return out                                  # no backward pass in the steps: not training
    compute = ops[t.name_regex(COMPUTE_RX.pattern)[ops]]
    graded = np.isfinite(t.args["seq"][compute])
    if not graded.any():
        return out                                  # no sequence numbers recorded: unknown
    optimizer = ops[t.name_mask(lambda n: n.startswith(OPTIMIZER_PREFIX))[ops]]
    training = np.concatenate([backward, optimizer])
    nograd = compute[~graded]
    # torch.compile's own: the compiled training forward (its ops run inside the CompiledFunction
    # autograd node and record no sequence number) and the ops a compile runs while tracing
    compiled = ops[t.name_mask(lambda n: n == "CompiledFunction")[ops] | t.name_regex(COMPILE_RANGE_RX.pattern)[ops]]
    nograd = nograd[~contained(t, nograd, compiled)]
    nograd = outermost(t, nograd[~contained(t, nograd, training)])
    # an autograd.Function's forward (reentrant checkpointing's CheckpointFunction, a custom
    # fused op) runs with grad mode off inside an op that records a backward node: training
    # forward work, and that op is where the training forward starts
    wrappers = _graded_wrappers(t, ops, nograd, training)
    nograd = nograd[~contained(t, nograd, wrappers)]
    nograd = nograd[(t.ts[nograd] >= lo) & (t.ts[nograd] < hi)]
    fwd = np.sort(t.ts[outermost(t, np.concatenate([compute[graded], wrappers]))])
    bwd_end = np.sort(t.ts[backward] + t.dur[backward])
    at = t.ts[nograd]
    # the last training forward and the last backward pass before each no-grad op: a forward
    # not yet followed by its backward means the op's output can feed that loss (a teacher)
    i_f = np.searchsorted(fwd, at, side="right") - 1
    i_b = np.searchsorted(bwd_end, at, side="right") - 1
    prev_f = np.where(i_f >= 0, fwd[np.maximum(i_f, 0)], -np.inf)
    prev_b = np.where(i_b >= 0, bwd_end[np.maximum(i_b, 0)], -np.inf)
    between = np.isfinite(prev_b) & (prev_b >= prev_f)
    if between.any():
        # the trace's leading stretch (no training forward or backward before it in the trace):
        # where later gaps after an update hold a no-grad forward too, it is the same loop, run
        # after the update the trace starts at (perfdoctor run's steps end at the update)
        between |= ~np.isfinite(prev_b) & ~np.isfinite(prev_f)
    else:
        out["evaluation.nograd_forward_share"] = 0.0
        out.update(_in_long_steps(steps.duration, np.zeros(len(steps)), total))
        return out
    # one region per gap between an update and the next training forward: from its first no-grad
    # op to that forward (or the steps' end), less the training's and the loader's work in it
    nxt = np.searchsorted(fwd, at[between], side="left")
    ends = np.where(nxt < len(fwd), fwd[np.minimum(nxt, len(fwd) - 1)], hi)
    starts = np.full(len(fwd) + 1, np.inf)
    np.minimum.at(starts, nxt, at[between])
    stop = np.full(len(fwd) + 1, hi)
    stop[nxt] = ends
    busy = np.concatenate([training, np.flatnonzero(k.dataloader & (t.ts >= lo) & (t.ts < hi))])
    b_lo, b_hi = intervals.union(t.ts[busy], t.ts[busy] + t.dur[busy])
    drained = _drained(t, k) if k.platform != "cpu" else None
    tail, per_step = 0.0, np.zeros(len(steps))
    for g in np.flatnonzero(np.isfinite(starts)):
        s0, e0 = float(starts[g]), float(min(stop[g], hi))
        if drained is not None:
            s0, e0 = max(s0, drained(s0)), min(max(e0, drained(e0)), hi)
        s, e = intervals.clip(b_lo, b_hi, s0, e0)
        tail += max(0.0, e0 - s0 - float((e - s).sum()))
        i = int(np.searchsorted(steps.end, s0, side="right"))    # the steps the stretch overlaps
        while i < len(steps) and steps.start[i] < e0:
            a, b = max(s0, float(steps.start[i])), min(e0, float(steps.end[i]))
            s, e = intervals.clip(b_lo, b_hi, a, b)
            per_step[i] += max(0.0, b - a - float((e - s).sum()))
            i += 1
    out["evaluation.nograd_forward_share"] = min(1.0, tail / total)
    out.update(_in_long_steps(steps.duration, per_step, total))
    return out


def _graded_wrappers(t: EventTable, ops: np.ndarray, nograd: np.ndarray, training: np.ndarray) -> np.ndarray:
    """The outermost ops outside backward and the optimizer that record a backward node (a sequence
    number) and hold a no-grad compute op: autograd Functions whose forward runs with grad off."""
    graded = ops[np.isfinite(t.args["seq"][ops])]
    graded = outermost(t, graded[~contained(t, graded, training)])
    if len(graded) == 0 or len(nograd) == 0:
        return graded[:0]
    keep = np.zeros(len(graded), bool)
    for tid in np.unique(t.tid[graded]):
        on = np.flatnonzero(t.tid[graded] == tid)
        g = graded[on]
        order = np.argsort(t.ts[g], kind="stable")
        g, on = g[order], on[order]
        r = nograd[t.tid[nograd] == tid]
        i = np.searchsorted(t.ts[g], t.ts[r], side="right") - 1     # the latest wrapper started before
        ok = i >= 0
        ok[ok] = t.ts[r][ok] + t.dur[r][ok] <= t.ts[g][i[ok]] + t.dur[g][i[ok]]
        keep[on[i[ok]]] = True
    return graded[keep]


def _in_long_steps(dur: np.ndarray, nograd: np.ndarray, total: float) -> dict:
    """The part of the no-grad stretch that only the long traced steps hold (longsteps.long_steps_part:
    a teacher or an evaluation in every step holds about as much in each step, none of it counted)."""
    share, fraction = long_steps_part(dur, nograd, total)
    return {"evaluation.nograd_long_steps_share": share, "evaluation.nograd_long_steps_fraction": fraction}


def _drained(t: EventTable, k: Kinds):
    """time -> when the device has finished all the work launched before that time (-inf: none)."""
    dev, launch = device_launch_index(t, k)
    ok = launch >= 0
    at = t.ts[launch[ok]]
    order = np.argsort(at, kind="stable")
    at = at[order]
    done = np.maximum.accumulate((t.ts[dev[ok]] + t.dur[dev[ok]])[order]) if len(at) else at

    def drained(x: float) -> float:
        i = int(np.searchsorted(at, x, side="left"))
        return float(done[i - 1]) if i > 0 else -np.inf
    return drained
