"""Checkpoint saves in `perfdoctor tune`'s trials: save_every (PD350).

The script's saves to a file are counted, and with save_every=N let through in one step of N:
every save of the first step that saves, then of the first step that saves N or more steps after
it, ... (what saving N times less often costs: PD350's model, one save every N steps; a model and
its optimizer saved in one step stay together). A skipped save returns None, as the save functions
do; the file on disk is the last one written. A save into a buffer (io.BytesIO: a deep copy, a
size check) is no checkpoint: it always runs.

The save functions: torch.save, safetensors' save_file (once the script imports it), and
Lightning's TorchCheckpointIO.save_checkpoint (its ModelCheckpoint callback's, and
Trainer.save_checkpoint's, writer), which serialises into a buffer and writes the bytes itself:
torch.save alone never saw a file there, and a user's every-step ModelCheckpoint trial was called
"never reached" after 42 saves. A save inside another one (Lightning's torch.save into its
buffer) is the outer save's: counted and decided once.
"""

from __future__ import annotations

import os
import threading

LIGHTNING_IO = ("lightning.fabric.plugins.io.torch_io", "lightning_fabric.plugins.io.torch_io")
_inside = threading.local()


def saves(torch, st) -> None:
    """Wrap the save functions for `st` (inject._State: changes, applied, save_calls, saved_at,
    steps(), watch, pid)."""
    every = st.changes.get("save_every")

    def wrap(fn, target: str, at: int):
        def save(*args, **kwargs):
            if os.getpid() != st.pid or getattr(_inside, "n", 0):
                return fn(*args, **kwargs)
            st.save_calls += 1
            dest = args[at] if len(args) > at else kwargs.get(target)
            if every and not isinstance(dest, (str, bytes, os.PathLike)) and "save_every" not in st.applied:
                st.note("the script's saves write to a buffer, not a file (a copy, or a writer of its own): "
                        "save_every thins saves to a file only")
            elif every and isinstance(dest, (str, bytes, os.PathLike)):
                st.applied.add("save_every")
                step = st.steps()
                if st.saved_at is not None and st.saved_at != step and step - st.saved_at < int(every):
                    return None
                st.saved_at = step
            _inside.n = 1
            try:
                return fn(*args, **kwargs)
            finally:
                _inside.n = 0
        save.__wrapped__ = fn
        save.__doc__ = getattr(fn, "__doc__", None)
        return save
    from perfdoctor.collect.timedcalls import SAFETENSORS_SAVE, replace_torch_save

    replace_torch_save(torch, lambda fn: wrap(fn, "f", 1))
    module, name = SAFETENSORS_SAVE

    def on_safetensors(mod):
        fn = getattr(mod, name, None)
        if callable(fn):
            setattr(mod, name, wrap(fn, "filename", 1))

    def on_lightning(mod):
        cls = getattr(mod, "TorchCheckpointIO", None)
        fn = getattr(cls, "save_checkpoint", None)
        if callable(fn) and not hasattr(fn, "__wrapped__"):
            cls.save_checkpoint = wrap(fn, "path", 2)        # (self, checkpoint, path)
    if st.watch is not None:
        st.watch(module, on_safetensors)
        for lightning in LIGHTNING_IO:
            st.watch(lightning, on_lightning)
