"""How the synthetic traces look: Kineto's (and the 2021 layout's) events, ids, flows, memory
records, device properties and trailer, and the JSON text torch writes them as. tests/tracegen.py
decides what happens in each step; EventWriter turns that into events on one host thread and
its GPU streams, on the integer tick clock the module docstring of tracegen.py describes."""

from __future__ import annotations

import json
import math
import random

from tracespec import (
    GPU_DELAY_US, RETURN_US, RT_US, MEM_BASE, MEM_BLOCKS, RUNTIME, COPY_TYPES, GPU_NAMES,
    TraceSpec, Gpu)


class EventWriter:
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
