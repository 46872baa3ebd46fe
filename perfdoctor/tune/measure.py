"""One measured run of `perfdoctor tune`: the unmodified script in a fresh child, with changes
injected, bounded in time, measured with the step-time estimator (perfdoctor.stats.steptime).

Also the comparisons between two runs: the speed-up with its 95% interval, and the loss drift
of a change that alters numerics (autocast, compile).

Loss drift. inject_loss.py records each step's loss: every backward() on a scalar, a scalar's
torch.autograd.grad, torch.func.grad_and_value's value. Two runs are compared over the calls
both made, in order (same data order when the script seeds its RNGs,
as training scripts that want repeatable runs do). The drift is the mean absolute difference
over the mean absolute baseline loss. A change diverges when its loss becomes non-finite where
the baseline's is finite, or when its mean loss over the last quarter of the common steps
exceeds the baseline's by more than DIVERGE of the baseline's scale: the larger of its last
quarter's mean and the drop from its first quarter to its last (what training achieved). Mixed
precision and compilation move the loss by rounding, not by tens of percent; and a loss that
both runs drove to nearly zero (a tiny ViT on the CPU: 1.3e-6 under autocast vs 2e-13 in fp32, from ~1)
has not diverged, however far apart the two tiny numbers are.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from perfdoctor import inputjson
from perfdoctor.analyze.stackcause import frame_kind
from perfdoctor.stats import steptime

DIVERGE = 0.10
STARTUP_MIN_S, STARTUP_RUNS = 60.0, 4      # startup_limit
MIN_LOSSES = 8
# trials whose loss is compared with the baseline's: precision and compilation must show theirs
# (a trial without one is not comparable, and fails); attention dropout off shows it where seen
LOSS_REQUIRED = frozenset({"autocast", "compile", "float32"})
LOSS_CHECKED = LOSS_REQUIRED | {"attention_dropout"}
TRACE_TAIL = 2 * steptime.MIN_STEPS     # the traced baseline runs on until this many steps follow its trace

# the outcomes of a script that ran to its own end: "exit" is sys.exit(0) from the loop
FINISHED = ("completed", "exit")

MIN_EFFECT = steptime.MATERIAL   # a speed-up this large either way is material (as gate's --min-effect)


@dataclass
class Measured:
    run_dir: Path
    changes: dict
    exit_code: int
    outcome: str
    wall_s: float
    steps: list = field(default_factory=list)
    inject: dict = field(default_factory=dict)
    child: dict = field(default_factory=dict)
    estimate: object = None            # stats.steptime.StepEstimate, or None without steps
    error: str | None = None           # why the run cannot be used (crash, too few steps)
    other_load: float | None = None    # cores used by other processes during the run
    cores: int | None = None
    ranks: int = 1                     # a job's ranks (tune/job.py): its step time is pace_rank's
    pace_rank: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def step_s(self) -> float | None:
        return getattr(self.estimate, "step_s", None)


def run_once(argv: list[str], module: str | None, run_dir: Path, changes: dict, *, run_s: float | None,
             max_steps: int | None, trace: bool = False, result=None, stacks: bool | None = False,
             output: Path | None = None, dist: list[str] | None = None) -> Measured:
    """Launch the script once (trace and Python stacks off unless asked: `stacks` None is `run`'s
    auto mode) and measure it: `run_s` seconds of
    training from its first step (a slow import or compile does not eat the steps), a script
    with no step by startup_limit(run_s) stopped then. `result` receives the launcher's
    RunResult (the baseline's diagnosis needs it). `output`: a file for the script's stdout and
    stderr (else they pass through). `dist`: torchrun's options, for a job of several ranks
    (tune/job.py)."""
    from perfdoctor.collect.launcher import RunConfig, launch

    cfg = RunConfig(argv=list(argv), module=module, run_dir=run_dir, max_steps=max_steps, duration=run_s,
                    duration_from="first-step", startup_s=startup_limit(run_s) if run_s else None,
                    trace=trace, stacks=stacks, changes=dict(changes), output=output,
                    trace_tail=TRACE_TAIL if trace else 0)
    if dist is not None:
        from perfdoctor.collect.ranks import launch_ranks
        from perfdoctor.tune.job import measure_job
        res = launch_ranks(cfg, dist)
        if result is not None:
            result.append(res)
        return measure_job(run_dir, changes, res.exit_code, res.wall_s)
    res = launch(cfg)
    if result is not None:
        result.append(res)
    # --duration's stop waits for a step boundary, then insists (SIGINT, SIGKILL): a script still
    # starting (or in a step) by then ends 130 or killed by perfdoctor, not by failing
    return measure_dir(run_dir, changes, res.exit_code, res.child, res.wall_s,
                       stopped_late=stopped_late(res.stopped_by, res.notes))


def stopped_late(stopped_by: str | None, notes: list) -> bool:
    """--duration's stop interrupted the script after its grace (the launcher's note says so)."""
    return stopped_by == "duration" and any(str(n).startswith("the script did not stop within") for n in notes)


def startup_limit(run_s: float) -> float:
    """How long a run may take to reach its first step: importing torch and a model, loading
    data and compiling take tens of seconds in real scripts (STARTUP_MIN_S), longer for long runs."""
    return max(STARTUP_MIN_S, STARTUP_RUNS * run_s)


def measure_dir(run_dir: Path, changes: dict, exit_code: int, child: dict, wall_s: float, *,
                stopped_late: bool = False, system: dict | None = None) -> Measured:
    """`stopped_late`: perfdoctor interrupted the script after --duration's grace (not a failure:
    measured from the steps it took, usually too few). `system`: the run's system metrics
    (system_of), where the caller read them already."""
    from perfdoctor.diagnose.live import loader_settings, read_steps
    from perfdoctor.gate.load import other_load_of
    from perfdoctor.stats.steptime import estimate

    outcome = child.get("outcome") or "killed"
    m = Measured(run_dir, dict(changes), exit_code, outcome, wall_s, read_steps(run_dir),
                 _read_json(run_dir / "inject.json"), child)
    # sys.exit(0) from the loop ends a script as finishing does ("exit", code 0): a run of too few
    # steps that way is "not measurable" (exit 3, give it more steps), not a failed script
    if (outcome not in ("stopped", *FINISHED) or exit_code != 0) and not stopped_late:
        why = gist(child.get("error")) or (f"exit code {exit_code}" if exit_code else outcome)
        m.error = f"the script failed ({why})"
    system = system_of(run_dir) if system is None else system
    m.other_load, m.cores = other_load_of(system)
    loader = loader_settings(run_dir, system)          # as `run` and `gate` read the same directory
    if m.steps:
        m.estimate = estimate(m.steps, num_workers=loader["num_workers"], prefetch_factor=loader["prefetch_factor"])
    if m.error is None and (m.estimate is None or not m.estimate.conclusive):
        reason = getattr(m.estimate, "reason", None) or "no training step recorded"
        m.error = f"not measurable: {reason}" + (" (still starting or in a step when --duration's stop "
                                                  "request's grace ran out: perfdoctor interrupted it)"
                                                  if stopped_late else "")
    return m


def longer_runs(m: Measured, runs_per_budget: int, max_steps: int | None = None) -> str:
    """What to change when a run could not be measured, from the pace it ran at: a script that
    ended by itself needs more steps of its own (--duration cannot add any), one --max-steps
    stopped a higher --max-steps; one that had too few steady steps needs runs long enough for
    MIN_STEPS of them plus the steps this run left out (warm-up), at this run's steps per second
    (a 6 s LBFGS step cannot fit 10 in the default 19 s run, and "more time" alone does not say
    how much); for the estimator's other reasons (correlated steps, no steady level) twice as
    long a run."""
    steps = [s for s in m.steps if isinstance(s.get("end"), (int, float)) and isinstance(s.get("dur"), (int, float))]
    if m.outcome in FINISHED:
        return (f"the script ended by itself after {len(m.steps)} step(s): give it more steps (its own "
                "arguments: epochs, iterations, data size)")
    if max_steps and len(m.steps) >= max_steps:
        return f"--max-steps {max_steps} stopped it: give it more steps (a higher --max-steps, or none)"
    if not steps:
        return "give it more time (--duration) or more steps"
    span = steps[-1]["end"] - (steps[0]["end"] - steps[0]["dur"])
    n = len(steps)
    steady = getattr(m.estimate, "n", 0) or 0
    reason = getattr(m.estimate, "reason", None) or ""
    if steady >= steptime.MIN_STEPS or not reason.startswith("only "):
        run_s = math.ceil(2 * span / 5) * 5
        return (f"{n} step(s) took {span:.0f} s here: runs about twice as long, --duration {run_s} "
                f"--budget {run_s * runs_per_budget}")
    need = steptime.MIN_STEPS + (n - steady)
    run_s = math.ceil(need * span / n / 5) * 5
    return (f"{n} step(s) took {span:.0f} s here, {span / n:.1f} s each: {steptime.MIN_STEPS} steady steps, "
            f"plus the {n - steady} this run left out, need runs of about {run_s} s from the first step: "
            f"--duration {run_s} --budget {run_s * runs_per_budget}, or smaller steps")


def judged(lo: float, hi: float) -> str:
    """A speed-up's 95% interval [lo, hi] as a trial's status: faster or slower when it excludes
    1; no change when it lies within MIN_EFFECT either way (the runs tell that nothing material
    changed); inconclusive when it reaches a material gain or a material loss without excluding 1
    (the runs varied too much to tell: an interval of 0.01-133x had read "no change")."""
    if lo > 1:
        return "faster"
    if hi < 1:
        return "slower"
    return "no change" if lo >= 1 / (1 + MIN_EFFECT) and hi <= 1 + MIN_EFFECT else "inconclusive"


def gist(error: str | None, limit: int = 240) -> str | None:
    """An exception's message in one line: its first line, and its last when the message holds
    a traceback (a DataLoader worker's error carries the worker's whole traceback, and the line
    that says what went wrong is its last)."""
    lines = [x.strip() for x in (error or "").splitlines() if x.strip()]
    if not lines:
        return None
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= limit else text[:limit - 1] + "…"


_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in ')


def output_tail(path: Path, lines: int) -> tuple[list[str] | None, list[str]]:
    """(the last `lines` lines of a run's output file, the script's own innermost frame of its last
    traceback when those lines do not reach it: its "File ..." line and the code line after it,
    led by "..."); (None, []) when the file cannot be read. An error raised deep inside torch
    ends its traceback in torch's frames, and the line that says where the script called it is
    above them."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 64 * 1024))
            text = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None, []
    tail, start = text[-lines:], max(0, len(text) - lines)
    own = [i for i, x in enumerate(text) if (f := _FRAME.match(x)) and frame_kind(f.group(1)) == "user"]
    tracebacks = [i for i, x in enumerate(text) if x.startswith("Traceback")]
    if own and tracebacks and tracebacks[-1] <= own[-1] < start:      # in the last traceback, above the tail
        i = own[-1]
        return tail, ["...", *text[i:min(i + 2, start)], "..."]
    return tail, []


def system_of(run_dir: Path) -> dict:
    """The run's system metrics (analyze/system.py), {} when its samples cannot be read."""
    data = _read_json(run_dir / "samples.json")
    try:
        from perfdoctor.analyze.system import system_metrics
        return system_metrics(data.get("samples") or [], data.get("notes") or [])
    except Exception:
        return {}


def speedup(bases: list[Measured], new: Measured) -> tuple[float, tuple[float, float]]:
    """base step time / new step time with its 95% interval (stats.speedups.speedup). Several
    baseline runs (before and after the trial) are pooled: their steady windows, end to end, for
    the point estimate. Every run here is the same command, so step n does the same work in each
    (when the script seeds its data order and sizes; where it does not, nothing repeats and the
    interval stays as wide): the interval pairs the trial with the baseline by step number, the
    baseline's runs averaged at each step number (the mean of their runs is the baseline's best
    figure for a step's work; pairing the trial with each run in turn would need the per-run
    intervals combined, and each would hold only one run's noise).
    A run whose DataLoader batches were scaled (batch_scale k, applied) trains on k times the
    samples a step: its speed-up is in samples per second, k x the step times' ratio."""
    from perfdoctor.stats.speedups import speedup as _speedup
    ratio, (lo, hi) = _speedup([b.estimate for b in bases], new.estimate, by_step=True)
    k = samples_scale(new) / samples_scale(bases[0])
    return float(ratio * k), (float(lo * k), float(hi * k))


def samples_scale(m: Measured) -> float:
    """How many times the baseline's samples a step `m` trained on: its batch_scale where the
    run applied it, else 1."""
    k = (m.changes or {}).get("batch_scale")
    applied = (m.inject or {}).get("applied") or []
    return float(k) if isinstance(k, (int, float)) and k > 0 and "batch_scale" in applied else 1.0


def loss_drift(base: Measured, new: Measured) -> dict | None:
    """{"drift", "steps", "diverged", "text"} over the common backward calls, or None when either
    run recorded too few losses to compare."""
    a, b = _losses(base), _losses(new)
    n = min(len(a), len(b))
    if n < MIN_LOSSES:
        return None
    a, b = a[:n], b[:n]
    bad = [i for i in range(n) if math.isfinite(a[i]) and not math.isfinite(b[i])]
    if bad:
        return {"drift": None, "steps": n, "diverged": True,
                "text": f"loss became non-finite at backward {bad[0] + 1} (baseline finite)"}
    pairs = [(x, y) for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
    scale = sum(abs(x) for x, _ in pairs) / len(pairs) if pairs else 0.0
    drift = (sum(abs(x - y) for x, y in pairs) / len(pairs) / scale) if scale > 0 else 0.0
    q = pairs[-max(1, len(pairs) // 4):]
    late_a, late_b = sum(x for x, _ in q) / len(q), sum(y for _, y in q) / len(q)
    early_a = sum(x for x, _ in pairs[:len(q)]) / len(q)
    diverged = late_b > late_a + DIVERGE * max(abs(late_a), early_a - late_a)
    # backward passes, not steps (4 a step under accumulation), each loss as backward() got it (divided by
    # the accumulation steps where the script scales it: a user read 1.225 beside its printed 4.9)
    text = (f"loss drift {100 * drift:.1f}% over {n} backward passes; last quarter {late_b:.4g} vs {late_a:.4g}"
            + (" (diverges)" if diverged else ""))
    return {"drift": round(drift, 4), "steps": n, "diverged": diverged, "text": text}


def no_drift_reason(base: Measured, new: Measured) -> str:
    """Why loss_drift had nothing to say: no loss in either run (the script takes its gradients
    in a way inject_loss.py cannot see a loss in), or too few in one of them."""
    a, b = len(_losses(base)), len(_losses(new))
    if not a and not b:
        return ("no loss was recorded in either run (a step's loss is seen in backward() on a scalar, "
                "torch.autograd.grad or torch.func.grad_and_value; torch.func.grad returns none): "
                "its numerics cannot be checked")
    return f"the loss could not be compared with the baseline's ({b} losses against {a}; {MIN_LOSSES} needed)"


def _losses(m: Measured) -> list[float]:
    out = []
    for v in m.inject.get("losses") or []:
        try:
            out.append(float(v))          # "nan"/"inf" strings parse to their floats
        except (TypeError, ValueError):
            out.append(float("nan"))
    return out


def _read_json(path: Path) -> dict:
    try:
        return inputjson.loads(inputjson.read_bytes(path))
    except (OSError, ValueError, RecursionError):
        return {}
