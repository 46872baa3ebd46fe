"""The changes `perfdoctor tune` makes at a model's outermost call (collect/inject.py's table):
autocast, torch.compile, float32 for a float64 or 16-bit model, channels_last. Module.__call__
is wrapped once; the outermost call of a module with parameters that require gradients (the
model being trained) gets the changes, the calls inside it run as they are (a float32 model's
submodules excepted: the float64 tensors its own code makes are cast on their way in).

Under autocast the loss runs under it too, as the fix advises ("the forward pass and the loss"):
a loss module (torch.nn's _Loss) called outside the model, and the functional losses that refuse
a bfloat16 input beside a float32 target (binary_cross_entropy, huber_loss: "Found dtype Float
but expected BFloat16"; pytorch/examples' DCGAN, nn.BCELoss on its discriminator's output, failed
its trial) wherever they are called. Autocast runs them in float32."""

from __future__ import annotations

import os

from perfdoctor.collect import dynamoskip


def module_call(torch, st) -> None:
    dtype_name = st.changes.get("autocast")
    comp = st.changes.get("compile")   # True: default mode; a string: that torch.compile mode
    f32 = bool(st.changes.get("float32"))
    cl = bool(st.changes.get("channels_last"))
    if not dtype_name and not comp and not f32 and not cl:
        return
    dtype = getattr(torch, dtype_name) if dtype_name else None
    Module = torch.nn.Module
    orig = Module.__call__
    f32t = torch.float32
    wider = (torch.float64, torch.bfloat16, torch.float16)     # the dtypes a model is made float32 from
    Loss = torch.nn.modules.loss._Loss
    compiling = dynamoskip.compiling_check(torch)
    if dtype is not None:
        _losses_under_autocast(torch, st, dtype)

    def __call__(self, *args, **kwargs):
        local = st.local
        if compiling() or os.getpid() != st.pid:    # traced by Dynamo (a compiled model's layers): as it is
            return orig(self, *args, **kwargs)
        if dtype is not None and isinstance(self, Loss) and not getattr(local, "depth", 0) \
                and (device := _device_type(torch, (args, kwargs))) is not None:
            with torch.autocast(device, dtype=dtype):
                return orig(self, *args, **kwargs)
        if getattr(local, "depth", 0):
            if f32 and id(self) in st.converted:           # a submodule: its float64 (bf16...) inputs too
                hit: list = []
                args, kwargs = _cast(torch, (args, kwargs), st.converted[id(self)], f32t, hit)
                if hit:     # float64 made inside the model (its forward's own tensors): the code must change too
                    st.inner_f64.add(type(self).__name__)
            return orig(self, *args, **kwargs)
        try:
            first = next(self.parameters(), None)
        except Exception:
            first = None
        if first is None or not first.requires_grad:
            return orig(self, *args, **kwargs)
        local.depth = 1
        try:
            if f32 and id(self) not in st.converted and first.dtype in wider:
                was = first.dtype
                self.float()
                st.converted.update((id(m), was) for m in self.modules())
                st.applied.add("float32")
            back = st.converted.get(id(self)) if f32 else None
            if back is not None:
                args, kwargs = _cast(torch, (args, kwargs), back, f32t)
            if cl:
                args, kwargs = _channels_last(torch, st, self, (args, kwargs))
            target = _compiled(torch, st, self, comp) if comp else self
            if dtype is not None:
                with torch.autocast(first.device.type, dtype=dtype):
                    st.applied.add("autocast")
                    out = orig(target, *args, **kwargs)
            else:
                out = orig(target, *args, **kwargs)
            return _cast(torch, out, f32t, back) if back is not None else out
        finally:
            local.depth = 0
    # its frame runs as Python inside a compiled model's eager parts (what it calls is compiled as
    # it would be without it): a compile trial measures what a user's torch.compile(model) gets
    Module.__call__ = dynamoskip.keep_out(__call__, recursive=False)


def _compiled(torch, st, module, comp):
    """torch.compile(module) (an OptimizedModule sharing its parameters, made at its first call),
    which the module's outermost calls are run through: what `model = torch.compile(model)` runs.
    Not module.compile(): on torch 2.13 that compiles nothing of a module of torch's own
    (nn.Sequential: Dynamo skips its _call_impl and forward as torch's files, and runs them
    eagerly, slower for its frame callback). Its own outermost call is an inner one (depth 1): it
    passes through."""
    opt = st.compiled.get(id(module))
    if opt is None:
        opt = st.compiled[id(module)] = torch.compile(module, **({"mode": comp} if isinstance(comp, str) else {}))
        st.applied.add("compile")
    return opt


MIXED_DTYPE_LOSSES = ("binary_cross_entropy", "huber_loss")   # refuse a 16-bit input beside a float32 target


def _losses_under_autocast(torch, st, dtype) -> None:
    """torch.nn.functional's losses that refuse mixed dtypes run under autocast (module docstring)."""
    F = torch.nn.functional
    compiling = dynamoskip.compiling_check(torch)
    for name in MIXED_DTYPE_LOSSES:
        fn = getattr(F, name, None)
        if fn is None:
            continue

        def under(*args, __fn=fn, **kwargs):
            if compiling() or os.getpid() != st.pid or (device := _device_type(torch, (args, kwargs))) is None:
                return __fn(*args, **kwargs)
            with torch.autocast(device, dtype=dtype):
                return __fn(*args, **kwargs)
        under.__name__, under.__doc__, under.__wrapped__ = fn.__name__, fn.__doc__, fn
        setattr(F, name, under)


AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")     # the device types torch.autocast is known to take


def _device_type(torch, obj) -> str | None:
    """The device type of the first tensor in `obj` ("cpu" without one); None for one autocast may
    not take (the call then runs as it is)."""
    found: list = []
    _tensors(torch, obj, lambda x: found.append(x.device.type) or x)
    device = found[0] if found else "cpu"
    return device if device in AUTOCAST_DEVICES else None


def _cast(torch, obj, src, dst, hit: list | None = None):
    """`obj` with its `src`-dtype tensors as `dst`. `hit` gets an entry per tensor converted."""
    def cast(x):
        if x.dtype != src:
            return x
        if hit is not None:
            hit.append(1)
        return x.to(dst)
    return _tensors(torch, obj, cast)


def _channels_last(torch, st, module, obj):
    """The model `module` in channels_last, in place, the first time it is called (when it has 4-D
    parameters: convolutions), and then the 4-D floating-point tensors of `obj` (its arguments)
    so; a module without 4-D parameters is left as it is, its arguments too. A model with lazy
    modules is converted at its first call after the one that made their parameters."""
    fmt = torch.channels_last
    converted = st.channels_last.get(id(module))
    if converted is None:
        params = list(module.parameters())
        if any(torch.nn.parameter.is_lazy(p) for p in params):
            return obj                  # a lazy module's first call makes its parameters: convert it after
        converted = st.channels_last[id(module)] = any(p.dim() == 4 for p in params)
        if converted:
            module.to(memory_format=fmt)
            st.applied.add("channels_last")
    if not converted:
        return obj
    return _tensors(torch, obj, lambda x: x.contiguous(memory_format=fmt)
                    if x.dim() == 4 and x.is_floating_point() else x)


def _tensors(torch, obj, fn):
    """`obj` with fn(tensor) for each of its tensors: a tensor, or plain tuples, lists and dicts of
    them (a subclass, a named tuple or a model-output class, is left as it is)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if type(obj) in (tuple, list):
        return type(obj)(_tensors(torch, x, fn) for x in obj)
    if type(obj) is dict:
        return {k: _tensors(torch, v, fn) for k, v in obj.items()}
    return obj
