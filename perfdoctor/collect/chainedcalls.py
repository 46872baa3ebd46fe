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

The same loop can run inside one call of the model: a decoder that calls its nn.GRU once per time
step, each call on the embedding of the next target token (the seq2seq tutorial's teacher forcing),
or on an nn.LSTMCell (PD387). So calls inside the outermost ones are followed too (MAX_TRACKED
modules), and an RNN module's outputs, to tell its state passed on.

Chain (the census's, for the counted step only) answers with per-module counts: "chained", the
calls that took a tensor the same module's previous call returned (looked for two containers
deep: `(out, (h, c))`); "sliced", the calls whose first tensor argument is a view of the same
tensor as the previous call's; "rnn_module", the class of the first RNN module run inside an
outermost call (or called as one); and of the RNN module the step called most, "rnn", its
configuration and the shape of its first call's input (collect/rebuild.py: what collect/rnnprobe.py
builds again to time one call over the sequence), "rnn_calls", "rnn_chained", "rnn_fed_sliced",
"rnn_fed_back" and "rnn_layers", the layers called as often around it (result).
Weak references only: the counting keeps no tensor alive.
"""

from __future__ import annotations

import weakref

from perfdoctor.collect.rebuild import config

GRAPH_NODES = 512     # autograd nodes walked back from an RNN call's input (_fed_back)
MAX_TRACKED = 4096    # modules whose calls are followed in the counted step (a transformer has hundreds)
DEPTH = 3             # containers looked into: model(x, (h, c)) -> (out, (h, c)) is two deep


class Chain:
    def __init__(self, tensor_type, rnn_types: tuple = ()):
        self.tensor = tensor_type
        self.rnn_types = rnn_types
        self.out: dict = {}           # id(module) -> weak references to the tensors its last call returned
        self.base: dict = {}          # id(module) -> a weak reference to its last call's first argument's base
        self.counts: dict = {}        # id(module) -> [chained calls, sliced calls]
        self.calls: dict = {}         # id(module) -> its calls in the step, outermost or inside one
        self.configs: dict = {}       # id(RNN module) -> rebuild.config of its first call (None: cannot build)
        self.rnn_module = None        # the class of the first RNN module called
        self.fed_back: dict = {}      # id(RNN module) -> its calls whose input was made from its last output
        self.layers: dict = {}        # id(other module called inside) -> rebuild.config of its first call, or None

    def call(self, key: int, args: tuple, kwargs: dict) -> None:
        """A call of module `key` begins (an outermost one, or one inside it: inner)."""
        self.calls[key] = self.calls.get(key, 0) + 1
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
        """A call of module `key` (an outermost one, or an RNN module's inside one) returned `out`."""
        self.out[key] = [r for r in (weak_ref(t) for t in self._tensors(out, DEPTH)) if r is not None]

    def inner(self, module, args: tuple = (), kwargs: dict | None = None, outermost: bool = False) -> None:
        """A module called inside an outermost call (or, `outermost`, an outermost call of an RNN
        module, which call() has counted)."""
        key = id(module)
        if not outermost and (key in self.counts or len(self.counts) < MAX_TRACKED):
            self.call(key, args, kwargs or {})
        x = args[0] if args and isinstance(args[0], self.tensor) else None
        if not (self.rnn_types and isinstance(module, self.rnn_types)):
            if key not in self.layers and len(self.layers) < MAX_TRACKED:
                self.layers[key] = _config(module, x)      # a layer the probe can build, or None
            return
        if key not in self.configs:
            self.rnn_module = self.rnn_module or type(module).__name__
            self.configs[key] = _config(module, x)
        if x is not None and self._fed_back(key, x):
            self.fed_back[key] = self.fed_back.get(key, 0) + 1

    def _fed_back(self, key: int, x) -> bool:
        """The RNN call's input depends, through the autograd graph, on a tensor the module's
        previous call returned: its input is made from its last state (attention over the encoder
        outputs queried with the hidden state, a decoder fed its own output without a detach), a
        recurrence beyond the layer that one call over the sequence cannot run. GRAPH_NODES at most."""
        node = getattr(x, "grad_fn", None)
        if node is None:
            return False
        last = [r() for r in self.out.get(key, ())]
        targets = {id(t.grad_fn) for t in last if t is not None and t.grad_fn is not None}
        seen, todo = set(), [node]
        while targets and todo and len(seen) < GRAPH_NODES:
            n = todo.pop()
            if id(n) in targets:
                return True
            if id(n) not in seen:
                seen.add(id(n))
                todo.extend(f for f, _ in getattr(n, "next_functions", ()) if f is not None)
        return False

    def result(self, key: int) -> dict:
        """The root module's chained and sliced calls; and the RNN module the step called most:
        its configuration ("rnn"), calls ("rnn_calls"), the calls that took a tensor its previous
        call returned ("rnn_chained"), and the most calls of a module called as often as it whose
        first tensor argument was a view of the same tensor as the previous call's ("rnn_fed_sliced":
        the loop's inputs are slices of one sequence, known before the loop), and its calls whose
        input was made from its last output ("rnn_fed_back": _fed_back), and the layers called inside
        as often as it that the probe can build ("rnn_layers": rebuild.config, in the order first
        called, 8 at most)."""
        chained, sliced = self.counts.get(key, (0, 0))
        out = {"chained": chained, "sliced": sliced, "rnn_module": self.rnn_module, "rnn": None, "rnn_calls": 0,
               "rnn_chained": 0, "rnn_fed_sliced": 0, "rnn_fed_back": 0, "rnn_layers": []}
        if self.configs:
            rnn = max(self.configs, key=lambda k: self.calls.get(k, 0))
            n = self.calls.get(rnn, 0)
            fed = [self.counts[k][1] for k, c in self.calls.items() if c == n and k in self.counts]
            out.update(rnn=self.configs[rnn], rnn_calls=n, rnn_chained=self.counts.get(rnn, (0, 0))[0],
                       rnn_fed_back=self.fed_back.get(rnn, 0), rnn_fed_sliced=max(fed, default=0),
                       rnn_layers=[c for k, c in self.layers.items() if c is not None and self.calls.get(k) == n][:8])
        return out

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


def _config(module, x) -> dict | None:
    try:
        return config(module, x)
    except Exception:                 # a subclass without the usual attributes: not built again
        return None


def weak_ref(obj):
    """A weak reference to a tensor or a module, or None where its class allows none (__slots__
    without __weakref__)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return None
