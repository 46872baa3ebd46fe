"""Embedding tables trained with dense gradients: what the module census sees of them.

An nn.Embedding or nn.EmbeddingBag built with sparse=False (the default) gets a gradient as
large as its whole table from every backward pass, though a batch looks up a few of its rows:
the backward pass fills a table of zeros and adds the looked-up rows' gradients into it, and the
optimizer then updates every row (Adam: several passes over the table and its two moment
buffers). With a table of millions of rows that is most of the step. sparse=True gives a
gradient of the looked-up rows alone, which SGD, Adagrad and SparseAdam take.

During the census step (modules.Census) each call of such a module inside the model (or as the
model) is seen: its weight's rows and width, and the indices it was given. The result, beside
the census's (child.json "root_calls" "dense_embeddings"):

    elements: the elements of the distinct dense-gradient tables called in the step
    touched:  at most the elements a sparse gradient would hold: per table, min(rows, indices
              looked up) x width (indices repeat, so fewer rows may be touched)
    tables:   how many such tables

Only tables whose weight requires a gradient count: a frozen pretrained embedding gets none.
"""

from __future__ import annotations

MAX_TABLES = 64


class DenseTables:
    def __init__(self, types: tuple = ()):
        self.types = types                # (nn.Embedding, nn.EmbeddingBag), or () to see none
        self.tables: dict = {}            # id(weight) -> [rows, width, indices looked up]

    def call(self, module, args, kwargs) -> None:
        if not self.types or not isinstance(module, self.types) or getattr(module, "sparse", True):
            return
        w = getattr(module, "weight", None)
        if w is None or not getattr(w, "requires_grad", False) or w.dim() != 2:
            return
        t = self.tables.get(id(w))
        if t is None:
            if len(self.tables) >= MAX_TABLES:
                return
            t = self.tables[id(w)] = [int(w.shape[0]), int(w.shape[1]), 0]
        idx = args[0] if args else kwargs.get("input")
        t[2] += int(idx.numel()) if hasattr(idx, "numel") else 0

    def result(self) -> dict | None:
        if not self.tables:
            return None
        ts = self.tables.values()
        return {"elements": sum(r * d for r, d, _ in ts), "touched": sum(min(r, n) * d for r, d, n in ts),
                "tables": len(self.tables)}
