"""Python stacks of the trainer and its loader workers: `py-spy record` over the run.

`StackRecorder(pid, out_dir, steps_path)` waits for the first measured step (steps.jsonl gets
its first line: the script has imported torch, built its model and loader), then runs

    py-spy record --pid PID --idle --full-filenames --nonblocking
                  --rate RATE --format chrometrace --duration MAX_S -o out_dir/pyspy-PID.json

for the trainer, and the same for each Python child process (loader workers) it finds, once a
second, up to MAX_CHILDREN: one py-spy per process, because py-spy's own --subprocesses merges
the processes into one chrometrace keyed by thread id, and the main threads of forked workers
share the trainer's thread id (their stacks then alternate in one track, every sample is a full
rewrite, and a one-worker minute came to 76 MB). Each py-spy samples every thread of its process
RATE times a second, idle threads included (--idle: time blocked in a write, a read or a lock
shows, not only CPU time), and writes begin/end events of each Python frame with microsecond
timestamps relative to its start. out_dir/pyspy.meta.json records each start as Unix time (taken
just before py-spy is started; its clock starts before it attaches), so samples line up with the
step records (`end`, `dur` in steps.jsonl) and the analysis keeps the steady steps only
(diagnose/stackfiles.py reads the files back, analyze/stacks.py attributes the samples). --duration bounds the files and the cost on long runs; each py-spy stops by itself
when its process ends. At the end the meta file gets py-spy's own CPU time (its cost).

`perfdoctor run` records stacks by default where they cost the job nothing (auto mode): at the
first step the machine's idle CPU is measured for IDLE_PROBE_S, and py-spy starts only when at
least MIN_IDLE_CORES (half a core: 8x what py-spy takes) per rank on this machine are idle (a
GPU machine's spare cores, usually), following at most AUTO_MAX_CHILDREN loader workers;
otherwise the meta file says `skipped`, and where the step has host time stacks would have named,
the diagnosis notes how to record anyway (`--stacks`).
`--no-stacks` turns it off.

--nonblocking reads the process's memory without pausing it, so the script never stops for a
sample. The price is torn stacks: while Python calls and returns quickly, a read can miss the
innermost frames, and their time goes to the caller's line. Long calls (torch.save, a blocking
read) are not affected; many short calls are: in tests/test_stacks.py about a third of the time
in 300 logging calls per step went to the user's own line (blocking mode: a tenth), which
overstates stacks.python_data_share by up to ~0.1 there (PD352 caps it by the untraced time).

Design: py-spy attaches to the running child rather than launching it. Launched by py-spy
(`py-spy record -- python ...`) the child would need no ptrace permission, but py-spy then
owns it: it returns 0 whatever the script's exit code, and kills the script when sampling
ends, so signals, exit codes and perfdoctor's own child side would all change. Attaching
needs ptrace: root or CAP_SYS_PTRACE, or Yama's kernel.yama.ptrace_scope = 0 (Ubuntu's
default of 1 lets a process trace only its descendants). When it is refused, one note says
so and how to allow it.

py-spy is looked for beside sys.executable (the venv's bin/), in the files of the installed
`py-spy` distribution (its wheel puts the binary in the scripts directory, wherever that is),
in the interpreter's scripts directories, then on PATH. When none is found, a note says so.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

from perfdoctor.collect.steprecord import first_step_recorded

RATE_HZ = 50           # samples per second: 20 ms resolution, ~3% of one core for py-spy (bench_stacks.py)
MAX_S = 120            # record at most this long (from the first step): bounds file size and cost
WAIT_EXIT_S = 15.0     # after the script ends, how long py-spy may take to notice and write
META = "pyspy.meta.json"          # beside pyspy-<pid>.json and pyspy-<pid>.log per process
IDLE_PROBE_S = 1.0                # auto mode: how long idle cores are measured at the first step
# auto mode: py-spy (2-6% of one core: bench_stacks.py) starts only where the machine's idle
# capacity is at least 8x that, half a core: then it runs in the gaps the job leaves
MIN_IDLE_CORES = 0.5
AUTO_MAX_CHILDREN = 2             # auto mode: loader workers recorded (each costs its own py-spy)
MAX_CHILDREN = 8                  # loader workers recorded (each costs its own py-spy)
CHILD_POLL_S = 1.0                # how often new worker processes are looked for

# The trainer is a Python process py-spy was pointed at: "no python processes found" there means
# it could not read the process's memory (py-spy words some refusals that way).
_REFUSED = re.compile(r"permission denied|operation not permitted|\bEPERM\b|ptrace|no python processes found", re.I)
_GONE = re.compile(r"Check that the process is running|No such process")   # py-spy met an exited process


def _ptrace_scope() -> str | None:
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return None


def ptrace_note() -> str:
    scope = _ptrace_scope()
    why = f" (kernel.yama.ptrace_scope = {scope})" if scope not in (None, "0") else ""
    return ("py-spy could not attach to the script: ptrace not permitted" + why + ". Allow it with "
            "`sudo sysctl kernel.yama.ptrace_scope=0`, run as root, or add --cap-add SYS_PTRACE to "
            "docker run; Python stacks skipped")


def no_pyspy_note() -> str:
    return (f"py-spy not found (looked beside {sys.executable}, in the py-spy package and on PATH): "
            "`pip install py-spy` in this environment; Python stacks skipped")


def skipped_note(idle: float | None, cores: int | None, need: float = MIN_IDLE_CORES) -> str:
    got = "unknown" if idle is None else f"{idle:.1f} of {cores}"
    return (f"Python stacks not recorded: no idle CPU for py-spy when the steps began ({got} cores idle, "
            f"{need:g} needed); `--stacks` records them anyway, at ~3% of a busy core")


def _local_ranks() -> int:
    """Processes of this job on this machine (the launcher's local world size; 1 outside one)."""
    from perfdoctor.collect.ranks import identity

    ident = identity()
    return max(1, ident.local_world_size or 1) if ident else 1


def measure_idle_cores(seconds: float) -> tuple[float, int]:
    """(idle cores, cores) over the next `seconds`: the machine's idle CPU time (idle + iowait)
    over wall time, from /proc/stat through psutil."""
    import psutil
    a = psutil.cpu_times()
    t0 = time.monotonic()
    time.sleep(seconds)
    b = psutil.cpu_times()
    wall = time.monotonic() - t0
    idle = (b.idle - a.idle) + (getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0))
    cores = psutil.cpu_count() or 1
    return (min(max(idle / wall, 0.0), float(cores)) if wall > 0 else 0.0), cores


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_py_spy() -> str | None:
    """The py-spy of this Python (beside sys.executable, in the py-spy package's files, in the
    interpreter's scripts directories), else the one on PATH."""
    name = "py-spy.exe" if os.name == "nt" else "py-spy"
    exe = Path(sys.executable)
    places = [exe.parent / name, exe.resolve().parent / name]
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        try:
            dist = distribution("py-spy")
            places += [Path(dist.locate_file(f)) for f in (dist.files or []) if Path(str(f)).name == name]
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover - Python < 3.8
        pass
    for scheme in sysconfig.get_scheme_names():
        if scheme.startswith(("posix", "nt", "osx")):
            try:
                places.append(Path(sysconfig.get_path("scripts", scheme)) / name)
            except KeyError:
                pass
    for p in places:
        if _executable(p):
            return str(p)
    return shutil.which("py-spy")


def py_spy_command(py_spy: str | list[str], pid: int, out: Path, rate: int = RATE_HZ,
                   max_s: float = MAX_S) -> list[str]:
    """py_spy: the binary, or a command prefix that runs it (e.g. under setpriv)."""
    return [*([py_spy] if isinstance(py_spy, str) else py_spy), "record", "--pid", str(pid),
            "--idle", "--full-filenames", "--nonblocking",
            "--rate", str(rate), "--format", "chrometrace", "--duration", str(int(max_s)), "--output", str(out)]


class StackRecorder:
    """Records the run's Python stacks with py-spy; see the module docstring.

    start() returns at once (a thread waits for the first step, then starts one py-spy for the
    trainer and one for each Python child process as it appears); stop() after the script has
    ended lets them finish writing. notes: what could not be done.
    """

    def __init__(self, pid: int, out_dir, steps_path, rate: int = RATE_HZ, max_s: float = MAX_S,
                 py_spy: str | list[str] | None = None, poll: float = 0.1, max_children: int = MAX_CHILDREN,
                 auto: bool = False, idle_cores=None):
        self.pid = int(pid)
        self.out_dir = Path(out_dir)
        self.steps_path = Path(steps_path)
        self.rate, self.max_s, self.poll, self.max_children = int(rate), float(max_s), float(poll), max_children
        self.py_spy = py_spy or find_py_spy()
        self.notes: list[str] = []
        self.procs: dict[int, subprocess.Popen] = {}
        self.meta: dict = {"pid": self.pid, "rate_hz": self.rate, "max_s": self.max_s, "processes": []}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.auto = bool(auto)               # record only when a core is idle (the default of `run`)
        self.idle_cores = idle_cores or measure_idle_cores
        self.need = MIN_IDLE_CORES
        if self.auto:
            # the ranks of a job on this machine decide alone on the same idle cores: each needs its share
            self.need = MIN_IDLE_CORES * _local_ranks()
            self.max_children = min(self.max_children, AUTO_MAX_CHILDREN)
            self.meta.update({"mode": "auto", "idle_cores_needed": self.need})
        if self.py_spy is None:
            self.notes.append(no_pyspy_note())

    @property
    def proc(self) -> subprocess.Popen | None:
        """The trainer's py-spy."""
        return self.procs.get(self.pid)

    def start(self) -> "StackRecorder":
        if self.py_spy is not None:
            self._thread = threading.Thread(target=self._run, name="perfdoctor-stacks", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set() and not first_step_recorded(self.steps_path):
            if not _alive(self.pid):
                return
            self._stop.wait(self.poll)
        if self._stop.is_set():
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.auto and (not self._core_to_spare() or self._stop.is_set() or not _alive(self.pid)):
            return                # no core to spare, or the script ended during the probe
        t0 = time.time()
        if not self._spawn(self.pid, "trainer", self.max_s):
            return
        # loader workers, one py-spy each (see the module docstring)
        while True:
            for child in python_children(self.pid):
                left = self.max_s - (time.time() - t0)
                if child not in self.procs and len(self.procs) <= self.max_children and left >= 2:
                    self._spawn(child, "child", left)
            if self._stop.wait(CHILD_POLL_S) or not _alive(self.pid):
                return

    def _core_to_spare(self) -> bool:
        """Auto mode: py-spy costs 2-6% of one core (bench_stacks.py); it runs only when at least
        MIN_IDLE_CORES stay idle while the script runs (measured over IDLE_PROBE_S at the first
        step), so it takes no CPU the job wants. Otherwise the meta file says why no stacks."""
        try:
            idle, cores = self.idle_cores(IDLE_PROBE_S)
        except Exception as exc:  # noqa: BLE001 - a probe failure only costs the stacks
            idle, cores = None, os.cpu_count()
            self.meta["idle_probe_error"] = f"{type(exc).__name__}: {exc}"
        self.meta.update({"idle_cores": None if idle is None else round(idle, 2), "cores": cores})
        if idle is not None and idle >= self.need:
            return True
        self.meta["skipped"] = "no_idle_core"      # the diagnosis says so where stacks would have helped
        try:
            (self.out_dir / META).write_text(json.dumps(self.meta, indent=1))
        except OSError:
            pass
        return False

    def _spawn(self, pid: int, role: str, duration: float) -> bool:
        out = self.out_dir / f"pyspy-{pid}.json"
        cmd = py_spy_command(self.py_spy, pid, out, self.rate, max(1, int(duration)))
        entry = {"pid": pid, "role": role, "file": out.name, "t0_unix": time.time(), "command": cmd}
        try:
            with open(self.out_dir / f"pyspy-{pid}.log", "wb") as log:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        except OSError as exc:
            self.notes.append(f"py-spy could not run ({exc}): Python stacks skipped")
            return False
        with self._lock:
            self.procs[pid] = proc
            self.meta["processes"].append(entry)
            (self.out_dir / META).write_text(json.dumps(self.meta, indent=1))
        return True

    def stop(self) -> None:
        """Call after the script has ended: each py-spy notices, writes its file and exits."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if not self.procs:
            return
        before = resource.getrusage(resource.RUSAGE_CHILDREN)   # the script is reaped already
        deadline = time.monotonic() + (WAIT_EXIT_S if not _alive(self.pid) else 0.5)
        killed = False
        for p in list(self.procs.values()):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGINT)            # py-spy writes what it has on Ctrl-C
                try:
                    p.wait(timeout=WAIT_EXIT_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    killed = True
        if killed:
            self.notes.append("py-spy did not finish writing its stacks; killed it")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        for entry in self.meta["processes"]:
            entry.update(_counts(self.out_dir / f"pyspy-{entry['pid']}.log"))
        self.meta["pyspy_cpu_s"] = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3)
        self.meta["pyspy_wall_s"] = round(time.time() - self.meta["processes"][0]["t0_unix"], 3)
        try:
            (self.out_dir / META).write_text(json.dumps(self.meta, indent=1))
        except OSError:
            pass
        self._check_failure(self.proc.returncode if self.proc else None)

    def _check_failure(self, code: int | None) -> None:
        out = self.out_dir / f"pyspy-{self.pid}.json"
        if out.is_file() and out.stat().st_size > 0:
            return
        try:
            log = (self.out_dir / f"pyspy-{self.pid}.log").read_text(errors="replace")
        except OSError:
            log = ""
        if _REFUSED.search(log):
            self.notes.append(ptrace_note())
        elif _GONE.search(log):     # py-spy's own words read as perfdoctor's failure (a user trial)
            self.notes.append("py-spy recorded no stacks: the script had ended before py-spy read its first sample")
        else:
            first = next((ln.strip() for ln in log.splitlines() if ln.strip() and "py-spy>" not in ln), None)
            self.notes.append(f"py-spy recorded no stacks (exit code {code}"
                              + (f": {first[:200]}" if first else "") + ")")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


_COUNTS = re.compile(r"Samples: (\d+) Errors: (\d+)")


def _counts(log: Path) -> dict:
    """py-spy's own tally from its log: stacks written (one per thread per sample) and samples
    it failed to read (a --nonblocking read torn by the running interpreter, a read error)."""
    try:
        m = _COUNTS.findall(log.read_text(errors="replace"))
    except OSError:
        return {}
    return {"samples": int(m[-1][0]), "errors": int(m[-1][1])} if m else {}


def python_children(pid: int) -> list[int]:
    """Python descendants of pid (loader workers), without multiprocessing's resource tracker."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(k) for t in Path(f"/proc/{p}/task").iterdir()
                    for k in Path(t, "children").read_text().split()]
        except (OSError, ValueError):
            continue
        for k in kids:
            try:
                cmd = Path(f"/proc/{k}/cmdline").read_bytes()
            except OSError:
                continue
            if b"python" in cmd and b"resource_tracker" not in cmd:
                out.append(k)
            todo.append(k)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False
