"""No-grad calls of the training's root module, timed per step by `perfdoctor run`.

An evaluation inside a training loop that draws no DataLoader batch (nanoGPT's estimate_loss:
batches sliced from an np.memmap, `model(X, Y)` under torch.no_grad() every eval_interval
steps) lengthens a step in every N with nothing the other hooks see. The module census
(modules.py Census) names the module called most in one step, the outermost one: the model.
Once it has, the calls of that one instance made on the training thread while grad mode is off
(torch.no_grad(), torch.inference_mode()) are timed, and their wall time is summed per step
(steps.jsonl `nograd`, seconds), with the time between two such calls in a row: an evaluation
loop's batch slicing and loss.item() (on a GPU the wait for the forward's queued kernels, which
the call itself does not pay). A run ends at a call with grad mode on (a training forward) and
at a step boundary. A call inside another timed call counts once.

The timing sits on the model's class: `type(model).__call__` (for most models inherited from
nn.Module, so a class attribute is added that calls the one it shadows, looked up at each
call: the census's Module.__call__ wrapper when it is on). Not forward hooks: a hook is pickled
with the module, and `torch.save(model)` of a model holding a local function fails. A class
attribute is pickled by reference, copied models (an EMA copy) keep the class and are not the
instance timed. A call with grad mode on pays one Python frame and a grad-mode read (~0.3 us;
a store; bench/bench_hooks.py); other instances of the class pay the same and are not timed. A model
compiled in place (`model.compile()`) is timed around its compiled call; `torch.compile(model)`
(OptimizedModule) has a __call__ of its own, which is what is wrapped then. Inside a graph that
dynamo traces (the model called from a compiled function) nothing is timed.

The same wrapper closes the gaps that the step's start and each optimizer step's end open (`open`,
`close`): from there to that instance's next call with grad mode on, less the DataLoader's wait,
is the batch in the making (steps.jsonl `pre`, their sum over the step, hooks.py), a few
attribute reads a gap. Each optimizer's step opens one, not only the step's first: a GAN's step
ends at its discriminator's optimizer, and its batch is drawn after the generator's step, before
the next discriminator call (a generator called before the model counts in the gap too).

What this misses: the evaluation's work before its first call and after its last (model.eval(),
the last loss.item(): on a GPU, the wait for the last forward), and evaluations of another
instance (an EMA copy, `model.module` under DDP). A lower bound.
A forked child (a DataLoader worker, a Hogwild trainer) times nothing.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from perfdoctor.collect import dynamoskip
from perfdoctor.collect.dynamoskip import compiling_check


class NogradClock:
    def __init__(self, thread: int):
        self.thread = thread          # the thread that runs the steps (TimedCalls.thread)
        self.step = 0.0               # seconds inside no-grad calls of the root since the last take()
        self.last = 0.0               # when the last of a run of no-grad calls ended (0: none running)
        self.opened = None            # (perf_counter, DataLoader wait) of the step's start or an optimizer
                                      # step's end, until the root's next grad-mode call closes the gap
        self.pre = 0.0                # seconds of those gaps since the last take_pre(), less the wait
        self.wait_now = None          # the session's cumulative DataLoader wait (a callable)
        self.depth = 0
        self.root_id = None           # id() of the instance timed, checked against the weak reference
        self.ref = None
        self.undo = None              # puts the class's __call__ back (another root chosen)
        self.timed = False            # child.json nograd_timed: steps.jsonl's nograd means it
        self.off = False              # a forked child
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self.off = True

    def from_census(self, census, torch, notes: list) -> None:
        """The census is done (its root, a weak reference, is set): time that module's calls."""
        ref, census.root = census.root, None
        if ref is None:
            return
        try:
            self.watch(ref(), torch)
        except Exception as exc:
            notes.append(f"the model's no-grad calls cannot be timed ({type(exc).__name__}: {exc})")

    def watch(self, module, torch) -> None:
        """Time the no-grad calls of `module` (the census's root) from now on."""
        if module is None or self.off:
            return
        if self.undo is not None:
            self.undo()
            self.undo = None
        self.ref, self.root_id = weakref.ref(module), id(module)
        cls = type(module)
        own = cls.__dict__.get("__call__")
        owner = next(k for k in cls.__mro__ if "__call__" in k.__dict__)
        compiling = compiling_check(torch)
        grad = torch.is_grad_enabled
        clock = self
        perf = time.perf_counter
        ident = threading.get_ident

        def __call__(mod, *args, **kwargs):
            call = own if own is not None else owner.__call__
            if compiling():           # traced by dynamo: no side effect of ours in its graph
                return call(mod, *args, **kwargs)
            if grad():
                clock.last = 0.0      # a call with grad mode on ends a run of no-grad calls
                if clock.opened is not None and id(mod) == clock.root_id and ident() == clock.thread:
                    clock.close(perf())
                return call(mod, *args, **kwargs)
            if id(mod) != clock.root_id or clock.depth or clock.off \
                    or clock.ref() is not mod or ident() != clock.thread:
                return call(mod, *args, **kwargs)
            clock.depth = 1
            t0 = perf()
            if clock.last:            # the Python since the last no-grad call (the batch, loss.item())
                clock.step += t0 - clock.last
            try:
                return call(mod, *args, **kwargs)
            finally:
                clock.last = perf()
                clock.step += clock.last - t0
                clock.depth = 0
        __call__._perfdoctor_nograd = True
        if own is not None and getattr(own, "_perfdoctor_nograd", False):
            return                    # already timed (a second session in this process)
        cls.__call__ = dynamoskip.keep_out(__call__, recursive=False)

        def undo():
            if own is not None:
                cls.__call__ = own
            elif cls.__dict__.get("__call__") is __call__:
                del cls.__call__
        self.undo = undo
        self.timed = True

    def open(self, t: float, wait: float) -> None:
        """A step starts, or an optimizer's step ends, at `t` (the DataLoader's cumulative wait then:
        `wait`): the time to the root's next call with grad mode on is the next batch in the making."""
        self.opened = (t, wait)

    def close(self, t: float) -> None:
        (t0, w0), self.opened = self.opened, None
        gap = t - t0 - ((self.wait_now() - w0) if self.wait_now is not None else 0.0)
        if gap > 0:
            self.pre += gap

    def take_pre(self) -> float:
        """The gaps closed since the last take: the step that just ended's batch in the making."""
        t, self.pre = self.pre, 0.0
        return t

    def take(self) -> float:
        """No-grad seconds since the last take: the step that just ended (both on the training thread)."""
        t, self.step, self.last = self.step, 0.0, 0.0   # a step boundary ends a run of no-grad calls
        return t
