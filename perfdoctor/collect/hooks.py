"""In-process hooks of `perfdoctor run`, installed when the script imports torch.

Steps come from the first source the script uses: optimizer steps, backward passes (and
autograd.grad calls), DataLoader iterations or outermost module calls (stepsource.py says how
one is chosen).

Data wait. Time inside DataLoader iterators' __next__ (worker queue wait, or the whole
loading work with num_workers=0), summed per step (loaderwait.py).

Stop. --max-steps and --duration end the script at a step boundary; with several ranks, every
rank at the same one (sharedstop.py).

Trace: window.py places the torch.profiler window by steps and by time.

Records go to <run>/steps.jsonl (one line per step, written in batches: steprecord.py says when
and what a kill can lose) and <run>/child.json at the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import deque

from perfdoctor.collect import dynamoskip, forked, funcpasses, loaderwait, threadstop
from perfdoctor.collect.cpuflags import cpu_bf16, cpu_fp16
from perfdoctor.collect.loaderfetch import FetchTimes
from perfdoctor.collect.loaderiters import LoaderIters
from perfdoctor.collect.loaderkinds import WORKER_INFO_MARKER, LoaderKinds, watch_worker_info
from perfdoctor.collect.nogradcalls import NogradClock
from perfdoctor.collect.optclock import OptimizerClock
from perfdoctor.collect.procstarts import ProcStarts
from perfdoctor.collect.sharedstop import SharedStop
from perfdoctor.collect.steprecord import FLUSH_FIRST, FLUSH_S, REREAD_S, SchedReads, dataset_kind, line, \
    start_mark
from perfdoctor.collect.stepsource import PASS_FALLBACK, SOURCES, StepSources
from perfdoctor.collect.timedcalls import TimedCalls
from perfdoctor.collect.tracebudget import TRACE_MB
from perfdoctor.collect.tracefile import compress_trace
from perfdoctor.collect.window import TRACE_S, WARMUP_S, Window, seconds

__all__ = ["Session", "StopRun", "compress_trace"]


def _main() -> bool:
    """Is this the main thread? (Asked only where a run stops: not at every boundary.)"""
    return threading.current_thread() is threading.main_thread()


class StopRun(BaseException):
    """Raised at a step boundary to end the script gracefully (--max-steps / --duration)."""


class Session(StepSources):
    def __init__(self, cfg: dict, watch=None):
        self.cfg = cfg
        self.watch = watch               # watch(module name, on_import): child.py's import watcher
        self.run_dir = cfg["run_dir"]
        self.max_steps = cfg.get("max_steps")
        self.torch = None
        self.lock = threading.Lock()
        self.notes: list[str] = []
        self.window = Window(self.run_dir, self.notes, skip=int(cfg.get("skip", 5)), active=int(cfg.get("active", 5)),
                             memory=bool(cfg.get("memory", False)), enabled=bool(cfg.get("trace", True)),
                             warmup_s=seconds(cfg, "warmup_s", "PERFDOCTOR_WARMUP_S", WARMUP_S),
                             trace_s=seconds(cfg, "trace_s", "PERFDOCTOR_TRACE_S", TRACE_S),
                             trace_mb=seconds(cfg, "trace_mb", "PERFDOCTOR_TRACE_MB", TRACE_MB))
        self.mode = None                 # "optimizer" | "backward" | "dataloader" | "module"
        self.source = None               # key of SOURCES
        self.primary = None              # id of the optimizer that defines step boundaries
        self.rebuilt = 0                 # times the primary was built again over the same parameters
        self.optimizer_calls = 0         # real optimizer.step() calls seen by the post-hook
        self.optimizer_steps: dict = {}  # id(optimizer) -> its steps (skipped ones included)
        self.others: dict = {}           # id(optimizer) -> marks of its steps since the primary's last step
        self.optimizer_names: dict = {}
        self.optimizer_sigs: dict = {}   # id(optimizer) -> its parameters' ids (optsteps._param_ids)
        self.optimizer_dtypes: dict = {}  # id(optimizer) -> elements of its parameters per dtype
        self.dataset_kinds: set = set()  # torch's _DatasetKind of every DataLoader iterated
        self.loader_kinds = LoaderKinds()  # what each loader reads and how it fetches (loaderkinds.py)
        self.in_optimizer = False        # inside an optimizer.step() (before the optimizer mode)
        self.pre_mark = None             # the first optimizer step's start
        self.passes_in_optimizer = 0     # backward passes inside optimizer.step() (closures)
        self.steps = 0
        self.step_base = 0               # steps before an optimizer took over from a fallback source
        self.fallback_notes: list = []   # what _choose said (dropped if an optimizer takes over)
        self.cum_wait = 0.0              # DataLoader wait and batches since the start
        self.cum_batches = 0
        self.cum_wait_cpu = 0.0          # the process's CPU inside __next__ of loaders without workers
        self.mark = None                 # (perf_counter, cum_wait, cum_batches, unix, schedstat, cum_wait_cpu) at the current step's start
        self.t_first = None              # perf_counter when the first measured step began
        # fallback candidates: their boundaries, kept until a source is chosen
        self.resets = None
        self.passes = 0
        self.grad_calls = 0              # of which torch.autograd.grad and torch.func.grad calls
        self.func_calls = 0              # of which torch.func.grad calls
        self.root_calls: dict = {}       # id(module) -> [class name, marks of its outermost calls...]
        self.module_hook = None          # the chosen module's forward pre-hook (source "module")
        self.module_skip = False
        self.module_training = False     # the chosen module was in training mode (a rollout, not an evaluation)
        self.census = None               # modules.Census, set when module calls are watched
        self.module_watch = None         # id of a chosen module compiled in place (the class wrapper marks its steps)
        self.group_marks: list = []      # backward passes that follow a gradient reset
        self.pass_marks: deque = deque(maxlen=PASS_FALLBACK + 1)
        self.loader_marks: list = []     # batch requests since the last backward pass
        self.batches_since_pass = 0
        self.stop_requested = False
        self.shared = SharedStop.from_cfg(cfg)   # --duration with several ranks: one step for all (sharedstop.py)
        # backward passes have nothing to tell: steps follow an optimizer, the census step is
        # over and no trace is being recorded (its memory budget is checked inside passes).
        # Set at each boundary; the backward wrapper then only calls through (passes.py)
        self.quiet_passes = False
        threadstop.attach(self, cfg)     # stopping, thread_stop, script_over: a stop in a thread of its own
        self.finished = False
        self.calls = TimedCalls()        # checkpoint saves and logging calls on this thread, per step
        self.opt_clock = OptimizerClock()  # time inside optimizer.step(), per step
        self.starts = ProcStarts()       # processes the script starts (a spawned trainer runs without hooks)
        self.nograd = NogradClock(self.calls.thread)   # the root module's no-grad calls, per step
        self.nograd.wait_now = lambda: self.cum_wait
        self.iters = LoaderIters()       # DataLoader iterator starts and peeks, per step
        self.fetches = FetchTimes(self.run_dir)   # what a loader worker spends making a batch
        os.makedirs(self.run_dir, exist_ok=True)
        # Buffered and written in batches (steprecord.py): the live readers (progress line, py-spy's
        # first-step wait) see the first steps at once, later ones when a step ends FLUSH_S after
        # the last write.
        self.out = open(os.path.join(self.run_dir, "steps.jsonl"), "w", buffering=1 << 16)
        self.flushed_at = 0.0
        self.pending: list[tuple] = []   # steps recorded and not yet written (_record, _flush)
        self.sched = SchedReads()        # schedstat at the boundaries, read once a millisecond at most
        try:
            signal.signal(threadstop.STOP_SIGNAL, self._on_stop_signal)
        except (ValueError, OSError, AttributeError):   # not the main thread
            pass
        self.pid = os.getpid()
        self.forked = None               # forked.ForkedSteps in a forked child of this process
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        """In a forked child (a Hogwild trainer, a DataLoader worker): record nothing, stop nothing,
        write no summary; its optimizer steps are counted apart (forked.py)."""
        if os.getpid() == self.pid or self.forked is not None:
            return
        self.forked = forked.ForkedSteps(self.run_dir)
        self.finished = True
        self.lock = threading.Lock()     # another thread of the parent may have held it
        self.pending = []
        out, self.out = self.out, None
        if out is not None:
            forked.detach(out)
            self._parent_out = out       # never closed here: closing would flush the parent's buffer

    # -- installation ---------------------------------------------------------------------
    def install(self, torch) -> None:
        self.torch = torch
        from perfdoctor.collect import inject   # `perfdoctor tune`'s changes (none under `run`)
        inject.apply(torch, self.cfg.get("changes"), self.run_dir, self.watch, steps=lambda: self.steps)
        dynamoskip.wrap_compile(torch)          # marks our hooks' frames once torch.compile loads Dynamo
        try:
            self.hook_optimizers(torch)
        except Exception as exc:  # very old torch
            self.notes.append(f"optimizer hooks unavailable ({exc}); steps come from backward passes or "
                              "DataLoader iterations")
        try:
            from perfdoctor.collect import passes
            self.resets = passes.GradResets()
            passes.wrap_backward(torch, self)
            funcpasses.wrap_func_grad(torch, self)
        except Exception as exc:
            self.notes.append(f"backward passes cannot be watched ({type(exc).__name__}: {exc})")
        try:
            from perfdoctor.collect import modules
            modules.watch(torch, self)
        except Exception as exc:
            self.notes.append(f"module calls cannot be watched ({type(exc).__name__}: {exc})")
        loaderwait.wrap_next(self)
        self._wrap_grad_scaler()
        watch_worker_info(self.run_dir)
        try:
            self.calls.install_torch(torch)
        except Exception as exc:
            self.notes.append(f"torch.save cannot be timed ({type(exc).__name__}: {exc})")
        try:
            self.starts.install()
        except Exception as exc:
            self.notes.append(f"process starts cannot be counted ({type(exc).__name__}: {exc})")
        self.window.install(torch)

    # -- step sources -----------------------------------------------------------------------
    def _mark(self, t: float | None = None) -> tuple:
        t = time.perf_counter() if t is None else t
        return t, self.cum_wait, self.cum_batches, time.time(), self.sched.at_boundary(t, self.steps), self.cum_wait_cpu

    # -- step boundaries ------------------------------------------------------------------
    def _record(self, end: tuple, skipped: bool = False) -> float:
        """One step: kept raw, and written to steps.jsonl with the others pending at each flush
        (each of the first FLUSH_FIRST steps, then when a step ends FLUSH_S after the last
        write). Formatting a batch at once, and one write(2) for it, cost a fraction of a line
        and a write a step."""
        dur = end[0] - self.mark[0]
        if self.forked is not None:
            return dur
        save, log, collect, convert = self.calls.take()
        starts = self.iters.take()
        opt = self.opt_clock.take()
        nograd = self.nograd.take()
        # the batch in the making: from the step's start, and each optimizer step's end, to the
        # model's next training call, less the DataLoader's wait (nogradcalls.py)
        pre = self.nograd.take_pre()
        self.nograd.open(end[0], end[1])
        with self.lock:
            self.steps += 1
            self.pending.append((self.steps, self.mark, end, dur, self.mode, self.window.recording,
                                 self.window.perturbed_next, skipped, save, log, starts, opt, nograd, collect,
                                 convert, pre))
            self.window.perturbed_next = False
            if self.steps <= FLUSH_FIRST or end[0] - self.flushed_at >= FLUSH_S:
                self._flush(end[0])
        self.mark = end
        return dur

    def _flush(self, now: float) -> None:
        """The pending steps to steps.jsonl; a full disk (or any write error) never reaches the
        script: later records are dropped and a note says so. Call with the lock held."""
        recs, self.pending = self.pending, []
        self.flushed_at = now
        if self.out is None or not recs:
            return
        try:
            self.sched.spread(recs)
        except Exception:                          # never the script's error: those steps lack cpu/runq
            pass
        try:
            self.out.write("".join(line(*r) for r in recs))
            self.out.flush()
        except (OSError, ValueError) as exc:       # ValueError: closed by finish() on another thread
            self.notes.append(f"steps.jsonl could not be written after step {recs[0][0] - 1} "
                              f"({exc.strerror or exc}): later steps are not recorded")
            try:
                self.out.close()
            except OSError:
                pass
            self.out = None

    def _boundary(self, end: tuple | None = None, skipped: bool = False) -> None:
        if self.forked is not None:             # a forked child: no step of the launched process's
            return
        end = end or self._mark()
        if self.census is not None and self.census.state != "done":
            self.census.boundary(self.mode)     # the outermost module calls of one whole step (modules.py)
            self.nograd.from_census(self.census, self.torch, self.notes)   # done: time its root's no-grad calls
        self.calls.poll()
        if self.mark is None:                   # the first boundary starts the count
            self.mark, self.t_first = end, end[0]
            self.calls.take()                   # saves and logs before the first step are no step's
            for clock in (self.iters, self.opt_clock, self.nograd):
                clock.take()
            self.nograd.take_pre()
            self.nograd.open(end[0], end[1])
            return
        dur = self._record(end, skipped)
        if self.finished:                       # boundaries settled at the end: no window, no stop,
            if self.stopping and not _main():   # but another trainer thread of a stopped run stops too
                raise StopRun()
            return
        self.window.on_boundary(self.steps - self.step_base, time.perf_counter(), self.t_first, dur)
        self.quiet_passes = (self.mode == "optimizer" and self.window.state != "recording"
                             and (self.census is None or self.census.state == "done"))
        stop = self.stop_requested if self.shared is None else self.shared.due(self.steps, self.stop_requested, dur)
        if stop or (self.max_steps and self.steps - self.step_base >= self.max_steps):
            self.stopping = True
            if not _main():
                threadstop.install(self)        # in front of a threading.excepthook the script set since
            raise StopRun()
        # The next step starts now: our own bookkeeping is not its time. Its other readings are
        # the boundary's (one schedstat read a step, not two) unless the bookkeeping took long
        # (the profiler started, stopped or exported): then they are read afresh.
        now = time.perf_counter()
        self.mark = self._mark(now) if now - end[0] > REREAD_S else start_mark(end, now)

    def _on_stop_signal(self, signum, frame) -> None:
        self.stop_requested = True
        if self.torch is None and not self.finished and "torch" not in sys.modules:    # not mid-import
            # no torch in this process, so no step boundary will ever come to stop at (a launcher
            # whose training runs in another process): stop now rather than after the grace period
            raise StopRun()
        if self.thread_stop is not None and not self.script_over.is_set():
            raise StopRun()                     # the trainer thread stopped; the main one outlived its grace

    # -- the end ----------------------------------------------------------------------------
    def _torch_threads(self) -> int | None:
        try:
            return int(self.torch.get_num_threads()) if self.torch is not None else None
        except Exception:   # a torch torn down at exit
            return None

    def finish(self, outcome: str, exit_code: int | None = None, error: str | None = None) -> None:
        self.script_over.set()
        if self.finished:
            return
        self.finished = True
        try:
            # the script has ended: a --duration stop crossing its exit means nothing (SIG_IGN outlives
            # the interpreter's finalisation, where a late stop signal would kill it)
            signal.signal(threadstop.STOP_SIGNAL, signal.SIG_IGN)
        except (ValueError, OSError, AttributeError):
            pass
        try:
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)   # do not lose the files to a 2nd Ctrl-C
        except (ValueError, OSError):
            old = None
        try:
            self._settle()
            self._note_optimizer_rates()
            self._note_rebuilt()
            self.window.finish()
            if self.lock.acquire(timeout=1.0):     # os._exit from another thread mid-record: wait a little
                try:
                    self._flush(time.perf_counter())
                finally:
                    self.lock.release()
            elif self.pending:
                self.notes.append(f"{len(self.pending)} step record(s) were not written: the script ended "
                                  "while one was being recorded")
            if self.census is not None and isinstance(self.census.result, dict):
                self.census.result["dynamo_graphs"] = dynamoskip.graphs_compiled()   # PD226
            info = {"outcome": outcome, "exit_code": exit_code, "error": error, "steps": self.steps,
                    "mode": self.mode, "step_source": SOURCES.get(self.source),
                    "profiler": self.window.state, "trace_enabled": self.window.enabled,
                    "window": self.window.info(), "notes": self.notes,
                    "torch_imported": self.torch is not None,
                    "torch_version": getattr(self.torch, "__version__", None),
                    "cuda_available": bool(self.torch and self.torch.cuda.is_available()),
                    "torch_threads": self._torch_threads(), "cpu_bf16": cpu_bf16(), "cpu_fp16": cpu_fp16(),
                    "dataset_kind": dataset_kind(self.dataset_kinds),
                    "loaders": self.loader_kinds.info(),
                    "timed_calls": self.calls.installed, "convert_timed": self.calls.converts,
                    "loader_iters": self.iters.info(),
                    "sample_random": self.fetches.trainer.info(),   # collect/samplerandom.py
                    "worker_info_used": os.path.exists(os.path.join(self.run_dir, WORKER_INFO_MARKER)),
                    "root_calls": self.census.result if self.census is not None else None,
                    "param_dtypes": self.optimizer_dtypes.get(self.primary),
                    "optimizer_timed": True, "optimizer": {**self.opt_clock.info(), "rebuilt": self.rebuilt},
                    "nograd_timed": self.nograd.timed, "pre_timed": self.nograd.timed,
                    "process_starts": self.starts.info(), "first_step_timed": self.first_timed,
                    "shared_stop": self.shared.info() if self.shared is not None else None,
                    "cpu_clock": "thread"}      # steps' `cpu` from the thread's CPU clock (steprecord.py)
            try:               # a full disk must not turn the script's own ending into a crash
                with open(os.path.join(self.run_dir, "child.json"), "w") as f:
                    json.dump(info, f, indent=1)
            except OSError:
                pass
            try:
                if self.out is not None:
                    out, self.out = self.out, None    # a later record from another thread writes nothing
                    out.close()
            except OSError:
                pass
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)
