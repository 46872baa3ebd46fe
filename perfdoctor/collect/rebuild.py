"""The layers of a loop over time steps, described in the script and built again for the probe.

A loop that runs its RNN layer once per time step (PD388, PD391, PD387) also calls the layers
around it once per step: a char-level model's embedding, dropout and output layer, a decoder's
embedding of the token before and its projection onto the vocabulary. One call over the sequence
runs each of them once. The census (collect/chainedcalls.py) describes, at its first call in the
counted step, each torch layer of a kind it can build again (config: its torch class, sizes,
options, its parameters' dtype and device, the shape of the input it was called on); the probe
(collect/rnnprobe.py) builds them in its own process (build) and times them per step and over the
sequence. Another module (the script's own class, a torch layer of another kind) is not built:
its time is taken to stay.

config runs in the script's process (torch imported there); build_rnn, build_layer and the shapes in the probe's.
"""

from __future__ import annotations

RNN_KINDS = ("LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell")
LAYER_KINDS = ("Embedding", "Linear", "Dropout", "LayerNorm")


def _kind(module, kinds: tuple) -> str | None:
    """The torch class among `kinds` that module is (a subclass: its torch base), or None."""
    return next((c.__name__ for c in type(module).__mro__
                 if c.__name__ in kinds and c.__module__.startswith("torch.nn")), None)


def _weights(module) -> dict:
    w = next(module.parameters(), None)
    if w is None:                     # Dropout: no parameters, the script's default dtype and device
        return {"dtype": None, "device": None}
    return {"dtype": str(w.dtype).removeprefix("torch."), "device": str(w.device)}


def config(module, x) -> dict | None:
    """How to build `module` again and call it as the script did (`x`: its first tensor argument,
    None for a PackedSequence), or None for a module of another kind."""
    import torch
    shape = list(x.shape) if isinstance(x, torch.Tensor) else None
    kind = _kind(module, RNN_KINDS)
    if kind is not None:
        return {"kind": kind, "input_size": int(module.input_size), "hidden_size": int(module.hidden_size),
                "num_layers": int(getattr(module, "num_layers", 1)), "bias": bool(module.bias),
                "batch_first": bool(getattr(module, "batch_first", False)),
                "bidirectional": bool(getattr(module, "bidirectional", False)),
                "proj_size": int(getattr(module, "proj_size", 0) or 0),
                "nonlinearity": getattr(module, "nonlinearity", None), **_weights(module),
                "threads": torch.get_num_threads(), "input_shape": shape}
    kind = _kind(module, LAYER_KINDS)
    if kind == "Embedding":
        opts = {"num_embeddings": int(module.num_embeddings), "embedding_dim": int(module.embedding_dim),
                "sparse": bool(module.sparse)}
    elif kind == "Linear":
        opts = {"in_features": int(module.in_features), "out_features": int(module.out_features),
                "bias": module.bias is not None}
    elif kind == "Dropout":
        opts = {"p": float(module.p)}
    elif kind == "LayerNorm":
        opts = {"normalized_shape": [int(n) for n in module.normalized_shape],
                "elementwise_affine": bool(module.elementwise_affine)}
    else:
        return None
    return {"kind": kind, "opts": opts, **_weights(module), "input_shape": shape,
            "input_dtype": str(x.dtype).removeprefix("torch.") if isinstance(x, torch.Tensor) else None}


def build_rnn(torch, cfg: dict):
    """(the layer as the loop calls it, the module that runs the whole sequence), both batch-first."""
    nn = torch.nn
    kind = cfg["kind"]
    dtype, device = getattr(torch, cfg["dtype"]), torch.device(cfg["device"])
    cell = kind.endswith("Cell")
    base = kind[:-4] if cell else kind
    opts: dict = {"bias": cfg["bias"], "batch_first": True}
    if base == "RNN" and cfg.get("nonlinearity"):
        opts["nonlinearity"] = cfg["nonlinearity"]
    if not cell:
        opts.update(num_layers=cfg["num_layers"], bidirectional=cfg["bidirectional"])
        if base == "LSTM" and cfg.get("proj_size"):
            opts["proj_size"] = cfg["proj_size"]
    whole = getattr(nn, base)(cfg["input_size"], cfg["hidden_size"], **opts).to(device, dtype)
    if not cell:
        return whole, whole
    step = getattr(nn, kind)(cfg["input_size"], cfg["hidden_size"], bias=cfg["bias"],
                             **({"nonlinearity": cfg["nonlinearity"]} if base == "RNN" else {})).to(device, dtype)
    return step, whole


def rnn_call_shape(cfg: dict) -> tuple[int, int]:
    """(batch, time steps per call) of the calls the census saw."""
    shape = cfg.get("input_shape") or []
    if cfg["kind"].endswith("Cell"):
        return (int(shape[0]) if len(shape) == 2 else 1), 1
    if len(shape) == 3:
        b, t = (shape[0], shape[1]) if cfg["batch_first"] else (shape[1], shape[0])
        return int(b), int(t)
    return 1, (int(shape[0]) if len(shape) == 2 else 1)          # unbatched [time, features]


def build_layer(torch, cfg: dict):
    """A layer `config` described (not an RNN), on its device in its dtype, in training mode."""
    if cfg["kind"] not in LAYER_KINDS:
        raise ValueError(f"no layer of kind {cfg['kind']!r} is built")
    layer = getattr(torch.nn, cfg["kind"])(**cfg["opts"])
    if cfg.get("dtype"):
        layer = layer.to(torch.device(cfg["device"]), getattr(torch, cfg["dtype"]))
    return layer.train()


def layer_input(torch, cfg: dict, shape: list[int], device):
    """A tensor of `shape` like the one the layer was called on: token ids under num_embeddings
    for an embedding, else values of its input dtype. None takes a gradient: the gradient of the
    layer's input (which the layer before it in the loop needs) is left out both ways, a low
    estimate of the per-step calls' time rather than a timing of the probe's own leaves."""
    if cfg["kind"] == "Embedding":
        return torch.randint(0, cfg["opts"]["num_embeddings"], shape, device=device)
    dtype = getattr(torch, cfg.get("input_dtype") or cfg.get("dtype") or "float32")
    return torch.randn(shape, device=device, dtype=dtype)


def whole_shape(shape: list[int], steps: int) -> list[int]:
    """The input shape of one call over `steps` time steps, from one call's [batch, 1, ...] (a
    time dimension of one) or [batch, ...] (none: one is put after the batch)."""
    if len(shape) >= 2 and shape[1] == 1:
        return [shape[0], steps, *shape[2:]]
    return [shape[0], steps, *shape[1:]] if shape else [steps]
