"""What the tune tests share: a plan's facts, stand-in runs, the small training script that
injection tests launch, and `perfdoctor tune` as a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from quiet import Foreign, skip_if_shared

from perfdoctor.tune import plan
from perfdoctor.tune.measure import Measured

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"
SGD = {"class": "SGD", "foreach": None, "fused": None, "supports": ["foreach", "fused"]}
LOADER0 = {"num_workers": 0, "persistent_workers": False, "prefetch_factor": None, "pin_memory": False,
           "batch_size": 16}


def facts(**kw) -> plan.Facts:
    base = dict(cores=2, cuda=False, verdict="input_cpu", data_wait=0.9, loader=dict(LOADER0),
                optimizers=[SGD], threads=1)
    base.update(kw)
    return plan.Facts(**base)


def planned_once(rule: str, knob: str, group: str, **fact) -> None:
    """A report whose `fact` (a Facts field: `rule` fired) plans `knob`'s trial once, in `group`, not
    skipped, predicted by `rule` (beside PD375, which a CPU report also ranks); a report without it
    plans none; and `run`'s tune hint offers `--only rule`."""
    from perfdoctor.rules.tunable import tune_command
    ours = [t for t in plan.plan(facts(**fact, verdict="cpu_compute", data_wait=0.0)) if knob in t.changes]
    assert len(ours) == 1 and ours[0].skip is None and ours[0].group == group
    assert plan.rule_for(ours[0].changes, {rule, "PD375"}) == rule
    assert not any(knob in t.changes for t in plan.plan(facts()))
    assert tune_command([rule], "train.py", cuda=False) == f"perfdoctor tune --only {rule} train.py"


def steady_run(tmp_path, name, ms, changes=None, seed=0):
    """A run of 60 steady steps around `ms` milliseconds (1% jitter), as measure_dir leaves one."""
    from perfdoctor.stats.steptime import estimate_durations
    durs = ms / 1e3 * (1 + 0.01 * np.random.default_rng(seed).standard_normal(60))
    return Measured(tmp_path / name, dict(changes or {}), 0, "stopped", 10.0, inject={"applied": list(changes or {})},
                    estimate=estimate_durations(durs), other_load=0.0, cores=2)


def measured(losses) -> Measured:
    return Measured(Path("."), {}, 0, "stopped", 1.0, inject={"losses": losses})


SCRIPT = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    loader = DataLoader(ds, batch_size=8, num_workers=0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    print("threads", torch.get_num_threads(), "workers", loader.num_workers, flush=True)
    for epoch in range(3):
        for x, y in loader:
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out.float(), y)
            opt.zero_grad(); loss.backward(); opt.step()
    print("dtype", out.dtype, "foreach", opt.defaults.get("foreach"), flush=True)
""")


def launch(tmp_path: Path, changes, max_steps=60, script_text=SCRIPT):
    pytest.importorskip("torch")
    from perfdoctor.collect.launcher import RunConfig, launch as _launch
    script = tmp_path / "train.py"
    script.write_text(script_text)
    d = tmp_path / "run"
    res = _launch(RunConfig(argv=[str(script)], run_dir=d, max_steps=max_steps, trace=False, changes=changes))
    return res, d


def injected(tmp_path: Path, capfd, changes: dict, script_text: str) -> tuple[str, dict]:
    """The script run to its end under `changes`, in a directory of its own: (its stdout, inject.json)."""
    sub = tmp_path / (re.sub(r"[^A-Za-z0-9]+", "_", plan.describe(changes)))
    sub.mkdir()
    res, d = launch(sub, changes, max_steps=None, script_text=script_text)
    assert res.exit_code == 0
    return capfd.readouterr().out, json.loads((d / "inject.json").read_text())


def ptune(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "perfdoctor", "tune", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def tuned(tmp_path: Path, script: Path, *args) -> tuple[dict, Foreign]:
    """`perfdoctor tune ARGS SCRIPT` into tmp_path/t: its JSON document, and the machine's share
    that other work took meanwhile (a tune that found nothing measurable on a shared machine skips)."""
    foreign = Foreign()
    r = ptune(*args, "--out", tmp_path / "t", "-o", tmp_path / "t.json", script)
    if r.returncode == 3:
        skip_if_shared(foreign)
    assert r.returncode == 0, r.stderr
    return json.loads((tmp_path / "t.json").read_text()), foreign
