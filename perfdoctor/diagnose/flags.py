"""Flags: problems reported beside the verdict, each with the numbers that raised it.

Thresholds start from ../shared/design/rule-catalog.md and the peer tools it cites; each is
stated next to its flag with the reason for it. Device-specific flags only fire on the
platform they describe (no CUDA advice on ROCm or CPU-only traces).
"""

from __future__ import annotations

from dataclasses import dataclass, field

IDLE_GPU_SHARE = 0.10          # idle >= 10% of the step: removing it could gain >= 1.11x
SYNC_PER_STEP = 1.0            # one sync per step (e.g. logging a loss) is normal; more is avoidable
SYNC_SHARE = 0.02              # ... or blocked >= 2% of the step (nsys cuda_api_sync)
RESERVED_SWING = 0.05          # reserved memory moving > 5% between steady steps (catalog)
TENSOR_CORE_ELIGIBLE = 0.05    # GEMM/conv >= 5% of kernel time before mixed precision matters
TENSOR_CORE_USED = 0.01        # below 1% of kernel time on tensor cores counts as unused
MEMORY_PRESSURE = 0.90         # peak reserved > 90% of device memory (TensorBoard plugin)
NUM_WORKERS_WAIT = 0.05        # num_workers=0 matters once exposed data wait >= 5% (tb_plugin)


@dataclass
class Flag:
    id: str
    title: str
    severity: str               # high | medium | low
    summary: str
    evidence: dict = field(default_factory=dict)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _sev(share: float) -> str:
    return "high" if share >= 0.2 else "medium" if share >= 0.05 else "low"


def flags_for(m: dict, gaps: list | None = None) -> list[Flag]:
    out: list[Flag] = []
    platform = m["trace.platform"]
    gpu = platform in ("cuda", "rocm")
    if m["input.num_workers_zero"] and (m["input.data_wait_share"] or 0) >= NUM_WORKERS_WAIT:
        w = m["input.data_wait_share"]
        out.append(Flag("num_workers_zero", "DataLoader runs with num_workers=0", _sev(w),
                        f"Batches are loaded in the training process itself (_SingleProcessDataLoaderIter); "
                        f"the trainer waits {_pct(w)} of each step for them.",
                        {"input.data_wait_share": w, "input.loader": m["input.loader"]}))
    if gpu and (m["gpu.idle_share"] or 0) >= IDLE_GPU_SHARE:
        idle = m["gpu.idle_share"]
        by_host = {k: m[k] for k in m if k.startswith("gpu.idle_while_") and (m[k] or 0) >= 0.01}
        top = max(by_host, key=by_host.get) if by_host else None
        what = top.removeprefix("gpu.idle_while_").removesuffix("_share").replace("_", " ") if top else "?"
        ev = {"gpu.idle_share": idle, "gpu.idle_host_wait_share": m["gpu.idle_host_wait_share"],
              "gpu.idle_kernel_wait_share": m["gpu.idle_kernel_wait_share"],
              **by_host}
        if gaps:
            g = gaps[0]
            ev["largest_gap"] = f"{g.duration_ms:.2f} ms in step {g.step} ({g.kind.replace('_', ' ')}; host: {g.host_event or g.host_activity})"
        out.append(Flag("idle_gpu_gaps", "The GPU sits idle inside steps", _sev(idle),
                        f"No kernel, copy or memset runs {_pct(idle)} of step time; most of it while the host is in {what}.",
                        ev))
    if gpu and ((m["sync.per_step"] or 0) > SYNC_PER_STEP or (m["sync.share"] or 0) > SYNC_SHARE):
        out.append(Flag("host_device_sync", "Host-device synchronisations every step",
                        "medium" if (m["sync.share"] or 0) >= SYNC_SHARE else "low",
                        f"{m['sync.per_step']:.1f} syncs per step block the host for {_pct(m['sync.share'] or 0)} of "
                        f"the step ({m['sync.scalar_dtoh_per_step']:.1f} per step from reading GPU scalars with item()/nonzero).",
                        {"sync.per_step": m["sync.per_step"], "sync.share": m["sync.share"],
                         "sync.scalar_dtoh_per_step": m["sync.scalar_dtoh_per_step"]}))
    if platform == "cuda" and (m["memcpy.pageable_h2d_per_step"] or 0) > 0:
        out.append(Flag("pageable_copies", "Host-to-device copies from pageable memory", "low",
                        f"{m['memcpy.pageable_h2d_per_step']:.1f} HtoD copies per step come from unpinned memory "
                        "and cannot overlap with compute.",
                        {"memcpy.pageable_h2d_per_step": m["memcpy.pageable_h2d_per_step"],
                         "memcpy.pageable_h2d_share": m["memcpy.pageable_h2d_share"]}))
    churn = (m["memory.free_per_step"] or 0) > 0 or (m["memory.reserved_swing"] or 0) > RESERVED_SWING
    if gpu and churn and (m["steps.count"] or 0) >= 2:
        out.append(Flag("allocator_thrashing", "The caching allocator keeps freeing and re-allocating",
                        "medium" if (m["memory.alloc_api_share"] or 0) >= 0.02 else "low",
                        f"After warm-up, {m['memory.malloc_per_step']:.1f} mallocs and {m['memory.free_per_step']:.1f} frees "
                        f"per step; reserved memory swings {_pct(m['memory.reserved_swing'] or 0)}.",
                        {"memory.malloc_per_step": m["memory.malloc_per_step"], "memory.free_per_step": m["memory.free_per_step"],
                         "memory.alloc_api_share": m["memory.alloc_api_share"], "memory.reserved_swing": m["memory.reserved_swing"]}))
    cc = m["trace.compute_capability"]
    if (platform == "cuda" and cc is not None and float(cc) >= 7.0
            and (m["tensor_core.eligible_share"] or 0) >= TENSOR_CORE_ELIGIBLE
            and (m["tensor_core.kernel_share"] or 0) < TENSOR_CORE_USED):
        out.append(Flag("no_tensor_cores", "Tensor cores unused", _sev(m["tensor_core.eligible_step_share"] or 0),
                        f"GEMM/convolution kernels take {_pct(m['tensor_core.eligible_share'])} of kernel time on a "
                        f"compute-capability {cc} GPU, but none run on tensor cores (fp32 math).",
                        {"tensor_core.kernel_share": m["tensor_core.kernel_share"],
                         "tensor_core.eligible_share": m["tensor_core.eligible_share"],
                         "tensor_core.eligible_step_share": m["tensor_core.eligible_step_share"],
                         "trace.compute_capability": cc}))
    if gpu and (m["memory.peak_reserved_fraction"] or 0) > MEMORY_PRESSURE:
        out.append(Flag("memory_pressure", "Device memory nearly full", "medium",
                        f"Peak reserved memory is {_pct(m['memory.peak_reserved_fraction'])} of the device.",
                        {"memory.peak_reserved_fraction": m["memory.peak_reserved_fraction"],
                         "memory.peak_reserved_bytes": m["memory.peak_reserved_bytes"]}))
    return out
