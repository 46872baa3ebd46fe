"""Where `perfdoctor run`'s steps come from: the step-source half of hooks.Session.

Steps come from the first of these sources that the script uses (child.json "mode" and
"step_source" say which):
1. Optimizer steps. A step ends when the first optimizer that ever stepped steps again (torch's
   global optimizer post-hook), so several optimizers, gradient accumulation and several
   backward passes per step are handled, and a step that GradScaler skips (GradScaler.step is
   wrapped) still ends a step. A closure optimizer (LBFGS) runs forward and backward inside
   optimizer.step(): those passes are not steps (a pre-hook tells that an optimizer step is
   running), and the first step is measured from its own start. When another optimizer steps
   HANDOVER times in a row with no step of the first between them (layer-wise training: one
   optimizer per layer, trained one after the other), steps follow it from the first of those.
   One of the first's class built again over the same parameters is the first built again
   (a learning-rate schedule written by hand): steps follow it at once (optsteps.py).
2. Backward passes (passes.py), for hand-written updates: a step begins with the first pass
   after the gradients were reset, so accumulation over several passes is one step. Chosen
   after FALLBACK steps without an optimizer step (or PASS_FALLBACK passes in which the
   gradients were never seen reset: then each pass is a step). A `torch.autograd.grad` call
   on weights (a functional loop; passes.weights_updated) returns fresh gradients: each such
   call starts a step, and so does a torch.func.grad call outside other transforms, unless
   backward passes run beside it (funcpasses.wrap_func_grad).
3. DataLoader iterations, for loops without backward passes (evaluation): after FALLBACK batches
   with neither an optimizer step nor a backward pass, each batch request ends a step.
4. Outermost module calls (modules.py), for loops with none of those (an inference loop over
   tensors): when one module has made more than FALLBACK outermost calls (not inside a
   DataLoader's __next__) with no backward pass and no batch, each call of that module starts a
   step. Calls made with autograd recording (grad mode on) may be a training step's forward
   passes (a per-sample loop calls its model once per sample before its one backward pass):
   those also wait MODULE_WAIT_S from the first call.
Until a source is chosen its boundaries are kept, and written as steps once it is: no step is
lost to the choice. The first boundary starts the count (its step began before any signal).
If an optimizer starts stepping after a fallback was chosen (an evaluation before training),
steps follow it from then on, and --max-steps, the warm-up and the trace count from there: a
trace already recorded over the fallback's steps is dropped and recorded again.
"""

from __future__ import annotations

from perfdoctor.collect import dynamoskip
from perfdoctor.collect.optsteps import OptimizerSteps

FALLBACK = 8                 # steps of a fallback source seen before it is chosen
PASS_FALLBACK = 32           # passes with no gradient reset seen before each pass counts as a step
NO_OPT = "no torch.optim optimizer stepped"   # a hand-written update is an optimizer too, not torch.optim's
SOURCES = {"optimizer": "optimizer steps", "backward": "backward passes (a step from one gradient reset to the next)",
           "backward-each": "backward passes (one per step: no gradient reset seen)",
           "backward-grad": "torch.autograd.grad calls (one per step)",
           "backward-func": "torch.func.grad calls (one per step)",
           "dataloader": "DataLoader iterations",
           "module": "calls of the outermost module (one per step)"}
MODULE_WAIT_S = 3.0          # outermost calls with grad mode on: the module source waits this long for a backward
MAX_ROOTS = 64               # distinct modules whose outermost calls are kept before a source is chosen


class StepSources(OptimizerSteps):
    """The step-source callbacks of hooks.Session (its state lives there: mode, source, marks...);
    the optimizers' are OptimizerSteps' (optsteps.py)."""

    def hook_optimizers(self, torch) -> None:
        """torch.optim's global step hooks call _on_optimizer_pre_step and _on_optimizer_step, except
        while Dynamo traces them inside a compiled optimizer step: nothing of ours in its graph."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        compiling = dynamoskip.compiling_check(torch)

        def pre(optimizer, args, kwargs):
            if not compiling():
                self._on_optimizer_pre_step(optimizer, args, kwargs)

        def post(optimizer, args, kwargs):
            if not compiling():
                self._on_optimizer_step(optimizer, args, kwargs)
        register_optimizer_step_pre_hook(dynamoskip.keep_out(pre, recursive=True))
        register_optimizer_step_post_hook(dynamoskip.keep_out(post, recursive=True))

    def _wrap_grad_scaler(self) -> None:
        """GradScaler.step that skips optimizer.step() (inf/NaN gradients) still ends a step."""
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

    def on_pass(self, roots, t0: float, fresh: bool | str = False) -> None:
        """A backward pass is about to run (passes.wrap_backward); not called in optimizer mode.
        `fresh`: a torch.autograd.grad call, whose gradients are new (a step starts); "func": a
        torch.func.grad call, which beside backward passes is no step of its own (a meta-learning
        inner loop whose outer loss calls backward)."""
        if self.in_optimizer:
            self.passes_in_optimizer += 1
            return
        if fresh:
            if fresh == "func" and self.passes > self.grad_calls:
                return
            reset = True
            self.grad_calls += 1
            self.func_calls += fresh == "func"
        else:
            reset = self.resets.before_pass(roots) if self.resets is not None else None
        self.passes += 1
        self.batches_since_pass = 0
        self.loader_marks = []
        m = self._mark(t0)
        if self.mode == "backward":
            if reset is not False or self.source == "backward-each":
                self._boundary(end=m)
            return
        if self.mode is not None:
            return
        self.pass_marks.append(m)
        if reset is not False:
            self.group_marks.append(m)
        if len(self.group_marks) > FALLBACK:
            if self.grad_calls == self.passes:
                source = self._grad_source()
                self._choose(source, self.group_marks, f"{NO_OPT} during the first {FALLBACK} "
                             f"{SOURCES[source].split(' (')[0]} (a functional loop): each call is a step")
            elif reset is None:
                self._choose("backward-each", self.group_marks, f"{NO_OPT} during the first {FALLBACK} "
                             "backward passes, and their gradients cannot be watched: each pass is a step")
            else:
                self._choose("backward", self.group_marks,
                             f"{NO_OPT} in the first {FALLBACK} rounds of backward passes, {_by_hand()}: a step "
                             "runs from one reset of the gradients (zero_grad or grad.zero_()) to the next")
        elif len(self.group_marks) <= 1 and len(self.pass_marks) > PASS_FALLBACK:
            self._choose("backward-each", list(self.pass_marks),
                         f"no optimizer step and no gradient reset seen in {PASS_FALLBACK} backward passes: each "
                         "pass is a step (a reset through .grad.data is invisible)")

    def _grad_source(self) -> str:
        """The source of a loop whose passes are all gradient calls: torch.func's or autograd's."""
        return "backward-func" if self.func_calls == self.grad_calls else "backward-grad"

    def after_pass(self) -> None:
        if not self.in_optimizer and self.resets is not None:
            self.resets.after_pass()

    def _on_batch_request(self, t0: float) -> None:
        if self.mode == "dataloader":
            self._boundary(end=self._mark(t0))
        elif self.mode is None and not self.in_optimizer:
            self.loader_marks.append(self._mark(t0))
            self.batches_since_pass += 1
            if self.batches_since_pass > FALLBACK:
                self._choose("dataloader", self.loader_marks,
                             f"no optimizer step nor backward pass during the first {FALLBACK} batches: "
                             "a step is one DataLoader iteration")

    def on_root_call(self, module, t0: float) -> None:
        """An outermost module call is about to run (modules.watch; only before a source is
        chosen). Kept per module while nothing better (a backward pass, a batch) has been seen."""
        if self.mode is not None or self.in_optimizer or self.passes or self.cum_batches or self.loader_marks:
            return
        marks = self.root_calls.get(id(module))
        if marks is None:
            if len(self.root_calls) >= MAX_ROOTS:
                return
            marks = self.root_calls[id(module)] = [module.__class__.__name__]
        marks.append(self._mark(t0))
        if len(marks) > FALLBACK + 1 and (t0 - marks[1][0] >= MODULE_WAIT_S or not self.torch.is_grad_enabled()):
            self._choose_module(module, marks)

    def _choose_module(self, module, marks: list) -> None:
        from perfdoctor.collect import modules
        name = marks[0]
        self.root_calls = {}
        self.module_training = bool(getattr(module, "training", False))
        self._choose("module", marks[1:], f"no optimizer step, backward pass or DataLoader batch in the first "
                     f"{len(marks) - 1} calls of the outermost module ({name}): a step is one call of it")
        if module is not None:
            try:
                self.module_hook = modules.hook_steps(module, self)
                # this call's own pre-hook comes next: not a second boundary (the class wrapper
                # marking a module compiled in place has marked this call already)
                self.module_skip = self.module_hook is not None
            except Exception as exc:
                self.notes.append(f"the module's calls cannot be watched from here on ({type(exc).__name__}: {exc})")

    def on_module_step(self, t0: float, hooked: bool = True) -> None:
        """The chosen module is called (its forward pre-hook, or the class wrapper when `hooked`
        is False: a module compiled in place)."""
        if self.mode != "module":                  # an optimizer took over: the hook has no more to say
            if self.module_hook is not None:
                self.module_hook.remove()
                self.module_hook = None
            self.module_watch = None
            return
        if hooked and self.module_skip:
            self.module_skip = False
            return
        self._boundary(end=self._mark(t0))

    def _choose(self, source: str, marks: list, note: str) -> None:
        """Adopt a fallback source: its boundaries so far become steps, the last one live."""
        self.mode, self.source = ("backward" if source.startswith("backward") else source), source
        self.notes.append(note)
        self.fallback_notes.append(note)
        marks = list(marks)
        if self.max_steps and not self.finished:
            marks = marks[: self.max_steps - (self.steps - self.step_base) + 1]   # --max-steps counts these too
        self.group_marks, self.loader_marks = [], []
        self.pass_marks.clear()
        self.mark, self.t_first = marks[0], marks[0][0]
        for m in marks[1:-1]:
            self._record(m)
        if len(marks) > 1:
            self._boundary(end=marks[-1])

    def _rebase(self) -> None:
        """An optimizer steps for the first time after a fallback source was chosen (evaluation
        before training, say): steps follow it from now on, and --max-steps, the warm-up and
        the trace count from here (a trace of the earlier steps is recorded again)."""
        old = SOURCES[self.source]
        self.notes[:] = [n for n in self.notes if n not in self.fallback_notes]
        dropped = self.window.rebase()
        # backward passes are no evaluation: many micro-batches accumulated before the first update
        why = ("gradients accumulated over them before the first update?" if self.source.startswith("backward")
               else "a rollout under torch.no_grad() before the first update, the model in training mode?"
               if self.source == "module" and self.module_training
               else "an evaluation before training?")
        self.notes.append(f"the first {self.steps} step(s) were {old} with no optimizer step ({why}); an optimizer "
                          "stepped then, and steps follow optimizer steps from "
                          "there: --max-steps, the warm-up and the trace count from that step"
                          + ("; the trace of the earlier steps was dropped and recorded again" if dropped else ""))
        self.step_base = self.steps
        if self.census is not None:                # count a step of the new source, not of the old one
            self.module_watch = None
            if self.census.state == "done":        # the class wrapper is off: put it on again
                from perfdoctor.collect import modules
                modules.watch(self.torch, self)
            else:
                self.census.reset()

    def _settle(self) -> None:
        """At the end, a run that never chose a source takes the best candidate it has."""
        if self.mode is not None:
            return
        if len(self.group_marks) > 1 and self.grad_calls == self.passes:
            source = self._grad_source()
            self._choose(source, self.group_marks, f"{NO_OPT}: each {SOURCES[source].split(' calls')[0]} "
                         "call is a step (a functional loop)")
        elif len(self.group_marks) > 1:
            self._choose("backward", self.group_marks, f"{NO_OPT}: a step runs from one gradient "
                         f"reset to the next ({_by_hand(short=True)})")
        elif len(self.pass_marks) > 1:
            self._choose("backward-each", list(self.pass_marks), f"{NO_OPT} and no gradient reset "
                         "was seen: each backward pass is a step")
        elif len(self.loader_marks) > 1:
            self._choose("dataloader", self.loader_marks, "no optimizer step nor backward pass: a step is one "
                         "DataLoader iteration")
        elif self.root_calls:
            marks = max(self.root_calls.values(), key=len)
            if len(marks) > 2:
                self._choose_module(None, marks)

def _by_hand(short: bool = False) -> str:
    """Why no optimizer step was seen: a hand-written update, or (once the script has compiled
    something) an optimizer step inside compiled code, where the hooks step aside (dynamoskip.py)."""
    compiled = dynamoskip.dynamo_loaded()
    if short:
        return ("a hand-written update, or an optimizer step inside torch.compile'd code, where perfdoctor's "
                "optimizer hooks step aside" if compiled else "hand-written update")
    if compiled:
        return ("so the script updates its parameters by hand or inside torch.compile'd code (where perfdoctor's "
                "optimizer hooks step aside, not to break the graph)")
    return "so the script updates its parameters by hand"


# called from the module class wrapper (modules.py), which Dynamo may meet inside a module
# compiled in place: bookkeeping, run as Python (dynamoskip.py)
for _fn in (StepSources.on_root_call, StepSources.on_module_step):
    dynamoskip.keep_out(_fn, recursive=True)
