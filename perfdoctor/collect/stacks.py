"""Python stacks of the trainer and its loader workers: `py-spy record` over the run.

`StackRecorder(pid, out_dir, steps_path)` waits for the first measured step (steps.jsonl gets
its first line: the script has imported torch, built its model and loader), then runs

    py-spy record --pid PID --subprocesses --idle --full-filenames --nonblocking
                  --rate RATE --format chrometrace --duration MAX_S -o out_dir/pyspy.json

py-spy samples every thread of the trainer and of its child processes (loader workers)
RATE times a second, idle threads included (--idle: time blocked in a write, a read or a
lock shows, not only CPU time), and writes one Chrome trace: begin/end events of each Python
frame with microsecond timestamps relative to py-spy's start. out_dir/pyspy.meta.json records
that start as Unix time (taken just before py-spy is started; its clock starts before it
attaches), so samples line up with the step records (`end`, `dur` in steps.jsonl) and the
analysis (analyze/stacks.py) keeps the steady steps only. --duration bounds the file and the
cost on long runs; py-spy stops by itself when the script ends.

--nonblocking reads the process's memory without pausing it (cheap; an occasional torn
stack); the shares come from thousands of samples, so a torn one does not matter.

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

RATE_HZ = 50           # samples per second: 20 ms resolution, ~3% of one core for py-spy (bench_stacks.py)
MAX_S = 120            # record at most this long (from the first step): bounds file size and cost
WAIT_EXIT_S = 15.0     # after the script ends, how long py-spy may take to notice and write
OUTPUT = "pyspy.json"
META = "pyspy.meta.json"
LOG = "pyspy.log"

# The trainer is a Python process py-spy was pointed at: "no python processes found" there means
# it could not read the process's memory (with --subprocesses py-spy words a refusal that way).
_REFUSED = re.compile(r"permission denied|operation not permitted|\bEPERM\b|ptrace|no python processes found", re.I)


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
                   max_s: float = MAX_S, subprocesses: bool = True) -> list[str]:
    """py_spy: the binary, or a command prefix that runs it (e.g. under setpriv)."""
    return [*([py_spy] if isinstance(py_spy, str) else py_spy), "record", "--pid", str(pid),
            *(["--subprocesses"] if subprocesses else []), "--idle", "--full-filenames", "--nonblocking",
            "--rate", str(rate), "--format", "chrometrace", "--duration", str(int(max_s)), "--output", str(out)]


def has_children(pid: int) -> bool:
    """Whether the process has child processes now (its loader workers start before the first
    step ends). Following children costs py-spy a scan of /proc at every sample: ~2% of a core."""
    try:
        return any(Path(t, "children").read_text().strip() for t in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return True          # cannot tell: follow them


class StackRecorder:
    """Records the run's Python stacks with py-spy; see the module docstring.

    start() returns at once (a thread waits for the first step, then starts py-spy); stop()
    after the script has ended lets py-spy finish writing. notes: what could not be done.
    """

    def __init__(self, pid: int, out_dir, steps_path, rate: int = RATE_HZ, max_s: float = MAX_S,
                 py_spy: str | list[str] | None = None, poll: float = 0.1):
        self.pid = int(pid)
        self.out_dir = Path(out_dir)
        self.steps_path = Path(steps_path)
        self.rate, self.max_s, self.poll = int(rate), float(max_s), float(poll)
        self.py_spy = py_spy or find_py_spy()
        self.notes: list[str] = []
        self.proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.py_spy is None:
            self.notes.append(no_pyspy_note())

    def start(self) -> "StackRecorder":
        if self.py_spy is not None:
            self._thread = threading.Thread(target=self._run, name="perfdoctor-stacks", daemon=True)
            self._thread.start()
        return self

    def _first_step_seen(self) -> bool:
        try:
            return self.steps_path.stat().st_size > 0
        except OSError:
            return False

    def _run(self) -> None:
        while not self._stop.is_set() and not self._first_step_seen():
            if not _alive(self.pid):
                return
            self._stop.wait(self.poll)
        if self._stop.is_set():
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        cmd = py_spy_command(self.py_spy, self.pid, self.out_dir / OUTPUT, self.rate, self.max_s,
                             subprocesses=has_children(self.pid))
        meta = {"pid": self.pid, "rate_hz": self.rate, "max_s": self.max_s, "command": cmd,
                "t0_unix": time.time()}
        try:
            with open(self.out_dir / LOG, "wb") as log:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        except OSError as exc:
            self.notes.append(f"py-spy could not run ({exc}): Python stacks skipped")
            return
        (self.out_dir / META).write_text(json.dumps(meta, indent=1))

    def stop(self) -> None:
        """Call after the script has ended: py-spy notices, writes its file and exits."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        p = self.proc
        if p is None:
            return
        before = resource.getrusage(resource.RUSAGE_CHILDREN)   # the script is reaped already
        try:
            p.wait(timeout=WAIT_EXIT_S if not _alive(self.pid) else 0.5)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGINT)            # py-spy writes what it has on Ctrl-C
            try:
                p.wait(timeout=WAIT_EXIT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                self.notes.append("py-spy did not finish writing its stacks; killed it")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._record_cost(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        self._check_failure(p.returncode)

    def _record_cost(self, cpu_s: float) -> None:
        """py-spy's own CPU time (its cost to the machine) into the meta file."""
        path = self.out_dir / META
        try:
            meta = json.loads(path.read_text())
            meta["pyspy_cpu_s"] = round(cpu_s, 3)
            meta["pyspy_wall_s"] = round(time.time() - meta["t0_unix"], 3)
            path.write_text(json.dumps(meta, indent=1))
        except (OSError, ValueError, KeyError):
            pass

    def _check_failure(self, code: int | None) -> None:
        out = self.out_dir / OUTPUT
        if out.is_file() and out.stat().st_size > 0:
            return
        try:
            log = (self.out_dir / LOG).read_text(errors="replace")
        except OSError:
            log = ""
        if _REFUSED.search(log):
            self.notes.append(ptrace_note())
        else:
            first = next((ln.strip() for ln in log.splitlines() if ln.strip() and "py-spy>" not in ln), None)
            self.notes.append(f"py-spy recorded no stacks (exit code {code}"
                              + (f": {first[:200]}" if first else "") + ")")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def load_recording(stacks_dir) -> tuple[list[dict], dict] | None:
    """(chrometrace events, meta) of a run's recording; None when there is none or it is unreadable."""
    d = Path(stacks_dir)
    try:
        meta = json.loads((d / META).read_text())
        raw = (d / OUTPUT).read_bytes()
    except (OSError, ValueError):
        return None
    try:
        import msgspec
        events = msgspec.json.decode(raw)
    except ImportError:  # pragma: no cover - msgspec is a dependency
        events = json.loads(raw)
    except Exception:   # noqa: BLE001 - a truncated file (py-spy killed mid-write)
        return None
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    return (events, meta) if isinstance(events, list) else None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False
