"""What fused=True is expected to make of a for-loop optimizer step on the CPU, by optimizer.

On a GPU a for-loop step is launch-bound and its kernel count sizes the gain (PD338). On the CPU
there are no launches: each of the for-loop's ops (about a dozen per parameter tensor for Adam,
one for plain SGD) dispatches and makes a pass over its tensors, where the fused kernel makes one
vectorised pass per tensor. How much that saves depends on the optimizer's class (how many passes
its update takes: Adam about a dozen, SGD with momentum a few, plain SGD one) and on where the
passes read from: a tensor of LARGE elements or more (collect/optclock.py) does not stay in a
core's share of the caches between the for-loop's passes, so each one streams from memory.

bench/bench_fused_cpu.py measures it inside a training loop (forward and backward between the
optimizer steps, for-loop and fused models stepped alternately in one process, so the machine's
noise hits both): the optimizer step's time for-loop / fused, torch 2.13 CPU, 2 threads, two runs
of the bench on a shared VM (the same pair moved by up to 1.4x between them):

    Adam and AdamW 1.7-3.3x (median 2.5) with tensors that stay cached, 4.4-8.1x with tensors
    of LARGE elements or more (an MLP of 2048-wide layers); Adagrad 1.4-2.1x and 3.1x;
    SGD with momentum 1.0-1.9x and 1.4-1.8x; plain SGD 0.9-1.0x

Plain SGD has no model: its update is one op per tensor, so fusing removes only the for-loop's
Python and dispatch per tensor. That is nothing on the bench's models, but `perfdoctor tune`
measured fused=True at 1.09x (1.06-1.13) on examples/overhead_bound.py (202 tensors of 64
elements, the optimizer 7% of the step): a table ratio of 1.0 would have been beaten.

The fused step's own time is bimodal between processes on that VM: the same script's fused AdamW
step took 1.7 ms in some runs and 2.8 ms in others (for-loop: 3.8-4.3 ms), a ratio of 1.4x, so
the range reaches down to 1.4x. Open: two `perfdoctor tune`s of such a script (a 512-wide MLP,
AdamW 40% of the step) measured fused=True at 0.83x and 0.93x (0.75-1.17), where PD338 expects
~1.27x (1.13-1.37x) and the bench, interleaved in one process, 1.2-1.3x; the VM's bimodal timing
is the likely cause, not a settled one.

In every bench pair the step's speed-up was the Amdahl bound of the optimizer's ratio on its share
of the step (the rest of the step does not change). The expected ratio mixes the two regimes by
the share of elements in large tensors:

    r = 1 / ((1 - large) / r_cached + large / r_streamed)

Against the two bench runs' 16 Adam and AdamW pairs, the expected step speed-up was within 25% of
the measured gain in 14; the two misses (the 512-wide MLP in the noisier run: measured 1.22x and
1.20x, expected 1.28x and 1.30x) lie inside the range, as all 16 do.

A foreach step (foreach=True, torch's default on a GPU but not on the CPU) is no faster there: each
aten::_foreach_* op loops over the tensors on the CPU, a pass per op as the for-loop makes.
`--base foreach` measured foreach / fused in two runs of the bench: Adam and AdamW 1.5-3.9x
(median 2.5) with cached tensors, 3.1-5.8x (4.5) streamed; Adagrad 1.9-4.8x (3.2) and 6.3-11.3x;
SGD with momentum 0.9-2.0x (1.3) and 1.4-1.6x. foreach was slower than the for-loop with cached
tensors, faster with streamed ones. Against the 16 Adam and AdamW pairs the expected step
speed-up was within 25% of the measured gain in 13 (the misses: the bimodal 512-wide MLP).
Open: `perfdoctor tune` of that MLP with AdamW(foreach=True) measured fused=True at 1.87x
(1.55-2.23) where PD338 expected 1.31x (range to 1.41x, ceiling 1.64x on the baseline's share):
its fused runs were faster outside the optimizer step too, as processes on that VM land in a fast
or a slow mode (separate runs of the same arm: fused step 1.2-3.5 ms, foreach 4.8-6.0 ms).

The class comes from the run (child.json `optimizer`, with SGD's momentum and the tensor sizes)
or from the trace's `Optimizer.step#<class>.step` annotations: a trace alone knows no tensor
sizes (the cached ratio is expected, the range reaches the streamed one) and no momentum (no
model for SGD). Plain SGD and other classes (RMSprop has no fused CPU version in torch 2.13)
are None.
"""

from __future__ import annotations

import re

NAMES = ("optimizer.class", "optimizer.fused_cpu_speedup", "optimizer.fused_cpu_speedup_low",
         "optimizer.fused_cpu_speedup_high", "optimizer.faster_versions")
# What torch offers a class besides its for-loop update (torch.optim, 2.4 and later): a class
# not named here (a library's optimizer) is unknown.
FUSED_CLASSES = ("Adam", "AdamW", "SGD", "Adagrad")
FOREACH_ONLY = ("RMSprop", "NAdam", "RAdam", "Adamax", "Adadelta", "ASGD", "Rprop")
NO_OTHER = ("LBFGS", "SparseAdam")
# class -> ((expected, low, high) cached, (expected, low, high) streamed): the optimizer step's
# speed-up, for-loop -> fused, on the CPU
SPEEDUP = {"Adam": ((2.4, 1.4, 3.3), (7.0, 4.4, 9.0)), "AdamW": ((2.4, 1.4, 3.3), (7.0, 4.4, 9.0)),
           "Adagrad": ((1.7, 1.3, 2.2), (3.1, 2.5, 3.8))}
SGD_MOMENTUM = ((1.3, 1.0, 1.9), (1.5, 1.3, 1.9))
# the same, foreach -> fused (bench/bench_fused_cpu.py --base foreach)
FROM_FOREACH = {"Adam": ((2.5, 1.5, 3.9), (4.5, 3.1, 5.8)), "AdamW": ((2.5, 1.5, 3.9), (4.5, 3.1, 5.8)),
                "Adagrad": ((3.2, 1.9, 4.8), (8.0, 6.3, 11.3))}
SGD_MOMENTUM_FROM_FOREACH = ((1.3, 0.9, 2.0), (1.5, 1.4, 1.6))
ANNOTATION = re.compile(r"^Optimizer\.step#(\w{1,64})\.step$")


def annotated_class(names: list[str]) -> str | None:
    """The optimizer class that the most Optimizer.step#<class>.step annotations name."""
    counts: dict = {}
    for n in names:
        m = ANNOTATION.match(n)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return max(counts, key=counts.get) if counts else None


def run_optimizer_metrics(opt: dict, base: str | None = None) -> dict:
    """The metrics from the run's optimizer (child.json `optimizer`), which knows SGD's momentum
    and the tensor sizes a trace lacks; {} without one (an older run directory: the trace's stand).
    `base`: the implementation the trace saw (optimizer.implementation)."""
    if not opt.get("class"):
        return {}
    elements, large = opt.get("elements"), opt.get("large_elements")
    return fused_cpu_metrics(opt["class"], opt.get("momentum"), large / elements if elements and large is not None else None,
                             base)


def fused_cpu_metrics(cls: str | None, momentum: float | None = None, large: float | None = None,
                      base: str | None = None) -> dict:
    """`large`: the share of the parameters' elements in tensors of LARGE elements or more (None:
    unknown, a trace alone). `base`: the implementation that ran (optimizer.implementation; None:
    unknown, taken as the for-loop, torch's default on the CPU); a fused one has nothing to gain."""
    out = dict.fromkeys(NAMES)
    out["optimizer.class"] = cls
    out["optimizer.faster_versions"] = ("fused" if cls in FUSED_CLASSES else "foreach" if cls in FOREACH_ONLY
                                        else "none" if cls in NO_OTHER else None)
    table, sgd = (FROM_FOREACH, SGD_MOMENTUM_FROM_FOREACH) if base == "foreach" else (SPEEDUP, SGD_MOMENTUM)
    if base == "fused":
        row = None
    elif cls == "SGD":
        row = sgd if momentum is not None and momentum > 0 else None
    else:
        row = table.get(cls)
    if row is None:
        return out
    cached, streamed = row
    if large is None:                   # the cached regime expected, the range up to the streamed one
        out.update(zip(NAMES[1:4], (cached[0], cached[1], streamed[2])))
        return out
    f = min(max(float(large), 0.0), 1.0)
    out.update(zip(NAMES[1:4], (1.0 / ((1.0 - f) / c + f / s) for c, s in zip(cached, streamed))))
    return out
