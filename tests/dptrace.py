"""Synthetic Kineto traces of one process driving several GPUs (torch.nn.DataParallel), with exact
ground truth per device. tracegen.py models one device; this module lays out a DataParallel step
by hand, interval by interval, so every per-device number is known exactly.

A step (all times in us from the step's start; `n` devices, GPU 0 the output device):

    replicate   ncclKernel Broadcast on every device               [100, 600)   (collective)
    scatter     Memcpy PtoP of the input chunk, every device       [600, 800)   (copy)
    forward     compute kernels, every device                      [1000, 1000 + fwd)
    gather      Memcpy PtoP of the outputs onto GPU 0              then `gather` us (copy)
    loss        compute kernels on GPU 0 alone                     then `loss` us
    backward    compute kernels, every device                      then `bwd` us
    reduce      ncclKernel Reduce of the gradients, every device   then 500 us   (collective)
    optimizer   compute kernels on GPU 0 alone                     then `opt` us
    idle        nothing on any device                              `tail` us to the step's end

Everything is launched at the step's start (short runtime calls), under a `DataParallel.forward`
annotation for the forward part, so the step's host range holds every launch and the step ends
with its host range (the device work ends `tail` us earlier).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

PID, TID, STREAM, NCCL_STREAM = 4242, 4242, 7, 21
GEMM = "ampere_sgemm_128x64_tn"
BROADCAST = "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)"
REDUCE = "ncclKernel_Reduce_RING_LL_Sum_float(ncclWorkElem)"
PTOP = "Memcpy PtoP (Device -> Device)"
LOSS = "void at::native::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, float const*)"
ADAM = "void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor<float, 4> >"


@dataclass
class DPSpec:
    devices: int = 4
    steps: int = 4
    fwd: int = 2000
    gather: int = 300
    loss: int = 700
    bwd: int = 2000
    opt: int = 2500
    tail: int = 200
    data_parallel: bool = True      # the DataParallel.forward annotation
    loss_kernel: str = GEMM         # GPU 0's loss and optimizer kernels (LOSS, ADAM: not GEMMs, no
    opt_kernel: str = GEMM          # mixed-precision gain: autocast keeps them fp32)


@dataclass
class DPTruth:
    step_us: float
    busy_us: list[float]            # per device: compute kernels + copies (no collectives)
    compute_us: list[float]         # per device: compute kernels alone
    gemm_us: list[float]            # per device: its GEMM kernels (fp32 SIMT sgemm)
    union_us: float                 # device busy over all devices (no collectives), as share.device reads it
    comm_exposed_us: float          # collective time with no compute kernel or copy beside it


def _layout(s: DPSpec) -> list[tuple[str, str, int, int, int]]:
    """(category, name, device, start, end) of one step's device work."""
    ev = []
    for d in range(s.devices):
        ev += [("kernel", BROADCAST, d, 100, 600), ("gpu_memcpy", PTOP, d, 600, 800),
               ("kernel", GEMM, d, 1000, 1000 + s.fwd)]
    t = 1000 + s.fwd
    ev.append(("gpu_memcpy", PTOP, 0, t, t + s.gather))
    t += s.gather
    ev.append(("kernel", s.loss_kernel, 0, t, t + s.loss))
    t += s.loss
    for d in range(s.devices):
        ev += [("kernel", GEMM, d, t, t + s.bwd), ("kernel", REDUCE, d, t + s.bwd, t + s.bwd + 500)]
    t += s.bwd + 500
    ev.append(("kernel", s.opt_kernel, 0, t, t + s.opt))
    return ev


def step_length(s: DPSpec) -> int:
    return 1000 + s.fwd + s.gather + s.loss + s.bwd + 500 + s.opt + s.tail


def truth(s: DPSpec) -> DPTruth:
    ev, n = _layout(s), s.devices
    comm = lambda name: name.startswith("nccl")  # noqa: E731
    busy = [sum(e - b for c, nm, d, b, e in ev if d == dev and not comm(nm)) for dev in range(n)]
    compute = [sum(e - b for c, nm, d, b, e in ev if d == dev and c == "kernel" and not comm(nm)) for dev in range(n)]
    gemm = [sum(e - b for c, nm, d, b, e in ev if d == dev and nm == GEMM) for dev in range(n)]
    # GPU 0 holds every non-collective interval of the others, and its own do not overlap
    return DPTruth(step_us=float(step_length(s)), busy_us=[float(x) for x in busy],
                   compute_us=[float(x) for x in compute], gemm_us=[float(x) for x in gemm], union_us=float(busy[0]), comm_exposed_us=1000.0)


def build(s: DPSpec) -> dict:
    events, corr, ext = [], 0, 0
    length = step_length(s)
    t0 = 1_000_000
    for i in range(s.steps):
        base = t0 + i * length
        events.append(_x("user_annotation", f"ProfilerStep#{i}", PID, TID, base, length, {"External id": ext}))
        if s.data_parallel:
            events.append(_x("user_annotation", "DataParallel.forward", PID, TID, base + 5, 1000 + s.fwd + s.gather,
                             {"External id": ext + 1}))
        ext += 2
        for j, (cat, name, dev, b, e) in enumerate(_layout(s)):
            corr += 1
            launch = base + 10 + 2 * j
            rt = "cudaLaunchKernel" if cat == "kernel" else "cudaMemcpyAsync"
            events.append(_x("cuda_runtime", rt, PID, TID, launch, 1, {"External id": ext, "cbid": 211, "correlation": corr}))
            stream = NCCL_STREAM if name.startswith("nccl") else STREAM
            events.append(_x(cat, name, dev, stream, base + b, e - b,
                             {"External id": ext, "device": dev, "context": 1, "stream": stream, "correlation": corr}))
    props = [{"id": d, "name": "NVIDIA A100-SXM4-40GB", "totalGlobalMem": 40 << 30, "computeMajor": 8,
              "computeMinor": 0, "numSms": 108} for d in range(s.devices)]
    return {"schemaVersion": 1, "deviceProperties": props, "traceEvents": events,
            "traceName": f"/tmp/dp_{PID}.pt.trace.json"}


def write(s: DPSpec, path) -> DPTruth:
    with open(path, "w") as f:
        json.dump(build(s), f)
    return truth(s)


def _x(cat, name, pid, tid, ts, dur, args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}
