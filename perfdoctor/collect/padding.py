"""Padding in the model's inputs: what the module census sees of it.

A batch of sequences of different lengths is padded to its longest one (pad_sequence, a
tokenizer's padding=True), or every sequence to a fixed length (padding="max_length"): the
model's layers then compute every padded position as if it held a token, and the attention
layers mask them out only at the end. Lengths of 8-128 drawn at random, in batches of 16, leave
~44% of the positions padding; batches of similar lengths leave almost none.

During the census step (modules.Census) each module call's inputs are read for the positions
it is told are padding, in the three ways PyTorch and transformers models say it:

    key_padding_mask  a keyword argument named *key_padding_mask (nn.MultiheadAttention,
                      nn.Transformer*: src_key_padding_mask...): True (or a non-zero float) at
                      a padded position
    attention_mask    a 2-D keyword argument named attention_mask (transformers' models): 0 at a
                      padded position
    padding_idx       the input of an nn.Embedding built with padding_idx: that id at a padded
                      position (the model's own pad token, whatever the loop calls its mask)

Each distinct tensor is counted once (the mask a TransformerEncoder hands every layer is one
batch's positions). The result, beside the census's (child.json "root_calls" "padding"):
{"pad": padded positions, "positions": all positions, "source": the way it was read}, from the
first way in the order above that saw any; None where none did. Reading a mask's count is a
host-device sync on a GPU: only in the census step, which is a warm-up step, and never while a
CUDA graph is being captured.
"""

from __future__ import annotations

SOURCES = ("key_padding_mask", "attention_mask", "padding_idx")
MAX_TENSORS = 256     # distinct tensors read in the census step


class Padding:
    def __init__(self, tensor_type=None, embedding_types: tuple = (), capturing=None):
        self.tensor = tensor_type
        self.embedding_types = embedding_types    # (nn.Embedding,): padding_idx read from these
        self.capturing = capturing                # () -> a CUDA graph is being captured: no sync then
        self.seen: dict = {}                      # id() -> the tensor counted (held: no id reused)
        self.counts = {s: [0, 0] for s in SOURCES}   # source -> [padded positions, positions]

    def call(self, module, args, kwargs) -> None:
        if self.tensor is None or len(self.seen) >= MAX_TENSORS:
            return
        try:
            self._call(module, args, kwargs)
        except Exception:         # a tensor that cannot be read (a fake or traced one): the census goes on
            pass

    def _call(self, module, args, kwargs) -> None:
        for name, v in kwargs.items():
            if not isinstance(v, self.tensor) or not isinstance(name, str):
                continue
            if name.endswith("key_padding_mask") and v.dim() >= 1:
                self._count("key_padding_mask", v, lambda x: x != 0)
            elif name == "attention_mask" and v.dim() == 2 and not v.is_floating_point():
                self._count("attention_mask", v, lambda x: x == 0)
        if self.embedding_types and isinstance(module, self.embedding_types):
            idx = getattr(module, "padding_idx", None)
            x = args[0] if args else kwargs.get("input")
            if isinstance(idx, int) and isinstance(x, self.tensor) and not x.is_floating_point() and x.dim() >= 1:
                self._count("padding_idx", x, lambda t: t == idx)

    def _count(self, source: str, x, padded) -> None:
        if id(x) in self.seen or x.numel() == 0:
            return
        if x.device.type != "cpu" and self.capturing is not None and self.capturing():
            return        # a count read during a CUDA graph's capture would invalidate the capture
        self.seen[id(x)] = x
        c = self.counts[source]
        c[0] += int(padded(x).sum().item())
        c[1] += int(x.numel())

    def result(self) -> dict | None:
        self.seen.clear()
        for s in SOURCES:
            pad, n = self.counts[s]
            if n:
                return {"pad": pad, "positions": n, "source": s}
        return None
