"""torch.autograd's own Chrome export, read as the Kineto categories it lacks.

`EventList.export_chrome_trace` (`prof.events().export_chrome_trace(path)`, `key_averages()`'s
list, torch.autograd.profiler_legacy, and every torch before 1.8) writes a bare JSON list whose
complete events carry no `cat`: each op, ProfilerStep#N and record_function range under
pid "CPU functions", and (torch <= 1.7 with use_cuda=True) each op's device time under pid
"CUDA functions". Without a category none of them is an op, a step or a kernel, and a training
loop read as one whole-trace "step" of 100% untraced host time. Here those rows get the
categories Kineto would have written: cpu_op and kernel. The torch 1.8+ form records no device
activity at all (its flow events only point at kernels it does not write), so a GPU run
exported that way (cudnn/cuda ops, nothing under "CUDA functions") is refused with one line:
read, it passed for a CPU-only run, "compute-bound on the CPU" with CPU-only advice.
"""

from __future__ import annotations

import re

import numpy as np

from perfdoctor.errors import TraceFormatError

CPU_PID, DEVICE_PID = "cpu functions", "cuda functions"
# op names only a CUDA/ROCm run calls (the device's work itself is not in this export)
DEVICE_OP_RX = re.compile(r"^aten::(cudnn_|miopen_|_cudnn|_cufft|_fused_sdp_choice_cuda)|^cuda|^hip", re.I)


def legacy_categories(path: str, cols: dict, strings: dict) -> str | None:
    """Give the uncategorised complete events of the legacy export their Kineto category, in
    place (cols['cat'] replaced, strings['cat'] extended); the warning to show, or None when
    the trace is not such an export. TraceFormatError for a GPU run's export without its device."""
    cats, pids = strings["cat"], strings["pid"]
    uncategorised = [i for i, c in enumerate(cats) if not c]
    cpu = [i for i, p in enumerate(pids) if isinstance(p, str) and p.lower() == CPU_PID]
    if not uncategorised or not cpu:
        return None
    x = (cols["ph"] == ord("X")) & _among(cols["cat"], uncategorised)
    on_cpu = x & _among(cols["pid"], cpu)
    if not on_cpu.any():
        return None
    device = [i for i, p in enumerate(pids) if isinstance(p, str) and p.lower() == DEVICE_PID]
    on_device = x & _among(cols["pid"], device)
    cat = np.array(cols["cat"], np.int32)
    names = strings["name"]
    # torch's own ranges (ProfilerStep#N, Optimizer.step#SGD.step, Optimizer.zero_grad#...) are
    # annotations in Kineto's export, not ops: read as ops, the Python inside them (the
    # optimizer's loop over its parameters) counted as op time. A user's record_function label
    # without '#' cannot be told from an op here and stays one.
    ranges = [c for c in set(cols["name"][on_cpu].tolist()) if "#" in str(names[c])]
    annotation = on_cpu & _among(cols["name"], ranges)
    cat[on_cpu & ~annotation] = _code(cats, "cpu_op")
    cat[annotation] = _code(cats, "user_annotation")
    if on_device.any():
        cat[on_device] = _code(cats, "kernel")
    cols["cat"] = cat
    ran_on_device = any(DEVICE_OP_RX.search(str(names[c])) for c in set(cols["name"][on_cpu].tolist()))
    if ran_on_device and not on_device.any():
        raise TraceFormatError(
            f"{path}: torch.autograd's Chrome export (EventList.export_chrome_trace) of a GPU run holds its ops "
            "but none of the GPU's activity, so where the step's time goes cannot be told; export with "
            "torch.profiler's prof.export_chrome_trace(path) (kernels, copies, syncs)")
    return ("read as torch.autograd's Chrome export (EventList.export_chrome_trace): ops and steps "
            "only, no categories, memory or input shapes")


def _among(codes: np.ndarray, wanted: list[int]) -> np.ndarray:
    """codes in `wanted` (a few string codes; np.isin would load numpy.ma, 20 ms of a cold report)."""
    out = np.zeros(len(codes), bool)
    for w in wanted:
        out |= codes == w
    return out


def _code(cats: list, cat: str) -> int:
    if cat not in cats:
        cats.append(cat)
    return cats.index(cat)
