"""Synthetic torch.profiler (Kineto) Chrome traces whose ground truth is known exactly.

`build(TraceSpec)` simulates one host thread issuing work to a GPU and returns the trace plus a
`Truth` computed from that simulation (never re-derived from the JSON). Event shapes copy the real
traces in ../shared/traces: current Kineto (cpu_op / cuda_runtime / kernel / gpu_memcpy ...),
the 2021 legacy layout (Operator / Runtime / Kernel, string tids, lowercase 'external id'),
ROCm (hip* runtime names, 'Dispatch Kernel' args) and CPU-only traces. Graph replay (CUDA,
current Kineto only) copies the H100 `launch_compiled` run: one cudaGraphLaunch whose kernels all
carry its correlation id, back to back on the stream, one flow arrow each.

Time model: every time is an integer number of ticks of `q` microseconds; q = 1 for integer-us
traces. With ns_resolution, q is the smallest of 0.125, 0.25, ... that is exactly representable
at the trace's epoch (0.25 us at the default 1.7e15 us), so `ts`/`dur` survive float64 parsing
exactly and every Truth number can be compared with ==.  Standard library only; no torch.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from dataclasses import dataclass, field
from typing import NamedTuple

MiB = 1 << 20
# Nominal host/GPU costs (us).
LAUNCH_US, GPU_DELAY_US, RETURN_US, STEP_GAP_US = 5.0, 3.0, 1.0, 2.0
RT_US = {"launch": LAUNCH_US, "memcpy": 6.0, "memcpy_sync": 6.0, "memset": 4.0, "sync": 3.0,
         "device_sync": 3.0, "item": 6.0, "malloc": 40.0, "free": 30.0, "graph": 15.0}
H2D_BYTES, PAGEABLE_US, PINNED_US = MiB, 100.0, 40.0
DTOH_BYTES, DTOH_US, MEMSET_BYTES, MEMSET_US = 4, 2.0, 256 * 1024, 5.0
MIN_SLOT_TICKS, MIN_OPS = 10, 4
MEM_BASE, MEM_BLOCKS = 256 * MiB, (MiB, 2 * MiB, 4 * MiB, 8 * MiB)

# kind -> (cuda name, cbid, hip name, cid); item/pageable copies block the host until done.
RUNTIME = {
    "launch": ("cudaLaunchKernel", 211, "hipLaunchKernel", 107),
    "memcpy": ("cudaMemcpyAsync", 41, "hipMemcpyAsync", 52),
    "memcpy_sync": ("cudaMemcpyAsync", 41, "hipMemcpyWithStream", 153),
    "item": ("cudaMemcpyAsync", 41, "hipMemcpyWithStream", 153),
    "memset": ("cudaMemsetAsync", 51, "hipMemsetAsync", 63),
    "sync": ("cudaStreamSynchronize", 131, "hipDeviceSynchronize", 48),
    "device_sync": ("cudaDeviceSynchronize", 165, "hipDeviceSynchronize", 48),
    "malloc": ("cudaMalloc", 20, "hipMalloc", 57),
    "free": ("cudaFree", 22, "hipFree", 59),
    "graph": ("cudaGraphLaunch", 311, None, None),     # CUDA only (see _Gen's checks)
}
# torch.compile's host ops around a compiled graph (what fusion.compiled reads), outermost first.
COMPILED_OPS = ("Torch-Compiled Region: 0/0", "CompiledFunction", "## Call CompiledFxGraph fx0 ##")
# torch.compile's compile phases as torch 2.x records them (dynamo_timed), outermost first
COMPILE_RANGES = ("_compile.compile_inner (dynamo_timed)", "OutputGraph.call_user_compiler (dynamo_timed)",
                  "compile_fx_inner (dynamo_timed)")
MEMCPY_NAMES = {  # copy -> (cuda name, rocm name)
    "pageable": ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Host -> Device)"),
    "pinned": ("Memcpy HtoD (Pinned -> Device)", "Memcpy HtoD (Host -> Device)"),
    "dtoh": ("Memcpy DtoH (Device -> Pageable)", "Memcpy DtoH (Device -> Host)"),
}
_VEC = "void at::native::vectorized_elementwise_kernel<4, {f}, at::detail::Array<char*, {n}> >(int, {f}, at::detail::Array<char*, {n}>)"
ELEMENTWISE = [  # (op, child op, kernel)
    ("aten::relu", "aten::clamp_min", _VEC.format(f="at::native::(anonymous namespace)::clamp_min_scalar_kernel_impl(at::TensorIteratorBase&, c10::Scalar)::{lambda()#1}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}", n=2)),
    ("aten::add_", None, _VEC.format(f="at::native::CUDAFunctor_add<float>", n=3)),
    ("aten::mul", None, _VEC.format(f="at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >", n=3)),
    ("aten::fill_", None, _VEC.format(f="at::native::FillFunctor<float>", n=1)),
]
# "Input type" of x.to(device) as torch 2.x records it (record_shapes=True): the source's type, then
# the non-tensor arguments; copy_ lists its destination first (the same type here), then the source.
COPY_TYPES = {"aten::to": lambda ty: [ty, "Scalar", "Scalar", "", "", "Scalar", "Scalar", ""],
              "aten::_to_copy": lambda ty: [ty, "Scalar", "Scalar", "", "", "Scalar", ""],
              "aten::copy_": lambda ty: [ty, ty, "Scalar"]}
NCCL_KERNEL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
BACKWARD_NODE = "autograd::engine::evaluate_function: "
OPTIMIZER_KERNEL = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
                    "TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, "
                    "std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>, "
                    "at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float)")
ROCM_GEMM = {True: "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB1_GRVW8_WG32_8_1",
             False: "Cijk_Ailk_Bljk_SB_MT64x64x8_SN_1LDSB0_GRVW4_WG16_16_1"}
TC_GEMM = {7: "volta_h884gemm_64x64_ldg8_nn",
           8: "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",
           9: "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"}
TC_CONV = {7: "volta_fp16_s884cudnn_fp16_256x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1",
           8: "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x128x32_stage4_warpsize2x2x1_g1_tensor16x8x16_kernel"}
GPU_NAMES = {6: "Quadro GP100", 7: "Tesla V100-SXM2-32GB", 8: "NVIDIA A100-SXM4-40GB", 9: "NVIDIA H100 80GB HBM3"}


@dataclass
class StepSpec:
    data_wait_us: float = 0.0
    cpu_ops_us: float = 1000.0
    kernels: int = 10
    kernel_us: float = 50.0
    syncs: int = 0
    item_syncs: int = 0
    pageable_h2d: int = 0
    pinned_h2d: int = 0
    mallocs: int = 0
    frees: int = 0
    nccl_kernels: int = 0
    nccl_us: float = 200.0
    tensor_core_kernels: int = 0
    gemm_ops: int = 0
    memsets: int = 0                 # extra: cudaMemsetAsync + 'Memset (Device)' (zero_grad style)
    graph_launches: int = 0          # cudaGraphLaunch calls (CUDA, kineto), each replaying graph_kernels
    graph_kernels: int = 8           # kernels of kernel_us each, back to back, one correlation
    compiled: bool = False           # torch.compile: triton_ elementwise kernels; graphs under COMPILED_OPS
    backward: bool = False           # the second half of the compute ops run as autograd engine nodes
    nccl_in_backward: bool = False   # with backward: the all-reduces are launched from AccumulateGrad nodes
    #                                  spread through backward, the last after its last op (DDP's buckets);
    #                                  otherwise all after the compute
    optimizer: bool = False          # an Optimizer.step annotation with one kernel ends the step
    compile_us: float = 0.0          # torch.compile (re)compiling before the step's ops: nested
    #                                  "(dynamo_timed)" ranges (COMPILE_RANGES), the outermost this long
    copy_type: str | None = None     # record_shapes: the HtoD copies' source type as torch writes it in
    #                                  their ops' "Input type" ("float", "unsigned char"); None: not recorded


@dataclass
class TraceSpec:
    steps: list[StepSpec]
    fmt: str = "kineto"              # "kineto" | "legacy2021"
    device: str = "cuda"             # "cuda" | "rocm" | "cpu"
    compute_major: int = 7
    num_workers: int = 0
    profiler_steps: bool = True
    first_step: int = 5
    start_us: float = 1_700_000_000_000_000.0
    ns_resolution: bool = False
    memory_events: bool = False
    reserved_churn: bool = False
    rank: int | None = None
    world_size: int = 1
    pid: int = 4242
    tid: int = 4242
    gap_us: float = 0.0
    seed: int = 0                    # extra: seeds kernel arg / op order / jitter choices
    end_sync: bool = False           # a device sync after the last step (a timing call, the profiler's stop)


@dataclass
class Truth:
    """Per-step lists follow spec.steps (logical steps, also when profiler_steps=False)."""
    n_steps: int                      # ProfilerStep annotations emitted (0 without them)
    step_ids: list[int]
    step_start_us: list[float]        # absolute ts of each step's start
    step_wall_us: list[float]         # host ProfilerStep durations
    step_wall_device_us: list[float]  # extended to the end of GPU work launched in the step
    data_wait_us: list[float]
    kernel_busy_us: list[float]       # union of non-NCCL kernels launched in the step
    nccl_busy_us: list[float]
    memcpy_us: list[float]
    memset_us: list[float]
    syncs: list[int]                  # stream/device syncs + blocking DtoH copies under aten::item
    pageable_h2d: list[int]           # copies *named* Pageable (0 on ROCm: names say Host -> Device)
    mallocs: list[int]
    frees: list[int]
    reserved_changes: list[int] = field(default_factory=list)  # [memory] events changing Total Reserved
    tensor_core_kernel_us: float = 0.0
    kernel_us_total: float = 0.0      # all non-NCCL kernels
    gemm_op_count: int = 0            # aten::mm + aten::addmm events
    peak_allocated_bytes: int = 0
    host_span_us: float = 0.0         # first step start -> last step end
    num_events: int = 0
    graph_kernels: list[int] = field(default_factory=list)   # kernels replayed from graph launches
    compile_us: list[float] = field(default_factory=list)    # outermost compile range per step


class Gpu(NamedTuple):
    kind: str                        # kernel | memcpy | memset
    name: str
    stream: int
    ticks: int
    extra: dict                      # kernel launch config or copy bytes/bandwidth


class Act(NamedTuple):
    """One host action of a step: nested ops with an optional runtime call in the innermost."""
    names: tuple = ()                # ops, outermost first; () = runtime call directly in the step
    kind: str | None = None          # RUNTIME key
    gpu: Gpu | None = None
    block: str | None = None         # host waits for: "copy" (its own copy) | "stream" | "device"
    tag: str = "compute"             # what Truth counts it as
    types: str | None = None         # the copy ops' source type, written as record_shapes does (COPY_TYPES)


class _Gen:
    def __init__(self, spec: TraceSpec):
        if not spec.steps or spec.fmt not in ("kineto", "legacy2021") or spec.device not in ("cuda", "rocm", "cpu"):
            raise ValueError("need steps, fmt kineto|legacy2021 and device cuda|rocm|cpu")
        if any(st.graph_launches for st in spec.steps) and (spec.fmt, spec.device) != ("kineto", "cuda"):
            raise ValueError("graph launches are modelled on CUDA kineto traces only")
        self.s, self.rng = spec, random.Random(spec.seed)
        self.legacy, self.rocm, self.gpu = spec.fmt == "legacy2021", spec.device == "rocm", spec.device != "cpu"
        self.q = 1
        if spec.ns_resolution:
            self.q = 0.125
            while math.ulp(spec.start_us + 1e10) > self.q:
                self.q *= 2
        self.start = round(spec.start_us / self.q) * self.q if spec.ns_resolution else int(round(spec.start_us))
        self.stream, self.nccl_stream = (0, 1) if self.rocm else (7, 14)
        self.free_at = {self.stream: 0, self.nccl_stream: 0}
        self.host, self.mem, self.dev = [], [], []
        self.ext, self.corr, self.ext_tick = 0, 100000, {0: 0}
        self.allocated, self.reserved, self.peak = MEM_BASE, MEM_BASE, MEM_BASE

    # -- time and ids ----------------------------------------------------------------------
    def ticks(self, us):
        return int(round(us / self.q))

    def ts(self, tick):
        return self.start + tick * self.q

    def dur(self, ticks):
        return ticks * self.q

    def jitter(self, us):
        n = self.ticks(us)
        return n + self.rng.randint(-(n // 5), n // 5)

    def new_ext(self, tick):
        self.ext += 1
        self.ext_tick[self.ext] = tick
        return self.ext

    # -- events --------------------------------------------------------------------------------
    def op(self, name, t0, t1, ext, annotation=False, types=None):
        if self.legacy:
            cat = "Operator"
            args = {"Input dims": [], "Input type": [], "Input names": [], "Output dims": [],
                    "Output type": [], "Output names": [], "Device": 0, "External id": ext,
                    "Extra arguments": [], "Trace name": "PyTorch Profiler", "Trace iteration": 0}
        else:
            cat, args = ("user_annotation" if annotation else "cpu_op"), {"External id": ext}
            if types and name in COPY_TYPES:
                args["Input type"] = COPY_TYPES[name](types)
        tid = str(self.s.tid) if self.legacy else self.s.tid
        self.host.append({"ph": "X", "cat": cat, "name": name, "pid": self.s.pid, "tid": tid,
                          "ts": self.ts(t0), "dur": self.dur(t1 - t0), "args": args})

    def memory(self, tick, nbytes, step):
        self.allocated += nbytes
        before = self.reserved
        if self.allocated > self.reserved:           # grow the cache to fit the largest block
            self.reserved = MEM_BASE + max(MEM_BLOCKS)
        elif nbytes < 0 and self.s.reserved_churn and step > 0:
            self.reserved = self.allocated           # released back to the driver: thrashing
        self.peak = max(self.peak, self.allocated)
        self.cur["reserved_changes"] += self.reserved != before
        args = {"Device Type": 1 if self.gpu else 0, "Device Id": 0 if self.gpu else -1,
                "Addr": 140000000000000 + self.rng.randrange(1 << 30) * 512, "Bytes": nbytes,
                "Total Allocated": self.allocated, "Total Reserved": self.reserved}
        ev = {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
              "pid": self.s.pid, "tid": self.s.tid, "ts": self.ts(tick), "args": args}
        if self.legacy:
            del ev["cat"], args["Addr"], args["Total Reserved"]
        self.mem.append(ev)

    def call(self, kind, t0, max_ticks, ext, gpu=None, block=None):
        """A runtime call at tick t0 (at most max_ticks unless it blocks) with optional GPU work
        (a Gpu, or a tuple of them: a graph replayed back to back under one correlation);
        returns the tick the call returns at."""
        name, code, hip, cid = RUNTIME[kind]
        name, code = (hip, cid) if self.rocm else (name, code)
        end = t0 + max(1, min(self.jitter(RT_US[kind]), max_ticks))
        self.corr += 1
        c = self.corr
        if gpu:
            ready = t0 + self.ticks(RETURN_US) if block else end + self.ticks(GPU_DELAY_US)
            for g in ((gpu,) if isinstance(gpu, Gpu) else gpu):
                g0 = max(ready, self.free_at[g.stream])
                g1 = self.free_at[g.stream] = g0 + g.ticks
                self.cur["gpu_end"] = max(self.cur["gpu_end"], g1)
                self.dev.append(self.gpu_event(g, g0, c, ext))
                self.dev.append(self.flow("f", c, g0, g.stream))
        if block == "copy":
            end = max(end, g1 + self.ticks(RETURN_US))
        elif block in ("stream", "device"):
            busy = [self.free_at[self.stream]] if block == "stream" else list(self.free_at.values())
            end = max([end] + [b + self.ticks(RETURN_US) for b in busy])
        if self.legacy:
            args = {"cbid": code, "correlation": c, "external id": ext,
                    "external ts": self.ts(self.ext_tick[ext])}
        else:
            args = {"External id": ext, ("cid" if self.rocm else "cbid"): code, "correlation": c}
            if self.rocm and gpu and gpu.kind == "kernel":
                args.update(kernel=gpu.name, stream="0x0")
        tid = str(self.s.tid) if self.legacy else self.s.tid
        self.dev.append({"ph": "X", "cat": "Runtime" if self.legacy else "cuda_runtime", "name": name,
                         "pid": self.s.pid, "tid": tid, "ts": self.ts(t0), "dur": self.dur(end - t0),
                         "args": args})
        if gpu:
            self.dev.append(self.flow("s", c, t0))
        return end

    def gpu_event(self, g: Gpu, t0, corr, ext):
        cat = {"kernel": ("kernel", "Kernel"), "memcpy": ("gpu_memcpy", "Memcpy"), "memset": ("gpu_memset", "Memset")}
        if self.rocm:
            kind = {"kernel": "Dispatch Kernel", "memcpy": g.name[7:11], "memset": "Memset"}[g.kind]
            args = {"device": 0, "stream": g.stream, "correlation": corr, "kind": kind}
        else:
            args = {"queued": 0} if g.kind == "kernel" else {}
            args.update({"device": 0, "context": 1, "stream": g.stream, "correlation": corr})
        args = {"External id": ext, **args} if not self.legacy else {**args, "external id": ext}
        if not self.rocm:
            args.update(g.extra)
        tid = f"stream {g.stream}" if self.legacy else g.stream
        return {"ph": "X", "cat": cat[g.kind][self.legacy], "name": g.name, "pid": 0, "tid": tid,
                "ts": self.ts(t0), "dur": self.dur(g.ticks), "args": args}

    def flow(self, ph, corr, tick, stream=None):
        pid, tid = (self.s.pid, self.s.tid) if ph == "s" else (0, f"stream {stream}" if self.legacy else stream)
        cat = "async" if self.legacy else "ac2g"
        ev = {"ph": ph, "id": corr, "pid": pid, "tid": tid, "ts": self.ts(tick), "cat": cat,
              "name": "launch" if self.legacy else "ac2g"}
        return {**ev, "bp": "e"} if ph == "f" else ev

    def kernel_extra(self):
        grid = self.rng.choice([1, 8, 64, 256, 1024])
        return {"registers per thread": self.rng.choice([32, 64, 96, 128]),
                "shared memory": self.rng.choice([0, 4096, 16384]),
                "blocks per SM": round(grid / 80, 6), "warps per SM": round(grid * 8 / 80, 6),
                "grid": [grid, 1, 1], "block": [256, 1, 1], "est. achieved occupancy %": min(100, grid // 8)}

    # -- one step ------------------------------------------------------------------------------
    def compute_op(self, st: StepSpec, j: int) -> Act:
        """The j-th forward/backward op: gemm ops first, then tensor-core convs, elementwise ops
        and kernel-less view ops (plan() shuffles them). Kernel j is tensor-core iff j < tc."""
        tc, major = j < st.tensor_core_kernels, self.s.compute_major
        if j < st.gemm_ops:
            names = ("aten::mm",) if j % 2 == 0 else ("aten::linear", "aten::addmm")
            sgemm = f"{'maxwell' if major < 7 else 'volta' if major == 7 else 'ampere'}_sgemm_128x64_nn"
            kname = ROCM_GEMM[tc] if self.rocm else TC_GEMM[min(max(major, 7), 9)] if tc else sgemm
        elif tc:
            names = ("aten::conv2d", "aten::convolution")
            kname = ROCM_GEMM[True] if self.rocm else TC_CONV[7 if major <= 7 else 8]
        elif j < st.kernels:
            top, child, kname = ELEMENTWISE[j % len(ELEMENTWISE)]
            names = (top, child) if child else (top,)
            if st.compiled:
                kname = f"triton_poi_fused_{top[6:].rstrip('_')}_{j}"
        else:
            names = ("aten::reshape", "aten::view")
        if j >= st.kernels or not self.gpu:
            return Act(names)
        kernel = Gpu("kernel", kname, self.stream, self.ticks(st.kernel_us), self.kernel_extra())
        return Act(names, "launch", kernel, tag="tc" if tc else "compute")

    def plan(self, st: StepSpec) -> list[Act]:
        """The step's host actions in issue order."""
        if st.tensor_core_kernels > st.kernels:
            raise ValueError("tensor_core_kernels > kernels")
        compute = [self.compute_op(st, j) for j in range(max(st.kernels, st.gemm_ops, MIN_OPS))]
        self.rng.shuffle(compute)
        item_ops = ("aten::item", "aten::_local_scalar_dense")
        if not self.gpu:
            return compute + [Act(item_ops, tag="cpu_item")] * st.item_syncs

        def copy(key, us, nbytes):
            name = "Memset (Device)" if key == "memset" else MEMCPY_NAMES[key][self.rocm]
            ticks = self.ticks(us)
            return Gpu("memset" if key == "memset" else "memcpy", name, self.stream, ticks,
                       {"bytes": nbytes, "memory bandwidth (GB/s)": nbytes / (ticks * self.q) / 1e3})

        to_ops = ("aten::to", "aten::_to_copy", "aten::copy_")
        nccl = Gpu("kernel", NCCL_KERNEL, self.nccl_stream, self.ticks(st.nccl_us), self.kernel_extra())
        sync = Act((), "sync", block="device" if self.rocm else "stream", tag="sync")
        for k in range(st.syncs, 0, -1):  # spread through the compute phase, the last right after it
            compute.insert(k * len(compute) // st.syncs, sync)
        collectives = [Act(("nccl:all_reduce",), "launch", nccl, tag="nccl")] * st.nccl_kernels
        if st.backward:
            half = len(compute) // 2
            node = lambda a: a._replace(names=(BACKWARD_NODE + "MulBackward0", "MulBackward0") + a.names)  # noqa: E731
            compute = compute[:half] + [node(a) if a.tag != "sync" else a for a in compute[half:]]
            if st.nccl_in_backward and st.nccl_kernels:
                hook = (BACKWARD_NODE + "torch::autograd::AccumulateGrad", "nccl:all_reduce")
                bwd = len(compute) - half
                for j in range(st.nccl_kernels, 0, -1):   # after backward op j * bwd / n, the last after all
                    compute.insert(half + j * bwd // st.nccl_kernels, Act(hook, "launch", nccl, tag="nccl"))
                collectives = []
        if st.optimizer:
            collectives = collectives + [Act(("Optimizer.step#SGD.step", "aten::_foreach_add_"), "launch",
                                             Gpu("kernel", OPTIMIZER_KERNEL, self.stream, self.ticks(st.kernel_us),
                                                 self.kernel_extra()))]
        return ([Act(to_ops, "memcpy_sync", copy("pageable", PAGEABLE_US, H2D_BYTES), "copy", "pageable",
                     st.copy_type)] * st.pageable_h2d
                + [Act(to_ops, "memcpy", copy("pinned", PINNED_US, H2D_BYTES), tag="pinned",
                       types=st.copy_type)] * st.pinned_h2d
                + [Act((), "free", tag="free")] * st.frees            # e.g. empty_cache()
                + [Act(("aten::empty",), "malloc", tag="malloc")] * st.mallocs
                + [Act(("aten::zero_",), "memset", copy("memset", MEMSET_US, MEMSET_BYTES), tag="memset")] * st.memsets
                + [self.graph(st, g) for g in range(st.graph_launches)]
                + compute
                + collectives
                + [Act(item_ops, "item", copy("dtoh", DTOH_US, DTOH_BYTES), "copy", "sync")] * st.item_syncs)

    def graph(self, st: StepSpec, g: int) -> Act:
        """The g-th graph launch of a step: st.graph_kernels kernels (elementwise, Triton-named
        when compiled) replayed by one cudaGraphLaunch; under COMPILED_OPS when compiled, else
        directly in the step (torch.cuda.graph's replay records no op)."""
        names = [f"triton_poi_fused_graph{g}_{j}" if st.compiled else ELEMENTWISE[j % len(ELEMENTWISE)][2]
                 for j in range(st.graph_kernels)]
        kernels = tuple(Gpu("kernel", n, self.stream, self.ticks(st.kernel_us), self.kernel_extra()) for n in names)
        return Act(COMPILED_OPS if st.compiled else (), "graph", kernels, tag="graph")

    def action(self, t: int, slot: int, act: Act, step_ext: int, step: int) -> int:
        """Lay out one action in [t, t+slot) plus however long it blocks; returns the next tick.
        Ops nest one tick inside each other; the runtime call starts mid-slot."""
        n = len(act.names)
        exts = [self.new_ext(t + 1 + d) for d in range(n)]
        wait = 0
        if act.kind:
            rt0, free_end = t + slot // 2, t + slot - n - 1
            end = self.call(act.kind, rt0, free_end - rt0, exts[-1] if n else step_ext, act.gpu, act.block)
            wait = max(0, end - free_end)
        if act.gpu and not isinstance(act.gpu, Gpu):   # a graph: its kernels run back to back on the step's stream
            self.cur["kernel"] += sum(g.ticks for g in act.gpu)
            self.cur["graph_kernels"] += len(act.gpu)
        elif act.gpu:  # kernels of a step share one stream (NCCL: another), so busy time == sum
            key = {"nccl": "nccl", "tc": "tc"}.get(act.tag, "kernel") if act.gpu.kind == "kernel" else act.gpu.kind
            self.cur[key] += act.gpu.ticks
        for d, (name, ext) in enumerate(zip(act.names, exts)):
            self.op(name, t + 1 + d, t + slot - 1 - d + wait, ext, annotation=name.startswith(("nccl:", "Optimizer.")),
                    types=act.types)
        if act.tag in ("compute", "tc") and self.s.memory_events:
            nbytes = self.rng.choice(MEM_BLOCKS)
            self.memory(t + 1, nbytes, step)
            self.memory(t + slot - 2 + wait, -nbytes, step)
        self.cur["gemm"] += sum(x in ("aten::mm", "aten::addmm") for x in act.names)
        if act.tag in ("sync", "pageable", "malloc", "free"):
            self.cur[act.tag] += 1
        return t + slot + wait

    def step(self, i, st, t0):
        self.cur = dict.fromkeys(("kernel", "tc", "nccl", "memcpy", "memset", "gpu_end", "gemm",
                                  "reserved_changes", "sync", "pageable", "malloc", "free", "graph_kernels"), 0)
        step_ext = self.new_ext(t0)
        t = t0 + 1
        if st.data_wait_us > 0:
            it = "_MultiProcessingDataLoaderIter" if self.s.num_workers > 0 else "_SingleProcessDataLoaderIter"
            dl = self.ticks(st.data_wait_us)
            self.op(f"enumerate(DataLoader)#{it}.__next__", t, t + dl, self.new_ext(t), annotation=True)
            t += dl
        if st.compile_us > 0:
            c = self.ticks(st.compile_us)
            for d, name in enumerate(COMPILE_RANGES):
                self.op(name, t + d, t + c - d, self.new_ext(t + d), annotation=True)
            t += c
        acts = self.plan(st)
        budget = self.ticks(st.cpu_ops_us)
        slot = budget // len(acts)
        if slot < MIN_SLOT_TICKS:
            raise ValueError(f"cpu_ops_us={st.cpu_ops_us} is too small for {len(acts)} host ops")
        for k, act in enumerate(acts):
            t = self.action(t, slot + (budget % len(acts) if k == len(acts) - 1 else 0), act,
                            step_ext if self.s.profiler_steps else 0, i)
        t += self.ticks(self.s.gap_us) + 1
        if self.s.profiler_steps:
            self.op(f"ProfilerStep#{self.s.first_step + i}", t0, t, step_ext, annotation=True)
        return t

    # -- whole trace -------------------------------------------------------------------------
    def run(self):
        rows, t = [], 0  # (start tick, end tick, counters) per step
        for i, st in enumerate(self.s.steps):
            t0 = t + (self.ticks(STEP_GAP_US) if i else 0)
            t = self.step(i, st, t0)
            rows.append((t0, t, self.cur))
        if self.s.end_sync and self.gpu:     # outside every ProfilerStep: it waits for the last step's work
            t = self.call("device_sync", t + 1, 1, 0, block="device")
        self.host.sort(key=lambda e: (e["ts"], -e["dur"]))
        end = max([t] + [c["gpu_end"] for _, _, c in rows])
        events = self.host + self.mem + self.dev + self.metadata() + self.trailer(end)
        doc = {"schemaVersion": 1}
        if not self.legacy:
            doc["deviceProperties"] = [self.device_props()] if self.gpu else []
        if self.s.rank is not None:
            doc["distributedInfo"] = {"backend": "nccl", "rank": self.s.rank, "world_size": self.s.world_size}
        doc["traceEvents"] = events
        if not self.legacy:
            doc["traceName"] = f"/tmp/perfdoctor_synthetic_{self.s.pid}.pt.trace.json"
        if self.s.ns_resolution:
            doc["displayTimeUnit"] = "ns"
        return doc, self.truth(rows, len(events))

    def truth(self, rows, num_events) -> Truth:
        s, q = self.s, self.q
        us = lambda key: [c[key] * q for _, _, c in rows]  # noqa: E731
        count = lambda key: [c[key] for _, _, c in rows]  # noqa: E731
        wall_dev, prev_end = [], 0
        for t0, t1, c in rows:  # device-extended steps, clipped so they do not overlap
            start, end = max(prev_end, t0), max(t1, c["gpu_end"])
            wall_dev.append((end - start) * q)
            prev_end = end
        tc_us = sum(us("tc"))
        return Truth(
            n_steps=len(rows) if s.profiler_steps else 0,
            step_ids=[s.first_step + i for i in range(len(rows))] if s.profiler_steps else [],
            step_start_us=[self.ts(t0) for t0, _, _ in rows],
            step_wall_us=[(t1 - t0) * q for t0, t1, _ in rows], step_wall_device_us=wall_dev,
            data_wait_us=[self.ticks(st.data_wait_us) * q for st in s.steps],
            compile_us=[self.ticks(st.compile_us) * q for st in s.steps],
            kernel_busy_us=[k + c for k, c in zip(us("kernel"), us("tc"))], nccl_busy_us=us("nccl"),
            memcpy_us=us("memcpy"), memset_us=us("memset"), syncs=count("sync"),
            pageable_h2d=[0] * len(rows) if self.rocm else count("pageable"),
            mallocs=count("malloc"), frees=count("free"),
            reserved_changes=[0] * len(rows) if self.legacy else count("reserved_changes"),
            tensor_core_kernel_us=tc_us, kernel_us_total=sum(us("kernel")) + tc_us,
            gemm_op_count=sum(count("gemm")), peak_allocated_bytes=self.peak if s.memory_events else 0,
            host_span_us=(rows[-1][1] - rows[0][0]) * q, num_events=num_events,
            graph_kernels=count("graph_kernels"))

    def device_props(self):
        if self.rocm:
            return {"id": 0, "name": "AMD Instinct MI250X", "totalGlobalMem": 32 << 30, "computeMajor": 9,
                    "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
                    "regsPerBlock": 65536, "warpSize": 64, "sharedMemPerBlock": 65536, "numSms": 110,
                    "maxSharedMemoryPerMultiProcessor": 65536}
        major = self.s.compute_major
        return {"id": 0, "name": GPU_NAMES.get(major, f"NVIDIA GPU sm_{major}0"), "totalGlobalMem": 32 << 30,
                "computeMajor": major, "computeMinor": 0, "maxThreadsPerBlock": 1024,
                "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "regsPerMultiprocessor": 65536,
                "warpSize": 32, "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 98304,
                "numSms": 80, "sharedMemPerBlockOptin": 98304}

    def metadata(self):
        ts, pid, tid = self.ts(0), self.s.pid, self.s.tid
        m = lambda name, p, t, args: {"name": name, "ph": "M", "ts": ts, "pid": p, "tid": t, "args": args}
        out = [m("process_name", pid, 0, {"name": "python"}), m("process_labels", pid, 0, {"labels": "CPU"})]
        if not self.legacy:
            out.append(m("process_sort_index", pid, 0, {"sort_index": pid}))
        if self.gpu:
            out += [m("process_name", 0, 0, {"name": "python"}), m("process_labels", 0, 0, {"labels": "GPU 0"})]
            if not self.legacy:
                out.append(m("process_sort_index", 0, 0, {"sort_index": 5000000 if self.rocm else 16777216}))
            for st in (self.stream, self.nccl_stream):
                out.append(m("thread_name", 0, f"stream {st}" if self.legacy else st, {"name": f"stream {st} "}))
                if not self.legacy:
                    out.append(m("thread_sort_index", 0, st, {"sort_index": st}))
        out.append(m("thread_name", pid, str(tid) if self.legacy else tid, {"name": f"thread {tid} (python)"}))
        if not self.legacy:
            out.append(m("thread_sort_index", pid, tid, {"sort_index": tid}))
        return out

    def trailer(self, end):
        spans = "Traces" if self.legacy else "Spans"
        out = [{"ph": "X", "cat": "Trace", "ts": self.ts(0), "dur": self.dur(end), "pid": spans,
                "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}}]
        if not self.legacy:
            out.append({"name": "process_sort_index", "ph": "M", "ts": self.ts(0), "pid": spans, "tid": 0,
                        "args": {"sort_index": 536870912}})
        return out + [
            {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
             "tid": "Trace PyTorch Profiler", "ts": self.ts(0)},
            {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
             "ts": self.ts(end + self.ticks(10.0))}]


def build(spec: TraceSpec) -> tuple[dict, Truth]:
    """The trace object (always a dict with "traceEvents") and its exact Truth."""
    return _Gen(spec).run()


# -- writing -----------------------------------------------------------------------------------
_encode = json.JSONEncoder(separators=(", ", ": ")).encode


def _kv(d: dict) -> str:
    """'"k": v, ...' on one line."""
    return _encode(d)[1:-1]


def _event_block(e: dict) -> str:
    """Kineto's pretty layout: identity line, time line (ns traces: 3 decimals), args block."""
    head = {k: v for k, v in e.items() if k not in ("ts", "dur", "args")}
    times = ", ".join(f'"{k}": {e[k]:.3f}' if isinstance(e[k], float) else f'"{k}": {e[k]}'
                      for k in ("ts", "dur") if k in e)
    lines = ["    " + part for part in (_kv(head), times) if part]
    if "args" in e:
        body = "\n      " + _kv(e["args"]) + "\n    " if e["args"] else ""
        lines.append('    "args": {' + body + "}")
    return "  {\n" + ",\n".join(lines) + "\n  }"


def render(obj: dict | list, *, indent: bool = True) -> str:
    """The JSON text write() produces for a trace dict or a bare event list."""
    if not indent:
        return json.dumps(obj, separators=(", ", ": "))
    if isinstance(obj, list):
        return "[\n" + ",\n".join(map(_event_block, obj)) + "\n]\n"
    parts = []
    for k, v in obj.items():
        if k == "traceEvents":
            body = "[\n" + ",\n".join(map(_event_block, v)) + "\n  ]"
        elif k == "deviceProperties" and v:
            body = "[\n" + ",\n".join("    {\n      " + _kv(d) + "\n    }" for d in v) + "\n  ]"
        else:
            body = json.dumps(v)
        parts.append(f"  {json.dumps(k)}: {body}")
    return "\n{\n" + ",\n".join(parts) + "\n}\n"


def write(spec: TraceSpec, path, *, gz: bool | None = None, bare_list: bool = False,
          truncate_at: float | None = None, indent: bool = True,
          truncate_gz_stream: bool = False) -> Truth:
    """Write the trace to `path`. truncate_at=f keeps the first fraction f of the JSON bytes
    (compressed afterwards when gz); with truncate_gz_stream=True it cuts the gzip stream instead."""
    obj, truth = build(spec)
    gz = str(path).endswith(".gz") if gz is None else gz
    if truncate_gz_stream and (not gz or truncate_at is None):
        raise ValueError("truncate_gz_stream needs gz and truncate_at")
    data = render(obj["traceEvents"] if bare_list else obj, indent=indent).encode()
    if truncate_at is not None and not truncate_gz_stream:
        data = data[:int(len(data) * truncate_at)]
    if gz:
        data = gzip.compress(data, mtime=0)
        if truncate_gz_stream:
            data = data[:int(len(data) * truncate_at)]
    with open(path, "wb") as f:
        f.write(data)
    return truth
