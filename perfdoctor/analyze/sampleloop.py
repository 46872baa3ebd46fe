"""A Python loop over the samples of a batch, seen in a trace (cpu.loop_* metrics).

A loss or a metric written as `for i in range(B): ... x[i] ...` runs the same short sequence
of eager ops once per sample: each op works on one row of the batch and costs mostly its fixed
dispatch cost, and the backward pass walks the same sequence (in reverse) once per sample too.
Written over the whole batch, the loop's ops become a few batched ops. In the trace the loop is a
run of the step's outermost ops (aten::*, autograd::*, on one thread, in time order) whose names
repeat with a short period, many times over, each period taking a row of a tensor: an indexing
op (aten::select, slice, index, narrow) or, in the backward pass, its backward node; or, for
`for row in x:`, an aten::unbind just before the run (UnbindBackward0 just after it), as for
`for x_t in x.split(1, dim=1):` an aten::split (or chunk; SplitBackward0).

    cpu.loop_share          = host time of those runs (first op's start to last op's end, the
                              Python between the ops included) / the steps' time
    cpu.loop_iterations     = periods in the longest such run (median over the steps that hold one)
    cpu.loop_ops_per_iteration = ops in one period of it
    cpu.loop_op_median_us   = median duration of the ops inside the runs
    cpu.loop_kept_op_share  = time of the outermost ops outside the runs / the steps' time; on a
                              GPU the larger of that and the device's busy time on work not
                              launched from the runs (that work stays after vectorising too)
    cpu.loop_python_share   = time between the runs' ops in gaps of SMALL_OP_US or more, where
                              about every iteration has one / the steps' time: Python work of the
                              loop's own, besides calling its ops

Between two ops of a loop body the interpreter runs a line or two: a few microseconds. A gap of
20 us or more (an op's fixed cost: cpuops.SMALL_OP_US) in about every iteration is work of its
own: a per-environment simulation in an RL rollout's time loop, a tokenizer, numpy. Whether it is
per-sample work that batches too, the trace cannot tell; PD365's expected gain leaves it in place
(its ceiling does not). A few such gaps in a long run are the thread being preempted: not counted.

The kept share bounds what vectorising can remove: the ops outside the loop stay, and everything else
may go, since the loop's cost is not only its ops. The autograd engine walks a graph of one node
per op per sample before the backward pass starts, and frees it (with the samples' saved tensors)
after: untraced time outside the runs that shrinks with the loop (a contrastive loss over 128
samples spent 1.6 ms of a 36 ms step there, as long as the whole vectorised step).

A run counts from MIN_ITERATIONS periods: a loop over a batch of 16 or more samples, and more
repeats than a few heads, crops or losses summed by hand; a period is at most MAX_PERIOD ops. The
indexing op keeps out loops that repeat without taking rows: a for-loop optimizer's per-parameter
ops, a simulation's time steps on whole tensors. A stack of identical layers that slice (a
chunked projection, rotary embeddings) repeats and takes slices too, but each layer has
parameters of its own: its backward pass runs an AccumulateGrad node per period, where a loop over
samples shares the parameters and accumulates each once; such runs are left out (an inference-only
stack, with no backward pass, is not told apart). Ops inside a DataLoader's __next__ take no part:
a map-style Dataset makes its batch one sample at a time by design (PD301, PD358 fix that), and
they count among the ops that stay. An RNN module's time steps (its
call and the backward nodes of the ops inside it, cpuops.rnn_rows) are left out the same way: a
packed nn.LSTM's backward pass walks one SliceBackward0 per time step. A run that calls an RNN cell
each period (nn.LSTMCell unrolled by hand: aten::lstm_cell) is a recurrence the trace does tell:
it and its backward are measured by cellloops.py for PD387 and left out here. What the trace cannot
tell: whether each iteration of a Python loop depends on the one before (a recurrence over time steps that index a sequence reads
alike), so the fix says when it does not apply. A live run with Python stacks can: the source of
the loop they sampled (analyze/recurrence.py, stacks.recurrent_loop_share).

On a GPU the loop is found the same way on the host; each of its ops launches kernels of a few
microseconds per sample besides. Its host time shortens the step only down to what the device
must still run: the device work launched outside the runs stays, so the share that stays is
the larger of the host's ops and that device time (PD365's ceiling and expected gain use it).
"""

from __future__ import annotations

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.arrays import isin, median, unique
from perfdoctor.analyze.cellloops import NAMES as CELL_NAMES, backward_of, cell_loops
from perfdoctor.analyze.cpuops import SMALL_OP_US, rnn_rows
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.nesting import contained, outermost
from perfdoctor.analyze.steps import Steps, device_launch_index
from perfdoctor.trace.table import EventTable

MIN_ITERATIONS = 16
MAX_PERIOD = 64
MAX_BRANCH_LEVELS = 8          # occurrence counts below which branching_runs leaves names out (its passes)
INDEXING = ("aten::select", "aten::slice", "aten::index", "aten::narrow")
# `for row in x:` and `for x_t in x.split(1, dim=1):` (chunk) take every slice at once, before the
# loop, and their backward nodes gather the slices' gradients after the loop's backward run (not
# unsafe_split / unsafe_chunk: torch's own, as an LSTM cell splits its gates every time step)
SPLITS = frozenset({"aten::unbind", "aten::split", "aten::split_with_sizes", "aten::chunk"})
SPLIT_NODES = ("UnbindBackward0", "SplitBackward0", "SplitWithSizesBackward0")
INDEXING_BACKWARD = ("SelectBackward0", "SliceBackward0", "IndexBackward0", "NarrowBackward0")
NAMES = ("cpu.loop_share", "cpu.loop_iterations", "cpu.loop_ops_per_iteration", "cpu.loop_op_median_us",
         "cpu.loop_kept_op_share", "cpu.loop_python_share", *CELL_NAMES)


def _indexing(name: str) -> bool:
    return name in INDEXING or (name.startswith("autograd::") and name.endswith(INDEXING_BACKWARD))


def periodic_runs(s: np.ndarray, takes_row: np.ndarray, own_params: np.ndarray | None = None,
                  splits: np.ndarray | None = None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Positions of `s` (name ids in time order) inside a run of MIN_ITERATIONS or more periods
    of at most MAX_PERIOD names, each period holding a position where `takes_row`; and each
    run's (iterations, period) at its smallest period. `for row in x:` takes its rows once, before
    the loop (aten::unbind; UnbindBackward0 after the loop's backward run; x.split(1, dim=1) and
    chunk likewise: SPLITS): a run with one within a period before or after it takes rows too.
    A period holding a position where `own_params` (an AccumulateGrad node) is a stack of layers,
    each with parameters of its own: a loop over samples shares them, and the backward pass
    accumulates each once. That run, and any run of as many iterations (give or take the edge
    one: the stack's forward pass), is left out."""
    n = len(s)
    own_params = np.zeros(n, bool) if own_params is None else own_params
    found: list[tuple[int, int, int, bool]] = []          # start, length, period, own parameters
    seen = np.zeros(n, bool)
    for p in range(1, min(MAX_PERIOD, n // MIN_ITERATIONS) + 1):
        eq = np.concatenate(([False], s[:-p] == s[p:], [False])).astype(np.int8)
        d = np.diff(eq)
        starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
        long = ends - starts + p >= MIN_ITERATIONS * p
        for a, b in zip(starts[long], ends[long]):        # s[i] == s[i + p] for i in [a, b)
            length = b - a + p
            # the split that took the rows lies outside the run: an LSTM cell's backward holds a
            # SplitBackward0 in every period (its gates' chunk), which takes no rows of the input
            rows = takes_row[a:a + p].any() or (splits is not None and (
                splits[max(0, a - p):a].any() or splits[a + length:a + length + p].any()))
            if not rows or seen[a:a + length].all():
                continue
            seen[a:a + length] = True
            found.append((a, length, p, bool(own_params[a:a + p].any())))
    layers = [length // p for _, length, p, own in found if own]
    covered = np.zeros(n, bool)
    runs: list[tuple[int, int]] = []
    for a, length, p, own in found:
        if own or any(abs(length // p - r) <= 1 for r in layers):
            continue
        # up to a period either side: the loop's first and last iterations may differ a little
        # (an accumulator that starts as a Python number: aten::rsub where the rest run sub)
        first = a - _edge(s[max(0, a - p):a][::-1], s[max(0, a - p) + p:a + p][::-1])
        end = a + length
        last = end + _edge(s[end:min(n, end + p)], s[end - p:min(n, end + p) - p])
        covered[first:last] = True
        runs.append((length // p, p))
    return covered, runs


def branching_runs(s: np.ndarray, takes_row: np.ndarray, own_params: np.ndarray | None = None,
                   splits: np.ndarray | None = None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """periodic_runs of a loop with a branch taken in some iterations only (a random flip in a
    per-sample augmentation: `if torch.rand(1).item() < 0.5: img = img.flip(2)`): its periods
    differ by that op, so no period repeats exactly. The branch's ops occur fewer times than the
    loop's own (once in each iteration): for each of MAX_BRANCH_LEVELS counts of at least
    MIN_ITERATIONS (those of the names that take a row, then the largest), the names that occur
    fewer times are left out (the indexing ones and a layer's AccumulateGrad excepted: the stack
    of layers periodic_runs leaves out stays out), and the runs found without them kept where
    they cover the most ops; the left-out ops inside a
    run's span belong to it. A few periodic_runs passes, whatever the number of names (one pass
    per name cost 0.6 s on a 20,000-op step of 150 names)."""
    n = len(s)
    none: tuple[np.ndarray, list[tuple[int, int]]] = (np.zeros(n, bool), [])
    if n < MIN_ITERATIONS:
        return none
    own_params = np.zeros(n, bool) if own_params is None else own_params
    splits = np.zeros(n, bool) if splits is None else splits
    names, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    fixed = np.zeros(len(names), bool)
    fixed[np.unique(inverse[takes_row | own_params])] = True            # never left out
    # a loop over samples takes one row an iteration: the row-taking names' counts first, then
    # the largest counts (a loop over `for row in x:` takes its rows before it, by unbind)
    rows = np.unique(counts[np.unique(inverse[takes_row])])[::-1]
    levels = [int(c) for c in (*rows, *np.unique(counts)[::-1]) if c >= MIN_ITERATIONS]
    levels = list(dict.fromkeys(levels))[:MAX_BRANCH_LEVELS]
    best, best_covered = none, 0
    for level in levels:
        out = (counts < level) & ~fixed
        if not out.any():
            continue
        keep = np.flatnonzero(~out[inverse])
        covered, runs = periodic_runs(s[keep], takes_row[keep], own_params[keep], splits[keep])
        if not runs or int(covered.sum()) <= best_covered:
            continue
        full = np.zeros(n, bool)
        edge = np.diff(np.concatenate(([0], covered.astype(np.int8), [0])))
        for a, b in zip(np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)):
            full[keep[a]:keep[b - 1] + 1] = True
        # a run of the indexing ops alone, left once the rest is out, is a loop only where the
        # ops left out between them are a branch (a few per iteration), not a stack of layers
        # that slice once among many ops of their own (the H100 corpus `alloc`)
        if fixed[inverse[keep[covered]]].all() and int(full.sum()) > 3 * int(covered.sum()):
            continue
        best, best_covered = (full, runs), int(covered.sum())
    return best


def _edge(ops: np.ndarray, twins: np.ndarray) -> int:
    """How many of `ops` (outward from a run's edge) belong to it: the fewest that hold the most
    matches with the same places a period inside (`twins`), if at least half of them match."""
    hits = np.cumsum(ops == twins)
    if not len(hits) or hits[-1] == 0:
        return 0
    k = int(np.argmax(hits == hits[-1])) + 1
    return k if 2 * int(hits[k - 1]) >= k else 0


def step_ops(t: EventTable, k: Kinds, steps: Steps) -> tuple[np.ndarray, np.ndarray]:
    """The aten::/autograd:: ops that start inside the steps, and the outermost of them."""
    ops = np.flatnonzero(k.cpu_op & t.name_mask(lambda n: n.startswith(("aten::", "autograd::"))))
    ops = steps.inside(t, ops)
    return ops, outermost(t, ops)


def sample_loop_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = dict.fromkeys(NAMES)
    total = float(steps.duration.sum())
    if len(steps) == 0 or total <= 0:
        return out
    ops, top = step_ops(t, k, steps)
    if len(top) == 0:
        return out
    # a DataLoader's batch is made one sample at a time by design (Dataset.__getitem__): the
    # fixes for that are the loader's (PD301, PD358); its ops stay, and take no part in a run
    in_loader = contained(t, top, np.flatnonzero(k.dataloader))
    # an RNN module (nn.LSTM, nn.GRU, nn.RNN) runs one op per gate and time step inside its call,
    # and its backward pass walks them one time step at a time (SliceBackward0 takes each step's
    # rows of a packed sequence): a recurrence inside torch, no Python loop; its ops stay too
    rnn = rnn_rows(t, ops, top)
    kept_loader_us = float(t.dur[top[in_loader | rnn]].sum())
    every_top, top = top, top[~(in_loader | rnn)]
    takes_row = t.name_mask(_indexing)
    splits = t.name_mask(lambda n: n in SPLITS or
                         (n.startswith("autograd::") and n.rsplit(": ", 1)[-1] in SPLIT_NODES))
    own_params = t.name_mask(lambda n: n.startswith("autograd::") and n.endswith("AccumulateGrad"))
    top_step = steps.index_of(t.ts[top])
    kept_us = kept_loader_us
    # each stretch of a run: its rows, the period, and its step and thread's longest run
    found: list[tuple[np.ndarray, float, tuple[int, int], tuple[int, int]]] = []
    for si in unique(top_step):
        for tid in unique(t.tid[top[top_step == si]]):
            rows = top[(top_step == si) & (t.tid[top] == tid)]
            rows = rows[np.argsort(t.ts[rows], kind="stable")]
            if len(rows) < MIN_ITERATIONS:
                kept_us += float(t.dur[rows].sum())
                continue
            covered, runs = periodic_runs(t.name[rows], takes_row[rows], own_params[rows], splits[rows])
            if not runs:
                covered, runs = branching_runs(t.name[rows], takes_row[rows], own_params[rows], splits[rows])
            kept_us += float(t.dur[rows[~covered]].sum())
            if not runs:
                continue
            period = median([r[1] for r in runs])
            # contiguous covered stretches: first op's start to last op's end, each at its own
            # period (a forward run of 4 ops a time step and its backward of 18: the median, 11,
            # read the forward's 24 time steps as 9)
            edge = np.diff(np.concatenate(([0], covered.astype(np.int8), [0])))
            for a, b in zip(np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)):
                found.append((rows[a:b], _period(t.name[rows[a:b]], period), max(runs), (int(si), int(tid))))
    # a loop over an RNN cell's time steps is a recurrence, not a loop over samples: its ops stay
    # (cellloops.py measures it for its own fix)
    forward, backward = cell_loops(t, ops, top, [f[0] for f in found])
    cells = [c or backward_of(f[0], backward) for f, c in zip(found, forward)]
    out.update(_cell_loop_metrics(t, k, steps, every_top, [f[:2] for f, c in zip(found, forward) if c], backward))
    loop_us, python_us, longest, op_us = 0.0, 0.0, {}, []
    stretches: list[tuple[int, float, float]] = []        # (thread, start, end) of each run
    for (rows, period, run, step_thread), cell in zip(found, cells):
        if cell:
            kept_us += float(t.dur[rows].sum())
            continue
        longest[step_thread] = run
        op_us.append(t.dur[rows].astype(np.float64))
        end = float(t.ts[rows[-1]] + t.dur[rows[-1]])
        loop_us += end - float(t.ts[rows[0]])
        python_us += _own_work(t, rows, period)
        stretches.append((step_thread[1], float(t.ts[rows[0]]), end))
    longest = list(longest.values())
    if not longest:
        out["cpu.loop_share"] = 0.0
        return out
    out["cpu.loop_share"] = min(1.0, loop_us / total)
    out["cpu.loop_iterations"] = median([r[0] for r in longest])
    out["cpu.loop_ops_per_iteration"] = median([r[1] for r in longest])
    out["cpu.loop_op_median_us"] = median(np.concatenate(op_us))
    kept = kept_us / total
    if k.platform != "cpu":
        kept = max(kept, _device_outside(t, k, steps, stretches) / total)
    out["cpu.loop_kept_op_share"] = min(1.0, kept)
    out["cpu.loop_python_share"] = min(out["cpu.loop_share"], python_us / total)
    return out


def _cell_loop_metrics(t: EventTable, k: Kinds, steps: Steps, top: np.ndarray, found: list,
                       backward: np.ndarray) -> dict:
    """rnn.cell_loop_* (cellloops.py) from the loop runs that call a cell ((rows, period) each),
    the backward nodes that walk them back and the steps' outermost ops (`top`)."""
    if not found:
        return {}
    total = float(steps.duration.sum())
    iterations = [round(len(rows) / period) for rows, period in found]
    ours = np.concatenate([*(rows for rows, _ in found), backward])
    span = sum(float(t.ts[rows[-1]] + t.dur[rows[-1]] - t.ts[rows[0]]) for rows, _ in found)
    # the backward walk from its first node's start to its last's end, per step and thread: the
    # autograd engine's time between the nodes is the loop's too (tests/test_cell_loops.py's LSTM:
    # the nodes alone made the share 0.66-0.71 of a quiet step, the walk 0.83-0.86; beside two
    # busy processes 0.35-0.66 and 0.48-0.91; a loaded full test run read 0.43 from the nodes)
    walk = steps.of_events(t)[backward].astype(np.int64) * (1 + int(t.tid.max(initial=0))) + t.tid[backward]
    for key in np.unique(walk):
        nodes = backward[walk == key]
        span += float((t.ts[nodes] + t.dur[nodes]).max() - t.ts[nodes].min())
    # what stays: the ops outside the loop and its backward; the untraced time between ops goes
    # with the loop as far as the ceiling goes (the autograd engine's set-up and release of a
    # graph of nodes per time step: a hidden-32 LSTMCell loop over 128 steps measured 12.8-13.8x
    # fused where the loop's own share allowed 4.1x)
    kept = float(t.dur[top[~isin(top, ours)]].astype(np.float64).sum()) / total
    if k.platform != "cpu":            # the device work launched outside the loop stays too
        dev, launch = device_launch_index(t, k)
        known = np.flatnonzero(launch >= 0)
        mine = np.zeros(len(dev), bool)
        mine[known] = contained(t, launch[known], ours)
        s, e = intervals.clip(t.ts[dev[~mine]], (t.ts + t.dur)[dev[~mine]], *steps.span)
        kept = max(kept, intervals.total(s, e) / total)
    return {"rnn.cell_loop_share": min(1.0, span / total), "rnn.cell_loop_kept_share": min(1.0, kept),
            "rnn.cell_loop_iterations": median(iterations)}


def _period(s: np.ndarray, fallback: float) -> float:
    """The smallest period at which nine in ten of a stretch's names (ids, in time order) repeat;
    `fallback` where none does (a loop with branches)."""
    for p in range(1, min(MAX_PERIOD, len(s) // 2) + 1):
        if np.mean(s[:-p] == s[p:]) >= 0.9:
            return float(p)
    return fallback


def _own_work(t: EventTable, rows: np.ndarray, period: float) -> float:
    """Time (us) in the gaps of SMALL_OP_US or more between consecutive `rows` (one stretch of a
    run, in time order), if about every iteration has one (at least half as many gaps as the
    stretch's iterations): the loop's own Python work. Fewer are preemptions: 0."""
    gaps = t.ts[rows[1:]] - (t.ts[rows[:-1]] + t.dur[rows[:-1]])
    long = gaps[gaps >= SMALL_OP_US]
    return float(long.sum()) if 2 * len(long) >= len(rows) / period else 0.0


def _device_outside(t: EventTable, k: Kinds, steps: Steps, stretches: list[tuple[int, float, float]]) -> float:
    """Device busy time inside the steps (us) on work not launched from the loop's stretches."""
    dev, launch = device_launch_index(t, k)
    ours = np.zeros(len(dev), bool)
    known = launch >= 0
    at, tid = t.ts[launch[known]], t.tid[launch[known]]
    hit = np.zeros(len(at), bool)
    for th, a, b in stretches:
        hit |= (tid == th) & (at >= a) & (at < b)
    ours[np.flatnonzero(known)[hit]] = True
    rows = dev[~ours]
    lo, hi = steps.span
    s, e = intervals.clip(t.ts[rows], t.ts[rows] + t.dur[rows], lo, hi)
    return intervals.total(s, e)
