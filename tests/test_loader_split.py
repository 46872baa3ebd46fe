"""The loader's IO/CPU split against a single thread's ceiling (analyze/system.py), and what the
rules make of it: CPU-bound workers get the workers fix, not "keep the data set in RAM"."""

from __future__ import annotations

import json

import pytest

from perfdoctor.analyze import registry
from perfdoctor.analyze.system import system_metrics
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.loader import load_rules


def _samples(n=20, workers=2, cpu=80.0, running=0.8, disk_sleep=0.0, runq=0.0, cores=16, busy=12.0,
             trainer_cpu=5.0, trainer_running=0.0, trainer_runq=0.0):
    """n samples 0.5 s apart; each worker spends `cpu`% of a core on CPU and is caught in state R in
    `running` of the samples (D in `disk_sleep`, S otherwise); the trainer likewise."""
    out = []
    for i in range(n):
        frac = (i % 10) / 10                      # deterministic state pattern over each 10 samples
        state = "running" if frac < running else "disk-sleep" if frac < running + disk_sleep else "sleeping"
        tstate = "running" if frac < trainer_running else "sleeping"
        t = i * 0.5
        w = [{"pid": 100 + k, "create_time": 1.0, "role": "worker", "cpu_percent": cpu, "state": state,
              "read_bytes": 0, "runq_wait_s": t * runq, "sched_cpu_s": t * cpu / 100} for k in range(workers)]
        out.append({"t": t, "unix": 1.8e9 + t, "cost_s": 0.001,
                    "trainer": {"pid": 1, "create_time": 1.0, "role": "trainer", "cpu_percent": trainer_cpu,
                                "state": tstate, "read_bytes": 0, "runq_wait_s": t * trainer_runq,
                                "sched_cpu_s": t * trainer_cpu / 100},
                    "workers": w, "helpers": [], "gpu": None,
                    "system": {"cpu_count": cores, "usable_cpus": cores, "cpu_quota_cores": None,
                               "cpu_usable_percent": busy, "cpu_total_percent": busy, "iowait_percent": 0.0,
                               "psi": None, "disk": None, "ram_available_bytes": 100 * 10 ** 9}})
    return out


def split(**kw):
    m = system_metrics(_samples(**kw), [])
    return m["input.split"], m["loader.runnable_share"]


def test_workers_at_08_core_are_cpu_bound_not_waiting():
    """The issue's case: 2 workers at 0.8 core each on 16 idle cores (was 'other' under a 0.9 line)."""
    s, r = split(cpu=80.0, running=0.8)
    assert s == "cpu" and r == pytest.approx(0.8)
    assert split(cpu=80.0, running=0.0) == ("cpu", pytest.approx(0.8))      # CPU time alone suffices
    # runnable = on a CPU or queued for one: 0.35 core + 0.2 s/s in the run queue
    assert split(cpu=35.0, running=0.0, runq=0.2) == ("cpu", pytest.approx(0.55))
    # run state alone: a throttled worker is in R without CPU time or run-queue wait
    assert split(cpu=20.0, running=0.6)[0] == "cpu"


def test_sleeping_workers_are_other_and_disk_sleep_is_io():
    assert split(cpu=30.0, running=0.3)[0] == "other"          # off-CPU 70%, no storage: other
    assert split(cpu=10.0, running=0.1, disk_sleep=0.6)[0] == "io"
    # storage a third of the time but computing 60%: the larger part is CPU
    assert split(cpu=60.0, running=0.6, disk_sleep=0.3)[0] == "cpu"
    # mostly off-CPU, a fifth or more in D: io
    assert split(cpu=35.0, running=0.3, disk_sleep=0.3)[0] == "io"
    # on a machine saturated by other jobs, a sleeping loader is still not CPU-bound
    assert split(cpu=5.0, running=0.0, busy=97.0)[0] == "other"


def test_trainer_with_num_workers_zero_counts_its_main_thread():
    """num_workers=0: the trainer's CPU holds its intra-op threads too; its main thread's state decides."""
    s, r = split(workers=0, trainer_cpu=600.0, trainer_running=0.2)
    assert s == "other" and r == pytest.approx(0.2)              # 6 cores busy, main thread mostly asleep
    assert split(workers=0, trainer_cpu=100.0, trainer_running=0.9) == ("cpu", pytest.approx(0.9))


def test_trainer_loading_is_judged_over_its_waits_when_the_hooks_timed_them():
    """num_workers=0 beside a busy step: the main thread runs 90% of the run, but inside
    DataLoader __next__ the process ran 0.09 s of 1 s (its queueing 0.02 s of the waits' part
    of the steps): a loader sleeping on something, 'other', not the trainer computing its batches
    (a user trial's sleeping loader read 'cpu'). Without those records the run's state decides."""
    from perfdoctor.analyze.system import wait_cpu_of
    steps = [{"step": i, "dur": 0.05, "wait": 0.01, "wcpu": 0.0009, "runq": 0.01, "profiled": False}
             for i in range(100)]
    steps += [{"step": 100, "dur": 0.5, "wait": 0.4, "wcpu": 0.4, "runq": 0.0, "profiled": True}]  # the trace's: out
    cpu, wait = wait_cpu_of(steps)
    assert (cpu, wait) == (pytest.approx(0.09 + 0.2), pytest.approx(1.0))
    m = system_metrics(_samples(workers=0, trainer_cpu=100.0, trainer_running=0.9), [], (0.09, 1.0))
    assert m["input.split"] == "other" and m["loader.trainer_wait_runnable_share"] == pytest.approx(0.09)
    assert m["loader.runnable_share"] == pytest.approx(0.9)          # the main thread over the run: PD114's
    m = system_metrics(_samples(workers=0, trainer_cpu=100.0, trainer_running=0.9), [], (0.95, 1.0))
    assert m["input.split"] == "cpu" and m["loader.trainer_wait_runnable_share"] == pytest.approx(0.95)
    # under MIN_TIMED_WAIT_S of waits, or a run with workers: the samples decide
    assert system_metrics(_samples(workers=0, trainer_cpu=100.0, trainer_running=0.9), [], (0.001, 0.05))[
        "input.split"] == "cpu"
    # a run whose samples cover under MIN_COVERED_S (0.4 s) but whose 0.3 s of waits were timed:
    # the exact clock decides (a short run converting each sample from Python lists got no split)
    samples = _samples(n=2, workers=0, trainer_cpu=100.0, trainer_running=0.0)
    samples[1].update(t=0.4, unix=1.8e9 + 0.4)
    samples[1]["trainer"]["sched_cpu_s"] = 0.4
    notes: list[str] = []
    short = system_metrics(samples, notes, (0.28, 0.3))
    assert short["input.split"] == "cpu" and short["loader.trainer_wait_runnable_share"] == pytest.approx(0.28 / 0.3)
    assert short["loader.runnable_share"] is None and not any("split needs" in n for n in notes)
    assert system_metrics(samples, notes, None)["input.split"] is None and "split needs" in notes[-1]
    assert system_metrics(_samples(cpu=30.0, running=0.3), [], (1.0, 1.0))["input.split"] == "other"
    assert wait_cpu_of([{k: v for k, v in s.items() if k != "wcpu"} for s in steps]) is None   # an older run


def test_a_hand_edited_step_records_odd_cpu_in_the_wait_counts_as_none():
    """steps.jsonl passes fields it does not check through (runfiles.conform): a `wcpu` or `runq`
    that is not a number ended `perfdoctor report` of the run in an internal error (TypeError)."""
    from perfdoctor.analyze.system import wait_cpu_of
    steps = [{"step": 1, "dur": 0.05, "wait": 0.01, "wcpu": "x", "runq": None, "profiled": False},
             {"step": 2, "dur": 0.05, "wait": 0.01, "wcpu": 0.004, "runq": "y", "profiled": False},
             {"step": 3, "dur": 0.05, "wait": 0.01, "wcpu": True, "runq": 0.01, "profiled": False}]
    cpu, wait = wait_cpu_of(steps)
    assert (cpu, wait) == (pytest.approx(0.004 + 0.01 * 0.2), pytest.approx(0.03))


def _metrics(samples, **shares) -> dict:
    m = dict.fromkeys(registry.REGISTRY)
    m.update({"trace.platform": "cuda", "share.device": 0.15, "share.input": 0.8, "share.host": 0.05,
              "share.communication": 0.0, "input.data_wait_share": 0.8, "input.loader": "multi_process",
              "input.num_workers_zero": False, "input.traced_op_share_of_wait": 0.0, **shares})
    m.update(system_metrics(samples, []))
    return m


def test_cpu_bound_workers_get_the_workers_fix_not_ram():
    rules = load_rules()
    d = evaluate(rules, _metrics(_samples(cpu=80.0, running=0.8)))
    assert d.verdict.rule.id == "PD109" and d.verdict.rule.bound == "input_cpu"
    fixes = [f.rule.id for f in d.fixes]
    assert "PD301" in fixes and "PD304" not in fixes, fixes
    # the same workers sleeping (remote storage, a lock): then RAM / caching advice is what follows
    d = evaluate(rules, _metrics(_samples(cpu=10.0, running=0.1)))
    assert d.verdict.rule.id == "PD110" and "PD304" in [f.rule.id for f in d.fixes]


def test_h100_loader_run(shared_traces):
    """num_workers=0, Gaussian blurs on the trainer: its main thread runs in every sample of the steps."""
    from perfdoctor.diagnose.live import diagnose_dir

    d = shared_traces / "h100" / "loader"
    if not d.is_dir():
        pytest.skip(f"integration data absent: {d}")
    doc = diagnose_dir(d)
    m = doc["traces"][0]["metrics"]
    assert m["loader.workers"] == 0 and m["input.split"] == "cpu" and m["loader.runnable_share"] == 1.0
    assert doc["verdict"]["rule"] == "PD113"
    fixes = [f["id"] for f in doc["findings"]]
    assert "PD301" in fixes and "PD304" not in fixes, fixes
    # over the steps the trainer's intra-op threads kept ~13.6 cores busy (6.2 over the whole process)
    samples = json.loads((d / "samples.json").read_text())["samples"]
    assert system_metrics(samples, [])["loader.trainer_cpu_mean"] == pytest.approx(6.24, abs=0.05)
    assert m["loader.trainer_cpu_mean"] == pytest.approx(13.6, abs=0.1)


def test_too_little_loading_observed_says_where_and_cuts_the_seconds():
    """0.498 s of loading seen: the note says 0.49 s, under the 0.5 s the split needs (not '0.50 s,
    less than 0.5 s'), and whether that was the trainer's thread or the workers."""
    from perfdoctor.analyze.inputsplit import split

    notes: list[str] = []
    ld = {"cpu": 0.9, "covered_s": 0.498, "runq": 0.0, "running": None, "d": 0.0}
    assert split({}, ld, True, notes) is None
    assert notes == ["input split (IO or CPU) unknown: data loading in the trainer's thread (no loader workers) was "
                     "observed for 0.49 s in all, under the 0.5 s the split needs (the run was too short to tell)"]
    split({}, ld, False, notes)
    assert "data loading in the loader workers was observed" in notes[1]


SLEEPING_LOADER = """
import time, torch
torch.set_num_threads(1)

class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        if i % 16 == 0:
            time.sleep(0.02)              # one wait on something else (a socket, a lock) a batch
        return torch.ones(64), 1

loader = torch.utils.data.DataLoader(Slow(), batch_size=16, num_workers=0)
model = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                            torch.nn.ReLU(), torch.nn.Linear(1024, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader):
    for _ in range(6):                    # ~20 ms of compute a step: the main thread busy most of the run
        loss = model(x.repeat(16, 1)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if step == 80:
        break
"""


@pytest.mark.torch
def test_live_a_trainer_loader_that_sleeps_is_not_called_cpu_work(tmp_path):
    """num_workers=0, the batch's wait a 20 ms sleep beside ~20 ms of compute: the trainer's
    process runs most of the run (its sampled state says 'cpu'), but inside __next__ it runs a few
    percent: the split is 'other' (a user trial read 'Input-bound (CPU) ... computes them itself')."""
    pytest.importorskip("torch")
    from tests.runs import prun_script, steps
    r, out = prun_script(tmp_path, "sleeping_loader.py", SLEEPING_LOADER, opts=("--no-stacks",))
    recs = [s for s in steps(out) if s.get("wait", 0) > 0.015 and not s.get("profiled")]
    assert len(recs) >= 40 and all("wcpu" in s for s in recs)
    assert sum(s["wcpu"] for s in recs) / sum(s["wait"] for s in recs) < 0.25
    m = json.loads((out / "report.json").read_text())["traces"][0]["metrics"]
    assert m["input.split"] == "other" and m["loader.trainer_wait_runnable_share"] < 0.5, \
        (m["input.split"], m["loader.trainer_wait_runnable_share"])


def test_the_trainers_threads_queueing_together_bounds_what_loading_in_it_gains():
    """loader.trainer_runq_wait_mean: the trainer process's threads' run-queue time together per
    second (its intra-op threads queued behind the workers hold up each parallel op). PD347's
    ceiling takes it where it exceeds the training thread's own (run.runq_share): an LSTM
    classifier's read 1.40x from the thread's 9.3% where num_workers=0 measured 1.42-1.45x."""
    m = system_metrics(_samples(cores=2, busy=98.0, cpu=8.0, trainer_cpu=175.0, trainer_runq=0.2), [])
    assert m["loader.trainer_runq_wait_mean"] == pytest.approx(0.2)
    assert system_metrics(_samples(), [])["loader.trainer_runq_wait_mean"] == 0.0
    rule = next(r for r in load_rules() if r.id == "PD347")
    base = {"loader.workers": 2, "share.input": 0.167, "run.data_wait_share": 0.14, "input.wait_busy_share": 0.83,
            "loader.worker_cpu_mean": 0.08, "loader.restart_share": 0.025, "run.runq_share": 0.093,
            "system.other_cores": 0.04}
    ceiling = {}
    for together in (None, 0.2, 0.05):
        d = evaluate([rule], {**base, "loader.trainer_runq_wait_mean": together})
        ceiling[together] = next(f for f in d.fixes if f.rule.id == "PD347").ceiling
    assert ceiling[None] == pytest.approx(1 / (1 - 0.167 - 0.025 - 0.093), rel=1e-3)
    assert ceiling[0.2] == pytest.approx(1 / (1 - 0.167 - 0.025 - 0.2), rel=1e-3) and ceiling[0.2] > 1.45
    assert ceiling[0.05] == ceiling[None]        # the training thread's own queueing is the larger

