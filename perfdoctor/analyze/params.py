"""What the model's parameters are made of (`run` only): elements per dtype of the optimizer's parameters.

collect/stepsource.py counts, at the step-defining optimizer's first step, the elements of its
parameters per dtype (child.json `param_dtypes`, e.g. {"torch.float64": 15000}):

    params.fp64_share = float64 (and complex128) elements / all elements
    params.half_dtype = "bfloat16" / "float16" where that dtype holds half the elements or more

A model in float64 (`model.double()`, tensors made with dtype=torch.double, numpy's float64
arrays turned into tensors) does every op at half the SIMD width of float32 on a CPU, and on a
GPU at a fraction of its float32 rate (1/2 on data-centre parts, 1/32 to 1/64 on others), without
tensor cores. A model kept in a 16-bit float (`model.bfloat16()`, `.half()`) runs fast only on a
CPU with that dtype's math (PD368). None without an optimizer, or for a trace alone.

The module census (collect/embeddings.py) adds the embedding tables trained with dense gradients:

    params.dense_embedding_share   = their elements / all elements (at most 1)
    params.embedding_touched_share = at most the share of those elements one step's lookups
                                     touch (min(rows, indices) x width per table / elements)
"""

from __future__ import annotations

from perfdoctor.analyze.stepwait import positive

NAMES = ("params.count", "params.fp64_share", "params.half_dtype", "params.dense_embedding_share",
         "params.embedding_touched_share")
FP64 = ("torch.float64", "torch.complex128")
HALF = {"torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def param_metrics(dtypes: dict | None, tables: dict | None = None) -> dict:
    """`tables`: child.json's root_calls "dense_embeddings"."""
    out = dict.fromkeys(NAMES)
    if not isinstance(dtypes, dict):
        return out
    counts = {k: positive(v) for k, v in dtypes.items() if isinstance(k, str)}
    total = sum(counts.values())
    if total <= 0:
        return out
    out["params.count"] = int(total)
    out["params.fp64_share"] = sum(v for k, v in counts.items() if k in FP64) / total
    out["params.half_dtype"] = next((HALF[k] for k, v in counts.items() if k in HALF and v >= total / 2), None)
    if isinstance(tables, dict):
        elements, touched = positive(tables.get("elements")), positive(tables.get("touched"))
        if elements > 0 and touched <= elements:
            out["params.dense_embedding_share"] = min(1.0, elements / total)
            out["params.embedding_touched_share"] = touched / elements
    return out
