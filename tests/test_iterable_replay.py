"""An IterableDataset read by forked DataLoader workers none of which shards it: each worker
replays the whole stream, every epoch holds each sample once per worker (PD221, PD310), whatever
the verdict. The script counts what it trained on, which is the truth the flag is held to."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from perfdoctor.analyze.loaderkinds import iterable_replayed
from perfdoctor.rules.loader import load_rules

RAW = ("input.dataset_kind", "input.loader_workers", "input.worker_info_used", "input.worker_start")


def test_the_rule_cases_state_the_replay_the_four_facts_imply():
    """PD221 and PD310 read input.iterable_replayed, one fact made of four: each of their cases
    that gives the four gives the value analyze/loaderkinds.py derives from them (None: absent)."""
    checked = 0
    for rule in (r for r in load_rules() if r.id in ("PD221", "PD310")):
        for case in rule.cases:
            if not any(k in case.metrics for k in RAW):
                continue
            raw = {k: v for k, v in case.metrics.items() if k != "input.iterable_replayed"}
            assert case.metrics.get("input.iterable_replayed") == iterable_replayed(raw), (rule.id, case.name)
            checked += 1
    assert checked >= 10
    assert iterable_replayed({"input.dataset_kind": "iterable", "input.loader_workers": 2,
                              "input.worker_start": "fork", "input.worker_info_used": None}) is None


STREAM = r'''
import sys, torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Records(IterableDataset):
    def __init__(self, n, shard):
        self.n, self.shard = n, shard

    def __iter__(self):
        info = get_worker_info() if self.shard else None
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(wid, self.n, nw):
            yield torch.full((16,), float(i)), i % 3


if __name__ == "__main__":
    ctx = "spawn" if "--spawn" in sys.argv else None
    seen = []
    model = torch.nn.Linear(16, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(Records(960, "--shard" in sys.argv), batch_size=16, num_workers=2,
                           multiprocessing_context=ctx):
        seen += x[:, 0].long().tolist()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    print(f"samples {len(seen)}, distinct {len(set(seen))}")
'''


def _run(tmp_path, *args):
    pytest.importorskip("torch")
    script = tmp_path / "stream.py"
    script.write_text(STREAM)
    out = tmp_path / ("run" + "".join(args))
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-stacks", "--out", str(out), str(script), *args],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    return r, doc["traces"][0]["metrics"], {f["id"] for f in doc["flags"]}, {f["id"] for f in doc["findings"]}


@pytest.mark.slow
def test_forked_workers_replaying_an_iterable_dataset_are_flagged_and_a_sharded_one_is_not(tmp_path):
    r, m, flags, fixes = _run(tmp_path)
    assert r.stdout == "samples 1920, distinct 960\n"              # the truth: every sample twice
    assert (m["input.dataset_kind"], m["input.loader_workers"], m["input.worker_info_used"],
            m["input.worker_start"], m["input.iterable_replayed"]) == ("iterable", 2, False, "fork", True)
    assert "PD221" in flags and "PD310" in fixes
    assert "PD221 Every loader worker replays the whole IterableDataset" in r.stderr
    # the same stream, sharded with get_worker_info() (imported at the script's top, before the
    # workers fork): each sample once, and nothing said
    r, m, flags, fixes = _run(tmp_path, "--shard")
    assert r.stdout == "samples 960, distinct 960\n"
    assert m["input.worker_info_used"] is True and m["input.iterable_replayed"] is False
    assert "PD221" not in flags and "PD221" not in r.stderr


@pytest.mark.slow
def test_spawned_workers_are_not_judged(tmp_path):
    """A spawned worker does not inherit perfdoctor's get_worker_info watch: it may shard unseen,
    so PD221 stays silent (PD310, the hedged fix, may still be offered on an input-bound run)."""
    r, m, flags, _ = _run(tmp_path, "--spawn")
    assert r.stdout == "samples 1920, distinct 960\n"
    assert m["input.worker_start"] == "spawn" and m["input.worker_info_used"] is False
    assert m["input.iterable_replayed"] is None                     # unknown, not "no"
    assert "PD221" not in flags
