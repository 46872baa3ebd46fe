"""What the trainer's own data loading computes, op by op.

With num_workers=0 (or any loader that prepares batches in the trainer's thread) the Dataset's
transforms run inside the DataLoader's `__next__` spans and the profiler traces their ops. The
outermost ops inside those spans (an op's children are its own time) say what the loading is:

- input.wait_tensor_op_share: their time in tensor math (every outermost aten op except the
  batch's collation and copies: aten::stack/cat, to/copy, empty, pin_memory; the sample's
  indexing and views: `self.x[i]` of a Dataset that holds its tensors in memory is an
  aten::select, no transform to move to a device (pytorch/examples' VAE style on synthetic
  data: aten::select was 28% of the loading, named as its tensor math); reading a label's value
  (item); and random generation, which in a loader is the data itself: a synthetic data set's
  samples, or an augmentation's few parameters) / the spans' time.
  Tensor math runs on a GPU as it is written: moved after the copy to the device it becomes a
  few batched kernels (article 003: convert to float and normalise on the GPU). Python, PIL,
  decoders and numpy are not traced: a loader busy with them shows a low share here;
- input.wait_fetch_share: the time of the outermost ops that fetch a sample and batch it, whatever
  is computed ahead of time: indexing a stored sample (select, index, slice, narrow, item) and
  collating (stack, cat; pin_memory) / the spans' time. Offline preprocessing (PD306) keeps these:
  a per-sample conversion (ToTensor's aten::to, contiguous's aten::clone, views) is
  preprocessing, done once when the result is stored (pytorch/examples mnist_rnn: aten::to 4.8%
  of its loading, indexing and collation 3.3%; with ToTensor and Normalize done once the step
  ran 2.47x as fast at a 59% wait, 2.04-3.02x in 13 interleaved pairs);
- input.wait_threaded_op_share: the time of the outermost ops that intra-op threads split well
  at a sample's size (convolutions, GEMMs, FFTs: oneDNN, BLAS and the FFT libraries run them on
  every thread) / the spans' time. A single-threaded DataLoader worker loses what the trainer's
  threads gave these ops and little else: elementwise ops on a sample's tensors are small, random
  generation with a generator is serial, Python is one thread (an H200 trainer with 16 threads
  spent 0% of its loading in such ops, and 8 workers hid all of it; the H100 corpus loader 33%, in
  convolutions, and its 8 workers took 2.7x the trainer's time per batch);
- input.wait_top_ops: the three ops with the most of that time, each with its share of the
  spans ("aten::stft 74%, aten::mm 11%"), the ones of at least MIN_SHOWN.

None where no loader span holds a traced op (workers prepare the batches: their ops are in other
processes, which the profiler does not record).
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.analyze import intervals
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.cpuops import is_gemm_conv
from perfdoctor.analyze.nesting import contained, outermost
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable

METRICS = ("input.wait_tensor_op_share", "input.wait_fetch_share", "input.wait_threaded_op_share",
           "input.wait_top_ops")
FFT = re.compile(r"^aten::(stft|istft|_?fft_\w+)$")
# what stays per sample and per batch when every deterministic step is stored ahead of time:
# indexing a sample out of tensors held in memory, collating the batch, pinning it
FETCH = frozenset({"aten::select", "aten::index", "aten::slice", "aten::narrow", "aten::item",
                   "aten::_local_scalar_dense", "aten::stack", "aten::cat", "aten::_cat",
                   "aten::pin_memory", "aten::_pin_memory"})
# what a loader does that is no transform: the fetch, and copies, allocation, random generation
# and views (no math)
NOT_TRANSFORM = FETCH | frozenset({"aten::to", "aten::_to_copy", "aten::copy_", "aten::empty", "aten::empty_strided",
                                   "aten::detach", "aten::alias", "aten::lift_fresh", "aten::clone",
                                   "aten::rand", "aten::randn", "aten::randint", "aten::randperm", "aten::normal_",
                                   "aten::uniform_", "aten::random_", "aten::bernoulli", "aten::bernoulli_",
                                   "aten::multinomial", "aten::rand_like", "aten::randn_like", "aten::randint_like",
                                   "aten::unbind", "aten::split", "aten::chunk", "aten::view", "aten::reshape",
                                   "aten::_reshape_alias", "aten::unsqueeze", "aten::squeeze", "aten::as_strided",
                                   "aten::expand", "aten::permute", "aten::transpose", "aten::t", "aten::flatten"})
MIN_SHOWN = 0.05
TOP = 3


def loader_op_metrics(t: EventTable, k: Kinds, steps: Steps) -> dict:
    out = dict.fromkeys(METRICS)
    spans = np.flatnonzero(k.dataloader & (t.ts >= steps.start[0]) & (t.ts < steps.end[-1])) if len(steps) else []
    if len(spans) == 0:
        return out
    ops = np.flatnonzero(k.cpu_op & t.name_mask(lambda n: n.startswith("aten::")))
    ops = ops[contained(t, ops, spans)]
    if len(ops) == 0:
        return out
    top = outermost(t, ops)
    s, e = intervals.union(t.ts[spans], t.ts[spans] + t.dur[spans])
    span_t = float((e - s).sum())
    if span_t <= 0:
        return out
    names = [t.names[c] for c in t.name[top]]
    transform = np.asarray([n not in NOT_TRANSFORM for n in names], bool)
    out["input.wait_tensor_op_share"] = min(1.0, float(t.dur[top][transform].sum()) / span_t)
    # matrix products and convolutions as the CPU metrics name them (cpuops.is_gemm_conv), and FFTs
    threaded = np.asarray([is_gemm_conv(n) or FFT.match(n) is not None for n in names], bool)
    out["input.wait_threaded_op_share"] = min(1.0, float(t.dur[top][threaded].sum()) / span_t)
    fetch = np.asarray([n in FETCH for n in names], bool)
    out["input.wait_fetch_share"] = min(1.0, float(t.dur[top][fetch].sum()) / span_t)
    by: dict[str, float] = {}
    for n, d, keep in zip(names, t.dur[top], transform):
        if keep:
            by[n] = by.get(n, 0.0) + float(d)
    shown = [(n, d / span_t) for n, d in sorted(by.items(), key=lambda x: -x[1])[:TOP] if d / span_t >= MIN_SHOWN]
    out["input.wait_top_ops"] = ", ".join(f"{n} {share:.0%}" for n, share in shown) or None
    return out
