"""Python stacks: finding py-spy, recording a real process with it, and attributing the steady
steps' time to frames and causes (analyze/stacks.py), checked against the script's own clock."""

from __future__ import annotations

import json
import linecache
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from quiet import Foreign, skip_if_shared
from stackcases import ten_steps

from perfdoctor.analyze import registry
from perfdoctor.analyze.stackcause import classify
from perfdoctor.analyze.stacks import attribute, section, segments, steady_steps
from perfdoctor.collect import stacks as collect_stacks
from perfdoctor.collect.stacks import StackRecorder, find_py_spy
from perfdoctor.diagnose.stackfiles import load_recording

PY_SPY = find_py_spy()
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy not installed")


# --- finding py-spy -------------------------------------------------------------------------

@needs_py_spy
def test_py_spy_found_beside_the_interpreter_without_path(monkeypatch):
    monkeypatch.setenv("PATH", "")
    found = find_py_spy()
    assert found is not None and Path(found).parent == Path(sys.executable).parent


@needs_py_spy
def test_py_spy_found_from_its_package_files(monkeypatch, tmp_path):
    """An interpreter whose directory holds no py-spy and an empty PATH: the installed py-spy
    distribution's file list still leads to the binary."""
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(collect_stacks.sysconfig, "get_scheme_names", lambda: ())
    found = find_py_spy()
    assert found is not None and Path(found).samefile(PY_SPY)


def test_missing_py_spy_is_said_once(monkeypatch, tmp_path):
    monkeypatch.setattr(collect_stacks, "find_py_spy", lambda: None)
    rec = StackRecorder(os.getpid(), tmp_path / "s", tmp_path / "steps.jsonl").start()
    rec.stop()
    assert len(rec.notes) == 1 and "py-spy not found" in rec.notes[0] and sys.executable in rec.notes[0]
    assert not (tmp_path / "s").exists()


# --- auto mode: stacks only where a core is idle ---------------------------------------------

def test_idle_cores_are_measured_in_cores():
    """Idle CPU time over wall time, in cores: every core spinning leaves less than half a core idle."""
    cores = os.cpu_count() or 1
    idle, n = collect_stacks.measure_idle_cores(0.3)
    assert n == cores and 0.0 <= idle <= cores
    spin = [subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 4\nwhile time.time() < t: pass"])
            for _ in range(cores)]
    try:
        time.sleep(0.5)
        busy, _ = collect_stacks.measure_idle_cores(1.0)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert busy < collect_stacks.MIN_IDLE_CORES, (busy, cores)


@needs_py_spy
def test_auto_mode_without_an_idle_core_records_nothing_and_says_why(tmp_path):
    probe = []
    rec, _ = _record(tmp_path, steps=8, auto=True, idle_cores=lambda s: probe.append(s) or (0.4, 2))   # 0.4 < MIN_IDLE_CORES
    meta = json.loads((tmp_path / "stacks" / collect_stacks.META).read_text())
    assert probe == [collect_stacks.IDLE_PROBE_S] and rec.procs == {}
    assert meta["mode"] == "auto" and meta["skipped"] == "no_idle_core" and meta["idle_cores"] == 0.4
    assert load_recording(tmp_path / "stacks") is None
    assert rec.notes == [] and meta["idle_cores_needed"] == collect_stacks.MIN_IDLE_CORES   # the diagnosis says it
    note = collect_stacks.skipped_note(meta["idle_cores"], 2, meta["idle_cores_needed"])
    assert "0.4 of 2 cores idle, 0.5 needed" in note and "--stacks" in note


def test_auto_mode_says_nothing_when_the_script_ends_during_the_probe(tmp_path):
    steps = tmp_path / "steps.jsonl"
    child = subprocess.Popen([sys.executable, "-c", f"open({str(steps)!r}, 'w').write('{{}}\\n')"])
    rec = StackRecorder(child.pid, tmp_path / "s", steps, auto=True,
                        idle_cores=lambda s: (child.wait(), (2.0, 2))[1]).start()
    rec._thread.join(timeout=30)
    rec.stop()
    assert rec.procs == {} and rec.notes == [] and load_recording(tmp_path / "s") is None


def test_auto_mode_needs_half_a_core_per_local_rank(tmp_path, monkeypatch):
    """Four ranks on one machine each decide alone on the same idle cores: each needs its share."""
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "8"), ("LOCAL_WORLD_SIZE", "4")):   # as torchrun sets them
        monkeypatch.setenv(name, value)
    rec = StackRecorder(os.getpid(), tmp_path / "s", tmp_path / "steps.jsonl", auto=True,
                        idle_cores=lambda s: (1.5, 16))
    assert rec.need == 4 * collect_stacks.MIN_IDLE_CORES and rec.max_children == collect_stacks.AUTO_MAX_CHILDREN
    (tmp_path / "s").mkdir()
    assert rec._core_to_spare() is False and rec.meta["skipped"] == "no_idle_core" and rec.meta["idle_cores"] == 1.5
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    rec = StackRecorder(os.getpid(), tmp_path / "s", tmp_path / "steps.jsonl", auto=True,
                        idle_cores=lambda s: (1.5, 16))
    assert rec._core_to_spare() is True and rec.notes == []


@needs_py_spy
def test_auto_mode_with_an_idle_core_records_the_trainer(tmp_path):
    rec, _ = _record(tmp_path, steps=12, auto=True, idle_cores=lambda s: (1.6, 2))
    got = load_recording(tmp_path / "stacks")
    if got is None:
        assert any("ptrace" in n for n in rec.notes), rec.notes
        pytest.skip("py-spy could not attach here: " + "; ".join(rec.notes))
    procs, meta = got
    assert meta["mode"] == "auto" and meta["idle_cores"] == 1.6 and "skipped" not in meta
    assert [p["role"] for p in procs] == ["trainer"] and procs[0]["events"]


# --- recording a real process ----------------------------------------------------------------

# Each step: a checkpoint (torch.save of ~48 MB: several sample periods long), Python data preparation, logging through the
# logging module, then a short sleep. The script times each part itself and writes steps.jsonl.
SCRIPT = """
import json, logging, os, random, sys, tempfile, time
import torch
out = sys.argv[1]
log = logging.getLogger("train")
log.addHandler(logging.FileHandler(os.path.join(out, "train.log")))
log.setLevel(logging.INFO)
state = {"w": torch.randn(12_000_000)}
path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")

def prepare():
    t = time.perf_counter()
    xs = []
    while time.perf_counter() - t < 0.06:
        xs.append(sum(random.random() for _ in range(200)))
    return xs

def log_it(xs):
    for _ in range(300):
        log.info("batch %s", xs[:50])

parts = {"ckpt": 0.0, "data": 0.0, "log": 0.0, "sleep": 0.0, "total": 0.0}
with open(os.path.join(out, "steps.jsonl"), "w") as f:
    for step in range(int(sys.argv[2])):
        t0 = time.perf_counter()
        t = time.perf_counter(); torch.save(state, path); dt_c = time.perf_counter() - t  # SAVE
        t = time.perf_counter(); xs = prepare(); dt_d = time.perf_counter() - t
        t = time.perf_counter(); log_it(xs); dt_l = time.perf_counter() - t
        t = time.perf_counter(); time.sleep(0.02); dt_s = time.perf_counter() - t
        dur = time.perf_counter() - t0
        if step >= 3:
            parts["ckpt"] += dt_c; parts["data"] += dt_d; parts["log"] += dt_l; parts["sleep"] += dt_s
            parts["total"] += dur
        f.write(json.dumps({"step": step + 1, "end": time.time(), "dur": dur, "wait": 0.0,
                            "mode": "optimizer"}) + "\\n")
        f.flush()
os.remove(path)
json.dump(parts, open(os.path.join(out, "truth.json"), "w"))
"""


def _record(tmp_path: Path, steps: int = 30, **recorder):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(steps)])
    rec = StackRecorder(child.pid, tmp_path / "stacks", tmp_path / "steps.jsonl", **recorder).start()
    child.wait(timeout=120)
    rec.stop()
    assert child.returncode == 0
    return rec, script


@needs_py_spy
@pytest.mark.quiet      # py-spy must be scheduled to see each save: a whole-suite run beside it saw 1 save in 1.4 steps
def test_recorded_shares_match_the_scripts_own_clock(tmp_path):
    rec, script = _record(tmp_path)
    got = load_recording(tmp_path / "stacks")
    if got is None:
        # attaching needs ptrace: then one note explains it, and nothing else is claimed
        assert any("ptrace" in n for n in rec.notes), rec.notes
        pytest.skip("py-spy could not attach here: " + "; ".join(rec.notes))
    procs, meta = got
    assert [p["role"] for p in procs] == ["trainer"] and meta["rate_hz"] == collect_stacks.RATE_HZ
    assert rec.notes == [] and meta["pyspy_cpu_s"] >= 0
    steps = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    truth = json.loads((tmp_path / "truth.json").read_text())
    rep = attribute(procs, meta, steps)
    registry.check(rep.metrics)
    m = rep.metrics
    assert m["stacks.steady_steps"] >= 20 and m["stacks.coverage"] > 0.9
    # the script's own timings of each part, as shares of its steady steps (steps 4..30; the
    # analysis drops max(2, 10%) warm-up steps: a step of sampling noise either way). The user's
    # own code is everything but the save, the logging and the sleep (prepare() and bookkeeping).
    truth["own"] = truth["total"] - truth["ckpt"] - truth["log"] - truth["sleep"]
    # Tolerances: a long call (torch.save) within 0.08 of the step (seen: 0.02-0.04 low on a
    # loaded machine, 0.068 low while the whole suite ran beside it); many short logging calls lose
    # time to the user's own line through py-spy's torn non-blocking reads (collect/stacks.py):
    # together those two are within 0.08, each within 0.15 (0.105 of drift seen in one CI run).
    share = {part: truth[part] / truth["total"] for part in ("ckpt", "own", "log")}
    # Samples py-spy failed to read leave their period to a neighbouring stack: any share may be
    # off by that much more (reported as stacks.unread_share, with a note from 10%).
    unread = m["stacks.unread_share"]
    assert unread is not None and 0 <= unread < 0.5, meta["processes"]
    tol = {"ckpt": 0.08 + unread, "own": 0.15 + unread, "log": 0.15 + unread}
    print(f"stacks {m}; truth {share}; unread {unread:.3f}")
    assert abs(m["stacks.checkpoint_share"] - share["ckpt"]) < tol["ckpt"], (m["stacks.checkpoint_share"], share, unread)
    both = m["stacks.python_data_share"] + m["stacks.logging_sync_share"]
    assert abs(both - share["own"] - share["log"]) < tol["ckpt"], (both, share, unread)
    for metric, part in (("stacks.python_data_share", "own"), ("stacks.logging_sync_share", "log")):
        assert abs(m[metric] - share[part]) < tol[part], (metric, m[metric], share[part], unread)
    assert (unread >= 0.10) == any("could not read" in n for n in rep.notes), rep.notes
    # py-spy misses whole saves when it is not scheduled (seen with the suite running beside it:
    # 16 of 27 saves seen); the interval is the median gap between saves, which one miss leaves alone,
    # and which a run of misses (the VM's own neighbours, held quiet here: 1.23 once) moves towards
    # 2: still nearer a save every step than one every other step
    assert m["stacks.checkpoint_interval_steps"] == pytest.approx(1.0, abs=0.45)
    # a frame can appear at two lines: py-spy reads the running process without stopping it, and
    # a few samples taken as torch.save returns land on the next line. The larger entry comes first.
    top: dict = {}
    for t in rep.top:
        top.setdefault(t["frame"], t)
    line = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if t.endswith("# SAVE"))
    assert top["torch.save"]["at"] == f"{script.name}:{line}" and top["torch.save"]["cause"] == "checkpoint"
    # the sleep in the loop is waiting, not data preparation
    assert any(t["cause"] == "waiting" and "time.sleep" in script.read_text().splitlines()[int(t["at"].split(":")[1]) - 1]
               for t in rep.top)
    assert top["torch.save"]["role"] == "trainer"
    doc = section(rep, meta)
    assert json.loads(json.dumps(doc))["top"][0]["share"] == round(rep.top[0]["share"], 4)


def test_refused_ptrace_leaves_one_note(tmp_path):
    if PY_SPY is None:
        pytest.skip("py-spy not installed")
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root + setpriv to produce a genuine ptrace refusal")
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"])
    steps = tmp_path / "steps.jsonl"
    steps.write_text('{"step": 1}\n')
    try:
        # root may ptrace anything: py-spy as 'nobody' gets the real EPERM refusal
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PY_SPY]
        rec = StackRecorder(target.pid, tmp_path / "s", steps, py_spy=cmd).start()
        deadline = time.monotonic() + 10
        while (rec.proc is None or rec.proc.poll() is None) and time.monotonic() < deadline:
            time.sleep(0.05)
        rec.stop()
        assert len(rec.notes) == 1 and "could not attach" in rec.notes[0] and "ptrace" in rec.notes[0]
        assert load_recording(tmp_path / "s") is None
    finally:
        target.kill()
        target.wait()


# --- the attribution on hand-built events (exact values) -------------------------------------

SITE = "/venv/lib/python3.11/site-packages/"


def _ev(ph, ts, name, file, line, pid=1, tid=7):
    return {"ph": ph, "ts": ts, "name": name, "pid": pid, "tid": tid, "args": {"filename": file, "line": line}}


def test_segments_rebuild_stacks_and_steady_windows_clip_them():
    # 10 steps of 100 ms from t=0: 60 ms in torch.save, then 40 ms forward
    t0 = 1000.0
    ev, steps = _save_steps(t0)
    main = ("main", "/home/u/train.py", 27)
    save = ("save", SITE + "torch/serialization.py", 1002)
    segs = segments(ev)
    assert len(segs[(1, 7)]) == 20 and segs[(1, 7)][0] == (0, 60_000, (main, save))
    assert [s["step"] for s in steady_steps(steps)] == [3, 4, 7, 8, 9, 10]
    rep = attribute([{"pid": 1, "role": "trainer", "t0_unix": t0, "events": ev}], {"pid": 1, "rate_hz": 100}, steps,
                    source=lambda f, n: "")
    assert rep.steady_steps == 6 and rep.sampled_s == pytest.approx(0.6)
    assert rep.metrics["stacks.checkpoint_share"] == pytest.approx(0.6)
    assert rep.metrics["stacks.checkpoint_interval_steps"] == pytest.approx(1.0)
    assert rep.metrics["stacks.python_data_share"] == 0.0
    assert [(t["frame"], t["at"], round(t["share"], 3)) for t in rep.top] == [
        ("torch.save", "train.py:27", 0.6), ("nn.Module.__call__", "train.py:27", 0.4)]


def test_anomaly_mode_storing_each_forward_ops_stack_is_its_own_share():
    """Anomaly mode's stored stacks: traceback.format_stack (and extract_stack below it) called from
    inside a forward op, 25 ms of each 100 ms step; a format_stack of the user's own elsewhere
    counts too (it is the same cost), a traceback module's other functions do not."""
    main = ("main", "/home/u/train.py", 9)
    fwd = ("Linear.forward", SITE + "torch/nn/modules/linear.py", 125)
    fmt = ("format_stack", "/usr/lib/python3.11/traceback.py", 213)
    ext = ("extract_stack", "/usr/lib/python3.11/traceback.py", 232)
    other = ("print_exc", "/usr/lib/python3.11/traceback.py", 183)
    ev = [_ev("B", 0, *main)]
    for k in range(10):
        t = k * 100_000
        ev += [_ev("B", t, *fwd), _ev("B", t + 10_000, *fmt), _ev("B", t + 15_000, *ext), _ev("E", t + 35_000, *ext),
               _ev("E", t + 35_000, *fmt), _ev("B", t + 35_000, *other), _ev("E", t + 45_000, *other),
               _ev("E", t + 100_000, *fwd)]
    ev.append(_ev("E", 1_000_000, *main))
    rep = ten_steps(ev)
    assert rep.metrics["stacks.anomaly_stack_share"] == pytest.approx(0.25)


def test_a_line_whose_stacks_differ_in_cause_names_the_main_one_and_its_part():
    """trainer.train() on one line: 30 ms of forward, then 70 ms of backward a step, all below the
    same library call. The row is that call at that line, 'mostly backward (70%)', whichever
    cause its first sample had (the row once took the first one's: 'model')."""
    from perfdoctor.report.labels import cause_text

    main = ("main", "/home/u/train_hf.py", 23)
    train = ("Trainer.train", SITE + "transformers/trainer.py", 2000)
    fwd = ("Module._call_impl", SITE + "torch/nn/modules/module.py", 1789)
    bwd = ("_engine_run_backward", SITE + "torch/autograd/graph.py", 825)
    ev = [_ev("B", 0, *main), _ev("B", 0, *train)]
    for k in range(10):
        t = k * 100_000
        ev += [_ev("B", t, *fwd), _ev("E", t + 30_000, *fwd), _ev("B", t + 30_000, *bwd), _ev("E", t + 100_000, *bwd)]
    ev += [_ev("E", 1_000_000, *train), _ev("E", 1_000_000, *main)]
    t0 = 1000.0
    steps = [{"step": k + 1, "end": t0 + (k + 1) * 0.1, "dur": 0.1, "wait": 0.0, "mode": "optimizer",
              "profiled": False} for k in range(10)]
    lines = {("/home/u/train_hf.py", 23): "    trainer.train()  # the line, as the file reads"}
    rep = attribute([{"pid": 1, "role": "trainer", "t0_unix": t0, "events": ev}], {"pid": 1, "rate_hz": 100}, steps,
                    source=lambda f, n: lines.get((f, n), ""))
    (row,) = rep.top
    assert (row["at"], row["cause"], row["cause_share"]) == ("train_hf.py:23", "backward", pytest.approx(0.7))
    assert row["code"] == "trainer.train()  # the line, as the file reads"       # shown beside it, stripped
    assert type(row["cause_share"]) is float and type(row["share"]) is float    # JSON-encodable (msgspec)
    import msgspec
    msgspec.json.encode(section(rep, {"rate_hz": 100}))
    assert row["share"] == pytest.approx(1.0)
    assert cause_text(row) == "mostly backward (70%)"
    assert cause_text({"cause": "data_loader", "cause_share": 0.95}) == "data loader"
    assert cause_text({"cause": "checkpoint"}) == "checkpoint"              # an older report


def test_a_save_every_step_is_told_from_one_long_save_by_the_step_ends():
    """As py-spy saw a CNN on an H200 save 66 ms of each 76 ms step: at 50 Hz the sampler can see
    nothing but torch.save from one save to the next (the stack's segments run on past a step
    end). The training thread records the step ends itself, so no save spans one: a save every
    step, not one save every ten."""
    main = ("main", "/home/u/train.py", 27)
    save = ("save", SITE + "torch/serialization.py", 1002)
    close = ("_open_zipfile_writer_file.__exit__", SITE + "torch/serialization.py", 700)
    t0 = 1000.0
    steps = [{"step": k + 1, "end": t0 + (k + 1) * 0.1, "dur": 0.1, "wait": 0.0, "mode": "optimizer",
              "profiled": False} for k in range(20)]

    def interval(saves_at, rate=50, shift_us=0, length_us=80_000):
        ev = [_ev("B", 0, *main)]
        for k in saves_at:           # each save: 40 ms writing, then closing the file
            a = k * 100_000 + 1_000 - shift_us
            ev += [_ev("B", a, *save), _ev("B", a + 40_000, *close), _ev("E", a + length_us, *close),
                   _ev("E", a + length_us, *save)]
        ev.append(_ev("E", 2_000_000, *main))
        rep = attribute([{"pid": 1, "role": "trainer", "t0_unix": t0, "events": ev}], {"pid": 1, "rate_hz": rate},
                        steps, source=lambda f, n: "")
        return rep.metrics

    m = interval(range(20), length_us=100_000)     # back to back: no other frame between the saves
    assert m["stacks.checkpoint_share"] == pytest.approx(1.0)
    assert m["stacks.checkpoint_interval_steps"] == pytest.approx(1.0, rel=0.05)
    # every 5th step; py-spy's clock starting 5 ms after perfdoctor's puts a save's first sample
    # before the step end it follows: still one save every 5 steps, at 50 and at 100 Hz
    ev_every5 = [k for k in range(20) if k % 5 == 0]
    assert interval(ev_every5, shift_us=5_000)["stacks.checkpoint_interval_steps"] == pytest.approx(5.0, rel=0.05)
    assert interval(ev_every5, rate=100, shift_us=5_000)["stacks.checkpoint_interval_steps"] == pytest.approx(
        5.0, rel=0.05)
    # the sampler lagging under IO: a save's last frame persists over three step ends: one save
    assert interval([5, 10, 15], length_us=350_000)["stacks.checkpoint_interval_steps"] == pytest.approx(
        5.0, rel=0.1)


PRODUCER_SCRIPT = """
import json, os, random, sys, time
from concurrent.futures import ThreadPoolExecutor

# Times drawn, not fixed: a step of exactly 30 ms would sample in step with py-spy's 10 ms period
# (3 samples a step, at the same phases) and read the parts by where those phases fall.
random.seed(0)

def load(i):                 # one producer thread: 25-45 ms of I/O-like waiting a batch
    time.sleep(random.uniform(0.025, 0.045))
    return list(range(1000))

out, steps = sys.argv[1], int(sys.argv[2])
parts = {"wait": 0.0, "total": 0.0}
with open(os.path.join(out, "steps.jsonl"), "w") as f, ThreadPoolExecutor(max_workers=1) as pool:
    it = iter(pool.map(load, range(steps)))
    for step in range(steps):
        t0 = time.perf_counter()
        xs = next(it)                                        # WAIT
        t = time.perf_counter(); dt_w = t - t0
        work = random.uniform(0.006, 0.016)                  # the step's own work: 6-16 ms
        while time.perf_counter() - t < work:
            sum(xs)
        dur = time.perf_counter() - t0
        if step >= 3:
            parts["wait"] += dt_w; parts["total"] += dur
        f.write(json.dumps({"step": step + 1, "end": time.time(), "dur": dur, "wait": 0.0,
                            "mode": "optimizer"}) + "\\n")
        f.flush()
json.dump(parts, open(os.path.join(out, "truth.json"), "w"))
"""


@needs_py_spy
def test_a_loop_waiting_on_its_thread_pool_is_measured_as_producer_wait(tmp_path):
    """A loop fed by a ThreadPoolExecutor's map (one producer, slower than the step) waits in
    the pool's results: stacks.producer_wait_share is the wait the script clocks itself (its step
    records, as perfdoctor's hooks would write them, hold no data wait: no DataLoader)."""
    script = tmp_path / "pool.py"
    script.write_text(textwrap.dedent(PRODUCER_SCRIPT))
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path), "120"])
    rec = StackRecorder(child.pid, tmp_path / "stacks", tmp_path / "steps.jsonl").start()
    child.wait(timeout=120)
    rec.stop()
    assert child.returncode == 0
    got = load_recording(tmp_path / "stacks")
    if got is None:
        assert any("ptrace" in n for n in rec.notes), rec.notes
        pytest.skip("py-spy could not attach here: " + "; ".join(rec.notes))
    procs, meta = got
    steps = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    truth = json.loads((tmp_path / "truth.json").read_text())
    rep = attribute(procs, meta, steps)
    registry.check(rep.metrics)
    m = rep.metrics
    want = truth["wait"] / truth["total"]
    print(f"producer wait: stacks {m['stacks.producer_wait_share']:.3f}, the script's clock {want:.3f}, "
          f"unread {m['stacks.unread_share']}")
    assert want > 0.4                      # the producer is the slower side (35 ms a batch vs an 11 ms step)
    # within 0.15 (and the samples py-spy failed to read), test_recorded_shares_match_the_scripts_own_clock's
    # tolerance for the user's own code: two runs here read 0.74 and 0.60 against 0.68
    assert abs(m["stacks.producer_wait_share"] - want) < 0.15 + (m["stacks.unread_share"] or 0)
    line = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if t.endswith("# WAIT"))
    top = next(t for t in rep.top if t["at"] == f"{script.name}:{line}")
    assert top["cause"] == "producer_wait" and top["frame"].startswith("concurrent.futures._base.")


def _run_with_stacks(tmp_path, script, steps, *args, options=()):
    """(the process, report.json) of `perfdoctor run --stacks --max-steps STEPS OPTIONS SCRIPT ARGS`;
    skips, with the note, where py-spy could not attach (ptrace refused)."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--stacks", "--out", str(out), "--max-steps",
                        str(steps), *map(str, options), str(script), *map(str, args)], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "report.json").read_text())
    if doc["stacks"] is None:
        notes = " ".join(doc["run"]["notes"])
        assert "ptrace" in notes, notes
        pytest.skip("py-spy could not attach here: " + notes)
    return r, doc


TORCH_PRODUCER_SCRIPT = """
import random, time
from concurrent.futures import ThreadPoolExecutor
import torch

random.seed(0)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

torch.set_num_threads(1)     # the step's own work stays small on a busy machine too

def load(i):                 # one loader thread: 50-70 ms of remote-read-like waiting a batch
    time.sleep(random.uniform(0.05, 0.07))
    return torch.randn(32, 64), torch.randint(0, 4, (32,))

with ThreadPoolExecutor(max_workers=1) as pool:
    for x, y in pool.map(load, range(10_000)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


@needs_py_spy
def test_run_of_a_loop_fed_by_its_own_thread_pool_is_input_bound_with_the_producer_fix_first(tmp_path):
    """`perfdoctor run` of a torch loop fed by a ThreadPoolExecutor (no DataLoader): its step
    records count no data wait and the trace reads the wait as untraced host time; the stacks
    measure it, so the verdict is input-bound on the loop's own producers (PD370), firm, the
    producers' fix ranks first, and the run's line says where the wait went."""
    pytest.importorskip("torch")
    script = tmp_path / "pool_train.py"
    script.write_text(textwrap.dedent(TORCH_PRODUCER_SCRIPT))
    r, doc = _run_with_stacks(tmp_path, script, 90)
    m = doc["traces"][0]["metrics"]
    print(f"producer wait {m['stacks.producer_wait_share']:.3f}, data wait {m['run.data_wait_share']}, "
          f"verdict {doc['verdict']['rule']} {doc['verdict']['confidence']}")
    # the producer (60 ms a batch) paces a step whose own work is ~1-2 ms (a busy machine: ~0.5 of
    # the step once with 30 ms batches): most of it is the wait
    assert m["stacks.producer_wait_share"] > 0.6 and (m["run.data_wait_share"] or 0) < 0.05
    # firm, or only as unsure as a shared machine makes any verdict (0.5), not the 0.4 of time
    # nothing names
    assert doc["verdict"]["rule"] == "PD370" and doc["verdict"]["confidence"] >= 0.5
    assert not any("most of the step is untraced" in n for n in doc["verdict"]["notes"])
    assert doc["findings"][0]["id"] == "PD369"
    said = " ".join(r.stderr.split())
    assert f"waiting on its own producers {100 * m['stacks.producer_wait_share']:.1f}% (Python stacks)" in said


SLEEPING_SCRIPT = """
import json, random, sys, time
import torch

random.seed(0)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
slept = total = 0.0
last = time.perf_counter()
for step in range(10_000):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    t = time.perf_counter()
    time.sleep(random.uniform(0.015, 0.025))          # SLEEP: pacing the loop
    now = time.perf_counter()
    if step >= 10:                                    # the script's own clock of its wait
        slept += now - t
        total += now - last
        json.dump({"slept": slept, "total": total}, open(sys.argv[1], "w"))
    last = now
"""


@needs_py_spy
def test_a_loop_that_sleeps_on_its_own_line_is_told_to_take_the_wait_off_the_step(tmp_path):
    """A loop that sleeps ~20 ms of each step on its own line: the stacks name the wait (cause
    waiting, stacks.waiting_share), PD371 offers to take it off the step with the whole wait as
    its ceiling and no expected gain (whether it can go is the user's call), and the verdict is
    not capped as unexplained untraced time."""
    pytest.importorskip("torch")
    script = tmp_path / "paced.py"
    script.write_text(textwrap.dedent(SLEEPING_SCRIPT))
    truth = tmp_path / "truth.json"
    r, doc = _run_with_stacks(tmp_path, script, 100, truth)
    m = doc["traces"][0]["metrics"]
    wait, clock = m["stacks.waiting_share"], json.loads(truth.read_text())
    want = clock["slept"] / clock["total"]
    print(f"waiting {wait:.3f}, the script's clock {want:.3f}, producer {m['stacks.producer_wait_share']}, "
          f"verdict {doc['verdict']['rule']} {doc['verdict']['confidence']}")
    # within 0.15 and what py-spy failed to read, as for the producer wait (a busy machine slows the
    # step's own work, so the share itself moves: 0.18 with the other cores taken, ~0.8 quiet)
    assert abs(wait - want) < 0.15 + (m["stacks.unread_share"] or 0) and m["stacks.producer_wait_share"] < 0.05
    line = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if "# SLEEP" in t)
    row = next(t for t in doc["stacks"]["top"] if t["at"] == f"{script.name}:{line}")
    assert row["cause"] == "waiting"
    fix = next(f for f in doc["findings"] if f["id"] == "PD371")
    assert fix["gain"]["expected"] is None and fix["gain"]["share"] == pytest.approx(wait, abs=1e-4)
    if (doc["traces"][0]["metrics"]["breakdown.other"] or 0) - wait <= 0.5:     # the stacks name the rest
        assert not any("most of the step is untraced" in n for n in doc["verdict"]["notes"])


def test_waiting_for_the_loops_own_producers_is_producer_wait():
    """The user's line receiving what its own threads or processes make (a pool's map, a future,
    a queue) is producer_wait; a join or a sleep is waiting; a DataLoader worker idle in its
    queue is waiting (torch's worker loop is what the line called)."""
    user = ("main", "/home/u/train.py", 30)
    lib = lambda mod, fn: (fn, "/usr/lib/python3.11/" + mod.replace(".", "/") + ".py", 1)  # noqa: E731
    source = lambda f, n: ""  # noqa: E731
    cond = (lib("threading", "Condition.wait"), lib("threading", "Lock.acquire"))
    futures = "concurrent.futures._base"
    producer = {
        "for x in pool.map(load, ids)": (lib(futures, "Executor.map.<locals>.result_iterator"),
                                         lib(futures, "_result_or_cancel"), lib(futures, "Future.result")),
        "fut.result()": (lib(futures, "Future.result"),),
        "q.get()": (lib("queue", "Queue.get"),),
        "mp.Pool.imap": (lib("multiprocessing.pool", "IMapIterator.next"),),
        "mp.Queue.get": (lib("multiprocessing.queues", "Queue.get"), lib("multiprocessing.connection", "Connection.recv_bytes")),
    }
    for what, called in producer.items():
        assert classify((user, *called, *cond), source)[0] == "producer_wait", what
    assert classify((user, lib("threading", "Thread.join"), *cond), source)[0] == "waiting"
    assert classify((user, lib("time", "sleep")), source)[0] == "waiting"
    loader_iter = ("LoaderIters.__iter__", "/opt/x/perfdoctor/collect/loaderiters.py", 80)
    worker = (user, loader_iter, ("_worker_loop", SITE + "torch/utils/data/_utils/worker.py", 1),
              lib("multiprocessing.queues", "Queue.get"), lib("multiprocessing.connection", "_poll"))
    assert classify(worker, source)[0] == "waiting"


def test_classify_causes():
    user = ("main", "/home/u/train.py", 40)
    lib = lambda mod, fn: (fn, SITE + mod.replace(".", "/") + ".py", 1)  # noqa: E731
    src = {40: "    print(loss.item())", 41: "    x = torch.stack(batch)"}
    source = lambda f, n: src.get(n, "")  # noqa: E731
    assert classify((user,), source)[:2] == ("logging_sync", "train.py:40")
    assert classify((("main", "/home/u/train.py", 41),), source)[0] == "python_data"
    assert classify((user, lib("numpy.random", "shuffle")), source)[0] == "python_data"
    assert classify((user, lib("wandb.sdk.wandb_run", "log")), source)[:2] == ("logging_sync", "wandb.sdk.wandb_run.log")
    assert classify((user, lib("torch.utils.data.dataloader", "_BaseDataLoaderIter.__next__")),
                    source)[:2] == ("data_loader", "DataLoader.__next__")
    assert classify((user, lib("safetensors.torch", "save_file")), source)[0] == "checkpoint"
    assert classify((user, lib("torch._tensor", "Tensor.backward"), lib("torch.autograd.graph", "_engine_run_backward")),
                    source)[:2] == ("backward", "Tensor.backward")
    assert classify((user, lib("torch.optim.optimizer", "Optimizer.zero_grad")), source)[0] == "optimizer"
    hooks = ("Session._boundary", "/opt/x/perfdoctor/collect/hooks.py", 216)
    assert classify((user, lib("torch.optim.optimizer", "wrapper"), hooks), source)[0] == "perfdoctor"
    # a DataLoader worker forked through perfdoctor's iterator, idle for its next index: waiting
    loader_iter = ("LoaderIters.__iter__", "/opt/x/perfdoctor/collect/loaderiters.py", 80)
    idle = (user, loader_iter, lib("torch.utils.data._utils.worker", "_worker_loop"),
            lib("multiprocessing.queues", "Queue.get"), lib("multiprocessing.connection", "Connection.poll"),
            lib("multiprocessing.connection", "_poll"), lib("selectors", "_PollLikeSelector.select"))
    assert classify(idle, source)[0] == "waiting"
    busy = idle[:3] + (lib("torch.utils.data._utils.fetch", "_MapDatasetFetcher.fetch"),)   # its work, not ours
    assert classify(busy, source)[0] == "other"
    ours = (user, lib("torch.optim.optimizer", "wrapper"), hooks, ("dumps", "/usr/lib/python3.11/json/__init__.py", 231))
    assert classify(ours, source)[0] == "perfdoctor"          # our hook running, in the standard library
    assert classify((user, lib("torch.functional", "einsum")), source)[0] == "other"
    # an evaluation inside the loop: a forward pass under a no_grad-decorated method or a function
    # named for it (the user trial's Trainer.evaluate over sliced tensors: no DataLoader to count)
    fit = ("Trainer.fit", "/home/u/pkg/__main__.py", 41)
    nograd = lib("torch.utils._contextlib", "context_decorator.<locals>.decorate_context")
    ev = ("Trainer.evaluate", "/home/u/pkg/__main__.py", 35)
    call = lib("torch.nn.modules.module", "Module._call_impl")
    assert classify((fit, nograd, ev, call), source)[:3] == ("evaluation", "nn.Module.__call__", "pkg/__main__.py:35")
    assert classify((fit, ("Runner.test", "/home/u/run.py", 9), call), source)[0] == "evaluation"
    assert classify((fit, ("Runner.validate_epoch", "/home/u/run.py", 9), call), source)[0] == "evaluation"
    # the evaluation's own `.item()` line is its time, not a log line's
    assert classify((fit, ("evaluate", "/home/u/train.py", 40)), source)[0] == "evaluation"
    # a no_grad helper that runs no model (an EMA update) is not an evaluation, nor is a backward
    assert classify((fit, nograd, ("ema_update", "/home/u/run.py", 3), lib("torch._foreach", "add")), source)[0] \
        != "evaluation"
    assert classify((("test", "/home/u/run.py", 3), call, lib("torch.autograd.graph", "_engine_run_backward")),
                    source)[0] == "model"
    # a closure optimizer's step (LBFGS: no_grad-decorated) runs the closure's forward with grad
    # enabled again, through the same decorator: the model, not an evaluation
    lbfgs = (user, lib("torch.optim.optimizer", "Optimizer.profile_hook_step.<locals>.wrapper"), nograd,
             lib("torch.optim.lbfgs", "LBFGS.step"), nograd, ("closure", "/home/u/train.py", 77), call,
             ("Sequence.forward", "/home/u/train.py", 28), call, lib("torch.nn.modules.rnn", "LSTMCell.forward"))
    assert classify(lbfgs, source)[:3] == ("model", "nn.Module.__call__", "train.py:28")
    assert classify((fit, nograd, ev, call), source)[0] == "evaluation"     # still, outside an optimizer
    wrap = lib("torch.optim.lr_scheduler",
               "LRScheduler.__init__.<locals>.patch_track_step_called.<locals>.wrap_step.<locals>.wrapper")
    assert classify((user, wrap, lib("torch.optim.adam", "Adam.step")), source)[:2] == ("optimizer", "Optimizer.step")
    # the user's own forward (a leaf user line) inside a module call is the model, not data
    fwd = ("Net.forward", "/home/u/model.py", 12)
    assert classify((user, lib("torch.nn.modules.module", "Module._call_impl"), fwd), source)[:3] == (
        "model", "model.py:12", "model.py:12")
    # a step compiled whole: Inductor's output code is torch's, its forward the model's, and the
    # user's line is the compiled function's (not the generated file's)
    step = ("train_step", "/home/u/train.py", 8)
    gen = ("Runner.call", "/tmp/torchinductor_u/ed/cedukpzviuucakt4q6k4fsgqqnhyzqo5ptuka5vt55u537y5rif6.py", 255)
    aot = lib("torch._functorch._aot_autograd.runtime_wrappers",
              "_AOTDispatchAutogradFunctionFactory.build.<locals>.CompiledFunction.forward")
    forward = (user, step, lib("torch._dynamo.eval_frame", "DisableContext.__call__.<locals>._fn"),
               lib("torch.autograd.function", "Function.apply"), aot, lib("torch._inductor.output_code", "CompiledFxGraph.__call__"), gen)
    assert classify(forward, source)[::2] == ("model", "train.py:8")
    backward = (user, step, lib("torch._tensor", "Tensor.backward"), lib("torch.autograd.graph", "_engine_run_backward"),
                lib("torch._functorch._aot_autograd.runtime_wrappers", "CompiledFunction.backward"),
                (gen[0], "/cache/ab/c" + "x" * 51 + ".py", 300))
    assert classify(backward, source)[::2] == ("backward", "train.py:8")
    # a stdlib frame resolves to its module name
    assert classify((user, ("Logger.info", "/usr/lib/python3.11/logging/__init__.py", 1489)),
                    source)[:2] == ("logging_sync", "logging.Logger.info")


# --- acceptance: a checkpoint after every step ------------------------------------------------

EX = Path(__file__).resolve().parent.parent / "examples" / "checkpoint_every_step.py"


# 100 MB: the save is ~0.6 of an every-step step (~125 ms), the gain ~2.5x. With 200 MB (~0.8, ~5x)
# the test took 106 s, and the gain 1 / (1 - share) magnified the share's sampling error twice as much
CKPT_MB = "100"


# Bare runs of the example, alternating every-step and every-100 in one process: each run builds
# its own model and writes to its own temporary directory, as a run of the script does; one
# process for a side's pairs saves importing torch for each run (~4 s each on a 2-core VM)
PAIRS = r"""
import runpy, sys
path, n, mb = sys.argv[1], int(sys.argv[2]), sys.argv[3]
main = runpy.run_path(path, run_name="checkpoint_pairs")["main"]
for _ in range(n):
    for every, steps in ((1, 20), (100, 105)):
        sys.argv = [path, "--every", str(every), "--steps", str(steps), "--mb", mb]
        main()
"""


@pytest.fixture
def memory_tmpdir(tmp_path):
    """Where the checkpoint test's saves go: a directory in /dev/shm when it is a writable tmpfs
    with room, else tmp_path. On a disk, the 80-step run writes 8 GB, four times a 20-step bare
    run, and the disk's writeback decides how long a save waits: on CI the run's saves held 0.70
    of its step against 0.60 in the bare runs around it (expected 3.24x, measured 2.48x). In
    memory a save is pickling and copying alone, alike in both."""
    shm = Path("/dev/shm")
    try:
        room = shutil.disk_usage(shm).free > 2 * 10**9 and os.access(shm, os.W_OK)
    except OSError:
        room = False
    if not room:
        yield tmp_path
        return
    where = Path(tempfile.mkdtemp(prefix="perfdoctor-test-", dir=shm))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _steady_pairs(n: int, env: dict | None = None) -> tuple[list[float], list[float]]:
    """n interleaved pairs of bare runs: (every-step ms/step, every-100 ms/step), in run order."""
    r = subprocess.run([sys.executable, "-c", PAIRS, str(EX), str(n), CKPT_MB],
                       capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr
    ms = [float(line.split("steady ", 1)[1].split(" ms/step", 1)[0]) for line in r.stdout.splitlines()
          if line.startswith("steady ")]
    assert len(ms) == 2 * n, r.stdout
    return ms[0::2], ms[1::2]


@pytest.mark.quiet
@pytest.mark.slow
@needs_py_spy
def test_checkpoint_every_step_ranks_the_checkpoint_fix_first(tmp_path, memory_tmpdir):
    """`run --stacks` on a script that saves ~100 MB after every step ranks the checkpoint fix
    first, and its expected gain is within 25% of the gain measured by saving every 100 steps."""
    skip_if_shared()
    foreign = Foreign()
    tmp = memory_tmpdir
    env = {**os.environ, "TMPDIR": str(tmp)}
    before = set(tmp.glob("perfdoctor-ckpt-*"))
    # measured: bare runs, interleaved (every 100 over 100 steady steps: exactly one save), two
    # pairs before the run and two after it: the disk's speed drifts (every-step bare runs of one
    # session: 214-316 ms), and pairs on both sides of the run average that drift as the run sees it
    t1, t100 = _steady_pairs(2, env)
    # 80 steps: the gain 1 / (1 - share) magnifies the share's sampling error (~0.6 of the step
    # here: 0.03 of share is 7% of gain; at 200 MB, 0.8 and 15%); 30 steps at 50 Hz with 200 MB
    # gave expected/measured 0.80-1.26
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--stacks", "--out", str(out), str(EX),
                        "--every", "1", "--steps", "80", "--mb", CKPT_MB], capture_output=True, text=True, timeout=240,
                       env=env)
    assert r.returncode == 0, r.stderr
    after1, after100 = _steady_pairs(2, env)
    t1, t100 = t1 + after1, t100 + after100
    measured = statistics.mean(t1) / statistics.mean(t100)
    doc = json.loads((out / "report.json").read_text())
    if doc["stacks"] is None:
        pytest.skip("no stacks recorded here: " + " ".join(doc["run"]["notes"]))
    skip_if_shared(foreign)
    first = doc["findings"][0]
    expected = first["gain"]["expected"]
    print(f"bare every 1: {t1} ms/step, every 100: {t100} ms/step, measured {measured:.2f}x; "
          f"expected {expected:.2f}x (checkpoint {first['gain']['share']:.1%} of the step)")
    assert first["id"] == "PD350", [f["id"] for f in doc["findings"]]
    assert doc["stacks"]["top"][0]["frame"] == "torch.save"
    assert abs(expected / measured - 1) <= 0.25, (expected, measured)
    assert "torch.save at checkpoint_every_step.py:" in r.stderr
    assert set(tmp.glob("perfdoctor-ckpt-*")) == before      # the 100 MB files went away


@needs_py_spy
def test_run_records_stacks_by_default_only_with_an_idle_core(tmp_path):
    """`perfdoctor run` without --stacks/--no-stacks: py-spy runs when the first step finds half a
    core idle or more, and then names the checkpoint; otherwise the report says why there are none."""
    env = {k: v for k, v in os.environ.items() if k != "PERFDOCTOR_STACKS"}
    out = tmp_path / "run"
    # 50 MB a save (the example's 200 MB wrote 6 GB in this test), and an MLP of 512, not 1024: at
    # 1024 torch.save held 0.48-0.59 of the sampled step and backward 0.28-0.31, and a slow stretch
    # of the VM put backward first (twice in a row locally); at 512, save 0.78 and backward 0.05,
    # over 60 steps (30 of the shorter steps left py-spy too few samples to name frames)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), str(EX),
                        "--every", "1", "--steps", "60", "--mb", "50", "--hidden", "512"], capture_output=True,
                       text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "stacks" / collect_stacks.META).read_text())
    doc = json.loads((out / "report.json").read_text())
    notes = " ".join(doc["run"]["notes"])
    print(f"idle cores at the first step: {meta['idle_cores']} of {meta['cores']}")
    assert meta["mode"] == "auto" and 0 <= meta["idle_cores"] <= meta["cores"]
    assert "could not be read" not in notes
    if meta.get("skipped") == "no_idle_core":   # meta keeps idle_cores rounded: 0.49 reads 0.5
        assert meta["idle_cores"] <= collect_stacks.MIN_IDLE_CORES and doc["stacks"] is None
        assert "Python stacks not recorded: no idle CPU" in notes and "Python stacks not recorded" in r.stderr
    elif doc["stacks"] is None:
        assert "ptrace" in notes, notes
    else:
        assert "skipped" not in meta and doc["stacks"]["top"][0]["frame"] == "torch.save"
        assert "PD350" in [f["id"] for f in doc["findings"]]


def test_skipped_stacks_are_mentioned_only_where_they_would_have_named_host_time(tmp_path):
    from perfdoctor.diagnose.live import run_stacks

    (tmp_path / "stacks").mkdir()
    meta = {"pid": 1, "mode": "auto", "skipped": "no_idle_core", "idle_cores": 0.2, "cores": 2,
            "idle_cores_needed": 0.5, "processes": []}
    (tmp_path / "stacks" / collect_stacks.META).write_text(json.dumps(meta))
    said = {}
    for name, m in {"compute-bound": {"breakdown.other": 0.02, "share.host": 0.01},
                    "untraced host time": {"breakdown.other": 0.4, "share.host": 0.4},
                    "GPU waiting on host syncs": {"breakdown.other": 0.01, "share.host": 0.3},
                    "no trace": {"breakdown.other": None, "share.host": None}}.items():
        notes: list[str] = []
        assert run_stacks(tmp_path, [], m, notes) is None
        said[name] = notes
    assert said["compute-bound"] == []
    for name in ("untraced host time", "GPU waiting on host syncs", "no trace"):
        assert len(said[name]) == 1 and "0.2 of 2 cores idle, 0.5 needed" in said[name][0], name


def test_an_empty_recording_says_why_when_the_run_was_too_short():
    from perfdoctor.analyze.stacks import attribute
    steps = [{"step": i, "end": 1000.0 + 0.01 * i, "dur": 0.01, "wait": 0.0} for i in range(1, 40)]
    # py-spy started 0.1 s before the last step ended (it waits for the first steps): nothing sampled
    rep = attribute([{"pid": 1, "role": "trainer", "t0_unix": 1000.29, "events": []}], {"pid": 1, "rate_hz": 50}, steps)
    assert rep.notes == ["py-spy recorded no stacks of the training thread: it started sampling 0.1 s before the "
                         "last step ended (it waits for the first steps): too short a run to name frames"]
    # a long run with nothing recorded: no such reason to give
    rep = attribute([{"pid": 1, "role": "trainer", "t0_unix": 990.0, "events": []}], {"pid": 1, "rate_hz": 50}, steps)
    assert rep.notes == ["py-spy recorded no stacks of the training thread"]


def test_work_inside_an_every_n_steps_block_is_periodic_not_batch_preparation(tmp_path):
    """A log line's metric (`acc = ...` under `if step % 50 == 0:`) is the script's periodic
    work: not batch preparation for DataLoader workers (PD352), not per-step logging (PD351)."""
    f = tmp_path / "train.py"
    f.write_text(textwrap.dedent("""\
        for step, (xb, yb) in enumerate(loader):
            xb = xb.float() / 255
            logits = model(xb)
            if step % log_every == 0 and rank == 0:
                acc = (logits.argmax(1) == yb).float().mean()
                print(f"step {step} acc {acc.item():.3f}")
            else:
                noise = np.random.rand(4)
            if not (step + 1) % 100:
                arr = np.load("x.npy")
            msg = "%d steps" % step
            print(loss.item())
        """))
    at = lambda n: ("main", str(f), n)  # noqa: E731
    lib = lambda mod, fn: (fn, SITE + mod.replace(".", "/") + ".py", 1)  # noqa: E731
    linecache.checkcache(str(f))
    assert classify((at(2),))[0] == "python_data"                 # every step
    assert classify((at(5),))[0] == "periodic"                    # the metric for the log line
    assert classify((at(6),))[0] == "periodic"                    # its .item() too
    assert classify((at(8), lib("numpy.random", "rand")))[0] == "python_data"   # the else branch
    assert classify((at(10), lib("numpy", "load")))[0] == "periodic"
    assert classify((at(11),))[0] == "python_data"                # "%d" % step formats a string
    assert classify((at(12),))[0] == "logging_sync"               # a device read every step
    # a logging library stays logging, periodic or not
    assert classify((at(6), lib("wandb.sdk.wandb_run", "log")))[0] == "logging_sync"
    # a file that does not parse says nothing about blocks
    bad = tmp_path / "bad.py"
    bad.write_text("if step % 10 == 0:\n    x = (\n")
    assert classify((("main", str(bad), 2),))[0] == "python_data"
    # its share counts as logging: with `--log-every 1` the block runs every step (PD351's case)
    ev = [_ev("B", 0, *at(5))]
    for k in range(10):
        ev += [_ev("E", k * 100_000 + 30_000, *at(5)), _ev("B", k * 100_000 + 30_000, *at(2)),
               _ev("E", (k + 1) * 100_000, *at(2)), _ev("B", (k + 1) * 100_000, *at(5))]
    steps = [{"step": k + 1, "end": 1000.0 + (k + 1) * 0.1, "dur": 0.1, "wait": 0.0, "mode": "optimizer"}
             for k in range(10)]
    rep = attribute([{"pid": 1, "role": "trainer", "t0_unix": 1000.0, "events": ev}], {"pid": 1, "rate_hz": 100}, steps)
    assert rep.metrics["stacks.logging_sync_share"] == pytest.approx(0.3)
    assert rep.metrics["stacks.python_data_share"] == pytest.approx(0.7)
    assert {t["at"]: t["cause"] for t in rep.top} == {"train.py:5": "periodic", "train.py:2": "python_data"}


def test_a_hand_written_update_is_the_optimizer_not_batch_preparation(tmp_path):
    """`p.data -= lr * p.grad` in a loop without torch.optim is the optimizer's step written out:
    it was python_data, and PD352 offered DataLoader workers for it (user trial: manual SGD over a
    40-layer MLP, 10% of the step on that line)."""
    f = tmp_path / "train.py"
    f.write_text(textwrap.dedent("""\
        for step in range(n):
            x = np.tanh(table[idx])
            loss = ((model(x) - y) ** 2).mean()
            for p in params:
                p.grad = None
            loss.backward()
            with torch.no_grad():
                for p in params:
                    p.data -= lr * p.grad
                    p.add_(p.grad, alpha=-lr)
            if (step + 1) % accum == 0:
                w.sub_(lr * w.grad)
            if step % 10 == 0:
                print(sum(p.grad.norm() for p in params).item())
                gn = p.grad.norm()
            g = torch.autograd.grad(loss, params)
            requires = x.requires_grad
        """))
    at = lambda n: ("main", str(f), n)  # noqa: E731
    lib = lambda mod, fn: (fn, SITE + mod.replace(".", "/") + ".py", 1)  # noqa: E731
    linecache.checkcache(str(f))
    assert classify((at(2), lib("numpy", "tanh")))[0] == "python_data"
    assert classify((at(5),))[0] == "optimizer"                   # the gradient reset
    assert classify((at(9),))[0] == "optimizer"
    assert classify((at(10),))[0] == "optimizer"
    assert classify((at(12),))[0] == "optimizer"                  # gradient accumulation: not periodic logging
    assert classify((at(14),))[0] == "periodic"                   # a logged grad norm stays the log line's
    assert classify((at(15),))[0] == "periodic"                   # read, not written
    assert classify((at(16),))[0] == "python_data"                # autograd.grad( is no update
    assert classify((at(17),))[0] == "python_data"


def test_gc_collect_called_by_the_loop_is_garbage_collection_not_batch_preparation(tmp_path):
    """gc.collect() is a builtin: py-spy's stack ends at the line that calls it, which read as the
    loop's own data work (python_data), and PD352 offered DataLoader workers for 99.6% of a user's
    step. Per 100 ms step: 10 ms forward, 10 ms backward, 80 ms in gc.collect()."""
    f = tmp_path / "train.py"
    f.write_text(textwrap.dedent("""\
        for step in range(n):
            out = model(x)
            out.sum().backward()
            gc.collect()
        """))
    linecache.checkcache(str(f))
    main = lambda n: ("<module>", str(f), n)  # noqa: E731
    fwd = ("Module._call_impl", SITE + "torch/nn/modules/module.py", 1789)
    bwd = ("_engine_run_backward", SITE + "torch/autograd/graph.py", 825)
    ev = []
    for k in range(10):
        t = k * 100_000
        for frames, dur in (((main(2), fwd), 10_000), ((main(3), bwd), 10_000), ((main(4),), 80_000)):
            ev += [_ev("B", t, *fr) for fr in frames] + [_ev("E", t + dur, *fr) for fr in reversed(frames)]
            t += dur
    steps = [{"step": k + 1, "end": 1000.0 + (k + 1) * 0.1, "dur": 0.1, "wait": 0.0, "mode": "optimizer",
              "profiled": False} for k in range(10)]
    rep = attribute([{"pid": 1, "role": "trainer", "t0_unix": 1000.0, "events": ev}], {"pid": 1, "rate_hz": 100}, steps)
    assert {row["at"]: row["cause"] for row in rep.top}["train.py:4"] == "garbage_collection"
    assert rep.metrics["stacks.gc_collect_share"] == pytest.approx(0.8)
    assert rep.metrics["stacks.python_data_share"] == 0.0
    from perfdoctor.analyze.callshares import combined
    from perfdoctor.rules.engine import evaluate
    from perfdoctor.rules.loader import load_rules
    m = {**rep.metrics, "breakdown.other": 0.8}
    diag = evaluate(load_rules(), {**m, **combined(m)})          # gc.share: the stacks' here (no timed calls)
    assert [f.rule.id for f in diag.fixes][:1] == ["PD384"] and "PD352" not in [f.rule.id for f in diag.fixes]
    assert diag.fixes[0].expected == pytest.approx(1 / (1 - 0.8 * 0.99), rel=1e-3)


def test_the_batch_in_the_making_is_the_work_before_the_first_forward_but_a_device_copy():
    """Work on a line before the loop's first forward call makes that call's input (a synthetic
    batch drawn each step); a copy to the device there is the copy's time (pinned memory's fix,
    not a worker's), and a line after the forward, or in a function without one, is neither."""
    from perfdoctor.analyze.stackcause import before_forward
    text = {1: "for step in range(n):", 2: "    x = torch.randn(128, 3, 96, 96)", 3: "    x = x.to(device)",
            4: "    out = model(x)", 5: "    loss = out.mean()"}
    source = lambda file, line: text.get(line, "") if file == "/home/u/train.py" else ""  # noqa: E731
    at = lambda line: (("<module>", "/home/u/train.py", line),)  # noqa: E731
    first = {("/home/u/train.py", "<module>"): 4}
    assert before_forward(at(2), first, source)
    assert not before_forward(at(3), first, source)               # x.to(device): the copy
    assert not before_forward(at(5), first, source)               # after the forward: needs its output
    assert not before_forward(at(2), {}, source)                  # no forward seen in that function


def test_tensor_math_after_the_forward_is_the_loss_whatever_torch_function_it_calls():
    """A user trial's contrastive loss written out in the loop (`sim = a @ b.T / 0.1`, then
    F.cross_entropy at several temperatures) read "python data" and "other": after the loop's first
    forward call, a line that runs torch's tensor functions or nothing below it is the loss. Not a
    line before the forward, one that calls numpy or a DataLoader, or one that copies to a device."""
    from perfdoctor.analyze.stackcause import after_forward
    text = {1: "for step in range(n):", 2: "    x = data[idx]", 3: "    a = enc(x)", 4: "    sim = a @ a.T / 0.1",
            5: "    loss = F.cross_entropy(sim, labels)", 6: "    y = y.to(device)", 7: "    s = np.sum(p)"}
    source = lambda file, line: text.get(line, "") if file == "/home/u/train.py" else ""  # noqa: E731
    at = lambda line, *below: (("<module>", "/home/u/train.py", line), *below)  # noqa: E731
    first = {("/home/u/train.py", "<module>"): 3}
    ce = ("cross_entropy", SITE + "torch/nn/functional.py", 3494)
    assert after_forward(at(4), first, source) and after_forward(at(5, ce), first, source)
    assert not after_forward(at(2), first, source) and not after_forward(at(2, ce), first, source)    # before it
    assert not after_forward(at(6), first, source)                                      # the copy's time
    assert not after_forward(at(7, ("sum", SITE + "numpy/_core/fromnumeric.py", 1)), first, source)
    assert not after_forward(at(5, ce), {}, source)                   # no forward seen in that function
    # a function the loop calls after its forward may make the next batch (nanoGPT's get_batch
    # between the forward and the backward): only the innermost user frame's place counts
    prefetch = (("<module>", "/home/u/train.py", 5), ("get_batch", "/home/u/train.py", 40))
    assert not after_forward(prefetch, first, source)


def test_a_metric_of_the_steps_results_is_read_every_step_not_batch_preparation(tmp_path):
    """Python after the forward pass on values read from tensors is a metric of the step's
    results: logging_sync (PD351: read it every N steps), not batch preparation that DataLoader
    workers could take (PD352). A user trial (an F1 in numpy over `out.argmax(1).numpy()` every
    step, 25% of it) read "Move batch preparation into DataLoader workers"; computing it every 50
    steps measured 1.49x. Batches made before the forward stay python_data; tensor math after it
    that reads no value is the loss (a loss written out: no worker can make it ahead either); in a
    loop that calls the model 8 times a step or more (a rollout: see attribute) all of it stays
    python_data. Per 100 ms step: 20 ms of numpy at the
    batch's line, 30 ms forward, 10 ms of loss math, 20 ms backward, 20 ms in the metric."""
    f = tmp_path / "train.py"
    f.write_text(textwrap.dedent("""\
        for step in range(n):
            x, y = np.take(X, idx), np.take(Y, idx)
            out = model(x)
            loss = ((out - y) ** 2).mean()
            loss.backward()
            f1 = f1_macro(y.numpy(), out.argmax(1).numpy())
        def f1_macro(y, p):
            return np.sum(p == y)
        """))
    linecache.checkcache(str(f))
    main = lambda n: ("<module>", str(f), n)  # noqa: E731
    metric = ("f1_macro", str(f), 8)
    np_sum, np_take = ("sum", SITE + "numpy/_core/fromnumeric.py", 1), ("take", SITE + "numpy/_core/fromnumeric.py", 2)
    fwd = ("Module._call_impl", SITE + "torch/nn/modules/module.py", 1789)
    bwd = ("_engine_run_backward", SITE + "torch/autograd/graph.py", 825)

    def recording(forward: bool, model_calls=None):
        ev = []
        for k in range(10):
            t = k * 100_000
            parts = [((main(2), np_take), 20_000), ((main(3), fwd) if forward else (main(3),), 30_000),
                     ((main(4),), 10_000), ((main(5), bwd), 20_000), ((main(6), metric, np_sum), 20_000)]
            for frames, dur in parts:
                ev += [_ev("B", t, *fr) for fr in frames] + [_ev("E", t + dur, *fr) for fr in reversed(frames)]
                t += dur
        t0 = 1000.0
        steps = [{"step": k + 1, "end": t0 + (k + 1) * 0.1, "dur": 0.1, "wait": 0.0, "mode": "optimizer",
                  "profiled": False} for k in range(10)]
        rep = attribute([{"pid": 1, "role": "trainer", "t0_unix": t0, "events": ev}], {"pid": 1, "rate_hz": 100},
                        steps, model_calls=model_calls)
        return rep.metrics, {row["at"]: row["cause"] for row in rep.top}

    m, causes = recording(forward=True, model_calls=1)
    assert causes["train.py:8"] == "step_results" and causes["train.py:2"] == "python_data"
    assert causes["train.py:4"] == "loss"
    assert m["stacks.logging_sync_share"] == pytest.approx(0.2)
    assert m["stacks.python_data_share"] == pytest.approx(0.2)         # the batch's numpy, not the loss math
    assert m["stacks.pre_forward_data_share"] == pytest.approx(0.2)    # the batch's numpy alone: before line 3
    # the model called 16 times a step (a rollout: the Python after a policy call steps the environment
    # on `a.numpy()` and makes the next call's input): none of it is read as a metric
    m, _ = recording(forward=True, model_calls=16)
    assert m["stacks.logging_sync_share"] == 0.0 and m["stacks.python_data_share"] == pytest.approx(0.5)
    assert m["stacks.pre_forward_data_share"] == 0.0       # a rollout's next input needs the last output
    # no forward pass among the stacks (a model called without nn.Module): nothing says what comes after it
    m, _ = recording(forward=False)
    assert m["stacks.logging_sync_share"] == 0.0 and m["stacks.python_data_share"] == pytest.approx(0.8)
    assert m["stacks.pre_forward_data_share"] == 0.0


def test_a_call_from_an_every_n_steps_block_is_periodic_and_a_forward_there_is_evaluation(tmp_path):
    """The sleep inside `log_metrics()`, called under `if step % 10 == 0:`, is periodic work (it
    was "waiting": PD359 called it unexplained; user trial); a forward under such a block is an
    evaluation inline in the loop, unless the block trains (a GAN's generator every n_critic)."""
    f = tmp_path / "train.py"
    f.write_text(textwrap.dedent("""\
        def log_metrics(step, loss):
            time.sleep(0.15)
            print(step, loss)
        for step, (xb, yb) in enumerate(loader):
            loss = loss_fn(model(xb), yb)
            if step % 10 == 0:
                log_metrics(step, loss.detach())
            if step % 100 == 0:
                val = loss_fn(model(xv), yv)
            if step % n_critic == 0:
                g_loss = -critic(gen(z)).mean()
                g_loss.backward()
                g_opt.step()
            time.sleep(0.001)
        """))
    at = lambda n, fn="main": (fn, str(f), n)  # noqa: E731
    module = ("_call_impl", SITE + "torch/nn/modules/module.py", 1)
    linecache.checkcache(str(f))
    assert classify((at(7), at(2, "log_metrics")))[0] == "periodic"     # the sleep in the log call
    assert classify((at(14),))[0] == "waiting"                           # a sleep every step
    assert classify((at(9), module))[0] == "evaluation"                  # an inline validation forward
    assert classify((at(5), module))[0] == "model"                       # the training forward
    assert classify((at(11), module))[0] == "model"                      # the generator trains there


def test_periodic_block_follows_the_file_text():
    """The joined text is cached per file, but a new line list (the file changed) is read again."""
    from perfdoctor.analyze.sourcelines import in_periodic_block
    v1 = ["for step in range(100):\n", "    loss = train()\n", "    if step % 10 == 0:\n", "        save()\n"]
    v2 = ["for step in range(100):\n", "    loss = train()\n", "    save()\n", "    log()\n"]
    current = [v1]
    lines_of = lambda f: current[0]   # noqa: E731 - one list object per version, as linecache gives
    assert in_periodic_block("/x/train.py", 4, lines_of) and not in_periodic_block("/x/train.py", 2, lines_of)
    current[0] = v2
    assert not in_periodic_block("/x/train.py", 4, lines_of)


# --- a hostile recording (a run directory from an artifact, a hand edit) ------------------------

def _hostile_dir(tmp_path: Path, meta, events=None, file: str = "pyspy-1.json") -> Path:
    d = tmp_path / "run" / "stacks"
    d.mkdir(parents=True)
    (d / "pyspy.meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta, allow_nan=True))
    if events is not None:
        (d / file).write_text(json.dumps(events))
    return d.parent


def _save_steps(t0: float = 1000.0):
    """Ten 100 ms steps of 60 ms torch.save and 40 ms forward (the first two stack frames of
    each), from Unix time t0; steps 5 and 6 profiled."""
    main = ("main", "/home/u/train.py", 27)
    save = ("save", SITE + "torch/serialization.py", 1002)
    fwd = ("Module._call_impl", SITE + "torch/nn/modules/module.py", 1789)
    ev = [_ev("B", 0, *main)]
    for k in range(10):
        t = k * 100_000
        ev += [_ev("B", t, *save), _ev("E", t + 60_000, *save), _ev("B", t + 60_000, *fwd), _ev("E", t + 100_000, *fwd)]
    ev.append(_ev("E", 1_000_000, *main))
    steps = [{"step": k + 1, "end": t0 + (k + 1) * 0.1, "dur": 0.1, "wait": 0.0, "mode": "optimizer",
              "profiled": k in (4, 5)} for k in range(10)]
    return ev, steps


PROC = {"pid": 1, "role": "trainer", "file": "pyspy-1.json", "t0_unix": 1000.0}


@pytest.mark.parametrize("meta,note", [
    ("[1, 2]", None),
    ('"x"', None),
    ({"skipped": True, "idle_cores": "x", "cores": [1], "idle_cores_needed": {"a": 1}}, "(unknown cores idle, 0.5 needed)"),
    ({"pid": 1, "rate_hz": 50, "processes": [dict(PROC, file="/dev/zero")]}, None),
    ({"pid": 1, "rate_hz": 50, "processes": [dict(PROC, file="../run.json")]}, None),
    ({"pid": 1, "rate_hz": 50, "processes": [dict(PROC, file="fifo")]}, None),
    ({"pid": 1, "rate_hz": 50, "processes": [dict(PROC, t0_unix=float("nan"))]}, "recorded no stacks"),
    ({"pid": 1, "rate_hz": 50, "processes": {"a": 1}}, None),
    ({"pid": 1, "rate_hz": 50, "processes": ["x", 1, None, dict(PROC, pid="1")]}, None),
], ids=["list", "string", "skipped-odd-types", "dev-zero", "outside", "fifo", "nan-start", "processes-object",
        "odd-processes"])
def test_a_hostile_stacks_meta_is_read_as_no_recording(tmp_path, meta, note):
    """The stacks files were read as py-spy wrote them: a meta file that is not an object, a
    process entry of another type, a NaN start or the idle cores as a string were exit 70; a
    process file naming /dev/zero read until the memory ran out, and a FIFO blocked forever. Each
    now reads as no recording (or no stacks of the training thread), with its note."""
    from perfdoctor.diagnose.live import run_stacks

    ev, steps = _save_steps()
    run = _hostile_dir(tmp_path, meta, ev)
    os.mkfifo(run / "stacks" / "fifo")
    notes: list[str] = []
    t0 = time.monotonic()
    got = run_stacks(run, steps, {}, notes)
    assert time.monotonic() - t0 < 10
    if note is None:
        assert got is None
    else:
        said = notes + ((got or {}).get("notes") or [])
        assert any(note in n for n in said), said


def test_odd_events_in_a_recording_are_left_out_and_the_rest_attributed(tmp_path):
    """Events no py-spy writes (not objects, a string line, a ts of NaN, args as a list, a name
    that is a list) made int() or .get() raise (exit 70); they are left out or their odd field
    read as unknown, and the save-every-step recording is attributed as when it is clean."""
    from perfdoctor.diagnose.live import run_stacks

    ev, steps = _save_steps()
    junk = [1, "x", None, {"ph": 5}, {"ph": "B", "ts": "nan"}, {"ph": "X", "ts": 3},
            {"ph": "B", "ts": 5e5, "pid": 1, "tid": 99, "name": ["a"], "args": [1]},
            {"ph": "B", "ts": 5e5, "pid": 1, "tid": 98, "name": "\x1b[31mx", "args": {"line": "\x1b]52;c;eA==\x07198"}}]
    run = _hostile_dir(tmp_path, {"pid": 1, "rate_hz": "fast", "processes": [PROC]}, junk + ev)
    m: dict = {}
    sec = run_stacks(run, steps, m, [])
    assert sec is not None and m["stacks.checkpoint_share"] == pytest.approx(0.6)


def test_skipped_stacks_are_said_where_the_trainer_does_its_own_loading(tmp_path):
    """A step of little host time but a data wait the trainer computes itself (num_workers=0:
    the Dataset's Python is the trainer's, and the stacks name its lines) says why there are no
    stacks, as a host-bound one does; with workers the loading is theirs, and nothing is said."""
    from perfdoctor.diagnose.live import run_stacks
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / collect_stacks.META).write_text(json.dumps(
        {"mode": "auto", "skipped": "no_idle_core", "idle_cores": 0.0, "cores": 2, "idle_cores_needed": 0.5}))
    base = {"breakdown.other": 0.02, "share.host": 0.02, "share.input": 0.78}
    for workers, said in ((0, True), (2, False), (None, False)):
        notes: list[str] = []
        assert run_stacks(tmp_path, [], {**base, "input.loader_workers": workers}, notes) is None
        assert notes == ([collect_stacks.skipped_note(0.0, 2)] if said else []), workers
