"""Opt-in py-spy stack dumps of the trainer and its loader workers (`perfdoctor run --stacks`).

`StackSampler(pids_fn, out_dir, every=5.0)` runs `py-spy dump --pid PID --nonblocking` on
every process pids_fn() returns (pids, or (pid, role) pairs, e.g. SystemSampler.current_pids)
every `every` seconds, writes each dump to out_dir/stacks-<t>-<pid>.txt and classifies the
main thread's stack:

    'io'       the top frames are file / socket calls (read, recv, open, socket/selectors
               code, ...), or the kernel says so: the thread was in uninterruptible sleep
               (state D) in one of the /proc probes taken around the dump, or py-spy reports it
               idle and its wait channel (/proc/.../wchan) is a storage or network wait. A read
               in C code (os.pread, PIL decoding a file) leaves no Python frame of its own.
    'waiting'  the thread waits on another process or thread: a multiprocessing / queue /
               threading frame is among the top frames (queue get, lock acquire, condition
               wait; their select/poll is on a pipe, not on storage), or py-spy reports the
               thread idle and the kernel wait channel is futex / pipe / unix socket /
               nanosleep, or unknown (time.sleep and other blocking C calls)
    'cpu'      the thread is running Python code or a native op (torch, PIL, numpy)
    'unknown'  no Python frames could be read

--nonblocking reads the process's memory without pausing it: cheap for the training run, at
the price of an occasionally torn stack; a single dump is a hint, the counts over many are
the evidence.

py-spy needs ptrace access. When it is refused (Yama ptrace_scope >= 1 for a process py-spy
did not start, no CAP_SYS_PTRACE in a container, another user's process), one note says how
to allow it and no further attempt is made.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

PTRACE_NOTE = ("py-spy could not attach (ptrace not permitted): run with --cap-add SYS_PTRACE or "
               "kernel.yama.ptrace_scope=0; stacks skipped")
NO_PYSPY_NOTE = "py-spy not found (pip install py-spy): stacks skipped"
_REFUSED = re.compile(r"permission denied|operation not permitted|\bEPERM\b", re.I)
_THREAD = re.compile(r"^Thread (0x[0-9a-fA-F]+|\d+) \(([a-z+]+)\)(?::\s*\"(.*)\")?")
_FRAME = re.compile(r"^\s{4}(\S.*?) \((.*?)(?::(\d+))?\)\s*$")

PROBES = 3         # /proc state/wchan reads after each dump
# kernel wait channels (/proc/<pid>/task/<tid>/wchan) of an idle thread
_WCHAN_WAIT = ("futex", "nanosleep", "pipe_read", "pipe_wait", "unix_", "do_wait", "ep_poll",
               "do_select", "do_sys_poll", "poll_schedule", "sigsuspend", "sigtimedwait")
_WCHAN_IO = ("folio_wait", "wait_on_page", "io_schedule", "blk", "bio", "nfs", "rpc_wait",
             "fuse", "ext4", "xfs", "btrfs", "filemap", "read_pages", "sk_wait_data", "tcp_",
             "inet_", "udp_", "sock_", "wait_woken")
TOP_FRAMES = 6     # how deep a wait frame may sit under socket/select frames and still count
_WAIT_FILES = ("multiprocessing/queues.py", "multiprocessing/connection.py",
               "multiprocessing/synchronize.py", "multiprocessing/managers.py",
               "multiprocessing/pool.py", "multiprocessing/popen_", "threading.py", "queue.py",
               "concurrent/futures/", "subprocess.py")
_WAIT_FUNCS = {"acquire", "wait", "sleep", "join", "get", "_wait_for_tstate_lock", "wait_for",
               "_recv", "recv", "_recv_bytes", "recv_bytes", "_poll", "poll", "result"}
_IO_FUNCS = {"read", "readinto", "read1", "readline", "readlines", "readall", "pread", "recv",
             "recv_into", "recvfrom", "open", "io_open", "listdir", "scandir", "stat", "lstat",
             "getaddrinfo", "connect", "create_connection",
             "urlopen", "getresponse", "_read_status", "sendall", "load_file", "fromfile",
             "memmap", "copyfileobj"}
_IO_FILES = ("socket.py", "ssl.py", "selectors.py", "http/client.py", "urllib3/", "botocore/",
             "s3fs/", "fsspec/", "gcsfs/", "requests/", "h5py/", "_pyio.py", "tarfile.py",
             "zipfile.py", "lmdb", "webdataset/")


def find_py_spy() -> str | None:
    """The py-spy installed with this Python (next to sys.executable) or on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


def parse_dump(text: str) -> list[dict]:
    """py-spy dump text -> [{'tid', 'idle', 'name', 'frames': [(func, file, line), ...]}] (top first)."""
    threads: list[dict] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            tid = int(m.group(1), 16) if m.group(1).startswith("0x") else int(m.group(1))
            threads.append({"tid": tid, "idle": m.group(2).startswith("idle"), "name": m.group(3),
                            "frames": []})
            continue
        f = _FRAME.match(line)
        if f and threads:
            threads[-1]["frames"].append((f.group(1), f.group(2), int(f.group(3) or 0)))
    return threads


def _short(func: str) -> str:
    return func.rsplit(".", 1)[-1]


def _is_wait(func: str, file: str) -> bool:
    file = file.replace("\\", "/")
    return _short(func) in _WAIT_FUNCS and any(w in file for w in _WAIT_FILES)


def _is_io(func: str, file: str) -> bool:
    file = file.replace("\\", "/")
    return _short(func) in _IO_FUNCS or any(w in file for w in _IO_FILES)


def _wchan_kind(wchan: str | None) -> str | None:
    """'io' for a kernel wait on storage or the network, 'waiting' for IPC/lock/sleep waits."""
    if not wchan or wchan == "0":
        return None
    if any(k in wchan for k in _WCHAN_WAIT):
        return "waiting"
    if any(k in wchan for k in _WCHAN_IO):
        return "io"
    return None


def classify_thread(thread: dict, states: tuple[str, ...] = (), wchan: str | None = None) -> str:
    """'io', 'cpu', 'waiting' or 'unknown' for one parsed thread.

    states: /proc state letters of the thread probed around the dump; wchan: the kernel
    function it slept in. The order: a Python-visible wait (queue, lock, condition) wins,
    then a Python-visible file/socket call, then the kernel's view (D = blocked on storage;
    wchan names storage/network vs futex/pipe/nanosleep), then py-spy's idle flag.
    """
    frames = thread["frames"]
    top = frames[:TOP_FRAMES]
    if any(_is_wait(fn, fl) for fn, fl, _ in top):
        return "waiting"
    if any(_is_io(fn, fl) for fn, fl, _ in frames[:2]):
        return "io"
    if "D" in states:
        return "io"
    if thread["idle"]:
        return _wchan_kind(wchan) or ("waiting" if frames else "unknown")
    return "cpu" if frames else "unknown"


def _main_thread(threads: list[dict], pid: int) -> dict | None:
    for t in threads:
        if t["tid"] == pid or t["name"] == "MainThread":
            return t
    return threads[0] if threads else None


def _probe(pid: int, tid: int) -> tuple[str | None, str | None]:
    """(state letter, wchan) of one thread now; None where unreadable."""
    state = wchan = None
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0].decode()
        with open(f"/proc/{pid}/task/{tid}/wchan", "rb") as f:
            wchan = f.read().decode().strip() or None
    except (OSError, IndexError):
        pass
    return state, wchan


class StackSampler:
    """Periodic non-blocking py-spy dumps; see the module docstring.

    results: one dict per dump {'t', 'pid', 'role', 'class', 'top', 'file'};
    notes: what could not be done, each said once; refused: ptrace was denied.
    """

    def __init__(self, pids_fn, out_dir, every: float = 5.0, timeout: float = 3.0,
                 py_spy: str | list[str] | None = None):
        self.pids_fn = pids_fn
        self.out_dir = Path(out_dir)
        self.every = float(every)
        self.timeout = float(timeout)
        if py_spy is None:
            found = find_py_spy()
            self.cmd = [found] if found else None
        else:
            self.cmd = [py_spy] if isinstance(py_spy, str) else list(py_spy)
        self.results: list[dict] = []
        self.notes: list[str] = []
        self.refused = False
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()
        if self.cmd is None:
            self._note(NO_PYSPY_NOTE)

    def start(self) -> "StackSampler":
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="perfdoctor-stacks", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1.0)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def active(self) -> bool:
        return self.cmd is not None and not self.refused

    def classes(self) -> dict[str, Counter]:
        """Counts of stack classes per role, e.g. {'worker': Counter({'cpu': 7, 'io': 2})}."""
        out: dict[str, Counter] = {}
        for r in self.results:
            out.setdefault(r["role"], Counter())[r["class"]] += 1
        return out

    def _note(self, msg: str) -> None:
        if msg not in self.notes:
            self.notes.append(msg)

    def _run(self) -> None:
        while self.active and not self._stop.wait(self.every):
            self.dump_once()

    def dump_once(self) -> list[dict]:
        """Dump every current process once; returns the new results."""
        new: list[dict] = []
        if not self.active:
            return new
        try:
            targets = list(self.pids_fn())
        except Exception as e:  # noqa: BLE001 - a bad callback must not kill the run
            self._note(f"stack sampler: listing processes failed: {e}")
            return new
        for item in targets:
            if self._stop.is_set() and self._thread is not None or not self.active:
                break
            pid, role = (item, "process") if isinstance(item, int) else (int(item[0]), str(item[1]))
            r = self._dump(pid, role)
            if r is not None:
                self.results.append(r)
                new.append(r)
        return new

    def _dump(self, pid: int, role: str) -> dict | None:
        t = time.monotonic() - self._t0
        before = _probe(pid, pid)
        for attempt in range(3):
            try:
                p = subprocess.run([*self.cmd, "dump", "--pid", str(pid), "--nonblocking"],
                                   capture_output=True, text=True, timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.failures += 1
                return None
            except OSError as e:
                self._note(f"py-spy could not run ({e}): stacks skipped")
                self.cmd = None
                return None
            # ESRCH while the process lives: a thread ended while py-spy listed them. Transient.
            if p.returncode == 0 or "No such process" not in (p.stderr or "") or not _pid_alive(pid):
                break
            time.sleep(0.05)
        if p.returncode != 0:
            msg = (p.stderr or "") + (p.stdout or "")
            if not _pid_alive(pid):
                return None                            # the worker ended meanwhile: not an error
            if _REFUSED.search(msg):
                self.refused = True
                self._note(PTRACE_NOTE)
                return None
            self.failures += 1
            first = next((ln for ln in msg.splitlines() if ln.strip()), f"exit code {p.returncode}")
            self._note(f"py-spy dump failed for a {role} process: {first.strip()[:200]}")
            return None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"stacks-{t:07.1f}-{pid}.txt"
        path.write_text(p.stdout)
        threads = parse_dump(p.stdout)
        main = _main_thread(threads, pid)
        if main is None:
            cls, top = "unknown", None
        else:
            # the kernel's view, probed right after the dump (a few reads: D is brief)
            probes = [before] + [_probe(pid, main["tid"]) for _ in range(PROBES)]
            states = tuple(st for st, _ in probes if st)
            wchans = [w for _, w in probes if w and w != "0"]
            wchan = next((w for w in wchans if _wchan_kind(w) == "io"), wchans[-1] if wchans else None)
            cls = classify_thread(main, states, wchan)
            top = "{} ({}:{})".format(*main["frames"][0]) if main["frames"] else None
        return {"t": round(t, 3), "pid": pid, "role": role, "class": cls, "top": top,
                "file": path.name}


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False
