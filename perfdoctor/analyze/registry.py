"""The metric registry: every metric perfdoctor computes, by name, with unit and meaning.

This is the contract between analysis and everything downstream (verdict, rules, reports, the
JSON schema). Analyzers may only emit registered names (tests enforce it); a metric whose
input is absent from a trace is None ("unknown"), never a made-up number.

Units: share = fraction of wall-clock step time (0..1, summed over the analysed steps);
fraction = a ratio of two other quantities (0..1); ms / us = time; count; per_step = count
per step; bytes; bool; str.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    doc: str


REGISTRY: dict[str, Metric] = {}


def _m(name: str, unit: str, doc: str) -> None:
    assert name not in REGISTRY, name
    REGISTRY[name] = Metric(name, unit, doc)


# -- trace ---------------------------------------------------------------------------------
_m("trace.events", "count", "Events read from the trace (flow arrows excluded).")
_m("trace.platform", "str", "cuda, rocm, mtia or cpu (cpu: no device activity, and no device runtime call inside the steps' ProfilerStep spans; without them, none but syncs and queries; a file with a device's properties cut off before its device events is that device's).")
_m("trace.device_name", "str", "Device model from deviceProperties (None when not recorded).")
_m("trace.untraced_device", "str", "The device a CPU-platform trace lists in deviceProperties though it holds no device activity and no runtime call: recorded without the device's activity (no ProfilerActivity.CUDA), so whether its ops ran there is unknown; None otherwise.")
_m("trace.compute_capability", "version", "CUDA compute capability as major.minor, e.g. 7.0 or 8.6, from deviceProperties; where the trace has none, the lowest capability its kernels were built for (volta_sgemm_...: 7.0; sm80_xmma_...: 8.0; trace.capability_from_kernels). None when unknown or not CUDA.")
_m("trace.capability_from_kernels", "bool", "trace.compute_capability is a floor read from the kernels' names (the trace names no GPU): the part, and so its peak throughput ratios, unknown. False where deviceProperties give it or nothing does; None when not CUDA.")
_m("trace.tensor_cores", "bool", "The GPU has tensor cores: compute capability 7.0 or later, but for the Turing parts built without them (GTX 16xx, MX450/550, small Quadro T parts); None when the capability is unknown or only a floor read from kernel names (the part might be one of those) that no tensor-core kernel in the trace confirms.")
_m("trace.devices_used", "count", "Devices that ran kernels in this trace.")
_m("trace.device_memory_bytes", "bytes", "Total device memory from deviceProperties.")
_m("trace.rank", "count", "Distributed rank from distributedInfo (None for single-process runs).")
_m("trace.world_size", "count", "Distributed world size from distributedInfo.")
_m("trace.clock_early_share", "fraction", "Linked launches whose device work started before the launch call began (more than 1 us: the host/device clock conversion's error), of all linked launches in the trace: over 5% says the host and device clocks disagree (or the timestamps were rewritten), and every share that sets host time against device time is in doubt (analyze/launches.py). None on the CPU or without linked launches.")
_m("trace.windows", "count", "Profiler windows of one process joined into this trace (1: a single window; diagnose/profwindows.py).")
_m("trace.truncated", "bool", "The file ended early (profiler killed mid-write); only parsed events are used, and only "
   "the steps completed before the cut.")
# -- steps ---------------------------------------------------------------------------------
_m("steps.count", "count", "Steps analysed.")
_m("steps.source", "str", "What defined the steps: ProfilerStep, DataLoader iterations, optimizer steps, whole trace.")
_m("steps.time_mean_ms", "ms", "Mean wall-clock step time (device work included).")
_m("steps.time_median_ms", "ms", "Median wall-clock step time.")
_m("steps.time_p90_ms", "ms", "90th percentile step time.")
_m("steps.time_min_ms", "ms", "Fastest step.")
_m("steps.time_max_ms", "ms", "Slowest step.")
_m("steps.time_cv", "fraction", "Coefficient of variation of step time (std / mean).")
# -- breakdown (priority: kernel > memcpy > memset > communication > runtime > data loading > CPU exec > other)
for _role, _doc in (
        ("kernel", "a compute kernel runs on the device"),
        ("memcpy", "a device memory copy runs and no kernel does"),
        ("memset", "a device memset runs and no kernel or copy does"),
        ("communication", "a collective (NCCL/RCCL kernel, or gloo op on CPU runs) runs, not overlapped by compute"),
        ("runtime", "the host is in a CUDA/HIP runtime call (launch, sync, malloc) and the device is idle"),
        ("data_loading", "the host waits for the next batch (DataLoader/DataPipe __next__) and the device is idle"),
        ("cpu_exec", "the host runs traced CPU ops and the device is idle"),
        ("other", "nothing traced runs (untraced Python, waiting) and the device is idle")):
    _m(f"breakdown.{_role}", "share", f"Share of step time in which {_doc}. The eight shares sum to 1.")
# -- the four competing shares behind the verdict (sum to 1) ---------------------------------
_m("share.device", "share", "Device busy: kernels + copies + memsets (on CPU-only runs: the model's traced ops).")
_m("share.input", "share", "Exposed data wait (= breakdown.data_loading).")
_m("share.host", "share", "Host-side idle causes: runtime calls + traced CPU ops + untraced time (CPU-only: runtime + untraced).")
_m("share.communication", "share", "Exposed communication (= breakdown.communication).")
# -- the machine the run used (measured by `perfdoctor run`; None for a trace alone) ---------
_m("machine.cpu_count", "count", "CPU cores usable by the training process.")
_m("machine.physical_cores", "count", "Physical cores among the usable CPUs (hyperthread siblings count once; capped by a cgroup quota); None when the topology is unknown.")
_m("machine.torch_threads", "count", "The trainer's torch intra-op threads (torch.get_num_threads() when the script ended); None for a trace alone.")
_m("machine.cpu_fp16", "bool", "The run's CPU has float16 math instructions (x86 avx512_fp16 or amx_fp16: /proc/cpuinfo, read by the run, collect/cpuflags.py); None for a trace alone, on Arm, or where unknown.")
_m("machine.cpu_bf16", "bool", "The run's CPU has bfloat16 math instructions (x86 avx512_bf16 or amx_bf16, Arm bf16: /proc/cpuinfo, read by the run, collect/cpuflags.py); None for a trace alone or where unknown.")
_m("machine.free_cores", "count", "Cores not busy during the run (cpu_count minus average busy cores).")
_m("machine.ram_free_bytes", "bytes", "Free RAM during the run.")
# -- input pipeline ------------------------------------------------------------------------
_m("input.data_wait_share", "share", "Exposed data wait: share of step time the trainer waits for a batch while the device is idle (= breakdown.data_loading).")
_m("input.data_wait_host_share", "share", "Share of step time the host spends inside DataLoader/DataPipe __next__, overlapped or not.")
_m("input.loader", "str", "single_process, multi_process, datapipe, or None when no loader annotation is traced.")
_m("input.worker_info_used", "bool", "Whether a DataLoader worker called torch.utils.data.get_worker_info() (perfdoctor run; forked workers only): an IterableDataset that does shards its stream. False: no worker did (or the workers were spawned); None for a trace or an older run.")
_m("input.dataset_class", "str", "Class name of the dataset of the DataLoader that yielded the most batches ('Subset of X' for a Subset of X; perfdoctor run); None for a trace alone.")
_m("input.per_sample_fetch", "bool", "That loader makes each batch sample by sample: map-style with batch_size set and a dataset without __getitems__, so dataset[i] runs once per sample and default_collate stacks the results (perfdoctor run).")
_m("input.loader_batch_size", "count", "That loader's batch_size (None with batch_size=None or unknown).")
_m("input.default_collate", "bool", "That loader builds its batches with torch's default_collate (False: the script's own collate_fn).")
_m("input.dataset_kind", "str", "map or iterable: the kind of dataset the script's first iterated DataLoader reads (torch's _DatasetKind, seen by perfdoctor run); None for a trace alone.")
_m("input.num_workers_zero", "bool", "DataLoader ran with num_workers=0 (_SingleProcessDataLoaderIter); None when unknown.")
_m("input.traced_op_share_of_wait", "fraction", "Share of data-wait time covered by traced CPU ops (transforms, collate) on the trainer thread.")
_m("input.wait_tensor_op_share", "fraction", "Time of the outermost tensor-math ops (aten ops other than collation and copies: stack/cat, to/copy, empty, pin_memory; a sample's indexing and views: select, slice, index, view; random generation) inside the DataLoader's __next__ spans / those spans' time: transforms the trainer computes itself, which run on a GPU as written. None where the spans hold no traced op (workers prepare the batches) (analyze/loaderops.py).")
_m("input.wait_top_ops", "str", "The (up to three) tensor-math ops with the most time inside the DataLoader's spans, each with its share of them (at least 5%), e.g. 'aten::stft 74%, aten::mm 11%'; None where none (analyze/loaderops.py).")
# -- device ----------------------------------------------------------------------------------
_m("gpu.kernel_busy_share", "share", "Union of kernel time on all devices / step time (the TensorBoard plugin's GPU utilisation).")
_m("gpu.idle_share", "share", "Share of step time with no kernel, copy or memset on any device.")
_m("gpu.idle_host_wait_share", "share", "Idle time ended by work the host launched only after the device went idle (HTA 'host wait').")
_m("gpu.idle_kernel_wait_share", "share", "Idle gaps shorter than gpu.kernel_wait_threshold_us between device work (launch latency; HTA 'kernel wait').")
_m("gpu.idle_other_share", "share", "Idle time whose next work was launched before the gap began (dependencies, syncs on other streams).")
_m("gpu.kernel_wait_threshold_us", "us", "Gap length (microseconds) below which an idle gap counts as kernel wait.")
_m("gpu.idle_while_data_wait_share", "share", "Device idle while the host waits in DataLoader __next__.")
_m("gpu.idle_while_sync_share", "share", "Device idle while the host is in a synchronising call (one made inside a step's host range).")
_m("gpu.idle_while_runtime_share", "share", "Device idle while the host is in other runtime calls (launches, malloc).")
_m("gpu.idle_while_cpu_ops_share", "share", "Device idle while the host runs traced CPU ops.")
_m("gpu.idle_while_untraced_share", "share", "Device idle while nothing is traced on the host.")
_m("gpu.idle_while_long_untraced_share", "share", "Device idle while nothing is traced on the host, in stretches of 1 ms or more (the loop's own code, e.g. a checkpoint write or logging; not the Python between a model's ops).")
_m("gpu.idle_while_long_runtime_share", "share", "Device idle while the host is in one runtime call (not a sync) for 1 ms or more: allocation, context creation, module loading; not a launch's dispatch cost.")
_m("gpu.kernels_per_step", "per_step", "Kernels per step.")
_m("gpu.kernel_median_us", "us", "Median kernel duration.")
_m("gpu.launch_bound_kernel_fraction", "fraction", "Kernels launched one by one (not replayed from a CUDA/HIP graph) that are shorter than the runtime call that launched them; None when no kernel was launched one by one.")
_m("gpu.graph_kernel_share", "fraction", "Kernels replayed from CUDA/HIP graphs (launched by cudaGraphLaunch/hipGraphLaunch: torch.compile mode=\"reduce-overhead\", torch.cuda.graph, make_graphed_callables) / all kernels joined to their launching call; None when none is joined.")
_m("gpu.graph_launches_per_step", "per_step", "Graph launches (cudaGraphLaunch, hipGraphLaunch) per step.")
# Per device, when one process drives several GPUs (torch.nn.DataParallel; analyze/replicas.py). Busy =
# kernels (collectives excluded), copies and memsets on that device, their union / step time. None
# unless work ran on two devices or more in this process.
_m("gpu.device_busy_max", "share", "Busy share of the busiest device (kernels other than collectives, copies, memsets on it / step time); None with one device.")
_m("gpu.device_busy_min", "share", "Busy share of the least busy device; None with one device.")
_m("gpu.device_busy_mean", "share", "Mean busy share over the devices: the device capacity the step uses (share.device under DataParallel); None with one device.")
_m("gpu.device_imbalance", "fraction", "1 - gpu.device_busy_mean / gpu.device_busy_max: the share of the busiest device's busy time the average device idles (0 = evenly busy); None with one device.")
# -- syncs and copies ------------------------------------------------------------------------
_m("sync.per_step", "per_step", "Host-device synchronisations per step (stream/device/event syncs, blocking memcpy, DtoH copies under item/_local_scalar_dense/nonzero).")
_m("sync.share", "share", "Share of step time the host spends blocked in synchronising calls.")
_m("sync.scalar_dtoh_per_step", "per_step", "DtoH copies issued by aten::item / _local_scalar_dense / nonzero per step.")
_m("sync.exposed_idle_share", "share", "Device idle the syncs expose: idle stretches that begin while the host is blocked in a sync (inside a step's host range) and outlast it, from their start until the host queues work again, less the host's data waits and the allocator calls memory.alloc_idle_share counts.")
_m("memcpy.pageable_h2d_per_step", "per_step", "Host-to-device copies from pageable (unpinned) memory per step.")
_m("memcpy.pageable_h2d_share", "share", "Device time in pageable HtoD copies / step time.")
_m("memcpy.h2d_share", "share", "Device time in all HtoD copies / step time.")
_m("memcpy.h2d_float_share", "fraction", "HtoD copy device time whose source tensor is float32 or float64 / all HtoD copy time (source types from record_shapes=True: the innermost aten::copy_/to/_to_copy holding the copy's launch). None when copies of known source type hold under half of the HtoD copy time (types not recorded).")
_m("memcpy.h2d_uint8_share", "fraction", "HtoD copy device time whose source tensor is 8-bit (uint8, int8, bool) / all HtoD copy time; None as memcpy.h2d_float_share.")
_m("memcpy.h2d_alone_share", "share", "HtoD copy time with no kernel running beside it / step time: copies serialised with compute (one stream), which a side stream's prefetch of the next batch would hide behind the kernels.")
# -- allocator and memory ------------------------------------------------------------------
_m("memory.malloc_per_step", "per_step", "cudaMalloc/hipMalloc calls per steady-state step (the first step is warm-up and excluded when there are 2+).")
_m("memory.free_per_step", "per_step", "cudaFree/hipFree calls per steady-state step.")
_m("memory.alloc_api_share", "share", "Share of steady-state step time in malloc/free runtime calls.")
_m("memory.alloc_idle_share", "share", "Device idle time while the host is inside cudaMalloc/cudaFree (or the synchronisation an empty_cache makes) / step time: what the allocator costs the step (host API time that overlaps device work costs nothing).")
_m("memory.empty_cache_per_step", "per_step", "Explicit torch.cuda.empty_cache() calls per step: bursts of cudaFree outside any CPU op (the allocator's own frees happen inside the op that allocates).")
_m("memory.events", "count", "[memory] allocator events in the trace (profile_memory=True).")
_m("memory.peak_reserved_bytes", "bytes", "Peak device memory reserved by the caching allocator ([memory] Total Reserved).")
_m("memory.peak_allocated_bytes", "bytes", "Peak device memory allocated to tensors ([memory] Total Allocated).")
_m("memory.reserved_swing", "fraction", "The deepest fall of reserved memory below its running peak over steady-state steps, relative to the peak: memory given back to the driver (cudaFree, empty_cache); growth alone is 0 (warming up). > 0.05 means the allocator keeps releasing and re-acquiring.")
_m("memory.reserved_changes_per_step", "per_step", "Times reserved memory changed per steady-state step.")
_m("memory.peak_reserved_fraction", "fraction", "Peak reserved / device memory.")
# -- tensor cores ----------------------------------------------------------------------------
_m("tensor_core.kernel_share", "fraction", "Tensor-core kernel time / all kernel time.")
_m("tensor_core.eligible_share", "fraction", "GEMM/convolution kernel time (tensor-core eligible) / all kernel time.")
_m("tensor_core.eligible_step_share", "share", "GEMM/convolution kernel time / step time (what mixed precision can speed up).")
# -- activation checkpointing (analyze/recompute.py) ----------------------------------------
_m("recompute.ops_per_step", "per_step", "Module forward ops (linear, conv, norms, activations, attention) run again inside backward nodes: activation checkpointing's recomputation (outermost ops only).")
_m("recompute.share", "share", "What that recomputation takes from the step: kernel time launched from those ops weighted by the device's busy share (GPU), or the ops' own time (CPU).")
# -- intra-op threads (analyze/threads.py; CPU-only traces, None elsewhere) -----------------
_m("threads.splittable_share", "share", "Own time (children excluded) of aten ops lasting at least 50 us / step time: the op work more intra-op threads can split on a CPU-only run.")
# -- small eager ops (analyze/cpuops.py; CPU-only traces, None elsewhere) -------------------
_m("cpu.small_op_share", "share", "CPU-only traces: time of the outermost eager ops (aten::*, autograd::*) that take under 20 us per op they hold (an autograd node of five tiny ops counts as small) / step time: ops whose time is mostly their fixed dispatch cost, which torch.compile removes (analyze/cpuops.py). None on GPU traces.")
_m("cpu.rnn_small_op_share", "share", "CPU-only traces: the part of cpu.small_op_share an RNN module runs (nn.LSTM, nn.GRU, nn.RNN: the aten::lstm, aten::gru, aten::rnn_tanh, aten::rnn_relu calls and the backward nodes of the ops inside them, by sequence number) / step time: torch.compile leaves them eager (Dynamo graph-breaks on these modules), so PD312 does not count them (analyze/cpuops.py). None on GPU traces.")
_m("cpu.ops_per_step", "per_step", "CPU-only traces: outermost eager ops (aten::*, autograd::*) per step.")
_m("cpu.op_median_us", "us", "CPU-only traces: median duration of those ops (profiled).")
_m("cpu.optimizer_large_op_share", "share", "CPU-only traces: time of the outermost eager ops of 20 us or more per op inside Optimizer.step's own part (after a closure's last backward pass), as a share of step time: the part of optimizer.step_share that is neither Python nor small ops. None without Optimizer.step annotations.")
# -- autograd anomaly detection (analyze/anomaly.py; None where the steps run no backward node) --
_m("autograd.anomaly_checked_share", "fraction", "Backward nodes (autograd::engine::evaluate_function events in the steps) followed by the engine's own NaN check of their outputs (an aten::isnan directly inside the evaluate_function, beside the node's event) / all of them: torch.autograd.set_detect_anomaly(True) or detect_anomaly() left on. 0 without anomaly mode.")
_m("autograd.anomaly_check_share", "share", "Time of those NaN checks (aten::isnan, aten::_is_any_true or any, aten::item directly inside a checked node's evaluate_function) / step time: part of what anomaly mode costs; the Python stacks it stores in every forward op are inside the ops' own time and untraced.")
# -- a Python loop over the batch's samples (analyze/sampleloop.py; CPU-only traces) ----------
_m("cpu.loop_share", "share", "Host ops (CPU or GPU traces): host time of runs of the step's outermost ops whose names repeat with a period of at most 64 ops, 16 or more times, each period taking a row of a tensor (aten::select/slice/index/narrow, or its backward node): a Python loop over the samples of a batch, from the run's first op to its last, the Python between them included / step time (analyze/sampleloop.py). 0: no such run; None on GPU traces.")
_m("cpu.loop_iterations", "count", "Host ops (CPU or GPU traces): periods (loop iterations) in the longest such run of a step (median over the steps that hold one).")
_m("cpu.loop_ops_per_iteration", "count", "Host ops (CPU or GPU traces): outermost ops in one period of those runs (median over the steps).")
_m("cpu.loop_op_median_us", "us", "Host ops (CPU or GPU traces): median duration of the ops inside those runs (profiled).")
_m("cpu.loop_kept_op_share", "share", "Where such a run was found: time of the outermost ops outside the runs / step time (on a GPU the larger of that and the device's busy time on work not launched from the runs): what vectorising the loop leaves; the rest of the step (the loop, the Python between ops, the autograd engine's untraced set-up and release of the per-sample graph) is what it can at most remove.")
# -- kernel fusion (analyze/fusion.py; CUDA and ROCm, None elsewhere) ------------------------
_m("fusion.unfused_share", "share", "Kernel time of unfused memory-bound kernels (elementwise, norms, reductions, activations, dropout, indexing; not GEMM, attention, layout, optimizer or compiled ones) / step time, weighted by the device's busy share: what torch.compile's fusion acts on (DataParallel: the busiest replica's).")
_m("fusion.unfused_kernels_per_step", "per_step", "Unfused memory-bound kernels per step.")
_m("fusion.pointwise_share", "share", "The part of fusion.unfused_share in pointwise arithmetic, copies and casts (ATen functor and copy kernels): what fusion folds into the neighbouring kernels; norms, reductions, softmax, dropout and activations keep about a pass each.")
_m("fusion.compiled", "bool", "The steps already run compiled code (Triton kernels or compiled-region ops; on a CPU-only trace the compiled-region ops).")
# -- compilation inside the steps (analyze/compiletime.py) --------------------------------
_m("compile.share", "share", "Host time inside torch.compile's compile ranges (the '(dynamo_timed)' ranges and the chromium-log phases dynamo, entire_frame_compile, backend_compile, inductor_compile...; their union over threads, nested ranges once) / step time: Dynamo and Inductor compiling in the steps, first compiles and recompiles.")
_m("compile.steps", "count", "Steps that hold compile-range time (compile.share's ranges).")
_m("compile.long_steps_share", "share", "The part of compile.share only the trace's long steps hold: in each traced step at least twice the median step, its compile time beyond the median step's / the steps' time. None with fewer than 3 steps or no long one (analyze/longsteps.py long_steps_part).")
_m("compile.long_steps_fraction", "fraction", "compile.long_steps_share's time / the long traced steps' time beyond the median step: 1 when the long steps are recompiles.")
_m("compile.run_share", "share", "Compile time at the run's rate (perfdoctor run): where the run's long steps recur at a period and the trace holds one (loop.long_steps_traced >= 1), the window's compile in every step plus compile.long_steps_fraction of loop.long_steps_share (a recompile every 10 steps under static shapes is 1 traced step in 5, 1 in 10 in the run). None otherwise (analyze/compiletime.py).")
_m("compile.region_ids", "count", "Distinct 'Torch-Compiled Region: F/N' ids (frame F, its N-th compile) run in the steps: compiled versions the steps used; a new one per step is a recompile per step.")
# -- math precision (analyze/precision.py; CUDA only, None elsewhere) ------------------------
_m("precision.gemm_fp32_share", "share", "Kernel time of fp32 GEMM/convolution kernels on the SIMT cores (no tensor cores) / step time.")
_m("precision.gemm_tf32_share", "share", "Kernel time of TF32 tensor-core GEMM/convolution kernels / step time.")
_m("precision.gemm_half_share", "share", "Kernel time of bf16/fp16/fp8/int8 GEMM/convolution kernels / step time.")
_m("precision.gemm_fp64_share", "share", "Kernel time of float64 GEMM/convolution kernels (dgemm, d884gemm, f64f64 cuBLASLt/CUTLASS, <double> templates) / step time.")
_m("precision.attention_fp32_share", "share", "Kernel time of fp32 attention kernels (fmha/flash/memory-efficient in f32) / step time.")
_m("precision.attention_half_share", "share", "Kernel time of bf16/fp16 attention kernels / step time.")
_m("precision.layout_share", "share", "Kernel time of NCHW<->NHWC layout transposes cuDNN adds around NHWC convolutions / step time.")
_m("precision.nchw_norm_share", "share", "Kernel time of batch-norm kernels on NCHW tensors (ATen's per-channel kernels, cuDNN's bn_*_1C11 NCHW kernels; not their channels_last/NHWC versions) / step time: what channels_last speeds up besides removing the layout transposes.")
_m("precision.conv_layout_applies", "bool", "channels_last can reorder the convolutions' tensors: True where the steps run aten::conv2d/conv3d (or their transposes), False where their only convolution ops are 1-D (aten::conv1d: 3-D tensors, which no memory format reorders), None where no convolution op is named or no kernel ran.")
_m("precision.memory_fp32_share", "share", "Kernel time of other fp32 kernels (elementwise, norms, reductions; optimizer excluded) / step time.")
_m("precision.amp_share", "share", "The share of the step mixed precision acts on: fp32/TF32 GEMM, fp32 attention and fp32 memory-bound kernel time (the last scaled by the part of GEMM/attention time still in fp32/TF32: autocast halves those kernels only through their inputs), weighted by the device's busy share (kernel time is on the critical path only where the device is); under DataParallel the busiest replica's kernels, weighted by its busy share (analyze/replicas.py critical_device), as for fusion, recompute and attention shares.")
_m("precision.amp_speedup", "ratio", "Expected speed-up of precision.amp_share under autocast bf16/fp16: peak tensor-core ratios of this GPU generation damped to r**0.8, memory-bound kernels 1.7x.")
_m("precision.amp_speedup_low", "ratio", "Low end of that speed-up (r**0.6, memory-bound kernels unchanged).")
_m("precision.amp_speedup_high", "ratio", "High end of that speed-up (r**0.95, memory-bound 2.0x).")
_m("precision.fp64_share", "share", "Float64 GEMM/convolution kernel time weighted by the device's busy share of the step: what training in float32 shortens (PD357).")
_m("precision.fp64_speedup", "ratio", "Expected speed-up of precision.fp64_share in float32 with TF32 matmuls: the fp64 -> TF32 peak ratio of this GPU generation damped to r**0.8.")
_m("precision.fp64_speedup_low", "ratio", "Low end of that speed-up (r**0.6).")
_m("precision.fp64_speedup_high", "ratio", "High end of that speed-up (r**0.95).")
_m("precision.fp64_speedup_peak", "ratio", "Speed-up of precision.fp64_share at the peak fp64 -> TF32 ratio: the ceiling.")
_m("precision.amp_speedup_peak", "ratio", "Speed-up of precision.amp_share at the peak throughput ratios (memory-bound 2x): the ceiling.")
# -- model-level patterns --------------------------------------------------------------------
_m("attention.math_ops_per_step", "per_step", "aten::_scaled_dot_product_attention_math calls per step (the unfused fallback).")
_m("attention.fused_ops_per_step", "per_step", "Flash / memory-efficient / cuDNN SDPA calls per step.")
_m("attention.manual_per_step", "per_step", "Hand-written attention per step (matmul, softmax, matmul among a thread's outermost ops; analyze/attention.py): forward or backward passes, whichever the window shows more of.")
_m("attention.manual_kernel_share", "share", "Device time of kernels launched by hand-written attention (forward and backward) / step time; None on CPU.")
_m("attention.manual_gemm_share", "share", "The part of attention.manual_kernel_share in GEMM kernels (the matmuls a fused attention kernel still computes; the rest it removes); None on CPU.")
_m("attention.math_kernel_share", "share", "Device time of kernels launched inside math-attention ops / step time.")
_m("parallel.data_parallel", "bool", "torch.nn.DataParallel ran (DataParallel.forward annotations).")
_m("parallel.wrapper", "str", "The data-parallel wrapper whose record_function labels the trace has: 'fully_shard' (FSDP2: FSDP::...), 'FullyShardedDataParallel' (FSDP1: FullyShardedDataParallel.*) or 'DistributedDataParallel' (DistributedDataParallel.forward), FSDP's first; None without any (analyze/patterns.py).")
_m("parallel.replica_compute_share_max", "share", "The busiest device's compute kernels alone (no copies, memsets or collectives: DataParallel's replicate/broadcast, scatter, gather and gradient reduce), their union / step time: about what a DDP step would take on that replica; None with one device.")
_m("parallel.replica_compute_share_mean", "share", "Mean over the devices of that compute-kernel share: the step if DDP evened the replicas' work; None with one device.")
_m("parallel.replica_idle_share", "share", "Under DataParallel on several devices: the union of device busy time over the devices minus their mean busy share (gpu.device_busy_mean): time the replicas idle while the one driving process replicates, scatters, gathers and computes the loss on the first device. share.device is the mean and this share is counted in share.host (analyze/replicas.py); None otherwise.")
_m("optimizer.step_share", "share", "Share of step time inside Optimizer.step annotations (host), after the last backward pass of a closure run inside them (optimizer.closure).")
_m("optimizer.kernels_per_step", "per_step", "Kernels launched inside Optimizer.step per step.")
_m("optimizer.ops_per_step", "per_step", "CPU ops run inside Optimizer.step per step (any depth): a for-loop optimizer runs several per parameter, foreach/fused a handful.")
_m("optimizer.closure", "bool", "A backward pass ran inside Optimizer.step: optimizer.step(closure) (LBFGS, Lightning's automatic optimization). The optimizer.* metrics then count what follows the closure's last backward in each range, the optimizer's own update. None without optimizer annotations.")
_m("optimizer.fused", "bool", "Optimizer kernels are fused / multi-tensor (multi_tensor_apply, fused_*; on the CPU the aten::_fused_*/_foreach_* ops); None without optimizer annotations.")
_m("optimizer.implementation", "str", "Which implementation Optimizer.step ran: 'fused' (fused=True: one kernel or aten::_fused_* op per tensor list), 'foreach' (multi-tensor: a multi_tensor_apply kernel or aten::_foreach_* op per arithmetic step), 'for-loop' (per tensor); None without optimizer annotations or ops inside them.")
_m("optimizer.class", "str", "Class of the optimizer: the first one that stepped (perfdoctor run), or the one most Optimizer.step#<class>.step annotations name (a trace alone).")
_m("optimizer.fused_cpu_speedup", "ratio", "Expected speed-up of the optimizer step on the CPU from its fused implementation (fused=True) over the one that ran (the for-loop, or foreach where optimizer.implementation says so; None where it ran fused), by class (and SGD's momentum, known to perfdoctor run only): measured by bench/bench_fused_cpu.py (analyze/fusedcpu.py). None for classes without a fused CPU version or a measurement.")
_m("optimizer.faster_versions", "str", "What torch offers optimizer.class besides its for-loop update: fused (and foreach: Adam, AdamW, SGD, Adagrad), foreach (RMSprop, NAdam, RAdam, Adamax, Adadelta, ASGD, Rprop), none (LBFGS, SparseAdam); None for a class it does not know (analyze/fusedcpu.py).")
_m("optimizer.fused_cpu_speedup_low", "ratio", "Low end of optimizer.fused_cpu_speedup's range.")
_m("optimizer.fused_cpu_speedup_high", "ratio", "High end of optimizer.fused_cpu_speedup's range.")
_m("gpu.kernel_time_per_step_cv", "fraction", "Variation of kernel time across steady steps (std / mean): varying input sizes keep the kernel count but not the work.")
_m("gpu.kernels_per_step_cv", "fraction", "Variation of kernel count across steady steps (std / mean): shape or control-flow churn.")
# -- the live run's step hooks (perfdoctor run; None for a trace alone) -----------------------
_m("run.steps", "count", "Steps the hooks measured (optimizer steps, or DataLoader iterations without an optimizer).")
_m("run.step_time_ms", "ms", "Steady-state step time: wall time of the steady window (warm-up, prefetch fill, profiled and post-export steps detected and left out; no step inside dropped) / its steps (perfdoctor/stats/steptime.py).")
_m("run.step_time_ci95_ms", "ms", "[low, high]: 95% confidence interval of run.step_time_ms (moving-block bootstrap, blocks of whole burst cycles).")
_m("run.steady_steps", "count", "Steps in the steady window that run.step_time_ms is measured over.")
_m("run.step_time_conclusive", "bool", "The steady window is long enough to tell (>= 10 steps and >= 3 blocks of 2 burst cycles).")
_m("run.step_time_median_ms", "ms", "Median step time over the steady window: a secondary figure (with a bursty loader most steps are short and the median is far below run.step_time_ms).")
_m("run.step_time_p90_ms", "ms", "90th percentile of the steady window's step times (secondary figure).")
_m("run.steps_per_s", "count", "Steps per second: 1 / run.step_time_ms.")
_m("run.data_wait_share", "share", "Time inside DataLoader __next__ / wall time of the steady window (every step of it, not only the traced ones).")
_m("run.runq_share", "share", "Share of the steady steps' wall time the training thread waited in the run queue for a CPU (schedstat): the cost of sharing the cores, with other processes or its own threads.")
_m("run.traced_runq_share", "share", "Share of the profiled steps' wall time the training thread waited in the run queue for a CPU (schedstat): where it is large, other work took the cores during the trace, and that, not the profiler, made the traced steps long.")
_m("run.thread_awake_share", "share", "Share of the steady steps' wall time the training thread was runnable, on a CPU or queued for one: sum(cpu + runq) / sum(dur) (the thread's CPU clock and schedstat). The rest it slept (a wait, a lock, storage, time.sleep): removing the thread's own work (its Python, dispatch) saves at most this. None for runs recorded before the CPU clock was used.")
_m("run.runq_runnable_share", "fraction", "Share of the training thread's runnable time (on a CPU or queued for one) in the steady steps that it spent queued: sum(runq) / sum(cpu + runq) from schedstat. A step's own work took about 1 / (1 - this) as long as it would on cores of its own.")
_m("input.wait_busy_share", "share", "Of the training thread's data wait over the steady window, the share it provably spent awake (on a CPU or queued for one: the loading work itself, or receiving batches from workers) rather than asleep waiting on them: a lower bound from schedstat per step (perfdoctor/analyze/stepwait.py); None without schedstat or with under 1% wait.")
_m("run.all_steps_wait_share", "share", "Time inside DataLoader __next__ / wall time of every measured step, warm-up included: what a run too short for a steady window still measures (perfdoctor/diagnose/live.py).")
_m("run.trace_inflation", "ratio", "Mean traced step (steps.time_mean_ms) / run.step_time_ms, at least 1: how much longer the profiled steps ran than un-profiled ones. A share of the traced step is at most this many times larger in an un-profiled step (the profiler only adds time), so ceilings use share x this (rules/engine.py). None for a trace alone.")
_m("run.profiled_steps", "count", "Steps recorded by torch.profiler (excluded from run.* step statistics).")
_m("run.skipped_optimizer_steps", "count", "Steps whose optimizer step GradScaler skipped (inf/NaN gradients).")
_m("run.outcome", "str", "completed, stopped (by --max-steps/--duration), exit, crashed, interrupted, killed "
   "(a signal ended it before it wrote child.json), no_module (-m named none) or unknown (child.json missing or "
   "damaged, no signal known).")
_m("run.exit_code", "count", "The script's exit code (128+N when signal N killed it).")
_m("run.stopped_early", "bool", "perfdoctor stopped the script (--max-steps / --duration).")
# -- the model's calls per step (perfdoctor run: analyze/loopcalls.py; None for a trace alone) --
_m("loop.model_name", "str", "Class of the module the step calls most often at the outermost level (no other module call running), in one whole step after the step source was chosen.")
_m("loop.model_calls_per_step", "per_step", "How many times that step called loop.model_name at the outermost level: 1 for a batched loop, the batch size for a per-sample loop (model(x[i:i+1])), the micro-batches for gradient accumulation.")
_m("loop.model_call_batch", "count", "The leading dimension of the first tensor argument of those calls (their batch size), the most common one; None when they got no tensor or a 0-d one.")
_m("loop.model_call_batch_share", "fraction", "Share of those calls whose first tensor argument had loop.model_call_batch as its leading dimension.")
_m("loop.model_cpu_autocast", "str", "The dtype torch.autocast(\"cpu\") cast to (\"bfloat16\", \"float16\") while the model ran, in the counted step (loop.model_name); None without CPU autocast (`perfdoctor run` only).")
_m("loop.backward_passes_per_step", "per_step", "Backward passes (and autograd.grad calls) in the step whose module calls were counted: 1 for a per-sample loop that sums its losses, one per micro-batch for gradient accumulation, 0 without training.")
_m("loop.batches_per_step", "per_step", "DataLoader batches per step over the steady window (0 when the loop has no DataLoader).")
_m("loop.extra_batches_excess_share", "share", "Steady steps that drew more DataLoader batches than the usual step (an evaluation every N steps, a second loader): their wall time beyond as many usual steps (the median usual step each) / the steady wall time; 0 when no step did, None without DataLoader batches.")
# -- DataLoader iterator starts (perfdoctor run: analyze/loaderstarts.py; None for a trace or an older run) --
_m("loop.long_steps_share", "share", "Work every N steps (an evaluation, a checkpoint, a log that reads device values): the steady steps in the phases of a period whose steps are mostly long (own time, outside the data wait and the run queue, at least twice the median step's) beyond chance, their wall time beyond the median step's / the steady wall time. 0 when no long steps stand out; None under 10 steps, or when long steps hold a tenth of the time or more at no period the window shows (at random, or a window too short to see one repeat) (perfdoctor/analyze/longsteps.py).")
_m("loop.long_steps_every", "count", "The period over its long phases: 20 = one step in 20 is long.")
_m("loop.long_step_ms", "ms", "Median wall time of the long steps (loop.long_steps_share).")
_m("loop.usual_step_ms", "ms", "Median wall time of the steady steps: the usual step the long ones are measured against.")
_m("loop.long_steps_any_share", "share", "Every steady step at least twice the median step's own time, at a period or not: their wall time beyond the median step's / the steady wall time. Bounds what work only the long steps hold can cost the run where loop.long_steps_share finds no period (too few long steps in the window); None under 10 steps (perfdoctor/analyze/longsteps.py).")
_m("loop.long_steps_traced", "count", "Profiled steps in the long steps' phases (by step number): 0 says the trace's breakdown saw only usual steps; None without a profiled step.")
_m("loop.long_steps_unnamed_share", "share", "loop.long_steps_share less evaluation.share, save.share, logging.share and loader.restart_share: long-step time no measured cause names (a lower bound: those shares can include work in every step).")
_m("loop.peek_share", "share", "Time of DataLoader iterators started for a peek (at most two batches drawn, never run out, then a new iterator of the same loader: next(iter(loader)) before an epoch, or an iterator re-created every step): their start, and the batches they drew in the step where they were dropped (an iterator re-created every step: its start, its shutdown and, with workers, its first batch's wait beyond the usual one) / the steady wall time. None when an iterator called a peek drew again later (two iterators of one loader used in turn).")
_m("loader.kept_pace_ms", "ms", "What one batch takes a worker that makes batches for a kept iterator (or persistent workers): loader.fetch_ms queued for a CPU as the training thread is now, / (1 - run.runq_runnable_share); loader.fetch_wall_ms when the trainer's queueing is unknown. Not the fresh workers' own queueing: they make batches the trainer throws away.")
_m("loop.peek_kept_share", "share", "The part of loop.peek_share that keeping one iterator leaves: for each iterator re-created every step, the batch its kept workers still make for that step, loader.kept_pace_ms / the workers, over the steady wall time. 0 without workers; None when loader.kept_pace_ms is unknown.")
_m("loop.peek_every_step", "share", "The steady steps that start an iterator re-created every step (one found a peek, its batch drawn in an earlier step) / the steady steps: such steps fork the workers, which also slows the rest of the step by an amount not measured.")
_m("loader.persistent_kept_share", "share", "The part of loader.restart_share that persistent workers leave: each new iterator's first batch, made while the trainer waits (loader.kept_pace_ms), and for an iterator dropped before it ran out the prefetch_factor batches per worker that persistent workers make before they take the reset; over the steady wall time. 0 without workers; None when loader.kept_pace_ms is unknown.")
_m("loop.peek_batches", "count", "Batches drawn by those peeks in the steady window and thrown away.")
_m("loader.restart_share", "share", "Time starting DataLoader iterators (each epoch's `for batch in loader`, peeks too) / the steady wall time: inside DataLoader.__iter__, inside the shutdown of the old iterator's workers, and the first batch's wait beyond the usual wait for a batch, and the waits beyond it for the first batch of each other worker in the steps after the start (with workers and persistent_workers=False each start starts the workers again).")
_m("loader.restarting", "bool", "A DataLoader with num_workers > 0 and persistent_workers=False was iterated: each new epoch starts its workers again.")
# -- the model's parameters (perfdoctor run: analyze/params.py; None for a trace or without an optimizer) --
_m("params.count", "count", "Elements of the step-defining optimizer's parameters, at its first step.")
_m("params.fp64_share", "fraction", "Share of those elements in float64 (or complex128): a model in double precision.")
_m("params.half_dtype", "str", "\"bfloat16\" or \"float16\" where that dtype holds at least half of those elements (a model converted with .bfloat16() / .half()); None otherwise.")
# -- what the loader's batches cost to make (perfdoctor run: analyze/loaderfetch.py; None for a trace or an older run) --
_m("loader.fetch_ms", "ms", "Mean time a DataLoader worker took to make one batch (torch's fetcher: __getitem__ per index or __getitems__, then collate_fn), less the time it waited in the run queue for a CPU meanwhile and the time it allocated the shared memory its collate stacks into; the handing over to the trainer (pickling, shared memory) is not in it. Forked workers only; None with num_workers=0 (the trainer's data wait is that time).")
_m("loader.fetch_wall_ms", "ms", "Mean wall time a DataLoader worker took to make one batch, its waits in the run queue for a CPU included (loader.fetch_ms is without them), less its shared-memory allocation: fresh workers' pace, which the batches they make and the trainer throws away slow too (PD355 and PD356 use loader.kept_pace_ms). Forked workers only.")
_m("loader.fetch_share", "ratio", "loader.fetch_ms x the batches the steady steps drew / the steady wall time: what making those batches would cost a trainer that made them itself (num_workers=0), as a share of today's step; above 1, loading needs the workers.")
_m("run.outside_loader_share", "share", "The steady steps' time outside DataLoader.__next__, iterator starts and worker shutdowns / their wall time: the step's own work (forward, backward, optimizer, the loop's Python), its queueing for a CPU included.")
# -- communication ---------------------------------------------------------------------------
_m("comm.share", "share", "Union of collective time / step time.")
_m("comm.exposed_share", "share", "Collective time not overlapped by compute / step time.")
_m("comm.overlap", "fraction", "Collective time overlapped by compute / collective time.")
_m("comm.exposed_reduce_share", "share", "Exposed collective time (the step breakdown's communication) covered by a reducing collective (all_reduce, reduce_scatter, reduce, by kernel or gloo/c10d op name) / step time: the gradient reduction that no_sync() / set_requires_gradient_sync(False) skip, without FSDP's parameter all-gathers or DDP's buffer broadcasts (analyze/comm.py).")
_m("comm.reduce_calls_per_step", "count", "Reducing collectives (all_reduce, reduce_scatter, reduce) per analysed step, one per call: their kernels, else their gloo ops (analyze/comm.py); 0 without any.")
_m("comm.reduce_call_mean_us", "us", "Mean duration of one of those calls; None without any.")
_m("comm.reduce_call_mean_bytes", "bytes", "Mean size of one of those calls (In msg nelems x the dtype's size) where the trace records it on every call; None otherwise (gloo CPU traces).")
_m("comm.launched_in_backward", "fraction", "Share of collective time (kernel durations in the analysed steps) launched while at least a tenth of "
   "its step's backward compute (kernel time launched from autograd engine ops) was still to be launched: collectives issued during "
   "backward, as DDP's bucketed all-reduce and FSDP's reduce-scatter are (the last bucket, issued as backward ends, is not counted), or "
   "before it. Near 0 when gradients are reduced after backward (by hand, in one bucket, at the tail of a compiled graph). None without "
   "collectives, or without backward compute in their steps (analyze/comm.py).")
_m("comm.sync_steps", "count", "Analysed steps that synchronise gradients: those that run an optimizer step (Optimizer.step annotations; "
   "DDP's no_sync() skips the all-reduce and the update together), or without such annotations those that launch collectives. "
   "steps.count / this = micro-batches per synchronisation when each step is one micro-batch. None without collectives.")

# -- across ranks (a multi-rank `perfdoctor run`: analyze/straggler.py) ------------------------
# None for a single process. Wait = exposed collective time per step; busy = step - wait.
_m("ranks.count", "count", "Ranks merged in this report (rank directories found).")
_m("ranks.world_size", "count", "World size the ranks reported (more than ranks.count: some ranks' directories are missing, e.g. other nodes').")
_m("ranks.step_time_spread", "fraction", "(slowest - fastest) / fastest steady-state step time across ranks (synchronous ranks run at one pace: near 0).")
_m("ranks.slowest_rank", "count", "The rank with the most own work per step (busy = step - collective wait): the straggler candidate.")
_m("ranks.fastest_rank", "count", "The rank with the least own work per step.")
_m("ranks.slowest_ratio", "ratio", "Own work per step of the slowest rank / the fastest's: how much slower the straggler is (1 = equal).")
_m("ranks.comm_wait_share_mean", "share", "Mean over ranks of the exposed collective wait / step.")
_m("ranks.network_wait_share", "share", "The smallest collective wait of any rank / step: what every rank waits alike (the transfer itself: network, NCCL/gloo).")
_m("ranks.straggler_wait_share", "share", "Mean over ranks of (its wait - the smallest wait) / step: the time ranks spend waiting for a slower rank.")
_m("ranks.others_wait_share", "share", "Mean over the ranks other than the slowest of (its wait - the smallest wait) / step: how long the ranks that wait for the slowest wait for it (the slowest waits for nobody).")
_m("ranks.straggler_wait_share_max", "share", "The largest (wait - smallest wait) / step of any rank: the fastest rank's wait for the straggler.")
_m("ranks.straggler_consistent", "bool", "The slowest rank is busier than the others step after step over the paired profiled steps: mean difference > 2 standard errors, or busier in so many steps that a one-sided sign test, times the rank count, is at most 5% (2 ranks: 6 of 6).")
_m("ranks.slowest_last_wait_share", "share", "Of the time ranks waited for a slower rank over the paired profiled steps (per step: each rank's own work short of the busiest rank's), the share in steps where the slowest rank (ranks.slowest_rank) was the busiest: near 1 for a rank the others wait for (in every step, or in its long steps only: an evaluation or checkpoint on one rank), about 1/ranks for ranks that take turns. None without paired steps or wait.")
_m("ranks.slowest_last_steps", "count", "Paired profiled steps in which the slowest rank (ranks.slowest_rank) was the busiest.")
_m("ranks.paired_steps", "count", "Profiled steps present in every rank's trace (paired by ProfilerStep number).")
_m("ranks.slowest_runq_excess", "fraction", "Share of the slowest rank's extra own time per profiled step that its step thread spent queued for a CPU core beyond what the other ranks queued per CPU second of its own (schedstat, the step thread's CPU clock): >= 0.5 means CPU contention, unless its extra CPU work alone is a straggler's wait (ranks.slowest_extra_cpu_share); queueing that comes with more work on a host all ranks share is not counted.")
_m("ranks.slowest_extra_cpu_share", "share", "The slowest rank's CPU time per profiled step (its step thread's CPU clock) beyond the other ranks' mean, as a share of its step: the wait its extra work alone costs the others. At least 5% of the step and at least the network wait: a straggler, even where it also queued for a CPU (contention is then not called).")
_m("ranks.slowest_extra_device_ms", "ms", "The slowest rank's compute per traced step (share.device x its traced step: torch's ops on a CPU, kernels and copies on a GPU) beyond the other ranks' mean.")
_m("ranks.slowest_extra_input_ms", "ms", "The slowest rank's data wait per traced step (share.input x its traced step) beyond the other ranks' mean.")
_m("ranks.slowest_extra_host_ms", "ms", "The slowest rank's other host time per traced step (share.host x its traced step: untraced Python, runtime calls) beyond the other ranks' mean.")
_m("ranks.slowest_extra_part", "str", "What most of the slowest rank's extra own work is: device (compute), input (data loading) or host, the part holding at least half of the parts' growth over the other ranks' mean; None when no part does or the parts are unknown.")
_m("ranks.wait_cause", "str", "Why ranks wait in collectives: straggler (one rank consistently slower), contention (the slowest rank waited for a CPU core: oversubscribed host), network (all ranks wait alike), uneven (no rank consistently slower: ranks.slowest_last_wait_share says how much of the wait was for the slowest), none (< 5% of the step), None (no trace: waits unknown).")

# -- system samples (perfdoctor run) ---------------------------------------------------------
# From perfdoctor/analyze/system.py (SystemSampler samples); None for a trace alone. "cores": CPU
# time per wall second (1.0 = one core fully busy); thresholds of input.split: analyze/inputsplit.py.
# Means and shares are over the samples taken during the steps (analyze/windows.py).
_m("system.samples", "count", "System samples taken while the script ran (every ~0.5 s).")
_m("system.sampler_core_fraction", "fraction", "CPU the sampler itself used, as a fraction of one core.")
_m("system.cpu_count", "count", "Logical CPUs of the machine (machine.cpu_count: those usable by the trainer).")
_m("system.cpu_busy_share", "fraction", "Mean busy fraction of the usable cores (all but idle and iowait).")
_m("system.iowait_share", "fraction", "Mean share of CPU time idle with IO outstanding (iowait; per core, so one blocked task on N cores shows at most 1/N).")
_m("system.psi_cpu_some_avg10", "fraction", "Mean of the kernel's PSI cpu 'some' avg10 (share of time runnable tasks waited for a CPU), /100.")
_m("system.psi_io_some_avg10", "fraction", "Mean of the kernel's PSI io 'some' avg10 (share of time some task was stalled on IO), /100.")
_m("system.psi_memory_some_avg10", "fraction", "Mean of the kernel's PSI memory 'some' avg10 (share of time some task was stalled on memory reclaim), /100.")
_m("system.psi_io_some_share", "fraction", "Share of the sampled wall time in which some task was stalled on IO (PSI io 'some' total over the run).")
_m("system.disk_read_mb_s", "MB/s", "Bytes read from the machine's disks per second (all processes; 1 MB = 1e6 bytes).")
_m("system.disk_busy_share", "fraction", "Share of wall time the busiest disk had IO in flight (iostat %util).")
_m("system.ram_available_bytes", "bytes", "Mean available RAM (MemAvailable) while the script ran.")
# From perfdoctor/analyze/memgrowth.py: memory that grows for good over the steady steps (after
# the profiled ones); 0.0 = measured and not growing; None = too few samples or steps to tell.
_m("host.rss_peak_bytes", "bytes", "Peak resident memory (RSS) of the trainer process over the run.")
_m("host.rss_growth_per_step_bytes", "bytes", "Persistent growth of the trainer's resident memory per steady step: least-squares slope over the steady window past its first 10%, x seconds per step; 0.0 unless both halves of the window grow and the fitted growth is >= 64 MiB (one malloc arena).")
_m("loader.workers_rss_growth_per_step_bytes", "bytes", "Persistent growth of the DataLoader workers' resident memory per steady step, each worker judged on its own samples as host.rss_growth_per_step_bytes is, summed (a Dataset that caches what it reads grows in every worker); 0.0 for steps without workers, None when the workers lived too short to judge.")
_m("host.ram_runway_steps", "count", "Steps until the machine's available RAM is used up at the trainer's and the workers' growth together (None without growth).")
_m("gpu.memory_growth_per_step_bytes", "bytes", "Persistent growth of the memory in use on the trainer's GPUs (NVML, other processes included) per steady step; same test as host.rss_growth_per_step_bytes.")
_m("gpu.memory_runway_steps", "count", "Steps until the trainer's GPUs are full at gpu.memory_growth_per_step_bytes (None without growth).")
_m("loader.workers", "count", "Most DataLoader worker processes alive at once (python descendants of the trainer, forkserver and trackers excluded); 0 = num_workers=0. The loader's own num_workers where the 1 s samples saw fewer (workers restarted for short epochs; perfdoctor run).")
_m("loader.worker_cpu_mean", "cores", "Mean CPU use of one worker (1.0 = a full core).")
_m("loader.worker_disk_sleep_share", "fraction", "Share of worker samples in uninterruptible disk sleep (state D: blocked on storage).")
_m("loader.worker_read_mb_s", "MB/s", "Storage reads of all workers together (read_bytes: page-cache hits excluded).")
_m("system.other_cores", "cores", "Cores used by processes other than the trainer and its loader workers during the run (machine busy share x cores - their own CPU): another job on a shared machine.")
_m("loader.worker_runq_wait_mean", "cores", "Mean time one worker waited in the run queue for a CPU per wall second.")
_m("loader.trainer_cpu_mean", "cores", "Mean CPU use of the trainer process (all its threads; 1.0 = a full core).")
_m("loader.trainer_disk_sleep_share", "fraction", "Share of samples in which the trainer's main thread was in disk sleep (state D).")
_m("loader.trainer_read_mb_s", "MB/s", "Storage reads of the trainer process (read_bytes).")
_m("loader.runnable_share", "fraction", "Share of its one thread's time the loader (a worker; with num_workers=0 the trainer's main thread) was runnable: on a CPU or queued for one, from CPU time and run state. >= 0.5: CPU-bound.")
_m("loader.threads_oversubscription", "ratio", "Runnable threads per usable core: (on-CPU + run-queue wait) of trainer and workers per wall second / machine.cpu_count; > 1 means threads queued for CPU.")
_m("gpu.util_mean", "fraction", "Mean NVML GPU utilisation (share of time a kernel ran) of the devices the run used, over the steps (run.sampling says which window); None without NVML.")
_m("gpu.memory_used_fraction_peak", "fraction", "Peak NVML memory used / total on the devices the run used (all processes on them).")
_m("input.split", "str", "What the input pipeline waits on in a live run: cpu, io, other (neither: remote storage, locks), or None (too few samples).")

# -- Python stacks (perfdoctor run: py-spy over the steady steps; analyze/stacks.py) ------------
# Shares of the sampled steady step time on the trainer's main thread; None without stacks.
_m("stacks.steady_steps", "count", "Steady steps the py-spy recording covered (warm-up, profiled and perturbed steps excluded).")
_m("stacks.coverage", "fraction", "Sampled time of the training thread / wall time of the covered steady steps.")
_m("stacks.unread_share", "fraction", "Samples py-spy failed to read / samples taken, for the trainer (from py-spy's "
   "own tally): each failed read's period goes to a neighbouring stack, so any stacks share may be off by this much.")
_m("stacks.checkpoint_share", "share", "Share of steady step time the training thread spends saving checkpoints (torch.save, torch.distributed.checkpoint, safetensors, save_pretrained, save_checkpoint...).")
_m("stacks.checkpoint_interval_steps", "count", "Steady steps per checkpoint save (1 = every step): one save = consecutive checkpoint samples inside one step (no save spans a step end); the median steady time between consecutive saves over the mean steady step, with three saves or more (a save the sampler missed leaves the median alone); otherwise steady steps / saves seen.")
_m("stacks.logging_sync_share", "share", "Share of steady step time in logging code (logging, TensorBoard, wandb, mlflow...) or on the user's lines that read device values (.item(), .cpu(), .tolist(), .numpy()) or run inside an `if step % N` block (a log line's metric; with N = 1 it runs every step).")
_m("stacks.evaluation_share", "share", "Share of steady step time in an evaluation inside the training loop: forward passes or loader fetches under a function named for it (evaluate, validate, test, Lightning's evaluation loop, HF Trainer.evaluate) or under torch's no_grad / inference_mode decorator, with no backward pass in the stack.")
_m("stacks.python_data_share", "share", "Share of steady step time in the user's own code and data libraries (numpy, PIL, random, tokenizers, transforms) outside model, backward, optimizer, DataLoader and checkpoint calls and outside `if step % N` blocks: batches built in the loop (tensor ops called straight from the loop count too).")
_m("stacks.producer_wait_share", "share", "Share of steady step time the training thread waits for a value its own threads or processes make, outside a DataLoader: a thread or process pool's results (Executor.map's iterator, Future.result, as_completed, Pool.map/imap) or a queue's get, called from the user's line. The step records count no data wait for it.")
_m("stacks.waiting_share", "share", "Share of steady step time the training thread blocks on its own line: a sleep, a wait, a join, a lock, a synchronize or barrier call (by the line's source text), or a call into threading/multiprocessing/queue that returns nothing the loop uses (not a producer's results: stacks.producer_wait_share).")
_m("stacks.producer_wait_exposed_share", "share", "stacks.producer_wait_share that the step cannot hide: on a device, at most gpu.idle_share (the trainer may wait on its producers while the device runs the work it queued; only the wait the device spends idle is on the step's path); the whole wait on a CPU or without a device timeline. None without stacks (analyze/stacks.exposed_waits).")
_m("stacks.waiting_exposed_share", "share", "stacks.waiting_share bounded by gpu.idle_share in the same way (a synchronize waits while the device works). None without stacks.")
_m("stacks.own_threads_busy_share", "share", "Share of the steady steps' sampled time in which one of the trainer process's other Python threads (the script's own: not perfdoctor's, not torch's pin-memory thread) runs a stack that is not blocked (no lock, queue, pipe, selector or sleep at its innermost frame; not waiting by its cause): the union over those threads (analyze/gilwait.py). Such a thread holds or wants the GIL the training step needs. None without stacks.")
_m("stacks.gil_wait_share", "share", "Share of the steady step time the training thread waits for the GIL while the loop's own threads run Python: min(stacks.own_threads_busy_share, the training thread's sleep over the steady steps (dur - cpu - runq of the step records) less the waits already named: the DataLoader data wait and the stacks' producer_wait, waiting, checkpoint and logging_sync shares) (analyze/gilwait.py). None on a GPU run (the training thread also sleeps in backward while the autograd device thread works, and in synchronizations), without the thread's CPU clock (run.thread_awake_share) or without stacks.")
_m("stacks.gil_bound_share", "share", "The most of the steady step that moving the loop's own Python threads out of the trainer's process can save: min(stacks.own_threads_busy_share, stacks.gil_wait_share's unnamed sleep plus the training thread's queueing for a core, runq, over the same steps). A thread woken for the GIL queues for a core on a busy machine: a spinning Python thread on 2 cores left the training thread asleep 0.67 of the step and queued 0.16, and moving it to a process sped the step 3.8x, above the sleep's 3.1x (analyze/gilwait.py). None where stacks.gil_wait_share is.")

# -- Checkpoint saves and logging calls (perfdoctor run; analyze/callshares.py) ------------------
# calls.*: timed on the training thread by run (collect/timedcalls.py), None for a trace or an
# older run directory; save.* and logging.*: the larger of the timed and the sampled (stacks) share.
_m("calls.optimizer_share", "share", "Share of steady step time the training thread spent inside optimizer.step() (timed per step by perfdoctor run; calls given a closure are not counted, since the forward and backward passes run inside them). Un-profiled, unlike optimizer.step_share. On a GPU it is the host's launch time, not the update's.")
_m("calls.nograd_share", "share", "Share of the steady wall time the training's model (the module the run's census found called most in a step) spent in calls with grad mode off (torch.no_grad, inference_mode), beyond the median step's such time: an evaluation every N steps that draws no DataLoader batch (timed per step by perfdoctor run, steps.jsonl nograd). A teacher or target network run in every step cancels; a step counts where its excess is at least half the usual step. The time between two such calls in a row (batch slicing, loss.item(): on a GPU the wait for the queued forward) is counted with them. A lower bound: the evaluation's work before its first call and after its last (model.eval(), the last loss.item()) is not timed, nor is an evaluation of another instance (an EMA copy). None when the calls were not timed (a trace alone, an older run) or the steps do not train.")
_m("calls.save_share", "share", "Share of steady step time the training thread spent inside torch.save and safetensors' save_file (timed per step by perfdoctor run).")
_m("calls.save_interval_steps", "count", "Steady steps per step that called torch.save or save_file (1 = every step): the median gap between the numbers of the steps that saved, with two or more; the steady steps over the saves with one. None when no steady step saved.")
_m("calls.log_share", "share", "Share of steady step time the training thread spent inside TensorBoard's SummaryWriter.add_* calls (torch.utils.tensorboard, tensorboardX; timed per step).")
_m("save.share", "share", "Share of steady step time spent saving checkpoints: the larger of calls.save_share (timed) and stacks.checkpoint_share (sampled), each of which sees only part of the savers.")
_m("save.interval_steps", "count", "Steady steps per checkpoint save, from the source save.share was taken from.")
_m("evaluation.nograd_forward_share", "share", "Share of step time an evaluation inside the training loop takes, seen by its no-grad forward ops (matmul/linear/conv without Kineto's sequence number, outside backward and the optimizer step) run between an update (a backward pass) and the next training forward: from the first of them to that forward, less the training's and the DataLoader's work there, so its Python metric work counts too. Not counted: a no-grad forward between the training forward and its backward (a teacher or target network feeding the loss). Counted though not evaluation: a teacher run before the training forward. On a GPU the stretch runs on the device-extended clock: from the device finishing the work launched before it to the later of the next training forward and the device finishing the evaluation's kernels. None without a backward pass (inference) or without sequence numbers (analyze/evalforward.py).")
_m("evaluation.nograd_long_steps_share", "share", "The part of evaluation.nograd_forward_share only the trace's long steps hold: in each traced step at least twice the median step, its no-grad stretch beyond the median step's (a teacher or an evaluation in every step puts as much in each step: not counted) / the steps' time. None with fewer than 3 steps or no long one (analyze/evalforward.py).")
_m("evaluation.nograd_long_steps_fraction", "fraction", "evaluation.nograd_long_steps_share's time / the long traced steps' time beyond the median step: 1 when the long steps are the no-grad evaluation, less when a checkpoint or a log shares them.")
_m("evaluation.nograd_run_share", "share", "evaluation.nograd_forward_share at the run's rate (perfdoctor run): where the trace's long steps hold it and the run measured its long steps (loop.long_steps_traced >= 1), the every-step part at the window's share plus evaluation.nograd_long_steps_fraction of loop.long_steps_share (an evaluation every 10 steps inside a 5-step window is 1 step in 5 there, 1 in 10 in the run); where the run's long steps show no period, of loop.long_steps_any_share instead, at most the window's share; else the window's share. None for a trace alone (analyze/callshares.py).")
_m("evaluation.share", "share", "Share of the steady wall time (for a trace alone: of the traced steps' time) an evaluation (or another loop) inside the training steps costs: the larger of loop.extra_batches_excess_share (steps that drew extra DataLoader batches), stacks.evaluation_share (sampled stacks) the trace's no-grad forward work between an update and the next training forward (evaluation.nograd_run_share under perfdoctor run, at the run's rate; evaluation.nograd_forward_share, the traced window's, for a trace alone) and the run's timed no-grad calls of the model (calls.nograd_share); None where none was measured.")
_m("logging.share", "share", "Share of steady step time spent logging or reading device values: the larger of calls.log_share (timed TensorBoard calls) and stacks.logging_sync_share (sampled).")


def names() -> list[str]:
    return list(REGISTRY)


def check(values: dict) -> None:
    unknown = set(values) - set(REGISTRY)
    if unknown:
        raise KeyError(f"unregistered metrics: {sorted(unknown)}")
