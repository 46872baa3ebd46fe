"""input.dataset_kind from a trace alone: the Python frames (with_stack=True) of a loader that
fetches in the trainer say whether its fetcher indexes the dataset (map-style) or iterates it,
and PD310 (shard an IterableDataset) is offered for the second only (analyze/loaderkinds.py).
Traces recorded by torch on the CPU."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="torch records the traces")

from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset  # noqa: E402

from perfdoctor.diagnose.offline import diagnose_path  # noqa: E402


class Stream(IterableDataset):
    def __iter__(self):
        for _ in range(10_000):
            yield torch.randn(64, 64).tanh()


class Indexing(IterableDataset):
    """An IterableDataset that indexes a map-style one: its __getitem__ calls are its own, deeper
    than the fetcher's frames."""

    def __init__(self):
        self.rows = TensorDataset(torch.randn(10_000, 64, 64))

    def __iter__(self):
        for i in range(len(self.rows)):
            yield self.rows[i][0].tanh()


class Slow(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        return torch.randn(64, 64).tanh()


def _report(tmp_path, dataset, with_stack=True) -> dict:
    from torch.profiler import ProfilerActivity, profile
    model = torch.nn.Linear(64, 8)
    batches = iter(DataLoader(dataset, batch_size=16))
    with profile(activities=[ProfilerActivity.CPU], with_stack=with_stack) as p:
        for _ in range(4):
            x = next(batches)
            x = x[0] if isinstance(x, list) else x          # a TensorDataset's batch is a list
            model(x).sum().backward()
            p.step()
    p.export_chrome_trace(str(tmp_path / "t.json"))
    return diagnose_path(str(tmp_path / "t.json"))


@pytest.mark.parametrize("dataset, kind", [(Slow, "map"), (lambda: TensorDataset(torch.randn(10_000, 64, 64)), "map"),
                                           (Stream, "iterable"), (Indexing, "iterable")],
                         ids=["getitem", "tensor-dataset", "generator", "iterable-indexing-a-map"])
def test_the_kind_comes_from_the_fetchers_frames(tmp_path, dataset, kind):
    doc = _report(tmp_path, dataset())
    m = doc["traces"][0]["metrics"]
    assert m["input.loader"] == "single_process"
    assert m["input.dataset_kind"] == kind
    slugs = {f["slug"] for f in doc["findings"]}
    if kind == "map":            # a map-style dataset needs no sharding, whatever the input share
        assert "iterable-dataset-sharding" not in slugs
    elif m["share.input"] >= 0.05:
        assert "iterable-dataset-sharding" in slugs


def test_without_python_frames_the_kind_is_unknown(tmp_path):
    doc = _report(tmp_path, Slow(), with_stack=False)
    assert doc["traces"][0]["metrics"]["input.dataset_kind"] is None
    names = {e.get("name") for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]}
    assert not any("fetch.py" in str(n) for n in names)
