"""Training in child processes of the launched one (Hogwild! with torch.multiprocessing): the
children are left alone (no step of theirs recorded, no stop raised in them) and the report
says where the training went (collect/forked.py, diagnose/childtrainers.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


HOGWILD = r"""
import sys, time
import torch, torch.nn as nn
import torch.multiprocessing as mp

def train(rank, model, steps, pause):
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 256), torch.randn(256, 1)
    for _ in range(steps):
        opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step()
        time.sleep(pause)
    print(f"proc {rank} done {steps} steps", flush=True)

if __name__ == "__main__":
    mp.set_start_method(sys.argv[1], force=True)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)); model.share_memory()
    procs = [mp.Process(target=train, args=(r, model, int(sys.argv[2]), float(sys.argv[3]))) for r in range(2)]
    for p in procs: p.start()
    for p in procs: p.join()
    print("exit codes", [p.exitcode for p in procs], flush=True)
    if len(sys.argv) > 4:                    # then a test in the main process, as pytorch/examples' Hogwild! does
        from torch.utils.data import DataLoader, TensorDataset
        with torch.no_grad():
            for x, in DataLoader(TensorDataset(torch.randn(int(sys.argv[4]) * 64, 256)), batch_size=64):
                model(x)
                time.sleep(float(sys.argv[5]) if len(sys.argv) > 5 else 0)
"""


def _script(tmp_path):
    script = tmp_path / "hogwild.py"
    script.write_text(HOGWILD)
    return script, tmp_path / "run"


def test_forked_trainers_are_left_alone_and_named(tmp_path):
    script, out = _script(tmp_path)
    # --max-steps and --duration: the launched process has no step to stop at, its children are not
    # stopped (a StopRun raised in them had crashed both, exit codes [1, 1], with "exit code 0" said)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--max-steps", "5", "--duration", "1",
                        "--out", str(out), str(script), "fork", "150", "0.01"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "exit codes [0, 0]" in r.stdout and r.stdout.count("done 150 steps") == 2, r.stdout
    assert "StopRun" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (out / "steps.jsonl").read_text() == ""           # no child's steps under the parent's numbers
    kids = [json.loads(p.read_text()) for p in sorted((out / "forked").glob("*.json"))]
    assert [k["steps"] for k in kids] == [150, 150], kids        # counted to the end: the exit writes it
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["stopped_by"] is None and doc["run"]["outcome"] == "completed"
    notes = " ".join(doc["run"]["notes"])
    assert "the script trained in 2 forked child process(es)" in notes
    assert "reached no step boundary in the launched process" in notes
    assert doc["verdict"]["bound"] == "inconclusive" and "ran in its child processes" in doc["verdict"]["summary"]
    assert "the script trained in 2 forked" in r.stderr                          # the first note shown


def test_spawned_trainers_are_named_with_their_function_and_how_to_diagnose_them(tmp_path):
    """Processes started with spawn run without the hooks: the launched process counted their
    starts (collect/procstarts.py), so the note names the function they ran, how and how many, and
    says how to diagnose them; tune, which measures the launched process's steps, is not offered."""
    script, out = _script(tmp_path)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), str(script), "spawn", "400", "0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "exit codes [0, 0]" in r.stdout
    child = json.loads((out / "child.json").read_text())
    assert child["process_starts"] == [{"method": "spawn", "target": "train", "via": None, "count": 2}]
    doc = json.loads((out / "report.json").read_text())
    note = next(n for n in doc["run"]["notes"] if n.startswith(("the script trained in", "the script may train in")))
    assert "2 process(es) running train(), started with multiprocessing (spawn start method)" in note, note
    assert "--nproc-per-node" in note and "call train() directly in the main process" in note
    assert not (out / "forked").exists()
    # "trained" where the children's CPU showed work, "may train" (and "if they trained") otherwise
    trained = note.startswith("the script trained in")
    assert trained == ("python child process(es) used" in note)
    summary = doc["verdict"]["summary"]
    assert ("the training ran in its child processes" in summary) if trained else ("if they trained" in summary)
    assert "perfdoctor tune" not in r.stderr


def test_process_starts_are_counted_by_method_and_function_without_fixing_the_start_method():
    """torch.multiprocessing.spawn's processes are named by the function it wraps, DataLoader
    workers are left out, and counting a default-context start never sets the default start
    method (a script's later set_start_method would then fail)."""
    code = textwrap.dedent("""
        import json, multiprocessing as mp
        from perfdoctor.collect.procstarts import ProcStarts, WORKER_LOOP
        def named(module, name):
            def f(*a): pass
            f.__module__, f.__qualname__ = module, name
            return f
        def main_worker(rank): pass
        starts = ProcStarts()
        class P:                       # what Process.start sees: its target, args and start method
            def __init__(self, target, args=(), method=None):
                self._target, self._args, self._start_method = target, args, method
        starts.saw(P(named("torch.multiprocessing.spawn", "_wrap"), (main_worker, 0, (), None), "spawn"))
        starts.saw(P(named("torch.multiprocessing.spawn", "_wrap"), (main_worker, 1, (), None), "spawn"))
        starts.saw(P(named(*WORKER_LOOP.rsplit(".", 1)), (), "fork"))
        starts.saw(P(named("mylib.jobs", "Runner.run"), ()))       # the default context's Process
        import functools
        starts.saw(P(functools.partial(functools.partial(main_worker, 1)), (), "forkserver"))
        unset = mp.get_start_method(allow_none=True)
        mp.set_start_method("forkserver")                            # still free to choose
        starts.saw(P(named("mylib.jobs", "Runner.run"), ()))
        print(json.dumps([starts.info(), unset]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    info, unset = json.loads(r.stdout)
    assert unset is None
    default = "fork" if sys.version_info < (3, 14) else "forkserver"
    assert info == [{"method": "spawn", "target": "main_worker", "via": "torch.multiprocessing.spawn", "count": 2},
                    {"method": default, "target": "mylib.jobs.Runner.run", "via": None, "count": 1},
                    {"method": "forkserver", "target": "main_worker", "via": None, "count": 1},
                    {"method": "forkserver", "target": "mylib.jobs.Runner.run", "via": None, "count": 1}]


def test_a_test_loop_after_spawned_trainers_is_said_to_be_no_training(tmp_path):
    """pytorch/examples' Hogwild!: the trainers run in spawned processes, then the main process
    tests the model. Its steps are that test (DataLoader batches, no backward pass): the note and
    the verdict say so, and no tune is offered (it would measure the test). The test lasts 3 s, so
    the sampled means are over its steps' window, where no child runs any more: the children's CPU
    is read over the whole run (a busy CI's slower test had filled that window, and no note came)."""
    script, out = _script(tmp_path)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), str(script), "spawn", "300", "0",
                        "60", "0.05"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["steps"] > 8 and json.loads((out / "child.json").read_text())["mode"] == "dataloader"
    assert doc["run"]["sampling"]["window"] == "steps" and doc["run"]["sampling"]["whole_run"]["loader.workers"] == 2
    # the children's CPU (~0.96 core each, sampled) says they trained
    note = next(n for n in doc["run"]["notes"] if n.startswith("the script trained in"))
    assert "running train(), started with multiprocessing (spawn start method): the " in note, note
    assert "timed here are the launched process's own, a loop with no backward pass" in note, note
    assert doc["run"]["training_elsewhere"] is True
    assert doc["verdict"]["summary"].startswith("These steps are the launched process's own loop with no backward pass")
    assert "perfdoctor tune" not in r.stderr and "These steps are the launched process's own" in r.stderr


def test_trainers_queueing_for_the_cores_are_told_to_share_them():
    """The children's threads oversubscribe the cores (PD213's threshold): no step of theirs is
    timed, so the note says what to do (Hogwild! with 2 threads a process on 2 cores measured 2x
    faster with 1); it says nothing where they fit, or where the children did no work."""
    from perfdoctor.diagnose.childtrainers import elsewhere
    starts = [{"method": "spawn", "target": "train", "via": None, "count": 2}]
    steps = [{"step": i, "mode": "dataloader"} for i in range(1, 17)]
    over = {"loader.workers": 2, "loader.worker_cpu_mean": 0.98, "loader.threads_oversubscription": 1.77,
            "loader.worker_runq_wait_mean": 0.78}
    note = elsewhere([], steps, over, starts)
    assert "Their threads wanted 1.77 cores per usable core, and each child queued for a core 0.78 s a second" in note
    assert "torch.set_num_threads(cores // processes)" in note
    fits = elsewhere([], steps, {**over, "loader.threads_oversubscription": 0.9}, starts)
    assert fits.startswith("the script trained in 2 process(es)") and "Their threads" not in fits
    idle = elsewhere([], steps, {**over, "loader.worker_cpu_mean": 0.1}, starts)
    assert idle is None                 # steps of its own, children idle: nothing says they trained
    trains = [{"step": i, "mode": "optimizer"} for i in range(1, 17)]
    own = elsewhere([], trains, over, starts)
    assert "the 16 step(s) timed here are the launched process's own while" not in own
    assert "the 16 step(s) timed here are the launched process's own, while 2 python child" in own
    assert "no backward pass" not in own


def test_no_note_offers_tune_where_the_steps_are_no_training():
    """On a machine busy with other work the confidence note names PD348 and says tune measures
    it; where the launched process's steps are a test after its trainers ran, tune would time that
    test, so the note keeps PD348 and drops the offer (CI on a loaded 2-core machine showed it)."""
    from perfdoctor.diagnose.childtrainers import LEAD, own_loop_only
    from perfdoctor.diagnose.confidence import confidence
    m = {"system.other_cores": 1.5, "run.runq_share": 0.6, "machine.torch_threads": 2}
    _, notes, _ = confidence("host", m)
    told = next(n for n in notes if "PD348" in n)
    assert "`perfdoctor tune` measures it" in told
    doc = {"run": {}, "verdict": {"summary": "s", "notes": list(notes)}, "traces": [
        {"verdict": {"summary": "t", "notes": list(notes)}}]}
    own_loop_only(doc, [{"mode": "dataloader"}], LEAD[0] + " 2 spawned child process(es)")
    for v in (doc["verdict"], doc["traces"][0]["verdict"]):
        assert not any("perfdoctor tune" in n for n in v["notes"]) and any("(PD348)" in n for n in v["notes"]), v
    kept = {"run": {}, "verdict": {"summary": "s", "notes": list(notes)}, "traces": []}
    own_loop_only(kept, [{"mode": "optimizer"}], LEAD[0] + " 2 spawned child process(es)")
    assert kept["verdict"]["notes"] == notes and kept["run"]["training_elsewhere"] is False
