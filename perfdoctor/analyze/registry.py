"""The metric registry: every metric perfdoctor computes, by name, with unit and meaning.

This is the contract between analysis and everything downstream (verdict, rules, reports, the
JSON schema). Analyzers may only emit registered names (tests enforce it); a metric whose
input is absent from a trace is None ("unknown"), never a made-up number.

Units: share = fraction of wall-clock step time (0..1, summed over the analysed steps);
fraction = a ratio of two other quantities (0..1); ms / us = time; count; per_step = count
per step; bytes; bool; str. The metrics only `perfdoctor run` measures are in registry_run.py.
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
_m("trace.untraced_device", "str", "The device a CPU-platform trace lists in deviceProperties (or, from an older torch without them, the GPUs its process labels name: 'GPU 0-7') though it holds no device activity and no runtime call: recorded without the device's activity (no ProfilerActivity.CUDA), so whether its ops ran there is unknown; None otherwise.")
_m("trace.profiler_options", "str", "The profiler options that add host work to every op, as the trace shows them: record_shapes (its ops' input types, or torch's own record_shapes field), with_stack (python_function frames), profile_memory ([memory] events); None when none.")
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
_m("trace.cut_s", "s", "`perfdoctor run` stopped recording inside the trace's last step, this long after recording "
   "began (its memory budget; the trace header's perfdoctor_cut_s): that step is cut short, its shares hold and its "
   "length does not. None when not cut.")
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
_m("untraced.unnamed_share", "share", "breakdown.other less the untraced time perfdoctor run names: the traced window's conversions of Python lists (calls.convert_traced_share; the steady window's calls.convert_share where the traced steps were not timed). breakdown.other for a trace alone.")
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
_m("input.dataset_class", "str", "Class name of the dataset of the training DataLoader: the one that yielded the most batches with autograd on (a validation loop under no_grad draws with it off), else the most batches ('Subset of X' for a Subset of X; perfdoctor run); None for a trace alone.")
_m("input.per_sample_fetch", "bool", "That loader makes each batch sample by sample: map-style with batch_size set and a dataset without __getitems__, so dataset[i] runs once per sample and default_collate stacks the results (perfdoctor run).")
_m("input.loader_batch_size", "count", "That loader's batch_size (None with batch_size=None or unknown).")
_m("input.loader_workers", "count", "That loader's num_workers (perfdoctor run; None for a trace alone).")
_m("input.worker_start", "str", "How that loader's worker processes started: fork, spawn or forkserver (perfdoctor run; None without workers or for a trace alone). Only forked workers inherit the watch behind input.worker_info_used.")
_m("input.default_collate", "bool", "That loader builds its batches with torch's default_collate (False: the script's own collate_fn).")
_m("input.iterable_replayed", "bool", "Every worker of that loader iterates its own copy of an IterableDataset from the start: two or more forked workers and none called get_worker_info() (analyze/loaderkinds.py). False for a map-style dataset, fewer than two workers, or workers that shard; None when unknown (a trace alone, unless its Python frames show a map-style dataset; an older run; spawned workers).")
_m("input.dataset_kind", "str", "map or iterable: the kind of dataset the script's first iterated DataLoader reads (torch's _DatasetKind, seen by perfdoctor run), else from a trace's Python frames (with_stack=True) of a loader fetching in the trainer: the fetcher calls the Dataset's __getitem__/__getitems__ (map) or its __iter__/__next__ (iterable); None otherwise.")
_m("input.num_workers_zero", "bool", "DataLoader ran with num_workers=0 (_SingleProcessDataLoaderIter); None when unknown.")
_m("input.traced_op_share_of_wait", "fraction", "Share of data-wait time covered by traced CPU ops (transforms, collate) on the trainer thread.")
_m("input.wait_tensor_op_share", "fraction", "Time of the outermost tensor-math ops (aten ops other than collation and copies: stack/cat, to/copy, empty, pin_memory; a sample's indexing and views: select, slice, index, view; random generation) inside the DataLoader's __next__ spans / those spans' time: transforms the trainer computes itself, which run on a GPU as written. None where the spans hold no traced op (workers prepare the batches) (analyze/loaderops.py).")
_m("input.wait_fetch_share", "fraction", "Time of the outermost ops that fetch a stored sample and batch it (select, index, slice, narrow, item; stack, cat, pin_memory) inside the DataLoader's __next__ spans / those spans' time: what stays when every deterministic per-sample step is done ahead of time. None where the spans hold no traced op (analyze/loaderops.py).")
_m("input.wait_threaded_op_share", "fraction", "Time of the outermost ops inside the DataLoader's __next__ spans that intra-op threads split well at a sample's size (convolutions, GEMMs, FFTs) / those spans' time: what a single-threaded worker loses against a trainer that ran its loading on several threads. None where the spans hold no traced op (analyze/loaderops.py).")
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
_m("gpu.idle_while_first_call_share", "share", "Device idle while the host is inside the first call of an op that lasted 1 ms or more and 10 times the median of its later calls (less the long runtime calls' and collectives' idle): one-time setup in the traced window (library handles, lazy initialisation, autotuning), which later steps do not pay and no fix of the step removes.")
_m("gpu.first_call_op", "str", "The op of the longest such first call (gpu.idle_while_first_call_share), or null.")
_m("gpu.first_call_repeat_ratio", "ratio", "That first call's duration over the median of the op's later calls.")
_m("gpu.idle_while_comm_op_share", "share", "Device idle while the host is inside a collective call (c10d::allreduce_, gloo:/nccl: ops, record_param_comms), less gpu.idle_while_long_runtime_share's: collectives a loop issues outside the model, which compiling it or replaying it as a graph leaves.")
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
_m("sync.h2d_copy_per_step", "per_step", "Of sync.per_step: blocking copy calls (cudaMemcpy, hipMemcpyWithStream) that carry a host-to-device copy: the host waits to send data (a .to(device) without non_blocking), not to read a value.")
_m("sync.h2d_copy_exposed_idle_share", "share", "The part of sync.exposed_idle_share whose idle stretches begin in those host-to-device copy calls.")
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
_m("memory.used_fraction_peak", "fraction", "Peak device memory in use / device memory: memory.peak_reserved_fraction where the trace recorded memory, else (`perfdoctor run`) NVML's gpu.memory_used_fraction_peak, which also counts the CUDA context and other processes: an upper bound, for headroom rules (little in use), never for pressure rules.")
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
_m("cpu.small_op_share", "share", "CPU-only traces: time of the outermost eager ops (aten::*, autograd::*) less the own time of the ops in them whose own time (their time less that of the ops directly inside) is 20 us or more, over step time: the ops' dispatch and the time of small ops, which torch.compile removes; an autograd node of five tiny ops is small all through, an aten::linear keeps its addmm's compute (analyze/cpuops.py). None on GPU traces.")
_m("cpu.rnn_small_op_share", "share", "CPU-only traces: the part of cpu.small_op_share an RNN module runs (nn.LSTM, nn.GRU, nn.RNN: the aten::lstm, aten::gru, aten::rnn_tanh, aten::rnn_relu calls and the backward nodes of the ops inside them, by sequence number) / step time: torch.compile leaves them eager (Dynamo graph-breaks on these modules), so PD312 does not count them (analyze/cpuops.py). None on GPU traces.")
_m("cpu.gemm_conv_share", "share", "CPU-only traces: time of the outermost matrix products and convolutions, forward and backward (aten::linear, addmm, mm, bmm, matmul, einsum, conv*, convolution_backward; each counted once where one holds another), outside DataLoader.__next__ (a loader's own transforms with num_workers=0 stay as they are under autocast around the model) / step time: the work 16-bit dot-product instructions shorten under CPU autocast.")
_m("cpu.conv_nd_share", "share", "CPU-only traces: time of the outermost 2-D and 3-D convolutions (aten::conv2d, conv3d and their transposes), and of aten::convolution_backward in the share of the forward convolutions' time they are, outside DataLoader.__next__ / step time: the work the channels_last memory format can speed up or slow down (PD392).")
_m("cpu.compute_share", "share", "CPU-only traces: share.device less cpu.small_op_share (0 at least): the own time of the ops whose own time is 20 us or more, compute rather than dispatch. Half the step or more is compute-bound (PD102); PD117 and PD357 weigh it too, and PD312 leaves it to the un-profiled step.")
_m("cpu.ops_per_step", "per_step", "CPU-only traces: outermost eager ops (aten::*, autograd::*) per step.")
_m("cpu.op_median_us", "us", "CPU-only traces: median duration of those ops (profiled).")
_m("cpu.optimizer_large_op_share", "share", "CPU-only traces: own time of the eager ops of 20 us or more own time inside Optimizer.step's own part (after a closure's last backward pass), as a share of step time: the part of optimizer.step_share that is neither Python nor small ops. None without Optimizer.step annotations.")
_m("cpu.optimizer_op_share", "share", "CPU-only traces: time of the outermost eager ops inside Optimizer.step's own part, as a share of step time: optimizer.step_share less its Python time between ops (which stretches when the thread loses its core). None without Optimizer.step annotations.")
# -- autograd anomaly detection (analyze/anomaly.py; None where the steps run no backward node) --
_m("autograd.anomaly_checked_share", "fraction", "Backward nodes (autograd::engine::evaluate_function events in the steps) followed by the engine's own NaN check of their outputs (an aten::isnan directly inside the evaluate_function, beside the node's event) / all of them: torch.autograd.set_detect_anomaly(True) or detect_anomaly() left on. 0 without anomaly mode.")
_m("autograd.anomaly_check_share", "share", "Time of those NaN checks (aten::isnan, aten::_is_any_true or any, aten::item directly inside a checked node's evaluate_function) / step time: part of what anomaly mode costs; the Python stacks it stores in every forward op are inside the ops' own time and untraced.")
# -- embedding tables' dense gradients (analyze/embeddinggrads.py; CPU traces) --
_m("embedding.dense_backward_share", "share", "Host time of the outermost aten::embedding_dense_backward / _embedding_bag_dense_backward ops (or the embedding_backward holding one) in the steps / step time: the backward pass filling a gradient as large as each table with sparse=False. CPU traces only (None on a GPU); None where the steps run no backward node.")
_m("optimizer.zero_grad_share", "share", "Time inside Optimizer.zero_grad ranges in the steps / step time, CPU traces only: setting gradients to None hands their memory back, and a table-sized gradient's is costly there. None on a GPU (the caching allocator keeps freed memory) and without such ranges.")
# -- rows gathered by advanced indexing (analyze/gathers.py; CPU traces) ----------------------
_m("gather.index_share", "share", "Host time of the outermost aten::index ops and IndexBackward0 backward nodes (autograd::engine::evaluate_function: IndexBackward0, whose index_put_ with accumulate=True adds the rows' gradients back one row at a time on a CPU) in the steps / step time: x[idx] and its backward. CPU traces only (None on a GPU: host time there is the kernels' launch); None where the steps run neither.")
_m("gather.index_backward_share", "share", "The IndexBackward0 nodes' part of gather.index_share (CPU traces; None where it is None).")
# -- a Python loop over the batch's samples (analyze/sampleloop.py; CPU-only traces) ----------
_m("cpu.loop_share", "share", "Host ops (CPU or GPU traces): host time of runs of the step's outermost ops whose names repeat with a period of at most 64 ops, 16 or more times, each period taking a row of a tensor (aten::select/slice/index/narrow, or its backward node): a Python loop over the samples of a batch, from the run's first op to its last, the Python between them included / step time (analyze/sampleloop.py). 0: no such run; None on GPU traces.")
_m("cpu.loop_iterations", "count", "Host ops (CPU or GPU traces): periods (loop iterations) in the longest such run of a step (median over the steps that hold one).")
_m("cpu.loop_ops_per_iteration", "count", "Host ops (CPU or GPU traces): outermost ops in one period of those runs (median over the steps).")
_m("cpu.loop_op_median_us", "us", "Host ops (CPU or GPU traces): median duration of the ops inside those runs (profiled).")
_m("cpu.loop_kept_op_share", "share", "Where such a run was found: time of the outermost ops outside the runs / step time (on a GPU the larger of that and the device's busy time on work not launched from the runs): what vectorising the loop leaves; the rest of the step (the loop, the Python between ops, the autograd engine's untraced set-up and release of the per-sample graph) is what it can at most remove.")
_m("cpu.loop_python_share", "share", "Where such a run was found: time between its ops in gaps of 20 us or more (an op's fixed cost), where about every iteration has one / step time: Python work of the loop's own besides calling its ops (an RL rollout's environment, a tokenizer, numpy), which batching the ops need not remove; a few such gaps in a long run (the thread preempted) count 0.")
_m("rnn.cell_loop_share", "share", "Host ops (CPU or GPU traces): host time of the loop runs that sampleloop.py finds and that call an RNN cell (aten::lstm_cell, gru_cell, rnn_tanh_cell, rnn_relu_cell: nn.LSTMCell and its kind) once a period, and of the backward runs of theirs (matched by sequence number), first op's start to last op's end / step time: a Python loop over a recurrence's time steps (analyze/cellloops.py), not counted in cpu.loop_share. None where no run calls a cell.")
_m("rnn.cell_loop_kept_share", "share", "Where such a loop was found: time of the steps' outermost ops outside the loop and its backward nodes / step time (on a GPU the larger of that and the device's busy time on work not launched from them): what replacing the loop with the fused module leaves at the least (the untraced time between ops goes with the loop).")
_m("rnn.cell_loop_iterations", "count", "Host ops: periods (time steps) in a forward loop run that calls an RNN cell (median over those runs).")
_m("tensorloop.share", "share", "Host ops (CPU or GPU traces): host time of runs of the step's outermost ops, outside Optimizer.step/zero_grad and DataLoader batches, whose names repeat with a short period 16 or more times, each period holding an in-place op and every op elementwise arithmetic or a copy (mul_, add_, lerp_, copy_, ...): a Python loop updating tensors one at a time (a weights' EMA, a target network's soft update, a hand-written SGD step), from the run's first op to its last / step time (analyze/tensorloops.py). 0: no such run.")
_m("tensorloop.gap_share", "share", "Host ops: the time between those runs' ops (the loop's Python per tensor) / step time.")
_m("tensorloop.tensors", "count", "Host ops: periods (tensors updated) in the longest such run of a step (median over the steps that hold one).")
_m("tensorloop.ops_per_tensor", "count", "Host ops: ops in one period of those runs (median over the steps).")
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
_m("attention.manual_per_step", "per_step", "Hand-written attention per step (matmul, softmax, matmul among a thread's outermost ops; analyze/attention.py): forward or backward passes, whichever the window shows more of; 0 where those passes are SDPA's math path backward (attention.math_kernel_share).")
_m("attention.manual_cpu_share", "share", "CPU traces: host time of the hand-written attention (each match's first op start to last op end, forward and backward: its ops and the Python between them) / step time; None off the CPU.")
_m("attention.manual_cpu_gemm_share", "share", "CPU traces: the part of attention.manual_cpu_share in its matmul ops (outermost aten::matmul/bmm and BmmBackward nodes inside the matches) / step time; None off the CPU.")
_m("attention.math_cpu_share", "share", "CPU traces: host time of scaled_dot_product_attention's unfused math path (taken on the CPU whenever dropout is on): its aten::_scaled_dot_product_attention_math ops and its backward nodes (matmul, softmax and their views, first to last) / step time; 0 without it, None off the CPU.")
_m("attention.math_cpu_gemm_share", "share", "CPU traces: the part of attention.math_cpu_share in its matmuls (outermost matmul/bmm inside the math ops, BmmBackward nodes in its backward) / step time.")
_m("attention.manual_kernel_share", "share", "Device time of kernels launched by hand-written attention (forward and backward) / step time; None on CPU.")
_m("attention.manual_gemm_share", "share", "The part of attention.manual_kernel_share in GEMM kernels (the matmuls a fused attention kernel still computes; the rest it removes); None on CPU.")
_m("attention.math_kernel_share", "share", "Device time of the kernels of SDPA's math path / step time: those launched inside aten::_scaled_dot_product_attention_math (and the copies and fills they need), and its backward, the autograd nodes of the ops it decomposes into (matched as hand-written backward passes where no hand-written forward is); each direction counted as often as the other where the window cut a step's worth of one (analyze/attention.py).")
_m("attention.math_gemm_share", "share", "The part of attention.math_kernel_share in GEMM kernels; None on CPU.")
_m("attention.gemm_half_speedup", "ratio", "How much faster the attention's GEMM work (hand-written and SDPA's math path) runs in a bf16/fp16 fused kernel: fp32 and TF32 GEMM time at the GPU's damped peak ratio to half precision (precision.py's r**0.8), half unchanged; None without such GEMMs, or with fp32/TF32 ones on a GPU whose ratios are unknown.")
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

def names() -> list[str]:
    return list(REGISTRY)


def check(values: dict) -> None:
    unknown = set(values) - set(REGISTRY)
    if unknown:
        raise KeyError(f"unregistered metrics: {sorted(unknown)}")


# the metrics of `perfdoctor run` (after check and _m: that module imports this one's _m)
from perfdoctor.analyze import registry_run  # noqa: E402,F401
