"""`perfdoctor tune` on a data-parallel job of one node (tune/job.py): every run is the whole job,
started through torchrun (DDP over gloo on the CPU here), its ranks stopped after the same step."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from quiet import Foreign, skip_if_shared
from tunecases import ptune

from perfdoctor.errors import PerfdoctorError
from perfdoctor.tune.job import SEVERAL_NODES, UNDER_LAUNCHER, _job_inject, job_command
from perfdoctor.tune.measure import Measured

# every sample waits 3 ms on storage (a sleep: a slow disk needs no core, so DataLoader workers
# overlap it with the ranks' compute on 2 cores as well as on 64). 12 ms of a ~30 ms step: at 1.5 ms
# (6 of 24) one worker measured 1.28x [1.10, 1.50] alone and inconclusive beside another test,
# whose load stretches the compute but not the wait
SLEEPY_DDP = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler

    class Sleepy(Dataset):
        def __len__(self):
            return 100000

        def __getitem__(self, i):
            time.sleep(0.003)
            return torch.full((256,), float(i % 7)), i % 10

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # one string: the ranks write to one output.log unbuffered, and print's arguments are written one
    # by one ("rankrank  10 of  2of" in a CI run)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
    data = Sleepy()
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=False))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        for _ in range(4):               # four updates per batch
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)     # not the interpreter's teardown: gloo's sometimes aborts there (examples/ddp_gloo.py)
""")


@pytest.mark.slow
@pytest.mark.quiet      # it judges a speed-up: beside the other worker's test it read "inconclusive" twice
def test_tune_of_a_torchrun_job_measures_workers_on_every_rank(tmp_path):
    """A 2-rank DDP job whose loader waits on storage in the ranks' main processes: tune, given
    the job's torchrun command line, runs the baseline and the workers trial as whole jobs; the
    workers are applied in both ranks, the ranks of each run stop after the same step, and the
    trial is measured faster at the pace of the slowest rank."""
    script = tmp_path / "ddp_sleepy.py"
    script.write_text(SLEEPY_DDP)
    foreign = Foreign()
    r = ptune("--only", "PD301", "--budget", "50", "--duration", "3", "--out", tmp_path / "t",
              "-o", tmp_path / "t.json", "torchrun", "--nproc-per-node", "2", script, timeout=240)
    if r.returncode == 3:
        skip_if_shared(foreign)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["command"] == f"torchrun --nproc-per-node 2 --standalone {script}"
    base = doc["baseline"]
    assert base["ranks"] == 2 and base["pace_rank"] in (0, 1) and "the slowest of 2 ranks" in r.stderr
    said = f"steady steps (the slowest of 2 ranks, rank {base['pace_rank']}); verdict"
    from perfdoctor.report import markdown
    assert said in " ".join(r.stdout.split())                       # the table's header (the terminal wraps it)
    assert said.replace("(", "\\(").replace(")", "\\)") in markdown.tune(doc)
    # the baseline's diagnosis is the job's, merged over its ranks
    report = json.loads((tmp_path / "t" / "baseline" / "report.json").read_text())
    assert report["ranks"]["count"] == 2 and any(f["id"] == "PD301" for f in report["findings"])
    # four updates per batch draw a batch every 4th step: the loop's own batch, not "another loop"
    assert "PD354" not in {f["id"] for f in report["findings"]}
    log = (tmp_path / "t" / "baseline" / "output.log").read_text()
    assert "rank 0 of 2" in log and "rank 1 of 2" in log
    trial = doc["trials"][0]
    assert trial["changes"].get("num_workers", 0) >= 1 and trial["status"] == "faster", trial
    assert trial["speedup"] > 1.2 and trial["ci95"][0] > 1
    run = Path(trial["dir"])
    steps = []
    for k in (0, 1):
        rank = run / "ranks" / f"rank-{k}"
        assert "num_workers" in json.loads((rank / "inject.json").read_text())["applied"]
        assert json.loads((rank / "run.json").read_text())["stopped_by"] == "duration"
        steps.append(json.loads((rank / "child.json").read_text())["steps"])
    assert steps[0] == steps[1] > 20
    assert doc["best"]["changes"].get("num_workers", 0) >= 1


def test_the_job_command_from_tunes_options_or_a_torchrun_command_line(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(k, raising=False)
    assert job_command([str(script), "--lr", "1"], None, None) == ([str(script), "--lr", "1"], None, None)
    assert job_command([str(script)], None, "2") == ([str(script)], None, ["--nproc-per-node", "2", "--standalone"])
    with pytest.raises(PerfdoctorError, match="--nproc-per-node 'two'"):
        job_command([str(script)], None, "two")
    tr = "torch.distributed.run"
    # tune's own --nproc-per-node goes first; a named rendezvous is kept, without --standalone
    assert job_command([tr, str(script), "-x"], tr, "4") == \
        ([str(script), "-x"], None, ["--nproc-per-node", "4", "--standalone"])
    assert job_command([tr, "--nproc_per_node=2", "--rdzv-endpoint", "localhost:0", "-m", "pkg.train"], tr, None) == \
        (["pkg.train"], "pkg.train", ["--nproc_per_node=2", "--rdzv-endpoint", "localhost:0"])
    assert job_command([tr, "--nproc-per-node", "2", "--master_port", "29512", str(script)], tr, None)[2] == \
        ["--nproc-per-node", "2", "--master_port", "29512"]              # its port, not a free one
    with pytest.raises(PerfdoctorError, match="this node only"):
        job_command([tr, "--nnodes", "2", "--nproc-per-node", "2", str(script)], tr, None)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(PerfdoctorError, match="run it once, not once per rank"):
        job_command([str(script)], None, None)


@pytest.mark.parametrize("words, env, says", [
    (["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "t.py"], {}, SEVERAL_NODES),
    (["t.py"], {"RANK": "0", "WORLD_SIZE": "2"}, UNDER_LAUNCHER)])
def test_a_tune_that_cannot_stop_the_ranks_together_is_refused_in_one_line(tmp_path, words, env, says):
    """Across nodes the runs could not stop together; started once per rank by a launcher, each
    rank would tune the job on its own: exit 2, one line, nothing run."""
    import subprocess
    import sys

    (tmp_path / "t.py").write_text("pass\n")
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "tune", "--out", "t", *words], cwd=tmp_path,
                       capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and r.stderr == f"perfdoctor: error: {says}\n", r.stderr
    assert not (tmp_path / "t").exists()


def test_a_change_counts_as_applied_only_where_every_rank_applied_it():
    def rank(applied, losses, notes=()):
        return Measured(Path("."), {}, 0, "stopped", 1.0,
                        inject={"applied": applied, "losses": losses, "notes": list(notes), "threads": 1})
    job = _job_inject([(0, rank(["num_workers", "threads"], [2.0, 1.5], ["a note"])),
                       (1, rank(["threads"], [9.0, 9.5], ["a note"]))])
    assert job["applied"] == ["threads"] and job["losses"] == [2.0, 1.5] and job["threads"] == 1
    assert job["notes"] == ["a note", "rank 1 did not apply num_workers"]


def test_a_one_node_jobs_report_offers_tune_with_its_ranks():
    from perfdoctor.report.tune_labels import tune_hint
    per = [{"rank": k, "host": "vm"} for k in (0, 1)]
    doc = {"run": {"command": "train.py", "steps": 40}, "traces": [{"metrics": {"trace.platform": None}}],
           "verdict": {"bound": "input_cpu"},
           "findings": [{"id": "PD301", "kind": "fix"}], "ranks": {"count": 2, "world_size": 2, "per_rank": per}}
    assert tune_hint(doc) == "perfdoctor tune --nproc-per-node 2 --only PD301 train.py"
    doc["ranks"]["per_rank"][1]["host"] = "other"        # two nodes: tune cannot run the job
    assert tune_hint(doc) is None
    doc["ranks"] = {"count": 2, "world_size": 4, "per_rank": per}        # a node's share of a larger job
    assert tune_hint(doc) is None


def _rank_run(top: Path, k: int, ms: float, outcome: str = "stopped", code: int = 0, error: str | None = None):
    import numpy as np
    d = top / "ranks" / f"rank-{k}"
    d.mkdir(parents=True)
    durs = ms / 1e3 * (1 + 0.01 * np.random.default_rng(k).standard_normal(60))
    ends = np.cumsum(durs)
    (d / "steps.jsonl").write_text("".join(json.dumps({"step": i + 1, "end": float(e), "dur": float(x), "wait": 0.0,
                                                       "batches": 1}) + "\n"
                                           for i, (e, x) in enumerate(zip(ends, durs))))
    (d / "child.json").write_text(json.dumps({"outcome": outcome, "steps": 60, "error": error}))
    (d / "rank.json").write_text(json.dumps({"rank": k, "world_size": 2, "exit_code": code}))
    (d / "run.json").write_text(json.dumps({"stopped_by": "duration" if outcome == "stopped" else None, "notes": []}))
    (d / "inject.json").write_text(json.dumps({"applied": ["threads"], "losses": [float(k)] * 10}))


def test_a_jobs_run_is_measured_at_its_slowest_rank_and_fails_with_a_failed_rank(tmp_path):
    from perfdoctor.tune.job import measure_job
    _rank_run(tmp_path / "a", 0, 10.0)
    _rank_run(tmp_path / "a", 1, 12.0)
    m = measure_job(tmp_path / "a", {"threads": 1}, 0, 5.0)
    assert m.ok and (m.ranks, m.pace_rank, m.run_dir) == (2, 1, tmp_path / "a")
    assert m.step_s == pytest.approx(0.012, rel=0.02) and m.inject["losses"] == [0.0] * 10     # rank 0's losses
    _rank_run(tmp_path / "b", 0, 10.0)
    _rank_run(tmp_path / "b", 1, 12.0, outcome="error", code=1, error="RuntimeError: out of data")
    m = measure_job(tmp_path / "b", {}, 1, 5.0)
    assert m.error == "the script failed (RuntimeError: out of data) on rank 1"
    _rank_run(tmp_path / "c", 0, 10.0)
    _rank_run(tmp_path / "c", 1, 10.0)
    assert measure_job(tmp_path / "c", {}, 1, 5.0).error == "the script failed (torchrun exit code 1)"
    (tmp_path / "d").mkdir()
    assert measure_job(tmp_path / "d", {}, 1, 5.0).error.startswith("the script failed (torchrun exit code 1; no rank")


def test_the_other_load_of_a_job_leaves_out_every_ranks_own_cpu():
    """A rank that waits for a busy straggler used 0.2 of a core, the straggler 1.0: one rank's own
    figure, doubled for its sibling, called 0.8 cores "other processes" on a quiet machine."""
    from perfdoctor.analyze.system import ranks_other_cores as job_other_cores
    quiet = [{"system.cpu_busy_share": 0.61, "machine.cpu_count": 2, "loader.trainer_cpu_mean": 0.2},
             {"system.cpu_busy_share": 0.59, "machine.cpu_count": 2, "loader.trainer_cpu_mean": 1.0}]
    assert job_other_cores(quiet) == 0.0
    busy = [dict(m, **{"system.cpu_busy_share": 0.9}) for m in quiet]
    assert job_other_cores(busy) == pytest.approx(0.6)
    workers = [dict(quiet[0]), dict(quiet[1], **{"loader.workers": 2, "loader.worker_cpu_mean": 0.1})]
    assert job_other_cores([dict(m, **{"system.cpu_busy_share": 0.75}) for m in workers]) == pytest.approx(0.1)
    assert job_other_cores([quiet[0], {"machine.cpu_count": 2}]) is None
