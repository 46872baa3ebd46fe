"""Machine-wide counters for the system sampler: CPU busy and iowait per core, load, PSI
pressure, whole-disk reads, RAM, and what the job may use (CPU affinity, physical cores, cgroup
quota). Read from /proc and /sys; an unreadable value is None, and what could not be read at all
is said once through `note`.

`MachineCounters(root_pid, note).start()` reads the static facts and primes the CPU counters;
each `sample()` returns the `system` dict of one sample (its CPU figures cover the time since
the previous call).
"""

from __future__ import annotations

import os
import time
from typing import Callable

import psutil

PSI_NOTE = "PSI (/proc/pressure/{res}) unavailable on this kernel: {res} pressure not sampled"
_SKIP_DISKS = ("loop", "ram", "zram", "dm-", "md", "sr", "fd")


def read_text(path: str) -> str | None:
    """A /proc or /sys file's text, or None when it cannot be read (unbuffered: one read)."""
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read().decode()
    except OSError:
        return None


class MachineCounters:
    def __init__(self, root_pid: int, note: Callable[[str], None]):
        self.root_pid = root_pid
        self._note = note
        self._prev_cpu = None
        self._psi_missing: set[str] = set()
        self._disks: list[str] | None = None
        self._affinity: list[int] | None = None
        self._quota: float | None = None
        self._physical: int | None = None

    def start(self) -> "MachineCounters":
        try:
            self._affinity = sorted(os.sched_getaffinity(self.root_pid))
        except OSError:
            self._affinity = None
        self._quota = cgroup_cpu_quota(self.root_pid)
        self._physical = physical_cores(self._affinity)
        try:
            self._disks = [d for d in os.listdir("/sys/block") if not d.startswith(_SKIP_DISKS)]
        except OSError:
            self._disks = None
        self._prev_cpu = psutil.cpu_times(percpu=True)
        return self

    def sample(self) -> dict:
        now = psutil.cpu_times(percpu=True)
        per_core, iowait = cpu_deltas(self._prev_cpu, now)
        self._prev_cpu = now
        total = sum(b for b, _ in per_core) / len(per_core) if per_core else None
        usable = None
        if per_core and self._affinity:
            sel = [per_core[i][0] for i in self._affinity if i < len(per_core)]
            usable = sum(sel) / len(sel) if sel else None
        try:
            load = list(os.getloadavg())
        except OSError:
            load = None
        vm = psutil.virtual_memory()
        return {"cpu_count": psutil.cpu_count(),
                "usable_cpus": len(self._affinity) if self._affinity else None,
                "usable_physical_cores": self._physical,
                "cpu_quota_cores": self._quota,
                "cpu_percent": [round(b, 2) for b, _ in per_core] if per_core else None,
                "cpu_total_percent": round(total, 2) if total is not None else None,
                "cpu_usable_percent": round(usable, 2) if usable is not None else None,
                "iowait_percent": round(iowait, 2) if iowait is not None else None,
                "loadavg": load,
                "psi": {res: self._psi(res) for res in ("cpu", "io", "memory")},
                "disk": self._disk(),
                "ram_available_bytes": vm.available, "ram_total_bytes": vm.total}

    def _psi(self, res: str) -> dict | None:
        if res in self._psi_missing:
            return None
        text = read_text(f"/proc/pressure/{res}")
        if text is None:
            self._psi_missing.add(res)
            self._note(PSI_NOTE.format(res=res))
            return None
        for line in text.splitlines():
            if line.startswith("some"):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                return {"some_avg10": float(kv["avg10"]), "some_total_us": int(kv["total"])}
        return None

    def _disk(self) -> dict | None:
        """Whole disks from /proc/diskstats (psutil's reader stats every device in /sys: 5x dearer).

        Fields after the name: reads completed, merged, sectors read (always 512 bytes), ...,
        io_ticks (ms with IO in flight) at index 9 of the counters.
        """
        text = read_text("/proc/diskstats")
        if not text:
            self._note("disk counters (/proc/diskstats) unavailable: storage reads not sampled")
            return None
        keep = set(self._disks) if self._disks is not None else None
        rb = rc = 0
        busy: dict[str, int] = {}
        for line in text.splitlines():
            f = line.split()
            if len(f) < 13:
                continue
            name = f[2]
            if keep is not None and name not in keep:
                continue
            if keep is None and name.startswith(_SKIP_DISKS):
                continue
            rc += int(f[3])
            rb += int(f[5]) * 512
            busy[name] = int(f[12])
        return {"read_bytes": rb, "read_count": rc, "busy_ms": busy}


def cpu_deltas(prev, now) -> tuple[list[tuple[float, float]], float | None]:
    """Per core (busy %, iowait %) since the previous reading, and iowait % of all cores.

    Busy = everything but idle and iowait (psutil's definition); guest time is already inside
    user time on Linux and is not counted twice.
    """
    if not prev or len(prev) != len(now):
        return [], None
    cores, io_sum, tot_sum = [], 0.0, 0.0
    for a, b in zip(prev, now):
        da = {f: getattr(b, f) - getattr(a, f) for f in b._fields}
        total = sum(v for f, v in da.items() if f not in ("guest", "guest_nice"))
        idle = da.get("idle", 0.0) + da.get("iowait", 0.0)
        if total <= 0:
            cores.append((0.0, 0.0))
            continue
        cores.append((max(0.0, 100.0 * (total - idle) / total),
                      100.0 * da.get("iowait", 0.0) / total))
        io_sum += da.get("iowait", 0.0)
        tot_sum += total
    return cores, (100.0 * io_sum / tot_sum if tot_sum > 0 else None)


def physical_cores(cpus: list[int] | None, root: str = "/sys/devices/system/cpu") -> int | None:
    """Distinct physical cores among the logical CPUs `cpus` (hyperthread siblings count once),
    from sysfs topology; None when it cannot be read."""
    if not cpus:
        return None
    cores = set()
    for c in cpus:
        try:
            with open(f"{root}/cpu{c}/topology/core_id") as f:
                core = f.read().strip()
            with open(f"{root}/cpu{c}/topology/physical_package_id") as f:
                package = f.read().strip()
        except OSError:
            return None
        cores.add((package, core))
    return len(cores)


def cgroup_cpu_quota(pid: int) -> float | None:
    """CPU quota of the process's cgroup in cores (cgroup v2 cpu.max or v1 cfs_quota), or None."""
    text = read_text(f"/proc/{pid}/cgroup")
    if not text:
        return None
    for line in text.splitlines():
        _, ctrls, path = line.split(":", 2)
        if ctrls == "":                                       # cgroup v2
            val = read_text(f"/sys/fs/cgroup{path}/cpu.max") or read_text("/sys/fs/cgroup/cpu.max")
            if val:
                q, period = (val.split() + ["100000"])[:2]
                if q != "max":
                    return int(q) / int(period)
        elif "cpu" in ctrls.split(","):                       # cgroup v1
            for root in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
                q = read_text(f"{root}{path}/cpu.cfs_quota_us") or read_text(f"{root}/cpu.cfs_quota_us")
                per = read_text(f"{root}{path}/cpu.cfs_period_us") or read_text(f"{root}/cpu.cfs_period_us")
                if q and per and int(q) > 0:
                    return int(q) / int(per)
    return None


def boot_unix() -> float | None:
    """The boot time as the wall clock stands now: the clock less /proc/uptime, the uptime read
    between two clock reads, the tightest pair of a few tries kept (a read preempted on a loaded
    machine, 0.8 s in a CI run, moved every process's birth that much later). None where
    /proc/uptime cannot be read."""
    try:
        reads = []
        for _ in range(5):
            t0, up, t1 = time.time(), float(read_text("/proc/uptime").split()[0]), time.time()
            reads.append((t1 - t0, (t0 + t1) / 2 - up))
            if t1 - t0 < 0.001:
                break
        return min(reads)[1]
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def boot_fix() -> float:
    """Seconds to add to psutil's create_time: the true boot time (boot_unix) less psutil's
    (btime, whole seconds). 0 where /proc/uptime is missing or the two disagree by more than the
    truncation can explain."""
    boot = boot_unix()
    if boot is None:
        return 0.0
    fix = boot - psutil.boot_time()
    return fix if 0.0 <= fix < 1.0 else 0.0


def born(proc) -> float:
    """A process's start in wall-clock seconds: its time since boot (/proc/<pid>/stat's starttime,
    psutil's create_time(monotonic=True)) after the boot time read now. psutil's create_time adds
    /proc/stat's btime, whole seconds (up to 1 s early), and a correction read once at import went
    stale as the clock moved: a CI's long-lived test process dated a new process 0.29 s early."""
    try:
        since = proc.create_time(monotonic=True)
    except TypeError:                        # psutil before 7: no monotonic create_time
        return proc.create_time() + boot_fix()
    boot = boot_unix()
    return boot + since if boot is not None else proc.create_time()
