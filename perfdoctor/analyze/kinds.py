"""What each event is: kernel, memcpy, runtime call, CPU op, DataLoader wait, ...

Kineto renamed its categories over the years (2021: Operator/Runtime/Kernel/Memcpy/Memset;
now cpu_op/cuda_runtime/kernel/gpu_memcpy/gpu_memset) and uses the CUDA category names for
HIP on ROCm, so every test here accepts all spellings and decides by category, then by name.
MTIA traces put device work in `mtia_ccp_events` (DMA transfers among it) and runtime calls in
`mtia_runtime`, launching with `runFunction - job_prep_and_submit_for_execution` (as HTA reads
them). Communication is collective kernels (NCCL/RCCL), or host-side gloo collectives: gloo runs
on the CPU, also for GPU tensors (`gloo:*` ops; `c10d::*`/`record_param_comms` too when the
process group's backend is gloo).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from perfdoctor.analyze.arrays import unique
from perfdoctor.trace.table import STEP_RX, EventTable

KERNEL_CATS = ("kernel",)
MTIA_DEVICE_CATS = ("mtia_ccp_events",)
MEMCPY_CATS = ("gpu_memcpy", "memcpy")
MEMSET_CATS = ("gpu_memset", "memset")
RUNTIME_CATS = ("cuda_runtime", "runtime", "cuda_driver", "mtia_runtime")
CPU_OP_CATS = ("cpu_op", "operator")
HOST_ANNOTATION_CATS = ("user_annotation", "python_function")

DATALOADER_RX = re.compile(r"^enumerate\((DataLoader|DataPipe)\)#.*__next__$")
# NCCL/RCCL, and PyTorch's symmetric-memory collectives (multimem_all_reduce_kernel, two_shot_all_reduce_kernel...;
# 2.2-2.4's intra_node_comm::oneShotAllReduceKernel)
COMM_KERNEL_RX = re.compile(r"nccl|rccl|(?:one_shot|two_shot|multimem)_\w*?(?:all_reduce|all_gather|reduce_scatter)|"
                            r"(?:one|two)Shot\w*?AllReduce", re.I)
# Host-side collective ops (the only communication visible in CPU-only / gloo traces).
COMM_OP_RX = re.compile(r"^(gloo:|nccl:|c10d::|record_param_comms$)")
GLOO_OP_RX = re.compile(r"^gloo:")
MTIA_LAUNCH = "runFunction - job_prep_and_submit_for_execution"
MTIA_COPY_RX = re.compile(r"dma|memcpy", re.I)
MTIA_SET_RX = re.compile(r"memset", re.I)
SYNC_RUNTIME_RX = re.compile(
    r"^(cuda|hip)(StreamSynchronize|DeviceSynchronize|EventSynchronize|Memcpy|MemcpyWithStream)$")
QUERY_RUNTIME_RX = re.compile(r"^(cuda|hip)(Get|DeviceGet|DriverGet|RuntimeGet|PeekAtLastError)")
MALLOC_RX = re.compile(r"^(cuda|hip)(Malloc|MallocHost|MallocManaged|MallocAsync)$")
FREE_RX = re.compile(r"^(cuda|hip)(Free|FreeHost|FreeAsync)$")


@dataclass
class Kinds:
    """Boolean row masks over an EventTable, computed once per trace."""

    complete: np.ndarray      # ph == 'X' (duration events)
    kernel: np.ndarray
    comm_kernel: np.ndarray
    memcpy: np.ndarray
    memset: np.ndarray
    runtime: np.ndarray
    cpu_op: np.ndarray        # aten/autograd ops and host annotations, minus steps and loader waits
    comm_op: np.ndarray       # host-side collectives (gloo/c10d)
    comm_host: np.ndarray     # host-side collectives that are the communication itself (gloo)
    step: np.ndarray
    dataloader: np.ndarray
    memory: np.ndarray        # '[memory]' instant events
    platform: str             # "cuda" | "rocm" | "mtia" | "cpu"
    cache: dict = field(default_factory=dict, repr=False)   # per-trace joins computed once (steps.py)

    @property
    def device_activity(self) -> np.ndarray:
        return self.kernel | self.memcpy | self.memset


def classify(t: EventTable) -> Kinds:
    x = t.ph == ord("X")
    kernel = x & t.cat_mask(*KERNEL_CATS)
    memcpy = x & t.cat_mask(*MEMCPY_CATS)
    memset = x & t.cat_mask(*MEMSET_CATS)
    mtia = x & t.cat_mask(*MTIA_DEVICE_CATS)
    if mtia.any():
        mtia_copy = mtia & t.name_mask(lambda n: MTIA_COPY_RX.search(n) is not None)
        mtia_set = mtia & ~mtia_copy & t.name_mask(lambda n: MTIA_SET_RX.search(n) is not None)
        kernel, memcpy, memset = kernel | (mtia & ~mtia_copy & ~mtia_set), memcpy | mtia_copy, memset | mtia_set
    runtime = x & t.cat_mask(*RUNTIME_CATS)
    host = x & t.cat_mask(*CPU_OP_CATS, *HOST_ANNOTATION_CATS)
    step = host & t.name_mask(lambda n: STEP_RX.match(n) is not None)
    loader = host & t.name_mask(lambda n: DATALOADER_RX.match(n) is not None)
    comm_kernel = kernel & t.name_mask(lambda n: COMM_KERNEL_RX.search(n) is not None)
    comm_op = host & t.name_mask(lambda n: COMM_OP_RX.match(n) is not None)
    memory = (t.ph == ord("i")) & t.name_mask(lambda n: n == "[memory]")
    platform = detect_platform(t, kernel | memcpy | memset, runtime, step)
    return Kinds(complete=x, kernel=kernel, comm_kernel=comm_kernel, memcpy=memcpy, memset=memset,
                 runtime=runtime, cpu_op=host & ~step & ~loader, comm_op=comm_op,
                 comm_host=comm_op if platform == "cpu" or _gloo_backend(t) else
                 comm_op & t.name_mask(lambda n: GLOO_OP_RX.match(n) is not None),
                 step=step, dataloader=loader, memory=memory, platform=platform)


def _steps_called_the_runtime(t: EventTable, runtime_rows: np.ndarray, step_rows: np.ndarray | None) -> bool:
    rows = np.flatnonzero(runtime_rows)
    steps = np.flatnonzero(step_rows) if step_rows is not None else np.zeros(0, int)
    if not len(rows):
        return False
    if len(steps):
        lo, hi = float(t.ts[steps].min()), float((t.ts[steps] + t.dur[steps]).max())
        return bool(((t.ts[rows] >= lo) & (t.ts[rows] < hi)).any())
    names = {t.names[c] for c in unique(t.name[rows])}
    return any(not SYNC_RUNTIME_RX.match(n) and not QUERY_RUNTIME_RX.match(n) for n in names)


def _gloo_backend(t: EventTable) -> bool:
    """The process group's backend is gloo (distributedInfo), so every host collective is one."""
    backend = str(t.meta.distributed_info.get("backend") or "")
    return "gloo" in backend and "nccl" not in backend


def trailer(t: EventTable) -> np.ndarray:
    """The profiler's trailer, written after every activity: metadata ('M') and its own `Trace` span."""
    return (t.ph == ord("M")) | t.cat_mask("Trace")


# kernels only AMD's libraries make: rocBLAS/hipBLASLt's Tensile GEMMs, MIOpen's kernels
ROCM_KERNEL_RX = re.compile(r"Cijk_|MIOpen", re.I)


def detect_platform(t: EventTable, device_rows: np.ndarray, runtime_rows: np.ndarray,
                    step_rows: np.ndarray | None = None) -> str:
    """cpu when nothing ran on a device and the steps made no runtime call (runtime calls come
    from the device's tracer, CUPTI or roctracer: a GPU run whose steps launched nothing has
    them, and is a GPU run with an idle device, not a CPU-only one; but the profiler's own
    device synchronisation when it stops, after the last step, is in the trace of a CPU-trained
    script on a machine with a GPU too: calls outside the ProfilerStep spans, and without them
    syncs and queries, do not count); mtia when MTIA categories, its launch call or an `mtia:`
    backend say so (HTA's test); rocm when HIP names or an AMD device say so. A file with a
    device's properties cut off before its device events is that device's trace, not a CPU one
    (its steps are dropped: analyze/steps.py)."""
    props = " ".join(str(p.get("name", "")) for p in t.meta.device_properties)
    # cut before its device events (and the trailer after them: metadata, the profiler's span)
    cut_before_device = t.meta.truncated and bool(t.meta.device_properties) and not trailer(t).any()
    if not device_rows.any() and not _steps_called_the_runtime(t, runtime_rows, step_rows) and not cut_before_device:
        return "cpu"
    rt_names = {t.names[c] for c in unique(t.name[runtime_rows])}
    if (any(c.lower() in MTIA_DEVICE_CATS for c in t.cats) or MTIA_LAUNCH in rt_names
            or str(t.meta.distributed_info.get("backend") or "").startswith("mtia")):
        return "mtia"
    if any(n.startswith("hip") for n in rt_names) or re.search(r"AMD|Radeon|Instinct", props):
        return "rocm"
    # neither (a trace of device activity alone, without runtime calls or device properties):
    # AMD's libraries name their kernels as NVIDIA's never are (Tensile GEMMs, MIOpen)
    if any(ROCM_KERNEL_RX.match(t.names[c]) for c in unique(t.name[device_rows])):
        return "rocm"
    return "cuda"
