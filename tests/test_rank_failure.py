"""A multi-rank job that fails: which rank's failure is the job's (diagnose/rankfailure.py), and a
rank killed by SIGKILL dying of it under perfdoctor's per-rank launcher (collect/ranks.py)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from perfdoctor.diagnose.rankfailure import before_first_step, first_failure, job_failure, uneven_hint

# rank 0's own error when rank 1 died under it (torch 2.13, gloo), as the trial recorded it
GLOO_PEER = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
             "closed by peer [127.0.0.1]:35482. This is typically caused by a remote worker crashing. Check the "
             "logs of the remote worker before reporting an error. GLHF!")
TORCHRUN = {"exit_code": 1, "signal": None}          # ranks.json of `--nproc-per-node`: torchrun's own exit


def _rank(rank, code, sig, end, outcome, error=None, steps=14):
    info = {"rank": rank, "exit_code": code, "signal": sig, "end_unix": end}
    doc = {"run": {"outcome": outcome, "exit_code": code, "signal": sig, "error": error, "steps": steps,
                   "error_line": error.splitlines()[0][:200] if error else None}}
    return info, doc


def _job(*ranks):
    return [r[0] for r in ranks], [r[1] for r in ranks]


def test_the_crashed_rank_tells_the_job_not_the_rank_stopped_after_it():
    """Rank 1 raises; rank 0 gets gloo's 'Connection closed by peer' and then torchrun's SIGTERM
    (143): the job's failure is rank 1's, with torchrun's exit code and signal (not rank 0's 15)."""
    infos, docs = _job(_rank(0, 143, 15, 1795985382.74, "crashed", GLOO_PEER),
                       _rank(1, 1, None, 1795985382.582, "crashed", "RuntimeError: planted crash on rank 1"))
    assert first_failure(infos, docs) == 1
    run = job_failure(TORCHRUN, infos, docs)
    assert run == {"exit_code": 1, "signal": None, "outcome": "crashed", "failed_rank": 1,
                   "error": "RuntimeError: planted crash on rank 1",
                   "error_line": "rank 1: RuntimeError: planted crash on rank 1"}
    # under the user's own torchrun (no ranks.json): rank 1's own exit code and signal, together
    assert job_failure({}, infos, docs)["exit_code"] == 1 and job_failure({}, infos, docs)["signal"] is None
    # the root cause wins even when its rank ended later (clocks, or a slow teardown)
    infos[1]["end_unix"] = 1795985399.0
    assert first_failure(infos, docs) == 1


def test_a_rank_killed_by_sigkill_is_named_with_its_signal():
    infos, docs = _job(_rank(0, 143, 15, 1795985758.2, "crashed", GLOO_PEER),
                       _rank(1, 137, 9, 1795985757.956, "killed"))
    run = job_failure({}, infos, docs)
    assert (run["failed_rank"], run["exit_code"], run["signal"], run["outcome"]) == (1, 137, 9, "killed")
    assert run["error_line"] == "rank 1 was killed by signal 9 (SIGKILL)" and run["error"] is None


def test_when_every_failure_is_a_consequence_the_first_to_end_tells_it():
    # the whole job stopped by SIGTERM (a scheduler's time limit): the first rank to end, its code
    infos, docs = _job(_rank(0, 143, 15, 20.0, "killed"), _rank(1, 143, 15, 10.0, "killed"),
                       _rank(2, 0, None, 5.0, "completed"))
    assert first_failure(infos, docs) == 1
    assert job_failure({}, infos, docs)["error_line"] == "rank 1 was killed by signal 15 (SIGTERM)"
    assert first_failure(*_job(_rank(0, 0, None, 1.0, "completed"), _rank(1, 0, None, 2.0, "completed"))) is None
    ok = job_failure({}, *_job(_rank(0, 0, None, 1.0, "completed"), _rank(1, 0, None, 2.0, "completed")))
    assert ok == {"exit_code": 0, "signal": None, "failed_rank": None}


def test_uneven_inputs_are_hinted_when_the_only_failure_waited_for_a_finished_rank():
    """uneven.py: rank 0 does 30 batches and exits 0; rank 1 dies in its 31st all-reduce."""
    infos, docs = _job(_rank(0, 0, None, 1795985905.18, "exit"), _rank(1, 1, None, 1795985905.327, "crashed", GLOO_PEER))
    assert job_failure({}, infos, docs)["error_line"].startswith("rank 1: RuntimeError: [/__w/pytorch")
    assert "rank 1 failed in a collective after rank(s) 0 had ended normally" in uneven_hint(infos, docs)
    crash = _job(_rank(0, 0, None, 1.0, "exit"), _rank(1, 1, None, 2.0, "crashed", "RuntimeError: boom"))
    assert uneven_hint(*crash) is None            # a failure of its own: nothing to do with the inputs
    # the job's run notes lead with it (the terminal shows the first note): a user trial's rank 1
    # left its loop early, and the default screen said only rank 0's "Connection reset by peer"
    # and "Python stacks not recorded"
    from perfdoctor.diagnose.ranks import _run_section
    run = _run_section(Path("/nonexistent"), {"notes": ["Python stacks not recorded: no idle CPU"]}, infos, docs)
    assert run["notes"][0].startswith("rank 1 failed in a collective after rank(s) 0 had ended normally")
    assert run["notes"][1:] == ["Python stacks not recorded: no idle CPU", "rank 1 exited with code 1 (its error says a peer failed)"]


def test_a_job_that_failed_before_its_first_step_says_so():
    infos, docs = _job(_rank(0, 143, 15, 2.0, "crashed", GLOO_PEER, steps=0),
                       _rank(1, 1, None, 1.0, "crashed", "RuntimeError: planted crash on rank 1", steps=0))
    run = job_failure(TORCHRUN, infos, docs)
    assert before_first_step(run, docs) == ("The job failed before its first step (rank 1: RuntimeError: planted "
                                            "crash on rank 1; exit code 1): nothing was measured to diagnose. Fix "
                                            "the failure and run again.")
    docs[0]["run"]["steps"] = 3
    assert before_first_step(run, docs) is None


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_rank_launcher_dies_of_its_scripts_signal(sig):
    """SIGKILL takes no handler: setting SIG_DFL for it raised OSError (a traceback, exit 1)."""
    r = subprocess.run([sys.executable, "-c", f"from perfdoctor.collect.ranks import die_of; die_of({int(sig)})"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == -sig and r.stderr == ""


KILLED = """
import os, signal, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    if rank == 1 and step == 4:
        os.kill(os.getpid(), signal.SIGKILL)       # the OOM killer
    loss = model(torch.randn(16, 32)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
os._exit(0)
"""


@pytest.mark.quiet
@pytest.mark.slow
def test_a_rank_killed_by_sigkill_fails_the_job_as_it_would_under_torchrun(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), "--nproc-per-node", "2",
                        "--no-trace", "--no-stacks", str(script)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 1, r.stderr[-3000:]                          # torchrun's, as without perfdoctor
    assert "perfdoctor/collect/ranks.py" not in r.stderr and "OSError" not in r.stderr
    # torchrun saw rank 1's launcher die of the signal (it had seen exit code 1)
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s*exitcode\s*: -9", r.stderr), r.stderr[-3000:]
    rank1 = json.loads((out / "ranks" / "rank-1" / "rank.json").read_text())
    assert (rank1["exit_code"], rank1["signal"]) == (137, 9)
    run = json.loads((out / "report.json").read_text())["run"]
    assert (run["failed_rank"], run["outcome"], run["exit_code"], run["signal"]) == (1, "killed", 1, None)
    assert run["error_line"] == "rank 1 was killed by signal 9 (SIGKILL)"
    assert "rank 1 was killed by signal 9 (SIGKILL)" in r.stderr        # the report's first line names it
