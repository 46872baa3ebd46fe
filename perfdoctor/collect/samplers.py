"""System sampling for `perfdoctor run`: the trainer, its loader workers, the machine, the GPUs.

`SystemSampler(root_pid, interval=0.5)` samples in a background thread while the user's script
runs. Each sample is a JSON-serialisable dict:

    t          seconds since start() (monotonic clock); unix: wall-clock time (to align with traces)
    cost_s     CPU seconds the sampler thread spent taking this sample (its own overhead)
    trainer    process dict for root_pid (None once it is gone)
    workers    process dicts of DataLoader workers (python processes descending from the trainer)
    helpers    process dicts of the other descendants (role 'forkserver', 'helper', 'other')
    system     machine-wide CPU, iowait, load, PSI, disk and RAM counters
    gpu        list of per-device dicts from NVML, or None when NVML is unavailable

A process dict holds: pid, ppid, role ('trainer', 'worker', 'forkserver', 'helper', 'other'),
name, create_time, cpu_percent (100 = one full core, over the previous interval; None on the
first sight of a process: there is no interval yet), state ('running', 'sleeping',
'disk-sleep', ... as psutil names /proc states; the state of the main thread), num_threads,
read_bytes (cumulative bytes the process caused to be fetched from storage) and read_chars
(cumulative bytes passed to read()-like calls, page-cache hits, pipes and sockets included)
from /proc/<pid>/io (None when not readable), rss_bytes (resident memory, /proc/<pid>/statm: a
forked worker's pages shared with the trainer count in both), and sched_cpu_s / runq_wait_s: cumulative
seconds on a CPU / waiting in a run queue for one, from /proc/<pid>/task/*/schedstat summed
over the threads (per-thread deltas are accumulated, so exited threads keep their share; a
process with more than MAX_THREADS_READ threads falls back to the main thread's line).
create_time is the process's time since boot on the boot time read as it is first seen
(machine_counters.born): psutil's adds /proc/stat's btime, which Linux truncates to whole
seconds, up to a second early, which made a 3-second worker that spun on a core look 75% busy.
Life counters, cumulative over the process's whole life (from create_time, whether or not it was
sampled then), so that a short run or a short-lived worker is judged over all of its time rather
than by how many point samples landed in it: cpu_life_s (user + system time of all its threads,
/proc/<pid>/stat; sys_life_s the system part), minflt_life (minor page faults), runq_life_s
(run-queue wait of its live threads, schedstat) and blkio_life_s (block-IO delay,
/proc/<pid>/stat field 42: None unless the kernel's delay accounting is on, kernel.task_delayacct=1
or the delayacct boot flag; a note says so).

Sampling is faster while the run is young (YOUNG_INTERVAL for the first YOUNG_S seconds): the
imports, the first steps and a run stopped after a few dozen steps all fall there.

The machine's counters are read by collect/machine_counters.py, the GPUs' by
collect/gpu_counters.py (NVML); this module follows the trainer's process tree.

Unknown values are None, never guessed. Anything that could not be sampled at all is said once
in `notes`.

Cost: children are found through /proc/<pid>/task/<tid>/children (cost grows with the
trainer's process tree, not with the number of processes on the host; psutil's recursive
children() scans every process on the machine), falling back to psutil where the kernel lacks
that file. Each sample records its own CPU cost in cost_s; `overhead()` summarises it.
"""

from __future__ import annotations

import os
import threading
import time

import psutil

from perfdoctor.collect.gpu_counters import GpuCounters
from perfdoctor.collect.machine_counters import MachineCounters, born, read_text

MAX_THREADS_READ = 256                     # per-thread schedstat/children reads per process
YOUNG_S = 10.0                             # the run's first seconds ...
YOUNG_INTERVAL = 0.1                       # ... are sampled this often (at most `interval`)
DELAYACCT_NOTE = ("block-IO delay accounting is off on this kernel (kernel.task_delayacct=0): storage waits "
                  "come from the sampled process states, not from per-process IO delay counters")
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

_HELPER_MARKS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker",
                 "compile_worker", "torch._inductor", "multiprocessing.popen_spawn_posix")
_FORKSERVER_MARK = "multiprocessing.forkserver"
_PY_NAMES = ("pt_main_thread", "pt_data_worker", "pt_autograd")


def _is_python(exe: str | None, name: str | None, trainer_exe: str | None) -> bool:
    base = os.path.basename(exe or "")
    if base.startswith(("python", "pypy")) or (exe and exe == trainer_exe):
        return True
    return bool(name) and (name.startswith(("python", "pypy")) or name in _PY_NAMES)


class _Tracked:
    """A psutil.Process kept across samples, with what we accumulate for it."""

    __slots__ = ("proc", "pid", "create_time", "role", "exe", "name", "cmd", "primed",
                 "tid_last", "sched_cpu_ns", "runq_ns", "sched_ok", "ppid", "life_runq_ns")

    def __init__(self, proc: psutil.Process, create_time: float):
        self.proc, self.pid, self.create_time = proc, proc.pid, create_time
        self.role, self.exe, self.name, self.cmd = "other", None, None, ""
        self.primed = False
        self.tid_last: dict[int, tuple[int, int]] = {}
        self.sched_cpu_ns = self.runq_ns = 0
        self.sched_ok = False
        self.ppid = None
        self.life_runq_ns = None


class SystemSampler:
    """Samples the trainer process tree and the machine every `interval` seconds.

    start() primes the counters and starts the thread; stop() returns within about one
    sample's cost (it does not wait out the interval). `samples` and `notes` grow while it
    runs; read them after stop(). `current_pids()` is safe to call from other threads.
    """

    def __init__(self, root_pid: int, interval: float = 0.5):
        self.root_pid = int(root_pid)
        self.interval = float(interval)
        self.samples: list[dict] = []
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tracked: dict[int, _Tracked] = {}
        self._as_worker: set[int] = set()     # pids sampled as workers (_not_a_worker)
        self._t0 = 0.0
        self._latest: list[tuple[int, str]] = []
        self._children_file = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
        self._trainer_exe = None
        self._machine = MachineCounters(self.root_pid, self._note)
        self._gpus = GpuCounters(self._note)
        self._delayacct = _delayacct_on()
        if not self._delayacct:
            self._note(DELAYACCT_NOTE)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "SystemSampler":
        self._t0 = time.monotonic()
        self._machine.start()
        self._gpus.start()
        procs = self._processes()            # prime cpu_percent on everything alive now
        self._latest = [(p["pid"], p["role"]) for p in procs if p["role"] in ("trainer", "worker")]
        self._thread = threading.Thread(target=self._run, name="perfdoctor-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval)
        self._gpus.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def current_pids(self) -> list[tuple[int, str]]:
        """(pid, role) of the trainer and its workers as of the latest sample."""
        return list(self._latest)

    def pids(self) -> list[int]:
        """Pids of the trainer and its workers as of the latest sample (current_pids without roles)."""
        return [pid for pid, _ in self._latest]

    def overhead(self) -> dict:
        """The sampler's own CPU cost: mean CPU seconds per sample and as a fraction of one core."""
        costs = [s["cost_s"] for s in self.samples]
        if not costs:
            return {"samples": 0, "cpu_s_per_sample": None, "core_fraction": None}
        mean = sum(costs) / len(costs)
        return {"samples": len(costs), "cpu_s_per_sample": mean,
                "core_fraction": mean / self.interval}

    def _interval(self) -> float:
        young = time.monotonic() - self._t0 < YOUNG_S
        return min(self.interval, YOUNG_INTERVAL) if young else self.interval

    def _run(self) -> None:
        next_t = time.monotonic() + self._interval()
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            c0 = time.thread_time()
            try:
                s = self._sample()
            except Exception as e:  # noqa: BLE001 - a sampler bug must not kill the user's run
                self._note(f"system sampler stopped after an error: {type(e).__name__}: {e}")
                return
            s["cost_s"] = round(time.thread_time() - c0, 6)
            self.samples.append(s)
            next_t += self._interval()
            if next_t < time.monotonic():    # fell behind (suspended VM, huge tree): skip ahead
                next_t = time.monotonic() + self._interval()

    def _note(self, msg: str) -> None:
        if msg not in self.notes:
            self.notes.append(msg)

    # -- one sample ------------------------------------------------------------------------
    def _sample(self) -> dict:
        procs = self._processes()
        trainer = next((p for p in procs if p["role"] == "trainer"), None)
        workers = [p for p in procs if p["role"] == "worker"]
        helpers = [p for p in procs if p["role"] not in ("trainer", "worker")]
        self._latest = [(p["pid"], p["role"]) for p in ([trainer] if trainer else []) + workers]
        return {"t": round(time.monotonic() - self._t0, 4), "unix": round(time.time(), 3),
                "trainer": trainer, "workers": workers, "helpers": helpers,
                "system": self._machine.sample(), "gpu": self._gpus.sample()}

    def _processes(self) -> list[dict]:
        """Walk the tree from root_pid; sample every live process in it."""
        out: list[dict] = []
        seen: set[int] = set()
        stack: list[tuple[int, int | None, str | None]] = [(self.root_pid, None, None)]
        while stack:
            pid, ppid, parent_role = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            tr = self._track(pid)
            if tr is None:
                continue
            if ppid is not None:
                tr.ppid = ppid
            d, kids = self._proc(tr, parent_role)
            if d is not None:
                out.append(d)
            stack.extend((k, pid, tr.role) for k in kids)
        for pid in list(self._tracked):
            if pid not in seen:
                del self._tracked[pid]       # gone: drop its psutil.Process
        return out

    def _track(self, pid: int) -> _Tracked | None:
        tr = self._tracked.get(pid)
        try:
            if tr is not None:
                # kept across samples: psutil's cpu_percent needs the previous reading. (A pid
                # freed and reused inside our own tree within one interval would be mistaken
                # for the old process; with pid_max in the millions this is not guarded.)
                return tr
            p = psutil.Process(pid)
            tr = _Tracked(p, born(p))
            tr.ppid = p.ppid()
            self._tracked[pid] = tr
            return tr
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def _classify(self, tr: _Tracked, parent_role: str | None) -> None:
        p = tr.proc
        try:
            exe = p.exe()
        except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
            exe = None
        # A child caught between fork and exec looks like the trainer (its command line too) and
        # exec may keep the executable (python starting python -c ...): the command line tells.
        try:
            cmd = " ".join(p.cmdline())
        except (psutil.AccessDenied, psutil.ZombieProcess):
            cmd = None
        if tr.name is not None and exe == tr.exe and cmd in (None, tr.cmd) and tr.primed:
            return                            # unchanged since last look (no exec happened)
        tr.exe = exe
        try:
            tr.name = p.name()
        except (psutil.AccessDenied, psutil.ZombieProcess):
            tr.name = tr.name or "?"
        tr.cmd = cmd if cmd is not None else tr.cmd
        if tr.pid == self.root_pid:
            tr.role = "trainer"
            self._trainer_exe = exe
        elif not _is_python(exe, tr.name, self._trainer_exe):
            tr.role = "other"                 # shell, nvidia-smi, ldconfig, compilers ...
        elif _FORKSERVER_MARK in tr.cmd:
            # forkserver children are forked from it and keep its command line
            tr.role = "worker" if parent_role == "forkserver" else "forkserver"
        elif any(m in tr.cmd for m in _HELPER_MARKS):
            tr.role = "helper"
        else:
            tr.role = "worker"

    def _proc(self, tr: _Tracked, parent_role: str | None) -> tuple[dict | None, list[int]]:
        p = tr.proc
        try:
            with p.oneshot():
                status = p.status()
                if status == psutil.STATUS_ZOMBIE:
                    # exited, not yet reaped: it does no work, and its executable and command
                    # line are gone, so a first look (a pid not seen before) would read a helper
                    # as a worker by its name alone (a CI run kept one in the workers)
                    return None, []
                self._classify(tr, parent_role)
                # by pid, not by the tracked entry: a sample that misses the process mid-exec, or
                # a read that fails during it, drops the entry, and the new one knows no past role
                if tr.role == "worker":
                    self._as_worker.add(tr.pid)
                elif tr.pid in self._as_worker:
                    self._as_worker.discard(tr.pid)
                    self._not_a_worker(tr.pid, tr.role)
                cpu = p.cpu_percent(None)
                nthreads = p.num_threads()
                try:
                    io = p.io_counters()
                    rb, rc = io.read_bytes, getattr(io, "read_chars", None)
                except (psutil.AccessDenied, AttributeError, NotImplementedError):
                    rb = rc = None
                try:
                    ct = p.cpu_times()
                    cpu_life, sys_life = ct.user + ct.system, ct.system
                except (psutil.AccessDenied, AttributeError):
                    cpu_life = sys_life = None
                try:
                    rss = p.memory_info().rss or None      # 0: the process is exiting (its pages gone)
                except (psutil.AccessDenied, AttributeError):
                    rss = None
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._tracked.pop(tr.pid, None)
            return None, []
        except psutil.AccessDenied:
            return None, []
        kids = self._threads(tr, nthreads)
        d = {"pid": tr.pid, "ppid": tr.ppid, "role": tr.role, "name": tr.name,
             "create_time": tr.create_time,
             "cpu_percent": round(cpu, 2) if tr.primed else None,
             "state": status, "num_threads": nthreads, "read_bytes": rb, "read_chars": rc, "rss_bytes": rss,
             "sched_cpu_s": round(tr.sched_cpu_ns / 1e9, 6) if tr.sched_ok else None,
             "runq_wait_s": round(tr.runq_ns / 1e9, 6) if tr.sched_ok else None,
             "cpu_life_s": round(cpu_life, 3) if cpu_life is not None else None,
             "sys_life_s": round(sys_life, 3) if sys_life is not None else None,
             "runq_life_s": round(tr.life_runq_ns / 1e9, 6) if tr.life_runq_ns is not None else None,
             **_stat_counters(tr.pid, self._delayacct)}
        tr.primed = True
        return d, kids

    def _not_a_worker(self, pid: int, role: str) -> None:
        """A process sampled as a worker turned out, at its exec, to be a helper (the resource
        tracker or forkserver caught between fork and exec, a copy of the trainer until then): the
        samples that counted it as a worker count it as what it is: all of them, not only the
        latest run of them (a sample that missed it mid-exec had ended the walk, and a CI run kept
        the earlier ones as workers)."""
        for s in self.samples:
            moved = [w for w in s["workers"] if w["pid"] == pid]
            if not moved:
                continue
            s["workers"] = [w for w in s["workers"] if w["pid"] != pid]
            s["helpers"] = s["helpers"] + [{**w, "role": role} for w in moved]

    def _threads(self, tr: _Tracked, nthreads: int) -> list[int]:
        """Accumulate schedstat deltas per thread; collect child pids. Returns the children."""
        pid = tr.pid
        base = f"/proc/{pid}/task"
        try:
            tids = [int(t) for t in os.listdir(base)] if nthreads <= MAX_THREADS_READ else [pid]
        except OSError:
            return []
        kids: list[int] = []
        last, new_last = tr.tid_last, {}
        ok = False
        for tid in tids:
            line = read_text(f"{base}/{tid}/schedstat")
            if line:
                parts = line.split()
                if len(parts) >= 2:
                    run, wait = int(parts[0]), int(parts[1])
                    r0, w0 = last.get(tid, (0, 0) if tr.primed else (run, wait))
                    tr.sched_cpu_ns += max(0, run - r0)
                    tr.runq_ns += max(0, wait - w0)
                    new_last[tid] = (run, wait)
                    ok = True
            if self._children_file:
                c = read_text(f"{base}/{tid}/children")
                if c:
                    kids.extend(int(x) for x in c.split())
        if tr.primed is False and ok:
            # first sight: the counters start here; the process's earlier life is not counted
            tr.sched_cpu_ns = tr.runq_ns = 0
        tr.tid_last = new_last
        tr.sched_ok = tr.sched_ok or ok
        tr.life_runq_ns = sum(w for _, w in new_last.values()) if ok else None
        if not self._children_file:
            try:
                kids = [c.pid for c in tr.proc.children(recursive=False)]
            except psutil.Error:
                kids = []
        return kids


def _delayacct_on() -> bool:
    """Whether /proc/<pid>/stat field 42 (delayacct_blkio_ticks) counts anything."""
    v = read_text("/proc/sys/kernel/task_delayacct")
    if v is not None:
        return v.strip() == "1"
    cmdline = read_text("/proc/cmdline") or ""
    return "delayacct" in cmdline.split()


def _stat_counters(pid: int, delayacct: bool) -> dict:
    """From /proc/<pid>/stat, over the process's life: minflt_life (minor page faults: pages the
    kernel mapped in, zeroed, on first touch; field 10) and blkio_life_s (seconds its threads waited
    for block IO, field 42; None without delay accounting)."""
    text = read_text(f"/proc/{pid}/stat")
    fields = text[text.rfind(")") + 2:].split() if text else []      # fields from 3 (state) on

    def field(n: int) -> int | None:
        return int(fields[n - 3]) if len(fields) > n - 3 and fields[n - 3].isdigit() else None
    blkio = field(42) if delayacct else None
    return {"minflt_life": field(10), "blkio_life_s": round(blkio / _CLK_TCK, 3) if blkio is not None else None}
