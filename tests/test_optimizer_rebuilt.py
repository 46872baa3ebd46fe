"""An optimizer built again every step over the same parameters (a learning-rate schedule written
by hand) is the step source all the same (collect/optsteps.py): it read "no training step was
recorded", the first Adam never stepping again and each new one stepping once."""

from __future__ import annotations

import pytest
from runs import child, prun_script, report, steps

SCRIPT = r"""
import sys
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
head = nn.Linear(4, 4)
x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
every = int(sys.argv[1])
opt = None
for step in range(60):
    if step % every == 0:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3 * 0.99 ** step)
    loss = nn.functional.cross_entropy(head(model(x)), y)
    opt.zero_grad(); loss.backward(); opt.step()
print("done")
"""


def test_an_optimizer_built_again_every_step_still_makes_the_steps(tmp_path):
    r, out = prun_script(tmp_path, "rebuilt.py", SCRIPT, "1")
    assert r.stdout == "done\n"
    assert child(out)["mode"] == "optimizer"
    assert len(steps(out)) == 59                              # every optimizer step after the first ends one
    doc = report(out)
    notes = doc["run"]["notes"]
    assert any("the Adam optimizer was built again over the same parameters 59 times (every step)" in n
               for n in notes), notes
    assert not any(n.startswith("optimizers step at different rates") for n in notes)
    # built every step: a high flag and the fix to build it once (no modelled gain: unknown, said why)
    assert doc["traces"][0]["metrics"]["optimizer.rebuilds_per_step"] == 1.0
    ids = {f["id"]: f for f in doc["findings"] + doc["flags"]}
    assert ids["PD223"]["severity"] == "high" and "PD390" in ids, sorted(ids)
    assert ids["PD390"]["gain"] is None and "1.4-2.4x" in ids["PD390"]["no_gain_reason"]


def test_one_built_every_ten_steps_is_said_so(tmp_path):
    r, out = prun_script(tmp_path, "rebuilt.py", SCRIPT, "10")
    assert r.stdout == "done\n"
    assert len(steps(out)) == 59
    doc = report(out)
    assert any("built again over the same parameters 5 times (once per 10 steps)" in n for n in doc["run"]["notes"])
    assert doc["traces"][0]["metrics"]["optimizer.rebuilds_per_step"] == pytest.approx(5 / 59, abs=1e-6)
    assert not {"PD223", "PD390"} & {f["id"] for f in doc["findings"] + doc["flags"]}     # said in a note only


def test_optimizers_over_other_parameters_are_not_one_built_again():
    """A second optimizer of the same class over other tensors (a GAN's generator) is another
    optimizer; one over the same tensors in another order is another too (its state is laid out
    otherwise), and so is an object without param_groups."""
    import torch
    from perfdoctor.collect.optsteps import _param_ids
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    first = torch.optim.Adam(a.parameters())
    assert _param_ids(torch.optim.Adam(a.parameters())) == _param_ids(first)
    assert _param_ids(torch.optim.Adam(b.parameters())) != _param_ids(first)
    assert _param_ids(torch.optim.Adam(list(a.parameters())[::-1])) != _param_ids(first)
    assert _param_ids(object()) is None
