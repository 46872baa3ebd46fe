"""Does each outermost call of the model take the state the call before it returned?

A per-sample loop, `for i in range(B): out = model(x[i:i+1])`, and a loop over a sequence's time
steps, `for t in range(T): out, h = model(x[:, t], h)`, both call the model many times a step,
each on a slice of one tensor, and both look alike to the counts (collect/modules.py: many calls,
a small leading dimension; a 1-D slice of token ids reads as one sample). Only the second passes
on its state: an argument of call t+1 *is* a tensor call t returned. That is a recurrence, which
cannot be batched across its calls (PD353 does not apply); where the slices come from one tensor
that exists before the loop (the whole input sequence: teacher forcing, a known sequence) and the
model runs an RNN module (nn.LSTM, nn.GRU, nn.RNN or their cells), one call over the whole
sequence does the same work with one dispatch per layer, not per time step (PD388).

Chain (the census's, for the counted step only) answers with per-module counts: "chained", the
calls that took a tensor the same module's previous call returned (looked for two containers
deep: `(out, (h, c))`); "sliced", the calls whose first tensor argument is a view of the same
tensor as the previous call's; "rnn_module", the class of the first RNN module run inside an
outermost call (or called as one), "rnn", its configuration and the shape of its first call's
input (rnn_config: what collect/rnnprobe.py builds again to time one call over the sequence), and
"rnn_calls", how many times the step called it (a loop over an nn.LSTMCell inside one call: PD387).
Weak references only: the counting keeps no tensor alive.
"""

from __future__ import annotations

import weakref

RNN_KINDS = ("LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell")   # torch's classes the probe builds
DEPTH = 3             # containers looked into: model(x, (h, c)) -> (out, (h, c)) is two deep


class Chain:
    def __init__(self, tensor_type, rnn_types: tuple = ()):
        self.tensor = tensor_type
        self.rnn_types = rnn_types
        self.out: dict = {}           # id(module) -> weak references to the tensors its last call returned
        self.base: dict = {}          # id(module) -> a weak reference to its last call's first argument's base
        self.counts: dict = {}        # id(module) -> [chained calls, sliced calls]
        self.rnn_module = None
        self.rnn = None
        self.rnn_id = None            # id() of that first RNN module, and its calls in the step
        self.rnn_calls = 0

    def call(self, key: int, args: tuple, kwargs: dict) -> None:
        """An outermost call of module `key` begins."""
        c = self.counts.setdefault(key, [0, 0])
        mine = {id(r()) for r in self.out.get(key, ()) if r() is not None}
        tensors = self._tensors((args, kwargs), DEPTH)
        if mine and any(id(t) in mine for t in tensors):
            c[0] += 1
        base = getattr(tensors[0], "_base", None) if tensors else None
        last = self.base.get(key)
        if base is not None and last is not None and last() is base:
            c[1] += 1
        self.base[key] = weak_ref(base) if base is not None else None

    def returned(self, key: int, out) -> None:
        """An outermost call of module `key` returned `out`."""
        self.out[key] = [r for r in (weak_ref(t) for t in self._tensors(out, DEPTH)) if r is not None]

    def inner(self, module, args: tuple = ()) -> None:
        """A module called inside an outermost call (or an outermost call of an RNN module)."""
        if self.rnn_module is None and self.rnn_types and isinstance(module, self.rnn_types):
            self.rnn_module, self.rnn_id = type(module).__name__, id(module)
            try:
                self.rnn = rnn_config(module, args[0] if args and isinstance(args[0], self.tensor) else None)
            except Exception:         # an RNN subclass without the usual attributes: no probe
                self.rnn = None
        if id(module) == self.rnn_id:
            self.rnn_calls += 1

    def result(self, key: int) -> dict:
        chained, sliced = self.counts.get(key, (0, 0))
        return {"chained": chained, "sliced": sliced, "rnn_module": self.rnn_module, "rnn": self.rnn,
                "rnn_calls": self.rnn_calls}

    def _tensors(self, v, depth: int) -> list:
        if isinstance(v, self.tensor):
            return [v]
        if depth <= 0:
            return []
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, (tuple, list)):
            return [t for x in v[:16] for t in self._tensors(x, depth - 1)]
        return []


def rnn_config(module, x) -> dict | None:
    """What builds the same recurrent layer again: its torch class (a subclass's base), sizes and
    options, its parameters' dtype and device, torch's thread count, and the shape of the input it
    was called on (a module's [batch, time, features] or [time, batch, features] by batch_first, a
    cell's [batch, features]; None for a PackedSequence). None for a class torch cannot build."""
    import torch
    kind = next((c.__name__ for c in type(module).__mro__
                 if c.__name__ in RNN_KINDS and c.__module__.startswith("torch.nn")), None)
    if kind is None:                  # torch's RNNBase subclassed from scratch: nothing to build again
        return None
    w = next(module.parameters())
    return {"kind": kind, "input_size": int(module.input_size),
            "hidden_size": int(module.hidden_size), "num_layers": int(getattr(module, "num_layers", 1)),
            "bias": bool(module.bias), "batch_first": bool(getattr(module, "batch_first", False)),
            "bidirectional": bool(getattr(module, "bidirectional", False)),
            "proj_size": int(getattr(module, "proj_size", 0) or 0),
            "nonlinearity": getattr(module, "nonlinearity", None),
            "dtype": str(w.dtype).removeprefix("torch."), "device": str(w.device),
            "threads": torch.get_num_threads(), "input_shape": list(x.shape) if x is not None else None}


def weak_ref(obj):
    """A weak reference to a tensor or a module, or None where its class allows none (__slots__
    without __weakref__)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return None
