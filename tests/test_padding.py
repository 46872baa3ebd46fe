"""Padded positions in the model's inputs (collect/padding.py, loop.padding_share, PD395): read
from the masks and padding ids the model is given during the census step."""

from __future__ import annotations

import pytest
from runs import child, prun_script, report

SCRIPT = """
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
LENS = [int(x) for x in sys.argv[1].split(",")]     # one batch: these lengths, padded to the longest


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32, padding_idx=0)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 2)

    def forward(self, x, mask):
        h = self.enc(self.emb(x), src_key_padding_mask=mask)
        return self.head(h.masked_fill(mask[..., None], 0).sum(1))


model = Model()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
T = max(LENS)
x = torch.zeros(len(LENS), T, dtype=torch.long)
for i, n in enumerate(LENS):
    x[i, :n] = torch.randint(1, 100, (n,))
mask = x == 0
y = torch.zeros(len(LENS), dtype=torch.long)
for _ in range(60):
    loss = nn.functional.cross_entropy(model(x, mask), y)
    opt.zero_grad(); loss.backward(); opt.step()
print("done")
"""


def test_padded_batches_are_read_and_get_length_buckets_first(tmp_path):
    pytest.importorskip("torch")
    r, out = prun_script(tmp_path, "pad.py", SCRIPT, "8,16,24,32", opts=("--skip-steps", "10"), trace=True)
    assert r.stdout == "done\n"
    pad = child(out)["root_calls"]["padding"]
    # 4 sequences padded to 32: 128 positions, 48 of them padding (the encoder hands each layer
    # its float copy of the mask: the same positions again, the same share)
    assert pad["source"] == "key_padding_mask" and pad["pad"] / pad["positions"] == 48 / 128, pad
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["loop.padding_share"] == pytest.approx(0.375) and m["loop.padding_source"] == "key_padding_mask"
    f = next(f for f in doc["findings"] if f["id"] == "PD395")
    assert "37.5% of the sequence positions" in f["summary"] and "key_padding_mask" in f["summary"]
    ops, p = m["share.device"], 0.375
    assert ops > 0.15    # 0.63-0.65 alone; 0.26 beside the rest of the suite (the gaps between ops stretch)
    # expected: the model's ops less the padded share of them (linear); the ceiling: all of them
    # quadratic in the positions
    assert f["gain"]["expected"] == pytest.approx(1 / (1 - ops * p), rel=1e-3)
    # (the profiler lengthens the ops, never shortens them: the share may be that much larger un-profiled)
    share = min(1.0, ops * (1 - (1 - p) ** 2) * max(1.0, m["run.trace_inflation"] or 1.0))
    assert f["gain"]["ceiling_share"] == pytest.approx(share, rel=1e-3)
    assert f["gain"]["ceiling"] == (None if share >= 1 else pytest.approx(1 / (1 - share), rel=1e-3))


def test_sequences_of_one_length_have_no_padding_to_remove(tmp_path):
    pytest.importorskip("torch")
    r, out = prun_script(tmp_path, "pad.py", SCRIPT, "32,32,32,32")
    assert r.stdout == "done\n"
    pad = child(out)["root_calls"]["padding"]
    assert pad["pad"] == 0 and pad["positions"] % 128 == 0 and pad["source"] == "key_padding_mask", pad
    doc = report(out)
    assert doc["traces"][0]["metrics"]["loop.padding_share"] == 0.0
    assert "PD395" not in {f["id"] for f in doc["findings"]}


def test_the_three_ways_a_model_is_told_of_padding():
    torch = pytest.importorskip("torch")
    from perfdoctor.collect.padding import Padding
    emb = torch.nn.Embedding(10, 4, padding_idx=0)
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]])           # 5 of 8 positions are the pad id
    # an embedding's padding_idx alone
    p = Padding(torch.Tensor, (torch.nn.Embedding,))
    p.call(emb, (ids,), {})
    p.call(emb, (ids,), {})                                     # the same tensor again: counted once
    p.call(torch.nn.Embedding(10, 4), (ids,), {})               # no padding_idx: nothing
    assert p.result() == {"pad": 5, "positions": 8, "source": "padding_idx"}
    # a transformers attention_mask (0: padding) comes before the ids
    p = Padding(torch.Tensor, (torch.nn.Embedding,))
    p.call(emb, (ids,), {})
    p.call(torch.nn.Linear(4, 4), (), {"input_ids": ids, "attention_mask": (ids != 0).long()})
    p.call(torch.nn.Linear(4, 4), (), {"attention_mask": torch.zeros(2, 1, 4, 4)})   # 4-D, float: not a padding mask
    assert p.result() == {"pad": 5, "positions": 8, "source": "attention_mask"}
    # a key padding mask (True or non-zero: padding) comes first
    p = Padding(torch.Tensor, (torch.nn.Embedding,))
    p.call(torch.nn.Linear(4, 4), (), {"attention_mask": (ids != 0).long()})
    p.call(torch.nn.MultiheadAttention(4, 1), (), {"key_padding_mask": torch.tensor([[False, True], [True, True]])})
    p.call(torch.nn.MultiheadAttention(4, 1), (),
           {"src_key_padding_mask": torch.tensor([[0.0, float("-inf")], [0.0, 0.0]])})
    assert p.result() == {"pad": 4, "positions": 8, "source": "key_padding_mask"}
    assert Padding(torch.Tensor, (torch.nn.Embedding,)).result() is None
    assert Padding().result() is None


def test_the_padding_record_is_read_only_when_it_adds_up():
    from perfdoctor.analyze.loopcalls import loop_metrics

    def read(pad):
        m = loop_metrics({"module": "Net", "calls": 1, "padding": pad}, [])
        return m["loop.padding_share"], m["loop.padding_source"]
    assert read({"pad": 48, "positions": 128, "source": "attention_mask"}) == (0.375, "attention_mask")
    assert read({"pad": 0, "positions": 128, "source": "padding_idx"}) == (0.0, "padding_idx")
    for bad in ({"pad": 129, "positions": 128}, {"pad": 1, "positions": 0}, {"pad": -1, "positions": 8},
                {"pad": "1", "positions": 8}, None, [1, 2]):
        assert read(bad) == (None, None), bad


def test_no_count_is_read_while_a_cuda_graph_is_captured():
    """Reading a device mask's count syncs with the device, which invalidates a CUDA graph being
    captured: the count is skipped then (a meta tensor stands for the device's here)."""
    torch = pytest.importorskip("torch")
    from perfdoctor.collect.modules import Census
    from perfdoctor.collect.padding import Padding
    mask = torch.zeros(2, 4, dtype=torch.bool, device="meta")
    p = Padding(torch.Tensor, (), capturing=lambda: True)
    p.call(torch.nn.MultiheadAttention(4, 1), (), {"key_padding_mask": mask})
    assert p.result() is None
    p.call(torch.nn.MultiheadAttention(4, 1), (), {"key_padding_mask": torch.tensor([[True, False]])})   # on the CPU
    assert p.result() == {"pad": 1, "positions": 2, "source": "key_padding_mask"}
    p = Padding(torch.Tensor, (), capturing=lambda: False)      # a count that cannot be read: none
    p.call(torch.nn.MultiheadAttention(4, 1), (), {"key_padding_mask": mask})
    assert p.result() is None
    census = Census(torch.Tensor, capturing=lambda: True)       # the census hands its check on
    assert census.padding.capturing() is True
