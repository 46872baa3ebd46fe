"""Optimizer steps as `perfdoctor run`'s step source: the optimizer half of stepsource.StepSources.

A step ends when the first optimizer that ever stepped (the primary) steps again. Another
optimizer that steps HANDOVER times in a row with no step of the primary between them takes over
(layer-wise training, a second stage). An optimizer built again over the same parameters (a
learning-rate schedule written as `opt = Adam(model.parameters(), lr=...)` inside the loop) is the
primary built again: it goes on as the primary from its first step, and the run says how often
that happened, since each new optimizer starts its state (momentum, Adam's moments) over.
Several optimizers stepping at different rates (a GAN's critic and generator) are said in a note.
"""

from __future__ import annotations

import time

RATES_NOTE = "optimizers step at different rates"   # the note's start (the report leads with it)
HANDOVER = 16                # another optimizer's steps in a row, none of the primary's, before steps follow it
MAX_IDS = 4096               # parameters whose ids make an optimizer's signature (a count past that)


class OptimizerSteps:
    """Mixed into hooks.Session through StepSources: its state (primary, others, optimizer_steps,
    optimizer_names, optimizer_dtypes, optimizer_sigs, rebuilt...) lives in the session."""

    first_timed = False      # the first step was measured from its own start (a closure optimizer's)

    def _on_optimizer_pre_step(self, optimizer, args, kwargs) -> None:
        self.opt_clock.pre()
        if self.mode != "optimizer":
            self.in_optimizer = True
            if self.pre_mark is None:
                self.pre_mark = self._mark()
                self.passes_in_optimizer = 0

    def _on_optimizer_step(self, optimizer, args, kwargs, skipped: bool = False) -> None:
        if self.forked is not None:            # a forked child's step: counted apart (forked.py)
            if not skipped:
                self.forked.step()
            return
        self.opt_clock.post(optimizer, args, kwargs, skipped)     # before the boundary: this step's time
        if not skipped:
            self.nograd.open(time.perf_counter(), self.cum_wait)   # the next batch: from here to the model's next call
            self.optimizer_calls += 1
        key = id(optimizer)
        if key not in self.optimizer_names:
            dtypes = self.optimizer_dtypes[key] = _param_dtypes(optimizer)
            self.optimizer_names[key] = (type(optimizer).__name__, sum(dtypes.values()) if dtypes is not None else None)
            sig = self.optimizer_sigs[key] = _param_ids(optimizer)
            if self.primary is not None and key != self.primary and sig is not None \
                    and sig == self.optimizer_sigs.get(self.primary) \
                    and self.optimizer_names[key][0] == self.optimizer_names[self.primary][0]:
                self._rebuilt(key)
        self.optimizer_steps[key] = self.optimizer_steps.get(key, 0) + 1
        self.in_optimizer = False
        if self.primary is None:
            self.primary = id(optimizer)
            if self.mode is not None:
                self._rebase()
            self.mode, self.source = "optimizer", "optimizer"
            self.mark = None
            if self.passes_in_optimizer and self.pre_mark is not None and not skipped:
                # A closure optimizer: the whole step (forward and backward included) ran inside
                # optimizer.step(), so the first step is measured from its start.
                self.notes.append(f"{type(optimizer).__name__}.step(closure) runs forward and backward inside the optimizer "
                                  f"step (as LBFGS and Lightning do): a step is one optimizer step; backward passes "
                                  f"inside its first step ({self.passes_in_optimizer}) are not steps")
                self.mark = self.pre_mark
                self.t_first = self.pre_mark[0]
                self.first_timed = True
            self._boundary(skipped=skipped)
            return
        if key == self.primary:
            if self.others:
                self.others = {}
            self._boundary(skipped=skipped)
        elif self.mode == "optimizer":
            marks = self.others.setdefault(key, [])
            marks.append(self._mark())
            if len(marks) >= HANDOVER:
                self._hand_over(key, marks)

    def _rebuilt(self, key) -> None:
        """The primary built again over the same parameters (same class, same tensors): the new
        one is the primary from this step on, its predecessor's steps counted as its own."""
        old = self.primary
        self.optimizer_steps[key] = self.optimizer_steps.pop(old, 0)
        self.optimizer_names.pop(old, None)
        self.optimizer_dtypes.pop(old, None)
        self.optimizer_sigs.pop(old, None)
        self.primary, self.others = key, {}
        self.rebuilt += 1

    def _note_rebuilt(self) -> None:
        """Said once the run ends: how often the primary optimizer was built again."""
        if self.rebuilt and self.primary in self.optimizer_names:
            cls = self.optimizer_names[self.primary][0]
            every = self.optimizer_steps.get(self.primary, 0) / (self.rebuilt + 1)   # the first one too
            self.notes.append(f"the {cls} optimizer was built again over the same parameters {self.rebuilt} times "
                              f"({'every step' if every < 1.5 else f'once per {every:.0f} steps'}): steps follow each "
                              f"new one; each starts its state over (momentum, Adam's moments: its first steps are "
                              f"not the ones it would take) and allocates it again at its first step: set the "
                              f"learning rate in optimizer.param_groups, or with torch.optim.lr_scheduler")

    def _hand_over(self, key, marks: list) -> None:
        """Another optimizer stepped HANDOVER times with no step of the primary between them: the
        training moved on (layer-wise training, a second stage), and steps follow the new one from
        the first of those steps (their boundaries are written now). The update time of those
        steps lands in the first of them."""
        old, new = self._optimizer_label(self.primary), self._optimizer_label(key)
        self.primary, self.others = key, {}
        self.notes.append(f"{old} stopped stepping and {'another ' if new == old else ''}{new} stepped {len(marks)} "
                          f"times in a row: steps follow it from then on (a new phase of training: layer by layer, "
                          "a second stage)")
        if self.max_steps and not self.finished:
            marks = marks[: self.max_steps - (self.steps - self.step_base)]   # --max-steps counts these too
        for m in marks[:-1]:                     # (as _choose: recorded; the last one is a live boundary)
            self._record(m)
        if marks:
            self._boundary(end=marks[-1])

    def _note_optimizer_rates(self) -> None:
        """Several optimizers stepping at different rates: steps follow the first one to step.
        Said, with what a step is then: the counts cannot tell a GAN's critic stepping 5 times per
        iteration from an actor updated every other iteration, so both readings are given."""
        if self.mode != "optimizer" or self.primary not in self.optimizer_steps:
            return
        n = self.optimizer_steps[self.primary]
        others = [(k, c) for k, c in self.optimizer_steps.items() if k != self.primary and c > 0]
        rarer = [(k, c) for k, c in others if n >= 1.5 * c]
        busier = [(k, c) for k, c in others if c >= 1.5 * n]
        name = self._optimizer_label
        head = f"{RATES_NOTE}: a step is one step of the first to step ({name(self.primary)}, {n} steps)"
        if busier:
            k, c = max(busier, key=lambda kc: kc[1])
            self.notes.append(f"{head}, and {name(k)} stepped {c} times, {c / n:.1f} per step: where {name(k)} "
                              f"steps once per loop iteration, a step spans about {c / n:.1f} iterations "
                              "(--max-steps counts steps)")
        elif rarer:
            k, c = min(rarer, key=lambda kc: kc[1])
            self.notes.append(f"{head}; {name(k)} stepped {c} times, once per {n / c:.1f} steps: where it steps "
                              f"once per loop iteration (a GAN's generator), an iteration spans about {n / c:.1f} "
                              "steps; where it steps every few iterations, a step is an iteration "
                              "(--max-steps counts steps)")

    def _optimizer_label(self, key) -> str:
        """Its class, and its parameter count where another optimizer has the same class."""
        cls, params = self.optimizer_names[key]
        same = sum(1 for c, _ in self.optimizer_names.values() if c == cls)
        return f"{cls} of {params:,} parameters" if same > 1 and params is not None else cls


def _param_dtypes(optimizer) -> dict | None:
    """Elements of the optimizer's parameters per dtype ({"torch.float64": n, ...}): at its first
    step, before which a script may still convert its model."""
    try:
        out: dict = {}
        for g in optimizer.param_groups:
            for p in g["params"]:
                out[str(p.dtype)] = out.get(str(p.dtype), 0) + int(p.numel())
        return out
    except Exception:           # an optimizer-like object without torch's param_groups
        return None


def _param_ids(optimizer) -> tuple | None:
    """The ids of the optimizer's parameters in order (the first MAX_IDS, and their count): two
    optimizers with the same signature update the same tensors. None for an optimizer-like object
    without torch's param_groups."""
    try:
        ids = [id(p) for g in optimizer.param_groups for p in g["params"]]
    except Exception:
        return None
    return (len(ids), *ids[:MAX_IDS])
