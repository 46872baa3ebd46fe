"""What a DataLoader worker spends making a batch (collect/loaderfetch.py, analyze/loaderfetch.py, PD347's model)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from perfdoctor.analyze.loaderfetch import fetch_metrics, last_per_worker, sampled_workers_or_fetched
from perfdoctor.analyze.stepwait import runq_runnable_share
from perfdoctor.diagnose.runfiles import read_fetches
from runs import prun_script


def test_batch_cost_leaves_out_queueing_and_shared_memory():
    lines = [{"pid": 7, "batches": 8, "wall_s": 0.050, "runq_s": 0.010, "shm_s": 0.008},
             {"pid": 7, "batches": 16, "wall_s": 0.100, "runq_s": 0.020, "shm_s": 0.016},   # cumulative: this one
             {"pid": 8, "batches": 16, "wall_s": 0.080, "runq_s": 0.0, "shm_s": 0.016}]
    steady = [{"dur": 0.010, "wait": 0.004, "batches": 1, "istart": 0.001}] * 9 + [{"dur": 0.010, "wait": 0.002, "batches": 2}]
    m = fetch_metrics(steady, lines)
    per_batch = ((0.100 - 0.020 - 0.016) + (0.080 - 0.016)) / 32
    assert m["loader.fetch_ms"] == pytest.approx(1e3 * per_batch)
    assert m["loader.fetch_share"] == pytest.approx(per_batch * 11 / 0.100)
    assert m["run.outside_loader_share"] == pytest.approx((9 * 0.005 + 0.008) / 0.100)
    assert fetch_metrics(steady, [])["loader.fetch_ms"] is None          # num_workers=0, spawned workers
    assert fetch_metrics([], lines) == dict.fromkeys(m)


def test_runq_over_runnable_time():
    steps = [{"cpu": 0.006, "runq": 0.002, "dur": 0.010}, {"cpu": 0.003, "runq": 0.001, "dur": 0.010}, {"dur": 0.010}]
    assert runq_runnable_share(steps) == pytest.approx(0.003 / 0.012)
    assert runq_runnable_share([{"dur": 0.01}]) is None


def test_fetch_lines_are_read_as_untrusted(tmp_path):
    p = tmp_path / "loaderfetch.jsonl"
    p.write_text("\n".join([
        json.dumps({"pid": 1, "batches": 4, "wall_s": 0.01, "runq_s": 0.0}),
        "not json", "[1, 2]", json.dumps({"pid": "x", "batches": 4, "wall_s": 0.01}),
        json.dumps({"pid": 2, "batches": -3, "wall_s": 0.01}), json.dumps({"pid": 3, "batches": 4, "wall_s": float("nan")}),
        json.dumps({"pid": 4, "batches": 2, "wall_s": 0.02, "runq_s": "slow"}),     # a bad optional field: unknown
        '{"pid": 5, "batc']))                                                         # cut short
    got = read_fetches(p)
    assert [r["pid"] for r in got] == [1, 4] and got[1].get("runq_s") is None
    assert read_fetches(tmp_path / "absent.jsonl") == []
    assert [r["batches"] for r in last_per_worker(got + [{"pid": 1, "batches": 9, "wall_s": 0.03}])] == [9, 2]


def test_workers_the_samples_missed_come_from_the_loader_and_its_fetch_lines():
    lines = [{"pid": 1, "batches": 32, "wall_s": 0.02, "cpu_s": 0.030, "first": 100.0, "at": 100.2},
             {"pid": 2, "batches": 32, "wall_s": 0.02, "cpu_s": 0.010, "first": 100.0, "at": 100.2},
             {"pid": 3, "batches": 1, "wall_s": 0.001, "cpu_s": 0.005, "first": 101.0, "at": 101.0}]   # a peek's worker
    m = {"loader.workers": 0, "system.cpu_busy_share": 0.8, "machine.cpu_count": 2, "loader.trainer_cpu_mean": 1.0}
    got = sampled_workers_or_fetched(m, {"workers": 2}, lines)
    assert got["loader.workers"] == 2 and got["loader.worker_cpu_mean"] == pytest.approx(0.040 / 0.4)
    assert got["system.other_cores"] == pytest.approx(0.8 * 2 - 1.0 - 2 * 0.1)    # their CPU is no other job's
    assert sampled_workers_or_fetched({**m, "loader.workers": 2}, {"workers": 2}, lines) == {}   # sampled: kept
    # one of two seen by the samples: the count is the loader's, the CPU use the samples'
    one = sampled_workers_or_fetched({**m, "loader.workers": 1, "loader.worker_cpu_mean": 0.3}, {"workers": 2}, lines)
    assert one == {"loader.workers": 2, "system.other_cores": pytest.approx(0.8 * 2 - 1.0 - 2 * 0.3)}
    assert sampled_workers_or_fetched(m, {"workers": 0}, lines) == {}
    assert sampled_workers_or_fetched(m, {"workers": 2}, []) == {"loader.workers": 2}


# In a fresh interpreter (the wrappers patch torch's classes): a fetcher called as a worker
# would call it, with default_collate, which in a worker stacks into shared memory.
IN_WORKER = """
    import json, os, sys, time, torch
    import torch.storage
    from torch.utils.data._utils import collate, fetch, worker
    from perfdoctor.collect.loaderfetch import FetchTimes

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.full((8,), float(i))

    times = FetchTimes(sys.argv[1])
    times.install(fetch, worker, torch.storage)
    times.install(fetch, worker, torch.storage)          # twice: wrapped once
    f = fetch._MapDatasetFetcher(Slow(), True, collate.default_collate, False)
    b = f.fetch([0, 1, 2, 3])                            # the trainer's own fetch (num_workers=0): not timed
    assert times.worker is None and not b.is_shared()
    worker._worker_info = object()                       # now as a worker
    for k in range(8):
        b = f.fetch(list(range(4 * k, 4 * k + 4)))
    assert b.is_shared() and b[1, 0].item() == 29.0
    times.flush()
    print("ok")
"""


@pytest.mark.torch
def test_a_workers_fetch_is_timed_with_its_shared_memory(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "w.py"
    script.write_text(textwrap.dedent(IN_WORKER))
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "ok\n", r.stderr
    lines = read_fetches(tmp_path / "loaderfetch.jsonl")
    # at 8 batches (the first power of two), flush(), and the finalizer as the process exits
    assert [x["batches"] for x in lines] == [8, 8, 8]
    x = lines[-1]
    assert x["wall_s"] >= 8 * 4 * 0.002                     # four 2 ms samples per batch
    assert 0 < x["shm_s"] < x["wall_s"] and x["runq_s"] >= 0 and x["cpu_s"] >= 0
    assert x["first"] <= x["last"] <= x["at"]


TRAIN = """
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 96
        def __getitem__(self, i):
            time.sleep(0.003)
            return torch.rand(8), torch.rand(1)

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Slow(), batch_size=4, num_workers=2, persistent_workers=True)
    if __name__ == "__main__":
        for epoch in range(2):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        print("done")
"""


@pytest.mark.torch
def test_a_run_measures_what_its_workers_spend_on_a_batch(tmp_path):
    """Persistent workers are terminated at the trainer's exit without running their finalizers:
    the lines written at 8, 16, ... batches still hold most of their work."""
    pytest.importorskip("torch")
    r, out = prun_script(tmp_path, "train.py", textwrap.dedent(TRAIN), opts=("--no-stacks",))
    assert r.stdout == "done\n", r.stderr
    workers = last_per_worker(read_fetches(out / "loaderfetch.jsonl"))
    assert len(workers) == 2 and all(w["batches"] >= 16 for w in workers)    # of 24 each
    m = json.loads((out / "report.json").read_text())["traces"][0]["metrics"]
    assert 12 <= m["loader.fetch_ms"] < 60          # four samples of 3 ms each, less nothing: they sleep
    assert 0 < m["run.outside_loader_share"] < 1
