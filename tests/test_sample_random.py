"""Random augmentation told from the loader's fetches (collect/samplerandom.py, PD224): the
generators' states around a fetch, in the trainer (num_workers=0) and in forked workers."""

from __future__ import annotations

import json
import random

import pytest
from runs import child, prun, report

from perfdoctor.analyze.loaderfetch import random_draw_metrics
from perfdoctor.collect.samplerandom import PROBES, RandomDraws


def test_a_fetch_that_draws_from_torch_python_or_numpy_is_told_from_one_that_does_not():
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    d = RandomDraws()
    for draw in (lambda: torch.rand(3), lambda: random.random(), lambda: np.random.randint(5), lambda: None):
        state = d.before()
        draw()
        torch.ones(3) * 2                           # tensor work that draws nothing
        d.after(state)
    assert d.info() == {"probed": 4, "drew": 3}
    assert PROBES == 4 and d.before() is None     # probed enough: later fetches pay a counter test
    d.after(None)
    assert d.info() == {"probed": 4, "drew": 3}


def test_the_share_of_probed_fetches_that_drew_over_the_trainer_and_each_workers_last_line():
    lines = [{"pid": 1, "batches": 8, "wall_s": 1.0, "probed": 4, "drew": 4},
             {"pid": 1, "batches": 16, "wall_s": 2.0, "probed": 4, "drew": 4},     # its later line: the same probes
             {"pid": 2, "batches": 8, "wall_s": 1.0, "probed": 4, "drew": 0}]
    assert random_draw_metrics(lines, None) == {"input.sample_random_share": 0.5}
    assert random_draw_metrics([], {"probed": 4, "drew": 3}) == {"input.sample_random_share": 0.75}
    assert random_draw_metrics([{"pid": 3, "batches": 2, "wall_s": 1.0}], None) == {"input.sample_random_share": None}
    assert random_draw_metrics([], {"probed": 2, "drew": 9}) == {"input.sample_random_share": 1.0}   # capped


LOADER = r"""
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
random_flip = sys.argv[2] == "random"
class Clips(Dataset):
    def __len__(self):
        return 512
    def __getitem__(self, i):
        x = torch.full((64,), float(i % 7))
        if random_flip and torch.rand(()) < 0.5:      # a random flip, as torchvision's draws
            x = x.flip(0)
        time.sleep(0.002)                            # the sample's decoding
        return x, torch.tensor(float(i % 2))
model = torch.nn.Linear(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Clips(), batch_size=8, num_workers=int(sys.argv[1]), shuffle=True)
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x)[:, 0], y)
        opt.zero_grad(); loss.backward(); opt.step()
print("loader: done")
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_randomly_augmented_dataset_is_flagged_and_a_deterministic_one_is_not(tmp_path, workers):
    pytest.importorskip("torch")
    script = tmp_path / "clips.py"
    script.write_text(LOADER)
    shares = {}
    for kind in ("random", "fixed"):
        out = tmp_path / kind
        r = prun("--no-trace", script, str(workers), kind, out=out)
        assert r.returncode == 0, r.stderr
        assert r.stdout == "loader: done\n"
        doc = report(out)
        m = doc["traces"][0]["metrics"]
        shares[kind] = m["input.sample_random_share"]
        flagged = any(f["id"] == "PD224" for f in doc["flags"])
        assert m["run.data_wait_share"] >= 0.05             # the steps wait for the sleeping loader
        assert flagged == (kind == "random")
        if workers:                                  # each forked worker's own probes, in its lines
            lines = [json.loads(x) for x in (out / "loaderfetch.jsonl").read_text().splitlines()]
            assert {x["probed"] for x in lines} == {4} and child(out)["sample_random"] is None
        else:
            assert child(out)["sample_random"]["probed"] == 4
    # a flip drawn per sample: every batch of 8 draws (a fetch is a batch)
    assert shares == {"random": 1.0, "fixed": 0.0}
