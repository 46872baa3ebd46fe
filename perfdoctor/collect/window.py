"""The torch.profiler window of `perfdoctor run`: where it starts, how long it records, its export.

Placed by steps and by time, so that short and long steps both get a trace of whole steady steps.
Called at each step boundary with the number of measured steps and the time since the first one
began:

- Start (warm-up). The profiler starts at the first boundary where `steps >= skip`
  (`--skip-steps`), or, when steps are long, where at least one step has ended and `warmup_s`
  seconds have passed since the first measured step began: skip = max(1, the steps that fit in
  the first `warmup_s` seconds). The first step is always skipped (lazy initialisation,
  allocator growth, autotuning and compilation land there).
- Profiler warm-up. torch.profiler's own warm-up step absorbs its start-up cost (CUPTI/Kineto
  initialisation: milliseconds on a CPU, up to a second or two on a GPU). It is kept when the
  last step was shorter than `warmup_s`, or on a process without CUDA shorter than CPU_STEP_S
  (0.1 s); a step at least that long dwarfs the start-up cost, so recording begins with the next
  step and a run of two long steps still gets a trace (a user's 6 steps of 3 s on a CPU had got
  none: 4 warm-up steps and a profiler warm-up left no step to record; a hand-written update's
  10 steps of 0.45 s none either: its step source is known after 8 of them). Without CUDA the
  first profiled step cost 0-3 ms more than the next ones (a 20-layer MLP's 8 ms step, started
  three times in one process: 8.3, 11.2 and 8.3 ms against 7.7-9.0): 3% of a 0.1 s step at most.
- End. Recording stops at the boundary where `active` steps (`--trace-steps`) are recorded, or
  at least one is and `trace_s` seconds of steps have been recorded: a run of a few long
  steps gets one or two whole steps, not a cut-short window, and the trace stays small.
- Memory. torch.profiler keeps every op event in memory, about 0.3 KB each while recording,
  and stop() and the export take about 1.5 KB an event more for a moment (tracebudget.py). A
  whole LBFGS step of pytorch/examples' time_sequence_prediction on the CPU (20 closure calls of
  an LSTM cell, 375k events each), with stop() parsing every event in Python (acc_events, since
  dropped), grew the script past the machine's 24 GB and the kernel killed it. So the window has
  a memory budget: the least of `trace_mb` (512 MB, PERFDOCTOR_TRACE_MB, "trace_mb") and a
  twentieth of the memory available when recording begins, above the process's peak resident
  size by then (the script's own per-step peaks, the profiler's start-up and its warm-up step do
  not count). The resident size also holds the free memory of a heap the records fragment (the
  script's freed tensors, kept: 1-40 KB an event on an LSTM or a conv net, by their tensors'
  size); past the budget, that free heap is first returned to the system (glibc malloc_trim,
  "heap_trims" in child.json's window) and recording goes on when the process is then half the
  budget or more below its limit. Else recording stops at the next point the hooks see on the
  profiling thread (a backward pass, a DataLoader batch, a step boundary): the trace then holds
  part of a step, and a note says how much.

Defaults: warmup_s = trace_s = 10 s, overridable by the environment (PERFDOCTOR_WARMUP_S,
PERFDOCTOR_TRACE_S) or the child configuration ("warmup_s", "trace_s"). Ending the window is
always `profile.stop()`, which exports what was recorded through `on_trace_ready`.

The trace file, its name and its compression off the training thread: tracefile.py.
If the script runs its own profiler, ours is not started (or steps aside when theirs starts). Its
first start off torch's importing thread keeps Kineto's line about that off stderr (profquiet.py).
"""

from __future__ import annotations

import os
import threading
import time

from perfdoctor.collect import profquiet
from perfdoctor.collect.tracefile import COMPRESS_WAIT_S, compress_in_background, remove_dropped, trace_path
from perfdoctor.collect.tracebudget import CHECK_S, TRACE_MB, memory_limit, release_free_heap, resident_bytes

WARMUP_S = 10.0
TRACE_S = 10.0
CPU_STEP_S = 0.1      # without CUDA, a step this long needs no profiler warm-up step (module doc)


def seconds(cfg: dict, key: str, env: str, default: float) -> float:
    """A time setting from the child config, else the environment, else the default."""
    for raw in (cfg.get(key), os.environ.get(env)):
        try:
            if raw is not None and float(raw) >= 0:
                return float(raw)
        except ValueError:
            pass
    return default


class Window:
    """The profiler window. state: pending | recording | exported | done | empty (the run ended
    before a whole step was recorded: no trace is written, since the script's tail after its
    last step is no step) | skipped (the script profiles itself) | failed."""

    def __init__(self, run_dir: str, notes: list[str], *, skip: int, active: int, memory: bool,
                 enabled: bool, warmup_s: float, trace_s: float, trace_mb: float = TRACE_MB):
        self.run_dir, self.notes = run_dir, notes
        self.trace_mb = trace_mb
        self.limit = None              # (resident bytes at which recording stops, budget), see Memory
        self.thread = None             # the thread that started the profiler: the only one that stops it
        self.checked = 0.0             # last resident-size reading (perf_counter)
        self.cut = None                # {"after_s", "resident_mb", "budget_mb"}: stopped inside a step
        self.trims: list[dict] = []    # free heap returned past the budget: {"after_s", "freed_mb", "ms"}
        self.skip, self.active, self.memory, self.enabled = skip, max(1, active), memory, enabled
        self.warmup_s, self.trace_s = warmup_s, trace_s
        self.torch = self.import_thread = None
        self.prof = None
        self.state = "pending"
        self.user_profilers = 0        # the script's own torch.profiler objects, started and not stopped
        self.warmup = 1                # profiler warm-up steps of this window (0 or 1)
        self.n = 0                     # boundaries since the profiler started
        self.t_record = None           # when recording began
        self.start_step = None         # measured steps before the window
        self.recorded = 0
        self.perturbed_next = False    # the export ran inside the next step's wall time
        self.compressor: threading.Thread | None = None
        self.generation = 0            # windows placed again after the step source changed (rebase)
        self.dropped: list = []        # (trace path, its compressor) of windows dropped by rebase
        self.export_s = None
        self.discard = False           # the run ended before a whole step was recorded: no trace

    @property
    def recording(self) -> bool:
        return self.state == "recording"

    def install(self, torch) -> None:
        self.torch = torch
        self.import_thread = threading.get_ident()     # torch registered its Kineto client in it (profquiet.py)
        self._wrap_user_profiler()

    def _wrap_user_profiler(self) -> None:
        """Know when the script has a torch.profiler of its own, from start() to stop(): a
        scheduled profiler is not 'enabled' during its wait phase, yet starting a second one
        then crashes Kineto when the first wakes up."""
        import torch.profiler as tp
        win = self
        orig_start, orig_stop = tp.profile.start, tp.profile.stop

        def start(prof, *a, **kw):
            if prof is not win.prof:
                win.user_profilers += 1
                if win.state in ("recording", "exported"):
                    win._stop(partial=True)
                    win.notes.append("the script started its own profiler: perfdoctor stopped its trace "
                                     "early; analyse the script's trace with `perfdoctor report`")
                    win.state = "skipped"
            return orig_start(prof, *a, **kw)

        def stop(prof, *a, **kw):
            if prof is not win.prof and win.user_profilers:
                win.user_profilers -= 1
            return orig_stop(prof, *a, **kw)
        tp.profile.start, tp.profile.stop = start, stop

    # -- at each step boundary ----------------------------------------------------------------
    def on_boundary(self, steps: int, now: float, t_first: float, last_dur: float) -> None:
        """steps: measured steps so far; t_first: when the first measured step began
        (perf_counter); last_dur: the step that just ended, in seconds."""
        if not self.enabled or self.torch is None:
            return
        if self.prof is not None and self.thread != threading.get_ident():
            return                      # a step of another thread: the profiler is its own thread's
        if self.state == "pending":
            by_steps = steps >= self.skip
            if by_steps or (steps >= 1 and now - t_first >= self.warmup_s):
                self.warmup = 0 if last_dur >= min(self.warmup_s, self._startup_free_s()) else 1
                self._start(now)
                self.start_step = steps
                if not by_steps:
                    self.notes.append(f"steps are long ({last_dur:.1f} s): the trace starts after {steps} warm-up "
                                      f"step(s) ({now - t_first:.0f} s >= {self.warmup_s:g} s) instead of "
                                      f"--skip-steps {self.skip}")
        elif self.state == "recording":
            self.n += 1
            if self.n == self.warmup:
                self.t_record = now
                self.limit = memory_limit(self.trace_mb)
            self.recorded = self.n - self.warmup
            rss = self._over_budget(now, force=True) if 1 <= self.recorded < self.active else None
            if rss is not None:
                self.notes.append(f"the trace holds {self.recorded} whole step(s), not --trace-steps "
                                  f"{self.active}: {self._budget_text(rss)}")
                self._stop(partial=False)
            elif self.recorded >= self.active or (self.recorded >= 1 and now - self.t_record >= self.trace_s):
                if self.recorded < self.active:
                    self.notes.append(f"steps are long: the trace holds {self.recorded} whole step(s) "
                                      f"({now - self.t_record:.1f} s >= {self.trace_s:g} s), "
                                      f"not --trace-steps {self.active}")
                self._stop(partial=False)
            else:
                # some torch versions ask for torch._inductor in start_trace
                with profquiet.inductor_left_unloaded(self.torch), profquiet.cycle_warning_hidden():
                    self.prof.step()

    def _startup_free_s(self) -> float:
        """How long a step must be for the profiler's start-up to vanish in it: CPU_STEP_S where
        the profiler records no CUDA activity (no CUPTI to start), else warmup_s."""
        try:
            cuda = bool(self.torch.cuda.is_available())
        except Exception:           # a torch without a working CUDA query: keep the warm-up step
            cuda = True
        return self.warmup_s if cuda else CPU_STEP_S

    def _start(self, now: float) -> None:
        torch = self.torch
        try:
            if self.user_profilers or torch.autograd.profiler._is_profiler_enabled:
                self.state = "skipped"
                self.notes.append("the script runs its own profiler: perfdoctor did not start a second one; "
                                  "analyse the script's trace with `perfdoctor report`")
                return
        except AttributeError:
            pass
        from torch.profiler import ProfilerAction, ProfilerActivity, profile
        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        warmup = self.warmup

        def sched(step: int):
            # `warmup` profiler warm-up steps, then record until on_boundary stops the profiler
            # (stop() exports what was recorded); ProfilerStep#N labels mark the steps.
            return ProfilerAction.WARMUP if step < warmup else ProfilerAction.RECORD
        try:
            self.prof = profile(activities=acts, profile_memory=self.memory, record_shapes=self.memory,
                                schedule=sched, on_trace_ready=self._export)
            self.thread = threading.get_ident()
            with profquiet.inductor_left_unloaded(torch), profquiet.cycle_warning_hidden(), \
                    profquiet.kineto_line_dropped(self.import_thread):
                self.prof.start()
            # measured once the profiler runs (CUPTI's libraries and buffers are no events), and
            # again when recording begins after a profiler warm-up step
            self.limit = memory_limit(self.trace_mb)
            self.state = "recording"
            self.n = 0
            self.t_record = now if warmup == 0 else None
        except Exception as exc:
            self.state = "failed"
            self.notes.append(f"torch.profiler could not start: {type(exc).__name__}: {exc}")

    def _over_budget(self, now: float, force: bool = False) -> int | None:
        """The resident size when it is past the window's budget (read at most every CHECK_S
        unless `force`), else None. Only while events are recorded, on the profiling thread."""
        if (self.state != "recording" or self.limit is None or self.t_record is None
                or threading.get_ident() != self.thread or (not force and now - self.checked < CHECK_S)):
            return None
        self.checked = now
        rss = resident_bytes()
        if rss is None or rss <= self.limit[0]:
            return None
        return self._after_release(rss, now)

    def _after_release(self, rss: int, now: float) -> int | None:
        """Past the limit: return the free heap to the system (tracebudget.py: the script's freed
        tensors kept by a heap the profiler's records fragment) and read again. Recording goes
        on when that brought the process back below the limit by half the budget or more, so
        a trim comes at most once per half budget of growth; else the resident size (stop)."""
        t0 = time.perf_counter()
        if not release_free_heap():
            return rss
        after = resident_bytes()
        if after is None:
            return rss
        ms = (time.perf_counter() - t0) * 1e3
        self.trims.append({"after_s": round(now - self.t_record, 3), "freed_mb": round((rss - after) / 2 ** 20),
                           "ms": round(ms, 1)})
        return None if after <= self.limit[0] - self.limit[1] // 2 else after

    def _budget_text(self, rss: int) -> str:
        mb = 2 ** 20
        return (f"the process grew to {rss / mb:.0f} MB while the profiler recorded (about 0.3 KB an op event, "
                f"once the free heap is returned), past the window's budget of {self.limit[1] / mb:.0f} MB over "
                "the earlier peak (PERFDOCTOR_TRACE_MB)")

    def check_memory(self, now: float | None = None) -> bool:
        """Called by the hooks inside a step (backward passes, DataLoader batches): stops the
        recording when the process has grown past the window's memory budget. True if it did.
        Never raises: it runs inside the script's backward and batch fetches."""
        if self.state != "recording":
            return False
        try:
            return self._cut_if_over(time.perf_counter() if now is None else now)
        except Exception:
            return False

    def _cut_if_over(self, now: float) -> bool:
        rss = self._over_budget(now)
        if rss is None:
            return False
        self.cut = {"after_s": round(now - self.t_record, 3), "resident_mb": round(rss / 2 ** 20),
                    "budget_mb": round(self.limit[1] / 2 ** 20)}
        try:     # in the trace's header too, for `perfdoctor report` of the trace alone
            self.prof.add_metadata("perfdoctor_cut_s", f"{now - self.t_record:.3f}")
        except Exception:
            pass
        self.notes.append(f"the trace stopped inside a step, {now - self.t_record:.1f} s after recording began "
                          f"and after {self.recorded} whole step(s): {self._budget_text(rss)}; the trace's "
                          "last step is cut short (its shares hold, not its length)")
        self._stop(partial=False)
        return True

    def _export(self, prof) -> None:
        if self.discard:
            return
        t0 = time.perf_counter()
        try:
            path = trace_path(self.run_dir, self.generation)
            prof.export_chrome_trace(path)     # plain JSON: no Python-level gzip on this thread
            self.state = "exported"
            self.compressor = compress_in_background(path)
        except Exception as exc:
            self.state = "failed"
            self.notes.append(f"writing the trace failed: {type(exc).__name__}: {exc}")
        self.export_s = time.perf_counter() - t0
        self.perturbed_next = True

    def _stop(self, partial: bool) -> None:
        prof, self.prof = self.prof, None
        if prof is None:
            return
        try:
            prof.stop()                  # exports what it recorded (on_trace_ready); nothing in warm-up
        except Exception as exc:
            self.notes.append(f"stopping the profiler failed: {type(exc).__name__}: {exc}")
        # the recorded events: torch's profile object holds them in a reference cycle, which only a
        # full garbage collection frees, and glibc keeps their heap after that (a GRU loop stayed
        # 200 MB above its bare size for the rest of the run). Let go of here, and the heap
        # returned, in the step the export already perturbs (tracebudget.py: ~0.3 KB an event)
        try:
            prof.profiler = None
        except Exception:
            pass
        del prof
        release_free_heap()
        if self.state == "exported":
            self.state = "done"
            if partial:
                self.notes.append("the trace covers fewer steps than asked (the run ended or another profiler started)")
        elif self.state == "recording":
            # stopped in the profiler's warm-up step: nothing was recorded, which is no failure
            self.state = "empty" if self.n < self.warmup else "failed"

    def rebase(self) -> bool:
        """Steps are counted afresh (the step source changed): a window over the old steps is
        dropped, its trace file too, and placed again. True when one was dropped."""
        if self.state == "recording":
            self.discard = True                  # stop without writing what it recorded
            self._stop(partial=True)
            self.discard = False
        elif self.state == "done":
            # its file may still be compressing: removed at the end (finish), never waited for here
            self.dropped.append((trace_path(self.run_dir, self.generation), self.compressor))
        else:
            return False
        self.generation += 1                    # the next window writes a file of its own
        self.state, self.start_step, self.recorded, self.n, self.compressor = "pending", None, 0, 0, None
        self.export_s, self.perturbed_next = None, False
        return True

    def end(self) -> None:
        """Stop recording (on the profiling thread): the trace is exported, unless it holds no
        whole step, or finish() gave it up."""
        if self.state == "recording" and self.recorded == 0:
            # Only the tail of the script since the last boundary was recorded: not a step.
            self.discard = True
            self._stop(partial=True)
            self.state = "empty"
        if self.state in ("recording", "exported"):
            self._stop(partial=self.state == "recording")
        elif self.prof is not None:              # given up by finish(): stopped, nothing written
            self.discard = True
            self._stop(partial=True)

    def thread_ended(self) -> None:
        """A thread of the script ends (threadstop.py): the profiler it started stops with it."""
        if self.prof is not None and self.thread == threading.get_ident():
            self.end()

    def finish(self) -> None:
        if self.prof is not None and self.thread != threading.get_ident():
            # torch.profiler stops only in the thread that started it (stopped from another, the
            # script crashed: SIGSEGV); that thread stops it when it ends, writing nothing
            self.state, self.discard = "failed", True
            self.notes.append("no trace: the thread that ran the profiler was still running when the script "
                              "ended, and a profiler stops only in its own thread")
        else:
            self.end()
        if self.compressor is not None:
            self.compressor.join(timeout=COMPRESS_WAIT_S)
            if self.compressor.is_alive():
                self.notes.append("the trace was still being compressed when the script ended; "
                                  "the uncompressed .pt.trace.json is kept")
        remove_dropped(self.dropped)            # traces of steps that turned out not to be steps

    def info(self) -> dict:
        started = self.start_step is not None
        return {"start_after_steps": self.start_step, "profiler_warmup_steps": self.warmup if started else None,
                "recorded_steps": self.recorded, "warmup_s": self.warmup_s, "trace_s": self.trace_s,
                "trace_mb": self.trace_mb, "budget_mb": round(self.limit[1] / 2 ** 20) if self.limit else None,
                "cut": self.cut, "heap_trims": self.trims}
