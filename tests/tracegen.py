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

from traceevents import EventWriter, render
from tracespec import (  # noqa: F401 - the names tests use as tracegen.X
    MiB, LAUNCH_US, GPU_DELAY_US, RETURN_US, STEP_GAP_US, RT_US, H2D_BYTES, PAGEABLE_US, PINNED_US,
    DTOH_BYTES, DTOH_US, MEMSET_BYTES, MEMSET_US, MIN_SLOT_TICKS, MIN_OPS, MEM_BASE, MEM_BLOCKS,
    RUNTIME, COMPILED_OPS, COMPILE_RANGES, MEMCPY_NAMES, ELEMENTWISE, COPY_TYPES, NCCL_KERNEL,
    BACKWARD_NODE, OPTIMIZER_KERNEL, ROCM_GEMM, TC_GEMM, TC_CONV, GPU_NAMES, StepSpec, TraceSpec,
    Truth, Gpu, Act)


class _Gen(EventWriter):
    """What each step of the spec does, in order, with the Truth it accumulates."""

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


def build(spec: TraceSpec) -> tuple[dict, Truth]:
    """The trace object (always a dict with "traceEvents") and its exact Truth."""
    return _Gen(spec).run()


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
