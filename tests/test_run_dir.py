"""Run directories: `run --out` never mixes two runs (--force replaces), `report RUN_DIR` re-diagnoses one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfdoctor.collect.rundir import claim, is_run_dir
from perfdoctor.errors import PerfdoctorError

# A tiny CPU training loop: a DataLoader whose batches cost CPU on the trainer thread (num_workers=0),
# so the run has steps, a trace window, and a couple of seconds of system samples.
TINY = textwrap.dedent("""
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset
    print("tiny:", sys.argv[1:], flush=True)

    class Slow(Dataset):
        def __len__(self):
            return 10 ** 6
        def __getitem__(self, i):
            t = time.perf_counter()
            while time.perf_counter() - t < 0.004:
                pass
            return torch.randn(32), i % 4

    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(DataLoader(Slow(), batch_size=8)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if step + 1 == int(sys.argv[1]):
            break
""")


def prun(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "perfdoctor", "run", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# -- claim (no subprocess) -------------------------------------------------------------------

def test_claim_refuses_a_run_and_force_removes_only_its_files(tmp_path):
    d = tmp_path / "r"
    claim(d)                                   # new: created
    assert d.is_dir() and not is_run_dir(d)
    claim(d)                                   # empty or foreign files: fine
    (d / "steps.jsonl").write_text("{}\n")
    (d / "trace").mkdir()
    (d / "trace" / "h_1.pt.trace.json.gz").write_bytes(b"x")
    (d / "mine.txt").write_text("keep")
    assert is_run_dir(d)
    with pytest.raises(PerfdoctorError, match=r"already holds a run \(steps.jsonl, trace/\).*--force") as e:
        claim(d)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert (d / "steps.jsonl").is_file() and (d / "trace" / "h_1.pt.trace.json.gz").is_file()
    claim(d, force=True)
    assert sorted(p.name for p in d.iterdir()) == ["mine.txt"]
    (tmp_path / "f").write_text("")
    with pytest.raises(PerfdoctorError, match="is a file"):
        claim(tmp_path / "f", force=True)


# -- real runs ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    pytest.importorskip("torch", reason="perfdoctor run tests need torch (test dependency)")
    root = tmp_path_factory.mktemp("rundir")
    script = root / "tiny.py"
    script.write_text(TINY)
    out = root / "run"
    r = prun("--skip-steps", "3", "--trace-steps", "3", "--out", out, script, "60")
    assert r.returncode == 0, r.stderr
    return script, out


def test_out_refuses_an_existing_run_and_force_replaces_it(tiny_run, tmp_path):
    script, first = tiny_run
    out = tmp_path / "run"
    r = prun("--skip-steps", "2", "--trace-steps", "2", "--out", out, script, "12")
    assert r.returncode == 0, r.stderr
    n_old = len((out / "steps.jsonl").read_text().splitlines())
    (out / "mine.txt").write_text("keep")
    before = _snapshot(out)
    old_trace = [p.name for p in (out / "trace").iterdir()]
    # refused: exit 2, one line, the script never ran, nothing touched
    r = prun("--out", out, script, "8")
    assert r.returncode == 2
    assert r.stdout == ""
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("perfdoctor: error: --out ") and "--force" in err[0], r.stderr
    assert _snapshot(out) == before
    # --force: the old run's files go first; the new run is all there is
    r = prun("--force", "--skip-steps", "2", "--trace-steps", "2", "--out", out, script, "8")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "tiny: ['8']\n"
    traces = [p.name for p in (out / "trace").iterdir()]
    assert len(traces) == 1 and traces != old_trace          # the trace file is named by the new pid
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert n_old >= 11 and len(steps) <= 8              # 12 and 8 optimizer steps: no line of the old run
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["steps"] == len(steps) and doc["run"]["command"].endswith("tiny.py 8")
    assert (out / "mine.txt").read_text() == "keep"
