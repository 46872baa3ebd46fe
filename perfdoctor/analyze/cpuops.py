"""Eager ops too small to be worth their dispatch, on CPU-only traces (cpu.* metrics).

Each eager op pays a fixed cost on the host before it computes: the Python binding, the
dispatcher, the output's allocation and TensorIterator's set-up, a few microseconds whatever the
tensor's size (more under the profiler). A model of many ops on small tensors (a simulation
stepped in Python, a per-element loss, an RNN cell unrolled by hand) spends most of its op time
there, and torch.compile removes it: the graph's ops become one fused C++ loop, called once.

    cpu.small_op_share = time of the outermost ops (aten::*, autograd::*) less the own time of
                         the large ops inside them / the steps' time

A large op's own time (its time less that of the ops directly inside it) is SMALL_OP_US or more,
at its place in most steps (a call long in one step only stalled: repeatedly_large): the compute
that stays when compile removes the dispatch around it. An autograd node of five tiny
ops is small all through, while an aten::linear holding an addmm of 44 us own time keeps those
44 us (its own and its transpose's few microseconds, and the addmm's bias copy, are small).
Dividing an op's time by the ops it held had called that linear three 18 us ops, and a
32 x 256 x 512 MLP's matrix products small (with a short run's trace inflation, PD312's bound
read 2163x on it).

    cpu.optimizer_large_op_share = own time of the large ops inside Optimizer.step's own part
                         (after a closure's last backward pass) / the steps' time

the part of optimizer.step_share that is neither Python nor small ops: compiling the model leaves
the optimizer's step, and PD312 takes out only what its own share counted of it.

    cpu.optimizer_op_share = time of the outermost ops inside that own part / the steps' time

what PD211 weighs the large ops against: the ops' time, not the step's wall time, whose Python
gaps between ops stretch when the thread loses its core (half a step of them in one CI run on a
loaded machine, where the ops themselves were 90% large).

    cpu.compute_share = share.device - cpu.small_op_share: the ops' compute, not their dispatch

    cpu.rnn_small_op_share = time of those small outermost ops that an RNN module runs: its call
                         (aten::lstm, aten::gru, aten::rnn_tanh, aten::rnn_relu: thousands of
                         small ops, one per gate and time step) and the backward nodes of the ops
                         inside it (their sequence numbers) / the steps' time

torch.compile leaves these eager: Dynamo graph-breaks on nn.LSTM, nn.GRU and nn.RNN
(torch._dynamo.config.allow_rnn is off by default: "Dynamo does not support RNN, GRU, or LSTM"),
so PD312 takes them out of what compiling removes. nn.LSTMCell's aten::lstm_cell is traced: not
these. A backward node is matched by its sequence number alone (the forward's thread's counter).

    cpu.gemm_conv_share = time of the outermost matrix products and convolutions (aten::linear,
                         addmm, mm, bmm, matmul, einsum, conv*, convolution_backward: forward and
                         backward), outside DataLoader.__next__ and sparse products / the steps'
                         time: the work bf16 dot-product instructions shorten under CPU autocast
                         around the model (PD375)

    cpu.conv_nd_share = time of the outermost 2-D and 3-D convolutions (aten::conv2d, conv3d and
                         their transposes) and of the convolutions' backward (aten::
                         convolution_backward) in the share of the forward convolutions' time
                         they are (a 1-D one's backward has the same name), outside
                         DataLoader.__next__ / the steps' time: the work channels_last can change
                         (PD392)

Outermost: an op not inside another op of that kind on its thread (an aten::linear holds an
aten::addmm; a backward node holds its aten ops), so nothing is counted twice. SMALL_OP_US is 20
microseconds: profiled, an op on a 2-element tensor takes 5-15 microseconds here, and an op under
20 is mostly its fixed cost. None on GPU traces (the host's ops overlap the device's work there:
PD311 and the launch metrics cover it).
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import isin, median, unique
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import contained, outermost, self_time
from perfdoctor.analyze.patterns import OwnPart, optimizer_step_rows
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

SMALL_OP_US = 20.0
RNN_OPS = frozenset({"aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu"})
# matrix products and convolutions, forward and backward: what 16-bit dot-product instructions
# (AVX512_BF16, AMX, Arm BF16) shorten under CPU autocast
GEMM_OPS = frozenset({"aten::linear", "aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::baddbmm",
                      "aten::addbmm", "aten::einsum", "aten::_addmm_activation"})
CONV_PREFIXES = ("aten::conv", "aten::_conv", "aten::mkldnn_convolution", "aten::cudnn_convolution",
                 "aten::slow_conv", "aten::_slow_conv", "aten::thnn_conv")
CONV_ND_OPS = frozenset({"aten::conv2d", "aten::conv3d", "aten::conv_transpose2d", "aten::conv_transpose3d"})
CONV_1D_OPS = frozenset({"aten::conv1d", "aten::conv_transpose1d"})
SPARSE_OPS = frozenset({"aten::smm", "aten::hspmm", "aten::sspaddmm"})   # sparse products without "sparse" in their names
NAMES = ("cpu.small_op_share", "cpu.ops_per_step", "cpu.op_median_us", "cpu.optimizer_large_op_share",
         "cpu.optimizer_op_share",
         "cpu.rnn_small_op_share", "cpu.gemm_conv_share", "cpu.conv_nd_share")


def _is_sparse(name: str) -> bool:
    return "sparse" in name.lower() or name in SPARSE_OPS


def is_gemm_conv(name: str) -> bool:
    return name in GEMM_OPS or name.startswith(CONV_PREFIXES)


def large_op_time(t: EventTable, ops: np.ndarray, top: np.ndarray, step: np.ndarray | None = None) -> np.ndarray:
    """Per row of `top` (outermost among `ops`): the own time (less the ops directly inside) of
    the ops inside it, itself included, whose own time is SMALL_OP_US or more (same thread), and
    at their place in most steps (`step`: each op's step index; repeatedly_large)."""
    out = np.zeros(len(top))
    own = self_time(t, ops)
    large = own >= SMALL_OP_US
    if step is not None:
        large = repeatedly_large(t, ops, large, step)
    big, big_own = ops[large], own[large]
    for tid in unique(t.tid[big]):
        b = t.tid[big] == tid
        on = np.flatnonzero(t.tid[top] == tid)
        on = on[np.argsort(t.ts[top[on]], kind="stable")]       # outermost: they never overlap
        i = np.searchsorted(t.ts[top[on]], t.ts[big[b]], side="right") - 1
        ok = i >= 0
        ok[ok] = t.ts[big[b][ok]] + t.dur[big[b][ok]] <= t.ts[top[on[i[ok]]]] + t.dur[top[on[i[ok]]]]
        np.add.at(out, on[i[ok]], big_own[b][ok])
    return out


def repeatedly_large(t: EventTable, ops: np.ndarray, long: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Per op of `ops` (long: own time SMALL_OP_US or more; step: its step's index): whether the
    call at its place, the k-th call of its name on its thread in its step, is long in most of the
    steps that have one. A step repeats its work, so a large op is long at its place step after
    step (an optimizer's update of the big weight, 2 of 10 parameters); a call that is long in one
    step and short at its place in the others stalled there (a page fault, the allocator, the
    profiler's own bookkeeping), and that time is no compute. A mass-spring simulation's 2-element
    copies, 88 us in 25 of their calls, had passed for 9% of compute that compiling keeps, and
    its compile measured beyond that bound. A single step is taken as it is."""
    if len(ops) == 0 or len(unique(step)) < 2:
        return long
    order = np.lexsort((t.ts[ops], t.name[ops], t.tid[ops], step))
    key = np.stack([step[order], t.tid[ops][order], t.name[ops][order]], axis=1)
    first = np.ones(len(order), dtype=bool)
    first[1:] = np.any(key[1:] != key[:-1], axis=1)
    starts = np.flatnonzero(first)
    k = np.arange(len(order)) - np.repeat(starts, np.diff(np.append(starts, len(order))))
    place = np.stack([t.tid[ops][order], t.name[ops][order], k], axis=1)
    places, inv = np.unique(place, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    seen = np.bincount(inv, minlength=len(places))
    longs = np.bincount(inv, weights=long[order].astype(np.float64), minlength=len(places))
    out = np.empty(len(ops), dtype=bool)
    out[order] = (2 * longs > seen)[inv]
    return long & out


def rnn_rows(t: EventTable, ops: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Which of the outermost ops `top` an RNN module runs: its calls (RNN_OPS) and the backward
    nodes whose sequence number is one of the ops' inside those calls."""
    calls = t.name_mask(lambda n: n in RNN_OPS)[top]
    if not calls.any():
        return calls
    seq = t.args.get("seq")
    if seq is None:
        return calls
    inside = ops[contained(t, ops, top[calls])]
    nums = seq[inside]
    nums = nums[np.isfinite(nums)]
    backward = t.name_mask(lambda n: n.startswith("autograd::"))[top] & isin(seq[top], nums)
    return calls | backward


def compute_share(m: dict) -> dict:
    """cpu.compute_share: the step's ops less its small ones (share.device - cpu.small_op_share),
    from the metrics already computed; None off the CPU or without the device share."""
    dev = m.get("share.device")
    if m.get("trace.platform") != "cpu" or dev is None:
        return {"cpu.compute_share": None}
    return {"cpu.compute_share": max(0.0, dev - (m.get("cpu.small_op_share") or 0.0))}


def _conv_nd_share(t: EventTable, k: Kinds, ops: np.ndarray, total: float) -> float:
    """cpu.conv_nd_share (module docstring), from the steps' aten and autograd ops `ops`."""
    def timed(names) -> float:
        rows = _outside_loader(t, k, ops[t.name_mask(lambda n: n in names)[ops]])
        return float(t.dur[outermost(t, rows)].astype(np.float64).sum())
    nd, one_d = timed(CONV_ND_OPS), timed(CONV_1D_OPS)
    if nd <= 0:
        return 0.0
    return min(1.0, (nd + timed({"aten::convolution_backward"}) * nd / (nd + one_d)) / total)


def _outside_loader(t: EventTable, k: Kinds, rows: np.ndarray) -> np.ndarray:
    """`rows` but the batches' own (a blur in DataLoader.__next__ with num_workers=0): autocast or
    a memory format around the model leaves the loader's work as it is."""
    return rows[~contained(t, rows, np.flatnonzero(k.dataloader))]


def cpu_op_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = dict.fromkeys(NAMES)
    total = float(steps.duration.sum())
    if k.platform != "cpu" or len(steps) == 0 or total <= 0:
        return out
    ops = np.flatnonzero(k.cpu_op & t.name_mask(lambda n: n.startswith(("aten::", "autograd::"))))
    step = steps.index_of(t.ts[ops])
    ops, step = ops[step >= 0], step[step >= 0]
    top = outermost(t, ops)
    if len(top) == 0:
        return out
    dur = t.dur[top].astype(np.float64)
    large = np.minimum(large_op_time(t, ops, top, step), dur)
    small = dur - large                                 # each outermost op's time but its large ops' own
    out["cpu.small_op_share"] = min(1.0, float(small.sum()) / total)
    rnn = rnn_rows(t, ops, top)
    out["cpu.rnn_small_op_share"] = min(1.0, float(small[rnn].sum()) / total)
    out["cpu.ops_per_step"] = len(top) / len(steps)
    mm = _outside_loader(t, k, ops[t.name_mask(is_gemm_conv)[ops]])   # outermost of their kind: linear holds addmm
    # nor a sparse product's dense kernel (torch.sparse.mm: an aten::addmm inside
    # aten::_sparse_addmm, an aten::mm inside SparseAddmmBackward0): autocast has no bf16 sparse
    # product, and a GCN's torch.sparse.mm under it failed ("expected scalar type Float but found
    # BFloat16") where 74% of its step had been offered to bf16
    mm = mm[~contained(t, mm, np.flatnonzero(k.cpu_op & t.name_mask(_is_sparse)))]
    out["cpu.gemm_conv_share"] = min(1.0, float(t.dur[outermost(t, mm)].astype(np.float64).sum()) / total)
    out["cpu.conv_nd_share"] = _conv_nd_share(t, k, ops, total)
    out["cpu.op_median_us"] = float(median(dur))
    opt = optimizer_step_rows(t, k, steps)
    if len(opt):
        inside = contained(t, top, opt)                     # any depth, same thread
        inside[inside] = OwnPart(t, opt, steps).own(t.ts[top[inside]])
        out["cpu.optimizer_large_op_share"] = min(1.0, float(large[inside].sum()) / total)
        out["cpu.optimizer_op_share"] = min(1.0, float(dur[inside].sum()) / total)
    return out
