"""A kineto (torch.profiler) trace built event by event, for tests that need exact device work:
host ops on given threads, kernel launches whose kernels run back to back on one stream, and
ProfilerStep spans; written with an H100's deviceProperties."""

from __future__ import annotations

import json


class HandTrace:
    def __init__(self):
        self.events: list[dict] = []
        self.corr = 0                  # the last launch's correlation id
        self.device_free = 0.0         # when the stream has run every kernel launched so far

    def op(self, tid: int, ts: float, name: str, dur: float, ext: int | None = None, args: dict | None = None) -> None:
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                            "args": ({} if ext is None else {"External id": ext}) | (args or {})})

    def launch(self, tid: int, ts: float, kernel: str, kernel_us: float, cat: str = "kernel") -> None:
        """A 5 us cudaLaunchKernel at ts; its kernel starts when it returns or the stream is free.
        cat="gpu_memcpy": a cudaMemcpyAsync and its copy instead."""
        self.corr += 1
        ids = {"correlation": self.corr, "External id": self.corr}
        api = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": 1, "tid": tid,
                            "ts": ts, "dur": 5.0, "args": ids})
        start = max(self.device_free, ts + 5)
        self.events.append({"ph": "X", "cat": cat, "name": kernel, "pid": 0, "tid": 7, "ts": start,
                            "dur": kernel_us, "args": {**ids, "device": 0, "stream": 7}})
        self.device_free = start + kernel_us

    def block(self, tid: int, ts: float, name: str, dur: float, cat: str = "user_annotation") -> None:
        """A record_function label (user_annotation) or a with_stack Python frame (python_function)."""
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur})

    def step(self, i: int, start: float, end: float) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
                            "ts": start, "dur": end - start})

    def tiny_op_steps(self, steps: int, gaps: int, gap_us: float, fill=None) -> None:
        """Host-bound steps: per step 40 x 25 us ops, each launching a 10 us kernel, with `gaps`
        stretches of gap_us spread between them: untraced (the Python between ops, or a long
        piece of the loop's code), or filled by `fill(self, ts, gap_us)` (a runtime call)."""
        t = 0.0
        for i in range(steps):
            s0 = t
            for j in range(40):
                self.op(1, t, "aten::add", 20.0, ext=self.corr + 1)
                self.launch(1, t + 5, "void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>", 10.0)
                t += 25.0
                if j % (40 // gaps) == 0:
                    if fill is not None:
                        fill(self, t, gap_us)
                    t += gap_us
            self.step(i, s0, t)

    def write(self, path) -> None:
        doc = {"traceEvents": self.events, "deviceProperties": [
            {"id": 0, "name": "NVIDIA H100", "computeMajor": 9, "computeMinor": 0, "totalGlobalMem": 80e9}]}
        path.write_text(json.dumps(doc))
