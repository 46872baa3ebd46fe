"""A Python loop over an RNN cell's time steps (rnn.cell_loop_* metrics, found by sampleloop.py).

`for t in range(T): h, c = self.cell(x[:, t], (h, c))` with an nn.LSTMCell (GRUCell, RNNCell)
repeats the same few ops once per time step and takes a slice of the input each time: the trace
reads like a loop over a batch's samples (sampleloop.py), but each iteration needs the state the
one before made, so it cannot be written over the whole sequence as batched ops. Its cell's call
is the trace's proof of that: aten::lstm_cell (aten::gru_cell, aten::rnn_tanh_cell,
aten::rnn_relu_cell) once an iteration. A loop run that calls one is a recurrence, and so is the
backward run that walks it back (its backward nodes' sequence numbers are the forward loop's
ops'). The fix is the fused module: nn.LSTM (nn.GRU, nn.RNN) runs every time step in one call,
its input projections for all steps as one matrix product and no Python between the steps
(cuDNN's kernels on a GPU). On a 2-core CPU (bench/bench_cell_loops.py) an LSTM measured 1.8-13.8x
from that change by shape, a GRU 1.2x.

    rnn.cell_loop_share      = host time of those runs and of the backward walks that take them
                               back (per step and thread, first op's or node's start to last one's
                               end: the Python and the autograd engine's time between them
                               included) / the steps' time
    rnn.cell_loop_kept_share = what the fused module leaves at the least: time of the steps'
                               outermost ops outside those runs and nodes / the steps' time; on a
                               GPU the larger of that and the device's busy time on work not
                               launched from them. The untraced time between ops is not kept: the
                               autograd engine builds and frees a graph of nodes per time step
                               (a hidden-32 LSTMCell loop over 128 steps measured 12.8-13.8x fused,
                               where the runs' own share allowed 4.1x)
    rnn.cell_loop_iterations = periods (time steps) in a forward run that calls a cell (median
                               over those runs)

All None where no run calls a cell. A loop that calls a cell in some iterations only, or a cell
called outside a loop (one step of a decoder), is no such run.
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze.arrays import isin
from perfdoctor.analyze.nesting import contained
from perfdoctor.trace.table import EventTable

CELL_OPS = frozenset({"aten::lstm_cell", "aten::gru_cell", "aten::rnn_tanh_cell", "aten::rnn_relu_cell"})
NAMES = ("rnn.cell_loop_share", "rnn.cell_loop_kept_share", "rnn.cell_loop_iterations")


def cell_loops(t: EventTable, ops: np.ndarray, top: np.ndarray,
               stretches: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Which `stretches` (the outermost ops of one loop run each, in time order) call an RNN cell,
    and the backward nodes among `top` (the steps' outermost ops) that walk those loops back: the
    ones whose sequence number is that of one of the loops' ops, or of an op inside them. `ops`:
    every op of the steps, nested ones included."""
    cell = t.name_mask(lambda n: n in CELL_OPS)
    forward = np.array([bool(cell[r].any()) for r in stretches], dtype=bool)
    seq = t.args.get("seq")
    if not forward.any() or seq is None:
        return forward, np.zeros(0, np.int64)
    rows = np.concatenate([stretches[i] for i in np.flatnonzero(forward)])
    nums = seq[np.concatenate([rows, ops[contained(t, ops, rows)]])]
    nums = nums[np.isfinite(nums)]
    nodes = top[t.name_mask(lambda n: n.startswith("autograd::"))[top]]
    return forward, nodes[isin(seq[nodes], nums)]


def backward_of(rows: np.ndarray, backward: np.ndarray) -> bool:
    """Is a loop run (`rows`) the backward pass of a cell loop: are at least half of its ops
    among that loop's `backward` nodes?"""
    return len(backward) > 0 and 2 * int(isin(rows, backward).sum()) >= len(rows)
