"""Training in forked children of the launched process (torch.multiprocessing with fork, Hogwild!,
os.fork): what the hooks do there.

A forked child inherits the hooks, the open steps.jsonl with its unwritten buffer, and the
--max-steps / --duration stop. None of it is the child's: its steps would interleave with the
launched process's under the same numbers, a flush would write the parent's buffered records a
second time, and a StopRun raised at its step boundary would crash a process the script started
(mp.Process prints the traceback and exits 1) while the script itself carried on.

So after a fork the child's hooks record nothing and stop nothing (hooks.Session._after_fork):
steps.jsonl's descriptor is pointed at /dev/null in the child, so that its copy of the buffer
can never be flushed into the file, and the child's optimizer steps are counted here, in a file
of its own, `forked/<pid>.json`: {"pid", "ppid", "steps", "first_unix", "last_unix"}, rewritten at
the first step, then at most once a second, and at the child's exit (multiprocessing's
finalizers, or atexit); a child that leaves through a bare os._exit loses at most the last
second's count: "at least". DataLoader workers are forked children too; they do not step an
optimizer and write nothing here.

`read(run_dir)` gives the children's records for the diagnosis (diagnose/live.py's note).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

DIR = "forked"
WRITE_EVERY_S = 1.0
MAX_FILES = 1024                # records read back (a script forking thousands of trainers)


class ForkedSteps:
    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, DIR, f"{os.getpid()}.json")
        self.steps = 0
        self.first = None
        self.written = 0.0
        self.failed = False

    def _at_exit(self) -> None:
        """The last count at the child's exit: a multiprocessing child leaves through os._exit after
        running multiprocessing's finalizers; a plain os.fork child that returns runs atexit.
        Registered at the first step: a multiprocessing child clears the finalizers it inherited
        when it starts, after the fork hooks ran."""
        atexit.register(self.final)
        mpu = sys.modules.get("multiprocessing.util")
        if mpu is not None:
            try:
                mpu.Finalize(None, self.final, exitpriority=100)
            except Exception:
                pass

    def final(self) -> None:
        if self.steps and self.written < float("inf"):
            self._write(time.time())
            self.written = float("inf")          # once

    def step(self) -> None:
        now = time.time()
        self.steps += 1
        if self.first is None:
            self.first = now
            self._at_exit()
        if self.steps == 1 or now - self.written >= WRITE_EVERY_S:
            self._write(now)

    def _write(self, now: float) -> None:
        if self.failed:
            return
        self.written = now
        rec = {"pid": os.getpid(), "ppid": os.getppid(), "steps": self.steps, "first_unix": round(self.first, 3),
               "last_unix": round(now, 3)}
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(rec, f)
            os.replace(tmp, self.path)
        except OSError:                 # a full disk: the child's training goes on, uncounted
            self.failed = True


def detach(out) -> None:
    """Point this process's copy of a buffered file's descriptor at /dev/null: whatever the buffer
    holds (the parent's records) is never written to the file from here."""
    try:
        fd = out.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
    except (OSError, ValueError):
        pass


def read(run_dir) -> list[dict]:
    """The forked children's step records, by pid; malformed files are skipped."""
    d = os.path.join(str(run_dir), DIR)
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".json"))[:MAX_FILES]
    except OSError:
        return []
    out = []
    for n in names:
        try:
            with open(os.path.join(d, n)) as f:
                rec = json.load(f)
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("pid"), int) and isinstance(rec.get("steps"), int) \
                and not isinstance(rec.get("steps"), bool) and rec["steps"] > 0:
            out.append(rec)
    return out
