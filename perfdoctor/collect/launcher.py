"""Parent side of `perfdoctor run`: start the child, sample the system, forward signals.

The child (child.py) inherits stdin/stdout/stderr, so the script's output passes through
untouched; or, where the caller names a file (`output`: tune's runs), both go there, unbuffered,
in the order written. SIGINT and SIGTERM sent to perfdoctor are forwarded to the child (its KeyboardInterrupt
is what ends the run), but not a SIGINT the child got itself: a terminal's Ctrl-C reaches the
whole process group, and a second one a millisecond later would cut short the script's handling
of the first (its `except KeyboardInterrupt:` cleanup, perfdoctor's records). --duration asks
the child to stop at its next step boundary (threadstop.STOP_SIGNAL), then insists (SIGINT,
SIGKILL) after a grace period.
Progress lines go to stderr only when it is a terminal. Everything measured lands in the run
directory; nothing here formats a report.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from perfdoctor.collect.child import ENV
from perfdoctor.collect.cupti import teardown_env
from perfdoctor.collect.inject_switches import launch_env
from perfdoctor.collect.rundir import claim
from perfdoctor.collect.rnnprobe import maybe_probe
from perfdoctor.collect.steprecord import FLUSH_S, first_step_recorded, steps_after_trace
from perfdoctor.collect.threadstop import STOP_SIGNAL

STOP_GRACE_S = 30.0
PROGRESS_EVERY_S = 5.0
SIGINT_WAIT_S = 0.25     # how long a SIGINT to perfdoctor waits for word that the child got it too
SIGINT_FRESH_S = 1.0     # word older than this is of another SIGINT
TAIL_WAIT = 3.0          # trace_tail's wait: at most this many times --duration


@dataclass
class RunConfig:
    argv: list[str]                      # [script or module name, *args]
    module: str | None = None            # -m MODULE
    run_dir: Path | None = None
    max_steps: int | None = None
    duration: float | None = None
    duration_from: str = "launch"        # where --duration's clock starts: "launch" | "first-step" (tune)
    startup_s: float | None = None       # "first-step": a script with no step this long after launch is stopped
    skip: int = 5
    active: int = 5
    memory: bool = False
    trace: bool = True
    stacks: bool | None = False          # py-spy stacks: True on, False off, None auto (when a core is idle)
    interval: float = 0.5
    force: bool = False                  # --force: replace a run already in run_dir
    changes: dict | None = None          # `perfdoctor tune`: changes injected into the script (inject.py)
    progress: bool = True                # progress lines on a terminal (off in the ranks of a multi-rank run)
    output: Path | None = None           # the script's stdout and stderr into this file (tune), not through
    stop_file: str | None = None         # --duration with several ranks: where they agree on the step to stop after
    trace_tail: int = 0                  # with a trace: --duration's stop waits for this many steps after the
                                         # traced ones (tune's traced baseline), at most TAIL_WAIT durations


@dataclass
class RunResult:
    run_dir: Path
    exit_code: int
    signal: int | None
    wall_s: float
    child: dict = field(default_factory=dict)
    stopped_by: str | None = None        # "max-steps" | "duration" | None
    notes: list[str] = field(default_factory=list)
    created: list[Path] = field(default_factory=list)   # the folders launch created (run_dir, parents), deepest first
    tail_s: float = 0.0                  # how long trace_tail kept the run past its duration


def default_run_dir(cfg: RunConfig, root: str = "perfdoctor-runs") -> Path:
    stem = cfg.module or Path(cfg.argv[0]).stem
    base = Path(root) / f"{datetime.now():%Y%m%d-%H%M%S}-{re.sub(r'[^A-Za-z0-9_.-]', '_', stem)}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


class ChildSignals:
    """Word of the signals the child handles: child.py makes the write end of this pipe its
    signal wakeup fd, so Python's C signal handler writes each signal's number there the moment
    it arrives (before any Python code runs, whatever the script is doing)."""

    def __init__(self):
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self.sigint_at: float | None = None      # when word of the child's last SIGINT was read
        self.owed = 0                            # SIGINTs perfdoctor sent the child: no word of a Ctrl-C

    def sent_sigint(self) -> None:
        self.owed += 1

    def poll(self) -> None:
        try:
            while data := os.read(self.r, 512):
                for _ in range(data.count(signal.SIGINT)):
                    if self.owed:
                        self.owed -= 1
                    else:
                        self.sigint_at = time.monotonic()
        except (BlockingIOError, OSError):
            pass

    def got_sigint(self, wait: float) -> bool:
        """Whether the child got a SIGINT of its own just now (waiting up to `wait` s for word)."""
        deadline = time.monotonic() + wait
        while True:
            self.poll()
            now = time.monotonic()
            if self.sigint_at is not None and now - self.sigint_at < SIGINT_FRESH_S:
                self.sigint_at = None            # one word for one SIGINT
                return True
            if now >= deadline:
                return False
            try:
                select.select([self.r], [], [], deadline - now)
            except (OSError, ValueError):
                return False

    def close(self) -> None:
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass


def forward_signals(proc: subprocess.Popen, heard: ChildSignals | None = None) -> tuple[list[int], dict]:
    """Forward SIGINT/SIGTERM to the child from now on, a SIGINT only if `heard` has no word that
    the child got it itself; returns (signals received so far, the handlers to restore with
    restore_signals)."""
    forwarded: list[int] = []

    def forward(signum, frame):
        forwarded.append(signum)
        if signum == signal.SIGINT and heard is not None and heard.got_sigint(SIGINT_WAIT_S):
            return                               # the terminal's Ctrl-C reached the child's process group
        if proc.poll() is None:
            if signum == signal.SIGINT and heard is not None:
                heard.sent_sigint()
            proc.send_signal(signum)
    return forwarded, {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}


def restore_signals(old: dict) -> None:
    for s, h in old.items():
        signal.signal(s, h)


def launch(cfg: RunConfig) -> RunResult:
    run_dir = cfg.run_dir or default_run_dir(cfg)
    created = [d for d in (run_dir, *run_dir.parents) if not d.exists()]
    claim(run_dir, cfg.force)            # refuses (or with force, clears) a directory holding a run
    child_cfg = {"run_dir": str(run_dir.resolve()), "argv": cfg.argv, "module": cfg.module,
                 "max_steps": cfg.max_steps, "skip": cfg.skip, "active": cfg.active,
                 "memory": cfg.memory, "trace": cfg.trace, "changes": cfg.changes, "stop_file": cfg.stop_file,
                 "duration": cfg.duration, "duration_from": cfg.duration_from}
    cupti_env, child_cfg["teardown_cupti"] = teardown_env(os.environ, cfg.argv, cfg.module)   # cupti.py
    # kineto logs "USDT: profiler_start/stop" to stderr at its default level: lines the script
    # never printed. Level 6 silences kineto's own log, unless the user chose a level.
    quiet = {} if "KINETO_LOG_LEVEL" in os.environ else {"KINETO_LOG_LEVEL": "6"}
    env = dict(os.environ, **cupti_env, **quiet, **launch_env(cfg.changes))     # inject_switches.py
    notes: list[str] = [child_cfg["teardown_cupti"]["note"]] if child_cfg["teardown_cupti"]["note"] else []
    t0 = time.monotonic()
    unbuffered = ["-u"] if getattr(sys.stdout, "write_through", False) else []   # python -u (torchrun's workers)
    heard = ChildSignals()
    env[ENV] = json.dumps(dict(child_cfg, signal_fd=heard.w))
    log = None
    try:
        if cfg.output is not None:           # unbuffered: a killed run's last lines, stdout and stderr in order
            log = open(cfg.output, "ab")
            env["PYTHONUNBUFFERED"] = "1"
        proc = subprocess.Popen([sys.executable, *unbuffered, "-m", "perfdoctor.collect.child"], env=env,
                                pass_fds=(heard.w,), stdout=log, stderr=log)
    except BaseException:
        heard.close()
        raise
    finally:
        if log is not None:
            log.close()                      # the child holds its own descriptors
    os.close(heard.w)
    # forward at once: a Ctrl-C while the samplers start must reach the script, not orphan it
    forwarded, old = forward_signals(proc, heard)
    samplers: list = []
    stopped_by, stop_sent_at, insisted = None, None, 0
    clock = _DurationClock(cfg, run_dir / "steps.jsonl", t0)
    progress = _Progress(run_dir) if cfg.progress and sys.stderr.isatty() else None
    try:
        samplers = _start_samplers(cfg, proc.pid, run_dir, notes)
        while True:
            try:
                proc.wait(timeout=cfg.interval)
                break
            except subprocess.TimeoutExpired:
                pass
            heard.poll()                         # word of a SIGINT perfdoctor did not get is soon stale
            elapsed = time.monotonic() - t0
            if stop_sent_at is None and (why := clock.due()) is not None:
                stopped_by, stop_sent_at = "duration", elapsed
                if why:
                    notes.append(why)
                proc.send_signal(STOP_SIGNAL)
            elif stop_sent_at is not None and insisted < 2 and elapsed - stop_sent_at > STOP_GRACE_S * (insisted + 1):
                # once each, a grace apart: a SIGINT every tick had interrupted the script's own
                # clean-up (torch.multiprocessing.spawn stopping its children) again and again
                if insisted == 0:
                    notes.append(f"the script did not stop within {STOP_GRACE_S:.0f} s of the request; interrupted it")
                    heard.sent_sigint()
                    proc.send_signal(signal.SIGINT)
                else:
                    notes.append(f"the script did not end within {STOP_GRACE_S:.0f} s of the interrupt; killed it")
                    proc.send_signal(signal.SIGKILL)
                insisted += 1
            if progress:
                progress.tick(elapsed)
    finally:
        restore_signals(old)
        os.close(heard.r)
        _stop_samplers(samplers, run_dir, notes)
    code = proc.returncode
    sig = -code if code < 0 else None
    exit_code = 128 + sig if sig else code
    child = _read_json(run_dir / "child.json")
    raced = sig == STOP_SIGNAL and stop_sent_at is not None and isinstance(child.get("exit_code"), int)
    if raced:
        # our own stop request met the script's exit (before the child could ignore it): the
        # script had ended by itself, and its code is the one it gave
        sig, exit_code = None, child["exit_code"]
        notes.append("the --duration stop request arrived as the script was exiting by itself")
    shared = child.get("shared_stop") if isinstance(child.get("shared_stop"), dict) else {}
    if child.get("outcome") == "stopped":
        # a rank that stopped at the step another rank's --duration chose stopped for --duration
        agreed = isinstance(shared.get("step"), int) and isinstance(child.get("steps"), int)
        stopped_by = stopped_by or ("duration" if agreed and child["steps"] >= shared["step"] else "max-steps")
    elif stopped_by == "duration" and not insisted and child.get("outcome") != "interrupted":
        # the script ended by itself after the request (it reached no step boundary in this
        # process to stop at: its training ran elsewhere, or it was ending anyway)
        if child and not raced:
            notes.append(f"--duration asked the script to stop after {stop_sent_at:.0f} s; it reached no step "
                         "boundary in the launched process to stop at, and ended by itself")
        stopped_by = None
    if not child and insisted < 2:           # (killed by perfdoctor itself: said above)
        # steps.jsonl is written in batches (collect/steprecord.py): a kill loses the last ones
        notes.append("the script ended before perfdoctor could record its summary (killed?); the records of its "
                     f"last steps (up to {FLUSH_S:g} s of them) may be lost with it: the step counts cover the steps "
                     "written")
    res = RunResult(run_dir, exit_code, sig, time.monotonic() - t0, child, stopped_by, notes, created,
                    clock.tail_s)
    # the RNN probe (rnnprobe.py: PD388, PD391, PD387) after the script, out of its wall time; in tune,
    # in its traced baseline only
    if child.get("outcome") != "interrupted" and (cfg.changes is None or cfg.trace) \
            and (said := maybe_probe(run_dir, child)):
        notes.append(said)
    try:
        (run_dir / "run.json").write_text(json.dumps({
            "argv": cfg.argv, "module": cfg.module, "exit_code": exit_code, "signal": sig,
            "wall_s": round(res.wall_s, 3), "stopped_by": stopped_by, "forwarded_signals": forwarded,
            "notes": notes, "config": {k: v for k, v in child_cfg.items() if k != "run_dir"}}, indent=1))
    except OSError as exc:                   # a full disk: the run's result is still reported
        notes.append(f"run.json could not be written ({exc.strerror or exc})")
    return res


def _start_samplers(cfg: RunConfig, pid: int, run_dir: Path, notes: list[str]) -> list:
    out = []
    try:
        from perfdoctor.collect.samplers import SystemSampler
        s = SystemSampler(pid, interval=cfg.interval)
        s.start()
        out.append(s)
    except Exception as exc:  # sampling must never break the user's run
        notes.append(f"system sampling unavailable: {type(exc).__name__}: {exc}")
    if cfg.stacks is not False:
        try:
            from perfdoctor.collect.stacks import StackRecorder
            st = StackRecorder(pid, run_dir / "stacks", run_dir / "steps.jsonl", auto=cfg.stacks is None)
            st.start()
            out.append(st)
        except Exception as exc:
            notes.append(f"py-spy stacks unavailable: {type(exc).__name__}: {exc}")
    return out


def _stop_samplers(samplers: list, run_dir: Path, notes: list[str]) -> None:
    for s in samplers:
        try:
            s.stop()
        except Exception as exc:
            notes.append(f"stopping a sampler failed: {exc}")
    for s in samplers:
        if hasattr(s, "samples"):            # the system sampler: its notes travel with its samples
            try:
                (run_dir / "samples.json").write_text(json.dumps({"samples": s.samples, "notes": s.notes}))
            except OSError as exc:           # a full disk: the script's exit code still comes back
                notes.append(f"samples.json could not be written ({exc.strerror or exc})")
        elif hasattr(s, "notes"):            # py-spy stacks: what could not be recorded
            notes.extend(s.notes)


def _json_or_none(line: str):
    """A steps.jsonl line (the last one may be half-written while the script runs), or None."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class _DurationClock:
    """When --duration's stop is due. From the launch (`run`), or from the first step's record
    (`tune`: a run's length is then its training's, however long the script takes to import,
    load and compile before it; a trial of torch.compile whose first step compiles for 40 s
    still trains as long as the baseline). A script that records no step within `startup_s` of
    its launch is stopped then. With cfg.trace_tail, the stop also waits for that many steps after
    the traced ones (up to TAIL_WAIT durations): a script of 1.2 s steps (nanoGPT on a CPU) had 8
    left after the trace window in tune's 30 s baseline, too few to measure, and tune ran it again
    for 60 s without a trace."""

    def __init__(self, cfg: RunConfig, steps_path: Path, t0: float):
        self.cfg, self.path, self.t0 = cfg, steps_path, t0
        self.start = t0 if cfg.duration_from == "launch" else None
        self.tail_s = 0.0                        # past the duration, waiting for trace_tail's steps

    def due(self) -> str | None:
        """None while the run goes on; "" when the duration has passed; a note when the script
        reached no step within startup_s."""
        if not self.cfg.duration:
            return None
        now = time.monotonic()
        if self.start is None and first_step_recorded(self.path):
            self.start = now                     # the first step's record is written as it ends
        if self.start is not None:
            if now - self.start < self.cfg.duration:
                return None
            tail = self.cfg.trace_tail if self.cfg.trace else 0
            if tail and now - self.start < TAIL_WAIT * self.cfg.duration and steps_after_trace(self.path, tail) < tail:
                self.tail_s = now - self.start - self.cfg.duration
                return None              # long steps: the trace window left too few to measure
            return ""
        if self.cfg.startup_s is not None and now - self.t0 >= self.cfg.startup_s:
            return (f"no training step within {self.cfg.startup_s:.0f} s of the launch (--duration counts "
                    "from the first step): asked the script to stop")
        return None


class _Progress:
    """A line on stderr every few seconds: steps so far, time per step, data wait."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "steps.jsonl"
        self.last = 0.0

    def tick(self, elapsed: float) -> None:
        if elapsed - self.last < PROGRESS_EVERY_S:
            return
        self.last = elapsed
        try:
            lines = self.path.read_text().splitlines()[-20:]
        except (OSError, ValueError):
            return
        recs = [r for r in map(_json_or_none, lines) if isinstance(r, dict)
                and all(isinstance(r.get(k), (int, float)) for k in ("dur", "wait"))]
        from perfdoctor.stats.steptime import ms
        if not recs:
            print(f"[perfdoctor] {elapsed:.0f} s, waiting for the first training step", file=sys.stderr)
            return
        total = sum(r["dur"] for r in recs)       # wall time over the recent steps: a median would
        dur = total / len(recs)                   # hide the long steps of a bursty loader
        wait = sum(r["wait"] for r in recs) / max(total, 1e-9)
        k = recs[-1].get("step")     # the k-th timed step is the run's step k + 1 (the first starts the clock)
        print(f"[perfdoctor] step {k + 1 if isinstance(k, int) else '?'} · {ms(dur * 1e3)} ms/step · "
              f"data wait {100 * wait:.0f}%", file=sys.stderr)
