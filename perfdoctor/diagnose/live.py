"""`perfdoctor run`'s diagnosis: run directory -> metrics -> rules -> report document.

Metrics come from three places, each saying only what it measured:
- the trace of the profiled window (the same analysis as `report`), when one was recorded;
- the step hooks (every step of the run: step time, data wait), as `run.*`;
- the system samplers (loader processes, CPU, IO, PSI, GPU), as `system.*`, `loader.*`,
  `machine.*` and `input.split`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from perfdoctor import inputjson
from perfdoctor.analyze import registry
from perfdoctor.analyze.callshares import call_metrics, combined, nograd_run_share
from perfdoctor.analyze.compiletime import compile_run_share
from perfdoctor.analyze.fusedcpu import run_optimizer_metrics
from perfdoctor.analyze.loaderfetch import fetch_metrics, random_draw_metrics, sampled_workers_or_fetched
from perfdoctor.analyze.loaderkinds import iterable_replayed, loader_metrics
from perfdoctor.analyze.loaderstarts import kept_metrics, kept_pace_ms, start_metrics, without_peeks
from perfdoctor.analyze.longsteps import long_step_metrics, unexplained
from perfdoctor.analyze.loopcalls import loop_metrics
from perfdoctor.analyze.memory import used_fraction
from perfdoctor.analyze.params import param_metrics
from perfdoctor.analyze.pipeline import CUT_NOTE, TraceAnalysis, analyze
from perfdoctor.analyze.stepseries import step_series
from perfdoctor.analyze.rnnsequence import layer_call_metrics, probe_metrics
from perfdoctor.analyze.stepwait import (few_steps_metrics, runq_runnable_share, runq_share, thread_awake_share,
                                         wait_busy_share)
from perfdoctor.analyze.system import other_cores
from perfdoctor.collect import forked
from perfdoctor.collect.launcher import RunResult
from perfdoctor.collect.loaderfetch import FILE as FETCH_FILE
from perfdoctor.collect.optsteps import RATES_NOTE
from perfdoctor.collect.rnnprobe import PROBE_FILE
from perfdoctor.diagnose import runfiles
from perfdoctor.diagnose.childtrainers import LEAD as CHILD_LEAD, elsewhere, own_loop_only
from perfdoctor.diagnose.document import build_document
from perfdoctor.diagnose.ending import late_start_hint, more_steps, outcome, steps_only_verdict, why_no_trace
from perfdoctor.diagnose.stepnotes import KIND_STEPS, drift_note, extra_batches_note, kinds_note, shared_note
from perfdoctor.errors import TraceFormatError
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.loader import load_rules
from perfdoctor.stats.steptime import StepEstimate, estimate, trace_inflation
from perfdoctor.trace import prefetch
from perfdoctor.trace.loader import load_trace, run_trace_files as run_traces


@dataclass
class StepsOnly:
    """Stands in for a TraceAnalysis when no trace was recorded (hooks and samples only)."""

    path: str
    metrics: dict
    steps: None = None
    step_breakdown_ms: None = None
    gaps: list = field(default_factory=list)
    memory_series: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)


def read_steps(run_dir: Path, warnings: list[str] | None = None) -> list[dict]:
    """Recorded steps of the final step mode (optimizer or DataLoader fallback); a line cut short
    or malformed is left out (and warned about, with `warnings`)."""
    recs = runfiles.read_steps(run_dir / "steps.jsonl", warnings)
    if recs:
        last_mode = recs[-1].get("mode")
        recs = [r for r in recs if r.get("mode") == last_mode]
    return recs


def step_estimate(steps: list[dict], num_workers: int | None = None,
                  prefetch_factor: int | None = None) -> StepEstimate:
    """The run's steady-state step time (perfdoctor.stats.steptime). When every step was
    disturbed (a run shorter than the profiled window), the disturbed steps stand in, marked
    inconclusive."""
    est = estimate(steps, num_workers=num_workers, prefetch_factor=prefetch_factor)
    # (a run without a trace whose steps were all warm-up has none to stand in: its own reason)
    if est.n == 0 and any(s.get("profiled") or s.get("perturbed") for s in steps):
        est = estimate([{**s, "profiled": False, "perturbed": False} for s in steps],
                       num_workers=num_workers, prefetch_factor=prefetch_factor)
        est.conclusive = False
        # (not "every step was warm-up...": the line it ends says "over 3 steady steps")
        est.reason = "no step was undisturbed, so the profiled ones and the one after the trace export stand in" + \
            (f"; {est.reason}" if est.reason else "")
    return est


def loader_settings(run_dir: Path, system: dict) -> dict:
    """num_workers and prefetch_factor of the script's first DataLoader, as inject.json recorded
    them (tune's runs), else the worker processes the samplers saw (prefetch_factor unknown: the
    estimator assumes torch's default)."""
    try:
        got = (inputjson.loads(inputjson.read_bytes(run_dir / "inject.json")).get("loaders") or [{}])[0].get("got") or {}
    except (OSError, ValueError, AttributeError, IndexError, TypeError, KeyError):
        got = {}
    got = runfiles.record(got, {"num_workers": runfiles.INT, "prefetch_factor": runfiles.INT})
    nw = got.get("num_workers")
    return {"num_workers": nw if nw is not None else system.get("loader.workers"),
            "prefetch_factor": got.get("prefetch_factor")}


def profiled(steps: list[dict]) -> list[dict]:
    """The steps inside the traced window."""
    return [s for s in steps if s.get("profiled")]


def step_metrics(steps: list[dict], res: RunResult, num_workers: int | None = None,
                 prefetch_factor: int | None = None, est: StepEstimate | None = None) -> dict:
    """run.* metrics: the steady-state step time (wall time of the steady window / its steps, with
    its block-bootstrap CI), the window's data-wait share, and median/p90 as secondary figures."""
    est = est or step_estimate(steps, num_workers, prefetch_factor)
    steady = est.window(steps)
    ms = (lambda x: None if x is None else 1e3 * x)
    return {"run.steps": len(steps), "run.outcome": outcome(res),
            "run.exit_code": res.exit_code, "run.stopped_early": res.stopped_by is not None,
            "run.profiled_steps": len(profiled(steps)),
            "run.skipped_optimizer_steps": sum(1 for s in steps if s.get("skipped")),
            "run.step_time_ms": ms(est.step_s),
            "run.step_time_ci95_ms": [ms(est.ci95[0]), ms(est.ci95[1])] if est.ci95 else None,
            "run.steady_steps": est.n, "run.step_time_conclusive": est.conclusive,
            "run.step_time_median_ms": ms(est.median_s), "run.step_time_p90_ms": ms(est.p90_s),
            "run.data_wait_share": est.wait_share, "run.steps_per_s": est.steps_per_s,
            "input.wait_busy_share": wait_busy_share(steady) if steady else None,
            "run.runq_share": runq_share(steady) if steady else None,
            "run.runq_runnable_share": runq_runnable_share(steady) if steady else None,
            "run.thread_awake_share": thread_awake_share(steady) if steady and res.child.get("cpu_clock") == "thread"
            else None,
            "run.traced_runq_share": runq_share(profiled(steps))}


def _system(run_dir: Path, steps: list[dict], kids: list[dict],
            damaged: list[str] | None = None) -> tuple[dict, list[str], dict | None, dict | None]:
    """System metrics over the steps window (analyze/windows.py), the notes, the `sampling` section
    and the run's series over time (analyze/runseries.py). A samples.json that is there but cannot
    be used adds one line to `damaged` (a missing one is a run that never sampled: not a fault)."""
    unknown = "the system samples (CPU, IO, memory) are unknown"
    try:
        raw = inputjson.loads(inputjson.read_bytes(run_dir / "samples.json"))
    except FileNotFoundError:
        return {}, [], None, None
    except OSError as exc:
        return _unsampled(damaged, f"samples.json could not be read ({exc.strerror or exc}): {unknown}")
    except UnicodeDecodeError:
        return _unsampled(damaged, f"samples.json is not JSON (not UTF-8 text): {unknown}")
    except (ValueError, RecursionError) as exc:
        return _unsampled(damaged, f"samples.json is not JSON ({getattr(exc, 'msg', None) or type(exc).__name__}): "
                                   f"{unknown}")
    if not isinstance(raw, dict) or not isinstance(raw.get("samples"), list):
        what = f"a JSON {type(raw).__name__}, not an object" if not isinstance(raw, dict) else "no list of samples"
        return _unsampled(damaged, f"samples.json holds {what}: {unknown}")
    data, dropped = runfiles.samples(raw)
    if dropped:
        data["notes"].append(f"{dropped} malformed system sample(s) in samples.json were left out")
    try:
        from perfdoctor.analyze.hostalloc import host_alloc
        from perfdoctor.analyze.memgrowth import memory_growth
        from perfdoctor.analyze.runseries import first_step_s, run_series
        from perfdoctor.analyze.system import system_metrics, wait_cpu_of
        from perfdoctor.analyze.windows import windowed_metrics
    except ImportError:
        return {}, data.get("notes", []), None, None
    notes = list(data.get("notes", []))
    samples = _trainers_apart(data.get("samples", []), kids)
    wait_cpu = wait_cpu_of(steps)
    metrics, sampling = windowed_metrics(samples, steps, notes, lambda got, said: system_metrics(got, said, wait_cpu))
    metrics.update(memory_growth(samples, steps))
    metrics.update(host_alloc(samples, steps))
    metrics["run.first_step_s"] = first_step_s(samples, steps)
    return metrics, notes, sampling, run_series(samples, steps)


def _unsampled(damaged: list[str] | None, line: str) -> tuple[dict, list[str], None, None]:
    if damaged is not None:
        damaged.append(line)
    return {}, [], None, None


def _trainers_apart(samples: list[dict], kids: list[dict]) -> list[dict]:
    """Forked children that trained (forked/<pid>.json) are python descendants of the trainer,
    which the sampler calls loader workers: they are helpers here, not the loader."""
    pids = {k["pid"] for k in kids}
    if not pids:
        return samples
    out = []
    for smp in samples:
        workers = smp.get("workers") or []
        moved = [w for w in workers if w.get("pid") in pids]
        if moved:
            smp = {**smp, "workers": [w for w in workers if w.get("pid") not in pids],
                   "helpers": list(smp.get("helpers") or []) + [{**w, "role": "other"} for w in moved]}
        out.append(smp)
    return out


def diagnose_run(res: RunResult, rule_dirs: list[str] | None = None) -> dict:
    run_dir = res.run_dir
    rules = load_rules(rule_dirs)
    damaged: list[str] = []         # one line per damaged run file (runfiles.py)
    launched = runfiles.read_record(run_dir / "run.json", runfiles.RUN, damaged)
    runfiles.read_record(run_dir / "child.json", runfiles.CHILD, damaged)   # its faults: res.child has its content
    steps = read_steps(run_dir, damaged)
    traces = run_traces(run_dir / "trace", damaged)
    analysis: TraceAnalysis | StepsOnly | None = None
    notes = list(res.child.get("notes") or []) + list(res.notes)
    if traces:
        try:
            analysis = analyze(_load(traces[0]))
        except TraceFormatError as exc:
            # a damaged trace is one damaged run file: the step timings and samples still tell
            damaged.append(f"trace/{traces[0].name} is unusable ({exc}): the diagnosis uses step timings and "
                           "system samples only")
    if analysis is None:
        m = dict.fromkeys(registry.REGISTRY)
        m["trace.platform"] = "cuda" if res.child.get("cuda_available") else "cpu"
        analysis = StepsOnly(str(run_dir), m)
        if not traces:
            notes.append("no trace was recorded (" + why_no_trace(res, steps) + ")" + (
                ": the diagnosis uses step timings and system samples only" if steps else ""))
    m = analysis.metrics
    kids = forked.read(run_dir)             # training in forked children (collect/forked.py)
    sysm, sample_notes, sampling, series = _system(run_dir, steps, kids, damaged)
    m.update({k: v for k, v in sysm.items() if k in registry.REGISTRY})
    fetches = runfiles.read_fetches(run_dir / FETCH_FILE)
    m.update(sampled_workers_or_fetched(m, res.child.get("loader_iters"), fetches))
    siblings = (runfiles.record(_read_json(run_dir / "rank.json"), runfiles.RANK).get("local_world_size") or 1) - 1
    if siblings > 0:                    # this job's other ranks on the machine are not "other work"
        m["system.other_cores"] = other_cores(m, siblings)
    est = step_estimate(steps, **loader_settings(run_dir, m))
    m.update(step_metrics(steps, res, est=est))
    m["machine.torch_threads"] = res.child.get("torch_threads")
    m["machine.cpu_bf16"], m["machine.cpu_fp16"] = res.child.get("cpu_bf16"), res.child.get("cpu_fp16")
    kind = res.child.get("dataset_kind")     # the run's own reading, else the trace's Python frames'
    if kind in ("map", "iterable"):
        m["input.dataset_kind"] = kind
    m.update(loader_metrics(res.child.get("loaders")))
    used = res.child.get("worker_info_used")
    m["input.worker_info_used"] = used if isinstance(used, bool) else None      # None: an older run
    m["input.iterable_replayed"] = iterable_replayed(m)
    m["run.trace_inflation"] = trace_inflation(m.get("steps.time_mean_ms"), m.get("run.step_time_ms"))
    m.update(few_steps_metrics(steps))
    steady = est.window(steps)
    m.update(start_metrics(steady, res.child.get("loader_iters")))
    m.update(fetch_metrics(steady, fetches))
    m.update(random_draw_metrics(fetches, res.child.get("sample_random")))
    pace = kept_pace_ms(m.get("loader.fetch_ms"), m.get("run.runq_runnable_share"), m.get("loader.fetch_wall_ms"))
    m.update(kept_metrics(steady, res.child.get("loader_iters"), pace))
    steady = without_peeks(steady)          # a peek before the epoch is no other loop
    m.update(loop_metrics(res.child.get("root_calls"), steady))
    m.update(layer_call_metrics(res.child.get("root_calls")))
    m.update(probe_metrics(_read_json(run_dir / PROBE_FILE), m))     # the RNN probe (collect/rnnprobe.py)
    m.update(long_step_metrics(steady, profiled(steps)))
    trained_elsewhere = elsewhere(kids, steps, m, res.child.get("process_starts"),
                                  (sampling or {}).get("whole_run"))
    kinds = kinds_note(steady)      # two kinds of step in turn: the thirds' medians flip between them, no drift
    m["run.step_kinds"] = 2 if kinds else 1 if len(steady) >= KIND_STEPS else None
    notes += ([trained_elsewhere] if trained_elsewhere else []) + extra_batches_note(steady) \
        + (kinds or drift_note(steady)) + [n for n in sample_notes if n not in notes]
    stacks = run_stacks(run_dir, steps, m, notes)
    notes += shared_note(m)
    notes.sort(key=_note_rank)
    opt = res.child.get("optimizer") or {}
    # a step(closure) runs forward and backward inside: its time is not the update's, and not counted
    opt_timed = res.child.get("optimizer_timed") is True and not opt.get("closure_calls")
    m.update(call_metrics(steady, res.child.get("timed_calls") is True, opt_timed,
                          res.child.get("nograd_timed") is True, res.child.get("convert_timed") is True,
                          res.child.get("pre_timed") is True, profiled(steps)))
    m.update(run_optimizer_metrics(opt, m.get("optimizer.implementation")))
    rebuilt = opt.get("rebuilt")            # the primary optimizer built again (collect/optsteps.py)
    m["optimizer.rebuilds_per_step"] = rebuilt / len(steps) if isinstance(rebuilt, int) and steps else None
    m.update(param_metrics(res.child.get("param_dtypes"), (res.child.get("root_calls") or {}).get("dense_embeddings")))
    m.update(nograd_run_share(m))           # the trace window's no-grad evaluation, at the run's rate
    m.update(compile_run_share(m))          # and its recompiles
    m.update(combined(m))
    m.update(used_fraction(m))
    m["loop.long_steps_unnamed_share"] = unexplained(m)
    registry.check(m)
    doc = build_document(str(run_dir), [(analysis, evaluate(rules, m))])
    told = any(n.startswith(_LEAD[0]) for n in notes)      # the run's cut note (collect/window.py) says it first
    doc["traces"][0]["notes"] = [n for n in doc["traces"][0]["notes"] if not (told and n.startswith(CUT_NOTE))] + notes
    doc["traces"][0]["warnings"] = list(doc["traces"][0]["warnings"]) + damaged
    argv, config = launched.get("argv") or [], launched.get("config") or {}
    # quoted as a shell would need it (a path with spaces), so that it can be pasted back
    command = shlex.join((["-m"] if launched.get("module") else []) + [str(a) for a in argv]) or None
    doc["run"] = {"dir": str(run_dir), "command": command, "outcome": m["run.outcome"], "exit_code": res.exit_code,
                  "signal": res.signal, "stopped_by": res.stopped_by,
                  "wall_s": round(res.wall_s, 3) if res.wall_s is not None else None,
                  "steps": len(steps), "steps_left_out": {k: v for k, v in est.dropped.items() if v},
                  "step_time_reason": more_steps(est.reason, est.conclusive, est.n, res.stopped_by,
                                                 config.get("max_steps"),
                                                 late_start_hint(steps, m.get("run.first_step_s"), config)),
                  "trace": [str(t) for t in traces], "notes": notes,
                  "sampling": sampling, "series": series, "step_series": step_series(steps, est.first, est.n)}
    doc["stacks"] = stacks
    steps_only_verdict(doc, res, steps, not isinstance(analysis, StepsOnly), trained_elsewhere,
                       "its trace file is unusable" if traces else None)
    own_loop_only(doc, steps, trained_elsewhere)
    return doc


# The terminal shows the first run note by default: what could change the advice first (Python
# stacks not recorded), then the notes about this run, then what only describes the machine or
# the sampling (no NVIDIA GPU, the sampled means, block-IO delay accounting off).
# the traced step is not whole (read its times so), or the training ran in child processes, or the
# steps' length drifts through the run (the time per step is then the run length's: a user trial
# training two models in turn, 1.7 ms then 48 ms a step, showed only "stacks not recorded"), or
# a step is not an iteration (a WGAN's critic steps 5 times an iteration: "6.95 ms/step" read as
# the iteration's time, its note under --details only)
_LEAD = ("the trace stopped inside a step", "the steady steps' length drifts", "the steady steps are of two kinds",
         RATES_NOTE) + CHILD_LEAD
_FIRST = ("python stacks not recorded",)
_LAST = ("no nvidia gpu found", "sampled means (", "block-io delay accounting is off", "other processes used")


def _note_rank(note: str) -> int:
    n = note.lower()
    return -1 if n.startswith(_LEAD) else 0 if n.startswith(_FIRST) else 2 if n.startswith(_LAST) else 1


def run_stacks(run_dir: Path, steps: list[dict], m: dict, notes: list[str]) -> dict | None:
    """The py-spy recording (if any) -> stacks.* metrics into m, and the report's `stacks` section."""
    from perfdoctor.analyze.gilwait import gil_wait
    from perfdoctor.analyze.stacks import attribute, exposed_waits, section, steady_steps
    from perfdoctor.collect.stacks import MIN_IDLE_CORES, skipped_note
    from perfdoctor.diagnose.stackfiles import load_recording

    rec = load_recording(run_dir / "stacks")
    if rec is None:
        meta = _read_json(run_dir / "stacks" / "pyspy.meta.json")
        if meta.get("skipped"):
            # worth saying where the step has host time the stacks would have named (5%: the
            # materiality of the rules that use them), the trainer's own loading included: with
            # num_workers=0 the Dataset's Python is the trainer's, and the stacks name its lines
            # (a user's per-pixel augmentation loop, 52% of the step, went unsaid)
            host = max(m.get("breakdown.other") or 0.0, m.get("share.host") or 0.0)
            loads = (m.get("share.input") or 0.0) if m.get("input.loader_workers") == 0 else 0.0
            if max(host, loads) >= 0.05 or m.get("breakdown.other") is None:
                notes.append(skipped_note(_number(meta, "idle_cores"), _number(meta, "cores"),
                                          _number(meta, "idle_cores_needed") or MIN_IDLE_CORES))
        elif (run_dir / "stacks" / "pyspy.meta.json").is_file():
            notes.append("py-spy's stack recording could not be read (killed while writing?)")
        return None
    rep = attribute(rec[0], rec[1], steps, model_calls=m.get("loop.model_calls_per_step"))
    m.update(rep.metrics)
    m.update(exposed_waits(m))
    m.update(gil_wait(steady_steps(steps), m))
    return section(rep, rec[1])


def _number(doc: dict, key: str) -> float | None:
    """doc[key] when it is a finite number (the file is untrusted: another type is unknown)."""
    return runfiles.record(doc, {key: runfiles.NUM}).get(key)


def load_result(run_dir: Path) -> RunResult:
    """A finished run as `launch` returned it, from the run directory's run.json and child.json
    (what `perfdoctor report RUN_DIR` re-diagnoses; unknown fields stay None)."""
    launched = runfiles.read_record(run_dir / "run.json", runfiles.RUN, [])      # warned by diagnose_run
    child = runfiles.read_record(run_dir / "child.json", runfiles.CHILD, [])
    code = launched.get("exit_code")
    code = child.get("exit_code") if code is None else code
    return RunResult(run_dir, code, launched.get("signal"), launched.get("wall_s"), child,
                     launched.get("stopped_by"), list(launched.get("notes") or []))


def diagnose_dir(run_dir: Path, rule_dirs: list[str] | None = None) -> dict:
    """Re-diagnose a run directory: the same document `perfdoctor run` produced from it."""
    return diagnose_run(load_result(Path(run_dir)), rule_dirs)


def _read_json(path: Path) -> dict:
    try:
        data = inputjson.loads(inputjson.read_bytes(path))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _load(path: Path):
    """The run's trace, from the load `perfdoctor report RUN_DIR` started early when there is one."""
    pending = prefetch.take(path)
    if pending is None:
        return load_trace(path)
    try:
        return pending.finish()
    finally:
        pending.close()


def write_run_events(run_dir: Path) -> None:
    """TensorBoard scalars of the run (report/run_scalars.py): its steps and system samples."""
    from perfdoctor.report.run_scalars import write_run_scalars

    samples = _read_json(run_dir / "samples.json").get("samples")
    write_run_scalars(run_dir / "tensorboard", read_steps(run_dir), samples if isinstance(samples, list) else [])
