"""In-process hooks of `perfdoctor run`, installed when the script imports torch.

Steps. A step ends when the first optimizer that ever stepped steps again (torch's global
optimizer post-hook), so several optimizers, gradient accumulation (one step per optimizer
step) and GradScaler-skipped steps (GradScaler.step is wrapped; a skip still ends the step) are
handled. A script without an optimizer falls back to DataLoader iterations: after
LOADER_FALLBACK batches without an optimizer step, each batch request ends a step.

Data wait. Time inside DataLoader iterators' __next__ (worker queue wait, or the whole
loading work with num_workers=0), summed per step.

Trace. torch.profiler records `active` steps after `skip` warm-up steps, with ProfilerStep
annotations. Kineto writes <run>/trace/<host>_<pid>.pt.trace.json on the training thread (its
C++ writer, the least the script can be held up); a background thread then compresses it to
.pt.trace.json.gz (isal, which releases the GIL) while training goes on, and the session waits
for it only when the script ends. If the script runs its own profiler, ours is not started (or
steps aside when theirs starts) and the run says so.

Records go to <run>/steps.jsonl (one line per step, flushed) and <run>/child.json at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time

LOADER_FALLBACK = 8
COMPRESS_WAIT_S = 120.0   # at the end, how long to wait for the trace's compression


def compress_trace(path: str) -> None:
    """path -> path + ".gz" (written under a hidden name, then renamed), then the plain file is
    removed. Any failure leaves the plain trace in place: readers take it as well."""
    d, name = os.path.split(path)
    partial = os.path.join(d, f".{name}.gz.partial")
    try:
        try:
            from isal import igzip as gz   # releases the GIL while compressing; ~4x zlib's speed
            level = 2
        except ImportError:  # pragma: no cover - isal is a dependency, but the child runs in the user's env
            import gzip as gz
            level = 6
        with open(path, "rb") as src, gz.open(partial, "wb", compresslevel=level) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(partial, path + ".gz")
        os.remove(path)
    except Exception:
        try:
            os.remove(partial)
        except OSError:
            pass


class StopRun(BaseException):
    """Raised at a step boundary to end the script gracefully (--max-steps / --duration)."""


class Session:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.run_dir = cfg["run_dir"]
        self.max_steps = cfg.get("max_steps")
        self.skip = int(cfg.get("skip", 5))
        self.active = int(cfg.get("active", 5))
        self.memory = bool(cfg.get("memory", False))
        self.trace_enabled = bool(cfg.get("trace", True))
        self.torch = None
        self.lock = threading.Lock()
        self.mode = None                 # "optimizer" | "dataloader"
        self.primary = None              # id of the optimizer that defines step boundaries
        self.optimizer_calls = 0         # real optimizer.step() calls seen by the post-hook
        self.user_profilers = 0          # the script's own torch.profiler objects, started and not stopped
        self.steps = 0
        self.batches_without_step = 0
        self.t_boundary = time.perf_counter()
        self.wait = 0.0
        self.batches = 0
        self.prof = None
        self.prof_state = "pending"      # pending | recording | done | skipped | failed
        self.notes: list[str] = []
        self.perturbed_next = False
        self.compressor: threading.Thread | None = None
        self.stop_requested = False
        self.finished = False
        os.makedirs(self.run_dir, exist_ok=True)
        self.out = open(os.path.join(self.run_dir, "steps.jsonl"), "w", buffering=1)
        try:
            signal.signal(signal.SIGUSR1, self._on_stop_signal)
        except (ValueError, OSError, AttributeError):   # not the main thread / no SIGUSR1
            pass

    # -- installation ---------------------------------------------------------------------
    def install(self, torch) -> None:
        self.torch = torch
        from perfdoctor.collect import inject   # `perfdoctor tune`'s changes (none under `run`)
        inject.apply(torch, self.cfg.get("changes"), self.run_dir)
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
            register_optimizer_step_post_hook(self._on_optimizer_step)
        except Exception as exc:  # very old torch
            self.notes.append(f"optimizer hook unavailable ({exc}); steps come from DataLoader iterations")
        self._wrap_dataloader()
        self._wrap_grad_scaler()
        self._wrap_user_profiler()

    def _wrap_dataloader(self) -> None:
        from torch.utils.data import dataloader as dl
        base = dl._BaseDataLoaderIter
        orig = base.__next__
        session = self

        def __next__(it):
            t0 = time.perf_counter()
            if session.mode != "optimizer":
                session._on_batch_request(t0)
            try:
                return orig(it)
            finally:
                session.wait += time.perf_counter() - t0
                session.batches += 1
        base.__next__ = __next__

    def _wrap_grad_scaler(self) -> None:
        session = self
        for modname in ("torch.amp.grad_scaler", "torch.cuda.amp.grad_scaler"):
            try:
                mod = __import__(modname, fromlist=["GradScaler"])
                cls = mod.GradScaler
            except Exception:
                continue
            if getattr(cls.step, "_perfdoctor", False):
                continue
            orig = cls.step

            def step(scaler, optimizer, *a, _orig=orig, **kw):
                calls = session.optimizer_calls
                out = _orig(scaler, optimizer, *a, **kw)
                if session.optimizer_calls == calls:           # the scaler skipped optimizer.step()
                    session._on_optimizer_step(optimizer, (), {}, skipped=True)
                return out
            step._perfdoctor = True
            cls.step = step

    def _wrap_user_profiler(self) -> None:
        """Know when the script has a torch.profiler of its own, from start() to stop(): a
        scheduled profiler is not 'enabled' during its wait phase, yet starting a second one
        then crashes Kineto when the first wakes up."""
        import torch.profiler as tp
        session = self
        orig_start, orig_stop = tp.profile.start, tp.profile.stop

        def start(prof, *a, **kw):
            if prof is not session.prof:
                session.user_profilers += 1
                if session.prof_state in ("recording", "exported"):
                    session._stop_profiler(partial=True)
                    session.notes.append("the script started its own profiler: perfdoctor stopped its trace "
                                         "early; analyse the script's trace with `perfdoctor report`")
                    session.prof_state = "skipped"
            return orig_start(prof, *a, **kw)

        def stop(prof, *a, **kw):
            if prof is not session.prof and session.user_profilers:
                session.user_profilers -= 1
            return orig_stop(prof, *a, **kw)
        tp.profile.start, tp.profile.stop = start, stop

    # -- step boundaries ------------------------------------------------------------------
    def _on_optimizer_step(self, optimizer, args, kwargs, skipped: bool = False) -> None:
        if not skipped:
            self.optimizer_calls += 1
        if self.primary is None:
            self.primary = id(optimizer)
            if self.mode == "dataloader":
                self.notes.append("an optimizer started stepping after the DataLoader fallback: "
                                  "steps now follow optimizer steps")
            self.mode = "optimizer"
            self._reset_boundary()
            return
        if id(optimizer) == self.primary:
            self._boundary(skipped=skipped)

    def _on_batch_request(self, t0: float) -> None:
        if self.mode is None:
            self.batches_without_step += 1
            if self.batches_without_step > LOADER_FALLBACK:
                self.mode = "dataloader"
                self.notes.append(f"no optimizer stepped during the first {LOADER_FALLBACK} batches: "
                                  "a step is one DataLoader iteration")
                self._reset_boundary()
        elif self.mode == "dataloader":
            self._boundary()

    def _reset_boundary(self) -> None:
        self.t_boundary = time.perf_counter()
        self.wait = 0.0
        self.batches = 0

    def _boundary(self, skipped: bool = False) -> None:
        now = time.perf_counter()
        with self.lock:
            self.steps += 1
            rec = {"step": self.steps, "end": round(time.time(), 6), "dur": round(now - self.t_boundary, 6), "wait": round(self.wait, 6),
                   "batches": self.batches, "mode": self.mode,
                   "profiled": self.prof_state == "recording", "perturbed": self.perturbed_next}
            if skipped:
                rec["skipped"] = True
            self.out.write(json.dumps(rec) + "\n")
            self.perturbed_next = False
            self.wait, self.batches = 0.0, 0
        self._profiler_step()
        if self.stop_requested or (self.max_steps and self.steps >= self.max_steps):
            raise StopRun()
        self.t_boundary = time.perf_counter()   # exclude our own bookkeeping from the next step

    def _on_stop_signal(self, signum, frame) -> None:
        self.stop_requested = True

    # -- profiler window ------------------------------------------------------------------
    def _profiler_step(self) -> None:
        if not self.trace_enabled or self.torch is None:
            return
        if self.prof_state == "pending" and self.steps >= self.skip:
            self._start_profiler()
        elif self.prof_state == "recording":
            self.prof.step()              # the schedule ends the cycle and calls _export
            if self.prof_state == "exported":
                self._stop_profiler(partial=False)

    def _start_profiler(self) -> None:
        torch = self.torch
        try:
            if self.user_profilers or torch.autograd.profiler._is_profiler_enabled:
                self.prof_state = "skipped"
                self.notes.append("the script runs its own profiler: perfdoctor did not start a second one; "
                                  "analyse the script's trace with `perfdoctor report`")
                return
        except AttributeError:
            pass
        from torch.profiler import ProfilerActivity, profile, schedule
        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        try:
            # One profiler warm-up step, then `active` recorded steps with ProfilerStep#N labels.
            self.prof = profile(activities=acts, profile_memory=self.memory, record_shapes=self.memory,
                                schedule=schedule(wait=0, warmup=1, active=self.active, repeat=1),
                                on_trace_ready=self._export)
            self.prof.start()
            self.prof_state = "recording"
        except Exception as exc:
            self.prof_state = "failed"
            self.notes.append(f"torch.profiler could not start: {type(exc).__name__}: {exc}")

    def _trace_path(self) -> str:
        d = os.path.join(self.run_dir, "trace")
        os.makedirs(d, exist_ok=True)
        return os.path.join(d, f"{socket.gethostname()}_{os.getpid()}.pt.trace.json")

    def _export(self, prof) -> None:
        t0 = time.perf_counter()
        try:
            path = self._trace_path()
            prof.export_chrome_trace(path)     # plain JSON: no Python-level gzip on this thread
            self.prof_state = "exported"
            self.compressor = threading.Thread(target=compress_trace, args=(path,),
                                               name="perfdoctor-trace-gzip", daemon=True)
            self.compressor.start()
        except Exception as exc:
            self.prof_state = "failed"
            self.notes.append(f"writing the trace failed: {type(exc).__name__}: {exc}")
        self.export_s = time.perf_counter() - t0
        self.perturbed_next = True      # the export ran inside the next step's wall time

    def _stop_profiler(self, partial: bool) -> None:
        prof, self.prof = self.prof, None
        if prof is None:
            return
        try:
            prof.stop()                  # a cycle cut short exports what it recorded (on_trace_ready)
        except Exception as exc:
            self.notes.append(f"stopping the profiler failed: {type(exc).__name__}: {exc}")
        if self.prof_state in ("exported", "recording"):
            self.prof_state = "done" if self.prof_state == "exported" else "failed"
        if partial and self.prof_state == "done":
            self.notes.append("the trace covers fewer steps than asked (the run ended or another profiler started)")

    # -- the end ----------------------------------------------------------------------------
    def finish(self, outcome: str, exit_code: int | None = None, error: str | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        try:
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)   # do not lose the files to a 2nd Ctrl-C
        except (ValueError, OSError):
            old = None
        try:
            if self.prof_state in ("recording", "exported"):
                self._stop_profiler(partial=self.prof_state == "recording")
            if self.compressor is not None:
                self.compressor.join(timeout=COMPRESS_WAIT_S)
                if self.compressor.is_alive():
                    self.notes.append("the trace was still being compressed when the script ended; "
                                      "the uncompressed .pt.trace.json is kept")
            info = {"outcome": outcome, "exit_code": exit_code, "error": error, "steps": self.steps,
                    "mode": self.mode, "profiler": self.prof_state, "trace_enabled": self.trace_enabled,
                    "notes": self.notes,
                    "torch_imported": self.torch is not None,
                    "torch_version": getattr(self.torch, "__version__", None),
                    "cuda_available": bool(self.torch and self.torch.cuda.is_available())}
            with open(os.path.join(self.run_dir, "child.json"), "w") as f:
                json.dump(info, f, indent=1)
            self.out.close()
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)
