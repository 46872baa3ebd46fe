"""How often one training step calls its model (loop.* metrics; `perfdoctor run` only).

A per-sample loop, `for i in range(len(x)): loss += crit(model(x[i:i+1]), y[i:i+1])`, runs the
model's whole op sequence once per sample at batch size 1: every op pays its dispatch (and on a
GPU its launch) once per sample, and each op does a sliver of the work it could do batched. The
trace shows only many small ops; the hooks see the loop itself. During one whole step after the
step source is chosen, `perfdoctor run` counts the outermost module calls (collect/modules.py,
child.json "root_calls"): the module called most, how many times, and the leading dimension of
its first tensor argument (the batch it was given), how many of its calls ran with autograd on
(a rollout under torch.no_grad() builds no graph for the backward pass to walk), and the dtype
CPU autocast cast to while it ran; and the memory format its convolutions' inputs came in (collect/convlayout.py).

The DataLoader batches per steady step, and the backward passes of the counted step, tell a
per-sample loop (one batch, many calls, one backward pass over their summed loss) from gradient
accumulation over micro-batches (a batch and a backward pass per call). Calls that take the state
the call before returned (collect/chainedcalls.py) are a loop over a sequence's time steps, not its
samples: a recurrence, which no batching of the calls can remove. Passes that each begin from
no gradients (loop.fresh_passes_per_step: torch.autograd.grad calls, or backward passes after a
reset) tell per-sample gradients taken one sample at a time (DP-SGD's clipping, influence scores)
from accumulation, whose passes add to the gradients of the one before. A model called with no tensor
argument, or with a 0-d one, has no batch: None.

Steady steps that draw more batches than the usual step run another loop inside them (an
evaluation every N steps, a second loader): their time beyond usual steps is what running that
loop less often saves (loop.extra_batches_excess_share).
"""

from __future__ import annotations

from perfdoctor.analyze.stepwait import extra_batches

NAMES = ("loop.model_name", "loop.model_calls_per_step", "loop.model_grad_calls_per_step", "loop.model_call_batch",
         "loop.model_call_batch_share",
         "loop.batches_per_step", "loop.backward_passes_per_step", "loop.fresh_passes_per_step",
         "loop.extra_batches_excess_share", "loop.model_cpu_autocast", "loop.conv_channels_last_share",
         "loop.model_call_chained_share", "loop.model_call_sliced_share", "loop.model_rnn_module",
         "loop.padding_share", "loop.padding_source", "loop.model_compiled_in_place", "loop.dynamo_graphs")


def loop_metrics(root_calls: dict | None, steady_steps: list[dict]) -> dict:
    """loop.* from child.json's "root_calls" and the steady window's step records."""
    out = dict.fromkeys(NAMES)
    batches = [s["batches"] for s in steady_steps if isinstance(s.get("batches"), (int, float))]
    if batches:
        out["loop.batches_per_step"] = sum(batches) / len(batches)
        timed = [s for s in steady_steps if isinstance(s.get("batches"), (int, float))
                 and isinstance(s.get("dur"), (int, float))]
        if len(timed) >= 3 and any(s["batches"] > 0 for s in timed):      # rows carry 0 without a DataLoader
            x = extra_batches(timed)
            out["loop.extra_batches_excess_share"] = x["excess_share"] if x else 0.0
    rc = root_calls or {}
    calls = rc.get("calls")
    if not isinstance(calls, int) or calls < 1:
        return out
    out["loop.model_name"] = rc.get("module") if isinstance(rc.get("module"), str) else None
    out["loop.model_calls_per_step"] = calls
    grad = rc.get("grad_calls")
    out["loop.model_grad_calls_per_step"] = grad if isinstance(grad, int) and 0 <= grad <= calls else None
    batch = rc.get("batch")
    out["loop.model_call_batch"] = batch if isinstance(batch, int) and batch >= 0 else None
    share = rc.get("batch_share")
    out["loop.model_call_batch_share"] = float(share) if isinstance(share, (int, float)) and 0 <= share <= 1 else None
    for key, name in (("chained", "loop.model_call_chained_share"), ("sliced", "loop.model_call_sliced_share")):
        n = rc.get(key)                   # of the calls after the first (collect/chainedcalls.py)
        if isinstance(n, int) and n >= 0 and calls > 1:
            out[name] = min(1.0, n / (calls - 1))
    rnn = rc.get("rnn_module")
    out["loop.model_rnn_module"] = rnn if isinstance(rnn, str) else None
    autocast = rc.get("cpu_autocast")
    out["loop.model_cpu_autocast"] = autocast if isinstance(autocast, str) else None
    layout = rc.get("conv_layout") if isinstance(rc.get("conv_layout"), dict) else {}
    n, cl = layout.get("calls"), layout.get("channels_last")
    if isinstance(n, int) and isinstance(cl, int) and 0 <= cl <= n and n > 0:
        out["loop.conv_channels_last_share"] = cl / n
    pad = rc.get("padding") if isinstance(rc.get("padding"), dict) else {}
    n, padded = pad.get("positions"), pad.get("pad")
    if isinstance(n, int) and isinstance(padded, int) and 0 <= padded <= n and n > 0:
        out["loop.padding_share"] = padded / n
        out["loop.padding_source"] = pad.get("source") if isinstance(pad.get("source"), str) else None
    inplace, graphs = rc.get("compiled_in_place"), rc.get("dynamo_graphs")     # PD226
    out["loop.model_compiled_in_place"] = inplace if isinstance(inplace, bool) else None
    out["loop.dynamo_graphs"] = graphs if isinstance(graphs, int) and not isinstance(graphs, bool) and graphs >= 0 \
        else None
    passes = rc.get("passes")
    out["loop.backward_passes_per_step"] = passes if isinstance(passes, int) and passes >= 0 else None
    fresh = rc.get("fresh_passes")
    if isinstance(fresh, int) and 0 <= fresh <= (passes if isinstance(passes, int) else -1):
        out["loop.fresh_passes_per_step"] = fresh
    return out
