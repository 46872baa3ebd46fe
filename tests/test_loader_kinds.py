"""What the training loader reads and how it fetches (collect/loaderkinds.py) and PD358."""

from __future__ import annotations

import pytest
from runs import child, prun_script, report

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, TensorDataset  # noqa: E402

from perfdoctor.analyze.loaderkinds import loader_metrics  # noqa: E402
from perfdoctor.collect.loaderkinds import LoaderKinds  # noqa: E402


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(10.0))


def _drawn(*loaders) -> list[dict]:
    kinds = LoaderKinds()
    for loader, n in loaders:
        it = iter(loader)
        for _ in range(n):
            next(it)
            kinds.count(it)
    return kinds.info()


def test_each_loader_is_described_by_its_first_batch_and_counted():
    ds = TensorDataset(torch.randn(64, 3), torch.randn(64))
    info = _drawn((DataLoader(ds, batch_size=8), 5),
                  (DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), 16, False), batch_size=None), 2),
                  (DataLoader(Stream(), batch_size=2), 3))
    assert info[0] == {"dataset": "TensorDataset", "module": "torch.utils.data.dataset", "per_sample": True,
                       "batch_size": 8, "workers": 0, "default_collate": True, "start": None, "batches": 5,
                       "grad_batches": 5}
    # batch_size=None with a batch sampler: the dataset is indexed once per batch
    assert info[2]["dataset"] == "TensorDataset" and info[2]["per_sample"] is False and info[2]["batches"] == 2
    assert info[1]["dataset"] == "Stream" and info[1]["per_sample"] is False     # an iterable: no indexing
    m = loader_metrics(info)
    assert m == {"input.dataset_class": "TensorDataset", "input.per_sample_fetch": True, "input.loader_batch_size": 8,
                 "input.default_collate": True, "input.loader_workers": 0, "input.worker_start": None}


def test_a_subset_is_judged_by_the_dataset_it_wraps_and_a_collate_fn_is_seen():
    from torch.utils.data import random_split
    ds = TensorDataset(torch.randn(64, 3))
    train, _ = random_split(ds, [48, 16])
    info = _drawn((DataLoader(train, batch_size=8, collate_fn=lambda b: b), 3))
    # Subset has a __getitems__, which still indexes the TensorDataset sample by sample
    assert info[0]["dataset"] == "Subset of TensorDataset" and info[0]["per_sample"] is True
    assert info[0]["default_collate"] is False


def test_a_dataset_with_getitems_fetches_batches():
    class Batched(TensorDataset):
        def __getitems__(self, idx):
            return [tuple(t[i] for t in self.tensors) for i in idx]
    info = _drawn((DataLoader(Batched(torch.randn(32, 2)), batch_size=4), 2))
    assert info[0]["dataset"] == "Batched" and info[0]["per_sample"] is False
    assert loader_metrics(None)["input.dataset_class"] is None
    assert loader_metrics([{"dataset": 3, "batches": "x"}])["input.dataset_class"] is None     # hostile child.json


def test_the_training_loader_is_the_one_drawn_with_autograd_on():
    """A validation loop under torch.no_grad() inside the steps can draw more batches than the
    training loop (a user's: 32 batches of 64 every 10 steps beside one of 256 a step): the loader
    drawn with autograd on is the training one, its batch size the run's (compare's samples/s)."""
    ds = TensorDataset(torch.randn(64, 3))
    train, val = DataLoader(ds, batch_size=16), DataLoader(ds, batch_size=4)
    kinds = LoaderKinds()
    t, v = iter(train), iter(val)
    for _ in range(2):
        kinds.count(t, torch.is_grad_enabled())
        next(t)
        with torch.no_grad():
            for _ in range(5):
                next(v)
                kinds.count(v, torch.is_grad_enabled())
    info = kinds.info()
    assert [(x["batch_size"], x["batches"], x["grad_batches"]) for x in info] == [(4, 10, 0), (16, 2, 2)]
    assert loader_metrics(info)["input.loader_batch_size"] == 16
    # an older child.json, without grad_batches: the loader that yielded the most
    assert loader_metrics([{k: v for k, v in x.items() if k != "grad_batches"} for x in info])[
        "input.loader_batch_size"] == 4


VALIDATING = r"""
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
train = DataLoader(TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1)), batch_size=128, shuffle=True)
val = DataLoader(TensorDataset(torch.randn(256, 16), torch.randn(256, 1)), batch_size=16)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(4):
    for i, (x, y) in enumerate(train):
        opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
        if i % 2 == 0:                       # 16 validation batches every other step
            model.eval()
            with torch.no_grad():
                for vx, vy in val:
                    torch.nn.functional.mse_loss(model(vx), vy).item()
            model.train()
"""


def test_a_validation_loop_inside_the_steps_is_not_the_training_batch(tmp_path):
    """Live: the validation every other step draws 8 batches of 16 a step and calls the model
    on each, the training one batch of 128: the run's loader batch size and model-call batch are
    the training loop's (both had read 16, and compare's samples/s with them)."""
    _, out = prun_script(tmp_path, "validating.py", VALIDATING)
    loaders, calls = child(out)["loaders"], child(out)["root_calls"]
    assert [(x["batch_size"], x["grad_batches"] > 0) for x in loaders] == [(16, False), (128, True)]
    assert (calls["calls"], calls["batch"]) == (1, 128)
    m = report(out)["traces"][0]["metrics"]
    assert m["input.loader_batch_size"] == 128 and m["loop.model_call_batch"] == 128


TRAIN = r"""
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
ds = TensorDataset(torch.randn(8192, 16), torch.randn(8192, 1))
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(6):
    for x, y in DataLoader(ds, batch_size=128, shuffle=True):
        opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
"""


def test_run_offers_whole_batch_indexing_for_a_tensor_dataset(tmp_path):
    _, out = prun_script(tmp_path, "tensor_data.py", TRAIN, trace=True)
    loader = child(out)["loaders"][0]
    assert loader["dataset"] == "TensorDataset" and loader["batches"] == 6 * 64
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert m["input.dataset_class"] == "TensorDataset" and m["input.per_sample_fetch"] is True
    # 128 dataset[i] calls and a stack per batch against a linear layer: most of the step is the wait
    assert m["share.input"] >= 0.05, m["share.input"]
    fix = next(f for f in doc["findings"] if f["id"] == "PD358")
    assert "reads a TensorDataset 128 samples at a time" in fix["summary"]
    assert fix["gain"]["ceiling"] == pytest.approx(1 / (1 - m["share.input"]), rel=0.01)
