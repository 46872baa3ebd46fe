"""The specs, the exact ground truth and the names of the synthetic traces tests/tracegen.py
writes: what a step does (StepSpec), what the trace is (TraceSpec), what it holds (Truth), and the
kernel, runtime and op names copied from the real traces in ../shared/traces."""

from __future__ import annotations

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
