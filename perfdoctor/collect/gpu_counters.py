"""NVIDIA GPU counters for the system sampler, through NVML (nvidia-ml-py): utilisation, memory,
SM clock and the processes on each device. Where NVML or a GPU is missing this says so once
(NO_GPU_NOTE) and every sample's `gpu` is None; a counter a device will not give is None
(unknown, never zero).
"""

from __future__ import annotations

from typing import Callable

NO_GPU_NOTE = "no NVIDIA GPU found (NVML unavailable): GPU utilisation not sampled"


class GpuCounters:
    def __init__(self, note: Callable[[str], None]):
        self._note = note
        self._nvml = None
        self._handles: list = []

    def start(self) -> "GpuCounters":
        try:
            import pynvml
            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, driver errors
            self._nvml = None
            self._handles = []
        if self._nvml is None or not self._handles:
            self._note(NO_GPU_NOTE)
            self.close()
        return self

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutdown failure changes nothing we report
                pass
            self._nvml = None

    def sample(self) -> list[dict] | None:
        nv = self._nvml
        if nv is None:
            return None
        out = []
        for i, h in enumerate(self._handles):
            d = {"index": i, "util_percent": None, "mem_util_percent": None, "memory_used_bytes": None,
                 "memory_total_bytes": None, "sm_clock_mhz": None, "pids": None}
            try:
                u = nv.nvmlDeviceGetUtilizationRates(h)
                d["util_percent"], d["mem_util_percent"] = u.gpu, u.memory
            except Exception:  # noqa: BLE001 - leave None: unknown, not zero
                pass
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h)
                d["memory_used_bytes"], d["memory_total_bytes"] = m.used, m.total
            except Exception:  # noqa: BLE001
                pass
            try:
                d["sm_clock_mhz"] = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
            except Exception:  # noqa: BLE001
                pass
            try:
                d["pids"] = [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
            except Exception:  # noqa: BLE001
                pass
            out.append(d)
        return out
