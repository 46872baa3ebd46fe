"""Embedding tables trained with dense gradients (PD383): the census sees the tables and the
rows a step looks up, the trace the backward op that fills the dense gradient."""

from __future__ import annotations

import gzip
import json

import pytest
from runs import child, prun_script, report

# A recommender's two tables (400K x 32 items, 20K x 32 users) under a small MLP, Adam, batch
# 256 of random ids, the user table looked up twice (its backward node adds two dense
# gradients); --sparse: sparse=True tables under SparseAdam, the MLP under Adam.
SCRIPT = r"""
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
sparse = "--sparse" in sys.argv
class Rec(nn.Module):
    def __init__(self):
        super().__init__()
        self.users = nn.Embedding(20_000, 32, sparse=sparse)
        self.items = nn.EmbeddingBag(400_000, 32, mode="sum", sparse=sparse)
        self.mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    def forward(self, u, i):
        return self.mlp(torch.cat([self.users(u), self.items(i)], 1)).squeeze(1) + 0 * self.users(u.flip(0)).sum()
model = Rec()
tables = list(model.users.parameters()) + list(model.items.parameters())
opts = ([torch.optim.SparseAdam(tables, lr=1e-3), torch.optim.Adam(model.mlp.parameters(), lr=1e-3)] if sparse
        else [torch.optim.Adam(model.parameters(), lr=1e-3)])
for step in range(24):
    u, i = torch.randint(0, 20_000, (256,)), torch.randint(0, 400_000, (256, 2))
    loss = nn.functional.binary_cross_entropy_with_logits(model(u, i), torch.rand(256))
    for o in opts:
        o.zero_grad()
    loss.backward()
    for o in opts:
        o.step()
print("done")
"""


def _node_share(out) -> float:
    """The Embedding*Backward nodes' time over the ProfilerSteps' in the run's trace, read raw."""
    path = next((out / "trace").glob("*.pt.trace.json*"))
    with (gzip.open(path) if path.suffix == ".gz" else open(path)) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]
    nodes = [e for e in events if e["name"].startswith("autograd::engine::evaluate_function: Embedding")
             and any(a <= e["ts"] < b for a, b in steps)]
    return sum(e["dur"] for e in nodes) / sum(b - a for a, b in steps)


def test_dense_tables_are_seen_and_get_sparse_gradients_first(tmp_path):
    r, out = prun_script(tmp_path, "rec.py", SCRIPT, trace=True)
    assert r.stdout == "done\n"
    tables = child(out)["root_calls"]["dense_embeddings"]
    # users: 2 x 256 ids of 20K rows; items: 256 bags of 2 ids of 400K rows
    assert tables == {"elements": (20_000 + 400_000) * 32, "touched": (512 + 512) * 32, "tables": 2}
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    params = 20_000 * 32 + 400_000 * 32 + 64 * 64 + 64 + 64 + 1
    assert m["params.dense_embedding_share"] == pytest.approx(420_000 * 32 / params, rel=1e-5)
    assert m["params.embedding_touched_share"] == pytest.approx(1024 / 420_000, rel=1e-5)   # rounded
    # the backward nodes of the lookups (three: users twice, items once), timed whole from the trace
    assert m["embedding.dense_backward_share"] == pytest.approx(_node_share(out), abs=0.002)
    assert 0.01 < m["embedding.dense_backward_share"] < 0.8
    first = doc["findings"][0]
    assert first["id"] == "PD383", [f["id"] for f in doc["findings"]]
    assert 0 < m["optimizer.zero_grad_share"] < 0.5          # the table-sized gradients freed
    share = ((m["optimizer.step_share"] + m["optimizer.zero_grad_share"]) * m["params.dense_embedding_share"]
             + m["embedding.dense_backward_share"]) * (1 - m["params.embedding_touched_share"])
    assert first["gain"]["expected"] == pytest.approx(1 / (1 - min(0.99, share)), rel=1e-3)
    assert first["gain"]["ceiling"] is None               # nothing measured bounds what goes


def test_sparse_tables_are_none_of_it(tmp_path):
    r, out = prun_script(tmp_path, "rec.py", SCRIPT, "--sparse", trace=True)
    assert r.stdout == "done\n"
    assert child(out)["root_calls"]["dense_embeddings"] is None
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["params.dense_embedding_share"] is None and m["embedding.dense_backward_share"] == 0.0
    assert "PD383" not in [f["id"] for f in doc["findings"]]


def test_frozen_and_foreign_modules_are_not_tables():
    torch = pytest.importorskip("torch")
    from perfdoctor.collect.embeddings import DenseTables
    tables = DenseTables((torch.nn.Embedding, torch.nn.EmbeddingBag))
    frozen = torch.nn.Embedding(100, 4).requires_grad_(False)
    sparse = torch.nn.Embedding(100, 4, sparse=True)
    dense = torch.nn.Embedding(100, 4)
    ids = torch.arange(10)
    for mod in (frozen, sparse, torch.nn.Linear(4, 4)):
        tables.call(mod, (ids,), {})
    assert tables.result() is None
    tables.call(dense, (ids,), {})
    tables.call(dense, (), {"input": torch.arange(200)})          # repeated ids: at most all 100 rows
    assert tables.result() == {"elements": 400, "touched": 400, "tables": 1}
    assert DenseTables().result() is None
