"""Checkpoint saves and logging calls timed on the training thread (collect/timedcalls.py), their
shares (analyze/callshares.py), and PD350/PD351 from them on a run without Python stacks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import types

import pytest

from perfdoctor.analyze.callshares import call_metrics, combined
from perfdoctor.collect.timedcalls import TimedCalls


def _fake_modules(monkeypatch):
    calls = []
    tb = types.ModuleType("torch.utils.tensorboard.writer")

    class SummaryWriter:
        def add_scalar(self, *a):
            time.sleep(0.02)
            calls.append("scalar")

        def add_histogram(self, *a):
            self.add_scalar()                 # nested in a timed call: counted once
            time.sleep(0.01)

        def flush(self):
            time.sleep(0.05)                  # not an add_* call: not timed
    tb.SummaryWriter = SummaryWriter
    st = types.ModuleType("safetensors.torch")
    st.save_file = lambda *a: time.sleep(0.03)
    monkeypatch.setitem(sys.modules, tb.__name__, tb)
    monkeypatch.setitem(sys.modules, st.__name__, st)
    return tb, st


def test_calls_on_the_training_thread_are_timed_once_and_others_not(monkeypatch):
    tb, st = _fake_modules(monkeypatch)
    tc = TimedCalls()
    tc.pending = [t for t in tc.pending if not t[0].startswith("tensorboardX")]
    tc.poll()
    assert not tc.pending
    w = tb.SummaryWriter()
    w.add_histogram("h")                       # 0.03 s: the nested add_scalar is inside it
    w.flush()
    st.save_file({}, "x")                      # 0.03 s
    save, log, collect, convert = tc.take()
    assert save == pytest.approx(0.03, abs=0.015) and log == pytest.approx(0.03, abs=0.015) and collect == 0.0
    assert convert == 0.0
    assert tc.take() == (0.0, 0.0, 0.0, 0.0)   # taken: the next step starts from nothing
    t = threading.Thread(target=lambda: (w.add_scalar(), st.save_file({}, "y")))   # a background save
    t.start()
    t.join()
    assert tc.take() == (0.0, 0.0, 0.0, 0.0)   # not on the training thread: not the step's
    tc.poll()                                  # nothing new: nothing wrapped twice
    assert tc._wrap(w.add_scalar.__func__, "log") is tb.SummaryWriter.add_scalar
    assert not hasattr(tb.SummaryWriter.add_scalar.__wrapped__, "_perfdoctor_timed")


def test_shares_come_from_the_steady_steps_and_the_larger_source_wins():
    steps = [{"dur": 0.1, "save": 0.05, "log": 0.01, "opt": 0.02}, {"dur": 0.1, "opt": 0.02},
             {"dur": 0.1, "save": 0.05, "gc": 0.03}, {"dur": 0.1, "opt": 0.04}]
    m = call_metrics(steps, timed=True)
    assert m == {"calls.save_share": pytest.approx(0.25), "calls.save_interval_steps": 2.0, "calls.nograd_share": None,
                 "calls.log_share": pytest.approx(0.025), "calls.optimizer_share": None,
                 "calls.gc_share": pytest.approx(0.075), "calls.convert_share": None,
                 "calls.pre_forward_share": None, "calls.convert_traced_share": None,
                 "calls.pre_forward_typical_share": None}
    assert set(call_metrics(steps, timed=False).values()) == {None}        # an older run directory
    # optimizer steps timed (collect/optclock.py): their share, whether the other calls were timed or not
    assert call_metrics(steps, timed=False, optimizer_timed=True)["calls.optimizer_share"] == pytest.approx(0.2)
    m = call_metrics(steps, timed=True)
    # py-spy saw more of the logging (a .item() line, wandb) and less of the saving
    m.update({"stacks.checkpoint_share": 0.2, "stacks.checkpoint_interval_steps": 3.0,
              "stacks.logging_sync_share": 0.3})
    assert combined(m) == {"save.share": pytest.approx(0.25), "save.interval_steps": 2.0,
                           "logging.share": 0.3, "evaluation.share": None, "gc.share": pytest.approx(0.075),
                           "untraced.unnamed_share": None}
    assert combined({}) == {"save.share": None, "save.interval_steps": None, "logging.share": None,
                            "evaluation.share": None, "gc.share": None, "untraced.unnamed_share": None}
    # gc.collect() seen both ways: the larger (timed 7.5%, py-spy's samples 9%)
    assert combined({**m, "stacks.gc_collect_share": 0.09})["gc.share"] == 0.09
    # an evaluation seen both ways: the larger measure (extra batches 8%, stacks 14%)
    assert combined({"loop.extra_batches_excess_share": 0.08, "stacks.evaluation_share": 0.14})[
        "evaluation.share"] == 0.14
    # saves every 10 steps, 2 of them among 27 steady steps: their gap, not 27 / 2; one save: the steps over it
    every10 = [{"step": n, "dur": 0.1, **({"save": 0.02} if n % 10 == 0 else {})} for n in range(1, 28)]
    assert call_metrics(every10, timed=True)["calls.save_interval_steps"] == 10.0
    assert call_metrics(every10[:15], timed=True)["calls.save_interval_steps"] == 15.0
    assert call_metrics([{k: v for k, v in s.items() if k != "step"} for s in every10], timed=True)[
        "calls.save_interval_steps"] == 13.5                     # an older run's steps have no numbers
    # no save in the steady steps: share 0, no interval
    assert call_metrics([{"dur": 0.1}] * 3, timed=True)["calls.save_interval_steps"] is None


SCRIPT = """
import os, sys, tempfile, torch
from safetensors.torch import save_file         # bound by name before any step: wrapped at its import
from torch.utils.tensorboard import SummaryWriter
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(256, 256)
big = {"table": torch.randn(4_000_000)}          # 16 MB written every step
opt = torch.optim.SGD(model.parameters(), lr=0.01)
d = tempfile.mkdtemp()
w = SummaryWriter(d)
for step in range(30):
    loss = model(torch.randn(64, 256)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 2:
        save_file(big, os.path.join(d, "ckpt.safetensors"))
    else:
        torch.save(big, os.path.join(d, "ckpt.pt"))
    w.add_histogram("w", model.weight, step)
w.close()
print("done")
"""


@pytest.mark.torch
def test_a_run_without_stacks_names_the_checkpoint_and_the_logging(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    pytest.importorskip("safetensors")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-stacks", "--no-trace", "--out", str(out),
                        str(script)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    # torch.save and safetensors' save_file by turns: every step's save is timed
    assert len(steps) == 29 and all(s["save"] > 0 and s["log"] > 0 for s in steps), steps
    assert all(s["save"] + s["log"] <= s["dur"] for s in steps)
    doc = json.loads((out / "report.json").read_text())
    m = doc["traces"][0]["metrics"]
    assert doc["stacks"] is None and m["stacks.checkpoint_share"] is None
    assert m["calls.save_interval_steps"] == 1.0 and m["save.share"] == m["calls.save_share"] > 0.05
    assert m["logging.share"] == m["calls.log_share"] > 0
    ids = [f["id"] for f in doc["findings"]]
    assert "PD350" in ids, (ids, m["save.share"])
    fix = next(f for f in doc["findings"] if f["id"] == "PD350")
    # every 100 steps keeps 1/100 of the saving: the expected gain follows the timed share
    assert fix["gain"]["expected"] == pytest.approx(1 / (1 - 0.99 * m["save.share"]), rel=0.02)
