"""`perfdoctor gate`: is the current run slower than the baseline run(s)?

Decision rules (documented in docs/commands.md, "How it decides"):

Step time: each run's steady-state step time (perfdoctor.stats.steptime: wall time of the
detected steady window / its steps, never a median, no long step dropped as an outlier).
- one baseline (within-run noise only, the weaker test): ratio = current / baseline step time,
  with the 95% CI of a moving-block bootstrap of both steady windows (blocks longer than the
  burst cycle), paired by step number when both runs ran the same command (gate/load.py
  same_command: the same blocks of step numbers on both sides, so work that repeats step for
  step cancels; stats.speedups.speedup). Regression when the ratio is at least 1 + --min-effect AND the CI lies above 1;
  improvement symmetrically; a change of at least --min-effect whose CI includes 1 is
  inconclusive; otherwise pass.
- several baselines (run-to-run noise): center = median of the baselines' step times, spread =
  scaled MAD of them (1.4826 x MAD). Regression when the current step time exceeds the center
  by more than --min-effect AND by more than --noise-k (3) spreads AND is slower than every
  baseline; improvement symmetrically; otherwise pass.
- fewer than --min-steps (10) steady steps, or a steady window too short for its correlation
  (the estimator's `conclusive`), in the current run (or in every baseline): inconclusive. No
  step records (a bare report.json): inconclusive. One exception needs no interval: when every
  steady step of the current run is slower than every steady step of the baselines by at least
  --min-effect (or faster, for an improvement), no step overlaps and the change is called.
- environment fingerprints differ (device, torch, CPU count, batch size): absolute times are
  "not comparable"; shares and the verdict are gated. Different commands (gate/load.py
  command_key) are gated as usual, and every output says so in one line (`commands.warning`).
- other processes used more than max(--max-other-load (0.25) x CPU count, 0.5) cores during the
  current or a baseline run (system.cpu_busy_share x machine.cpu_count minus the trainer's and
  the loader workers' CPU): step time is inconclusive (a noisy neighbour, not the code).

A current run whose script failed (report.labels.script_failure) fails the gate (`failed`, exit 1).

Shares (share.input = exposed data wait, gpu.idle_share = idle device), gated whatever the
fingerprint: regression when the share grows by at least --min-share (0.10 = 10 points) AND
(several baselines) by more than --noise-k spreads of the baselines' shares, or (one baseline,
step records on both sides) the 95% block-bootstrap CI of the change of the steady windows'
data-wait share (wait / wall time) lies above 0. A verdict change is a warning, never a failure
on its own. gate/shares.py: a share that moved while its time per traced step did not follow
passes; baselines too far apart to tell a change (a threshold of 100 points) are inconclusive.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from perfdoctor.gate.load import (RunData, busy_texts, command_warning, fingerprint_diff, load_run, same_command,
                                  bound_words, settings_diff)
from perfdoctor.gate.rows import (EXIT, FAILED, IMPROVEMENT, INCONCLUSIVE, NOT_COMPARABLE, PASS, REGRESSION, SCRIPT,
                                  SHARES, STEP_TIME, GateOptions, Row)
from perfdoctor.gate.shares import share_row
from perfdoctor.report.labels import script_failure
from perfdoctor.report.values import s_as_ms
from perfdoctor.stats import speedups
from perfdoctor.stats.speedups import speedup
from perfdoctor.stats.steptime import StepEstimate


@dataclass
class GateResult:
    outcome: str
    reason: str
    rows: list
    method: str
    notes: list
    fingerprint: dict
    commands: dict = field(default_factory=dict)   # current, baselines, differ, warning (one line or None)

    @property
    def warning(self) -> str | None:
        """The line every output prints when the runs ran different commands."""
        return self.commands.get("warning")

    def exit_code(self, strict: bool = False) -> int:
        code = EXIT[self.outcome]
        return 1 if strict and code == 3 else code

    def to_dict(self) -> dict:
        return {"outcome": self.outcome, "reason": self.reason, "method": self.method,
                "exit_code": self.exit_code(), "rows": [asdict(r) for r in self.rows],
                "notes": self.notes, "fingerprint": self.fingerprint, "commands": self.commands}


def gate_paths(current, baselines, **options) -> GateResult:
    """Gate a run (directory or report JSON) against one or more baselines. Options: see GateOptions."""
    from perfdoctor.errors import PerfdoctorError
    if not baselines:
        raise PerfdoctorError("give at least one --baseline")
    return gate_runs(load_run(current), [load_run(b) for b in baselines], GateOptions(**options))


def gate_runs(cur: RunData, bases: list[RunData], opt: GateOptions | None = None) -> GateResult:
    opt = opt or GateOptions()
    notes: list[str] = []
    diffs: list[str] = []
    unknown: set[str] = set()
    for b in bases:
        d, u = fingerprint_diff(b.fingerprint, cur.fingerprint)
        diffs += [x for x in d if x not in diffs]
        unknown.update(u)
    notes += [n for r in (*bases, cur) for n in (r.read_note, r.schema_note) if n]
    seen = {k for b in bases for k in b.flags}
    unknown_before = set.intersection(*(b.unevaluated for b in bases)) if bases else set()   # none could raise them
    new = [f"{k} ({v})" for k, v in cur.flags.items() if k not in seen | unknown_before and not v.startswith("low")]
    if new:    # not gated (a flag is no measured slowdown), but a CI reader should see it
        notes.append("new flags in the current run: " + "; ".join(new))
    if unknown:
        notes.append("environment not fully known (" + ", ".join(sorted(unknown)) + "): compared on what is known")
    settings = [x for b in bases for x in settings_diff(b, cur)]
    if settings:
        notes.append("the run's settings differ from the baseline's: " + "; ".join(dict.fromkeys(settings))
                     + " (gated all the same: it may be the change under test)")
    rows: list[Row] = []
    method = ("within-run (one baseline: weaker evidence, as two runs of one command can differ by more; 3 "
              "baselines weigh the spread between runs)") if len(bases) == 1 else (
        "run-to-run (2 baselines: a spread from two runs can be small by chance; 3 or more weigh it)"
        if len(bases) == 2 else f"run-to-run ({len(bases)} baselines)")
    if diffs:
        why = ("environment differs (" + "; ".join(diffs) + "): absolute times not compared, "
               "gating shares and verdict only")
        notes.append(why)
        rows.append(Row(STEP_TIME, _ms_med(bases), _ms_one(cur), "", "", NOT_COMPARABLE, why))
    else:
        # a report without the machine's core count (hand-edited) keeps the half-core floor
        busy = busy_texts([("the current run", cur), *((b.label, b) for b in bases)], opt.max_other_load)
        if busy:
            why = ("the machine was busy with other work (" + "; ".join(busy) + " used by other processes): "
                   "step times are not comparable, rerun on a quiet machine")
            rows.append(Row(STEP_TIME, _ms_med(bases), _ms_one(cur), "", "", INCONCLUSIVE, why))
        else:
            rows.append(_step_time(cur, bases, opt, notes))
    for key, label in SHARES:
        r = share_row(cur, bases, key, label, opt)
        if r is not None:
            rows.append(r)
    rows.append(_verdict(cur, bases))
    if ended := script_failure(cur.doc.get("run")):   # an early crash reads as a speed-up
        rows.insert(0, Row(SCRIPT, "", ended, "", "exit code 0", FAILED,
                           f"the current run's script {ended}: its steps are not the job's, fix the failure and gate again"))
    notes += [f"{b.label}: the script {e}: its steps cover the run up to that failure"
              for b in bases if (e := script_failure(b.doc.get("run")))]
    outcome = _outcome(rows)
    differ, warning = command_warning(bases, cur)
    return GateResult(outcome, _reason(outcome, rows, cur), rows, method, notes,
                      {"current": cur.fingerprint, "baselines": [b.fingerprint for b in bases],
                       "differs": diffs, "unknown": sorted(unknown)},
                      {"current": cur.command, "baselines": [b.command for b in bases], "differ": differ,
                       "warning": warning})


def _step_s(r: RunData) -> float | None:
    """The run's steady step time: from its step records, else its report's run.step_time_ms."""
    if r.steady is not None:
        return r.steady.step_s
    v = r.time_ms("run.step_time_ms")
    return None if v is None else v / 1e3


def _secs(x: float | None) -> str:
    return s_as_ms(x, "unknown")


def _ms_one(r: RunData) -> str:
    return _secs(_step_s(r))


def _ms_med(rs: list[RunData]) -> str:
    vs = [v for v in map(_step_s, rs) if v is not None]
    return "unknown" if not vs else _secs(float(np.median(vs)))


def _step_time(cur: RunData, bases: list[RunData], opt: GateOptions, notes: list[str]) -> Row:
    name = STEP_TIME
    if cur.steps is None:
        return Row(name, _ms_med(bases), _ms_one(cur), "", "", INCONCLUSIVE,
                   "no step records for the current run (give its run directory, not only report.json)")
    cs = cur.steady
    notes.append(f"current: {cs.describe()}")
    bss, brs = [], []
    for b in bases:
        if b.steps is None:
            notes.append(f"baseline {b.label}: no step records, not used for step time")
            continue
        s = b.steady
        notes.append(f"baseline {b.label}: {s.describe()}")
        if s.n < opt.min_steps or not s.conclusive:
            notes.append(f"baseline {b.label}: {_too_few(s, opt)}, not used for step time")
            continue
        bss.append(s)
        brs.append(b)
    need = f">= {opt.min_steps} steady steps"
    if cs.n < opt.min_steps or not cs.conclusive or not bss:
        apart = _apart(cs, [b.steady for b in bases if b.steps is not None], opt)
        if apart is not None:
            return apart
    if cs.n < opt.min_steps or not cs.conclusive:
        return Row(name, "", _secs(cs.step_s), "", need, INCONCLUSIVE,
                   f"the current run: {_too_few(cs, opt)}", {"current_steps": cs.n})
    if not bss:
        return Row(name, "", _secs(cs.step_s), "", need, INCONCLUSIVE,
                   f"no baseline with a conclusive steady window of {opt.min_steps} or more steps")
    if len(bss) == 1:
        return _within(name, bss[0], cs, opt, by_step=same_command(brs[0], cur))
    return _across(name, bss, cs, opt)


def _apart(c: StepEstimate, bss: list[StepEstimate], opt: GateOptions) -> Row | None:
    """Regression (improvement) without an interval: every steady step of the current run is at
    least 1 + min_effect times slower (faster) than every steady step of the baselines, each side
    with min_steps steps or more. Correlated or short windows cannot bias that: no step overlaps."""
    bss = [b for b in bss if b.n >= opt.min_steps and len(b.durs)]
    if c.n < opt.min_steps or not len(c.durs) or not bss:
        return None
    cd = c.durs * c.scale
    bd = np.concatenate([b.durs * b.scale for b in bss])
    k = 1 + opt.min_effect
    center = float(np.median([b.step_s for b in bss]))
    base, curs, chg = _secs(center), _secs(c.step_s), f"{100 * (c.step_s / center - 1):+.1f}%"
    values = {"current_step_s": c.step_s, "baseline_step_s": [b.step_s for b in bss], "current_min_s": float(cd.min()),
              "current_max_s": float(cd.max()), "baseline_min_s": float(bd.min()), "baseline_max_s": float(bd.max()),
              "current_steps": c.n, "baseline_steps": int(len(bd))}
    thr = f"±{100 * opt.min_effect:.0f}%, no overlap"
    # named as every other step-time reason is ("regression: step time ..."): a CI log's one line
    why = (f"step time {base} -> {curs} ({chg}): every one of the current run's {c.n} steady steps is {{}} than "
           f"every one of the baselines' {len(bd)} "
           f"by {100 * opt.min_effect:.0f}% or more ({{}}; too few or too correlated steps for an interval, "
           "but no step overlaps)")
    if cd.min() >= k * bd.max():
        return Row(STEP_TIME, base, curs, chg, thr, REGRESSION,
                   why.format("slower", f"fastest {_secs(float(cd.min()))} vs slowest {_secs(float(bd.max()))}"), values)
    if k * cd.max() <= bd.min():
        return Row(STEP_TIME, base, curs, chg, thr, IMPROVEMENT,
                   why.format("faster", f"slowest {_secs(float(cd.max()))} vs fastest {_secs(float(bd.min()))}"), values)
    return None


def _too_few(s: StepEstimate, opt: GateOptions) -> str:
    if s.n < opt.min_steps:
        return f"only {s.n} steady-state steps (need {opt.min_steps})"
    return s.reason or "inconclusive steady window"


def _within(name: str, b: StepEstimate, c: StepEstimate, opt: GateOptions, by_step: bool = False) -> Row:
    faster, (flo, fhi) = speedup(b, c, level=opt.level, by_step=by_step)       # baseline / current
    ratio, lo, hi = 1 / faster, 1 / fhi, 1 / flo              # current / baseline
    change = ratio - 1
    values = {"baseline_step_s": b.step_s, "current_step_s": c.step_s, "ratio": ratio, "ci95": [lo, hi],
              "baseline_ci95": list(b.ci95), "current_ci95": list(c.ci95),
              "baseline_median_s": b.median_s, "current_median_s": c.median_s,
              "baseline_steps": b.n, "current_steps": c.n, "blocks": [b.block, c.block]}
    thr = f"±{100 * opt.min_effect:.0f}% & CI"
    ci = f"CI{100 * opt.level:.0f} of the ratio {lo:.2f}-{hi:.2f}"
    base, curs, chg = _secs(b.step_s), _secs(c.step_s), f"{100 * change:+.1f}%"
    if change >= opt.min_effect:
        if lo > 1:
            return Row(name, base, curs, chg, thr, REGRESSION,
                       f"step time {base} -> {curs} ({chg}; {ci}; one baseline: within-run noise only)", values)
        return Row(name, base, curs, chg, thr, INCONCLUSIVE,
                   f"step time {chg} but not beyond the within-run noise ({ci})", values)
    if change <= -opt.min_effect:
        if hi < 1:
            return Row(name, base, curs, chg, thr, IMPROVEMENT, f"step time {base} -> {curs} ({chg}; {ci})", values)
        return Row(name, base, curs, chg, thr, INCONCLUSIVE,
                   f"step time {chg} but not beyond the within-run noise ({ci})", values)
    return Row(name, base, curs, chg, thr, PASS, f"step time {chg}, within ±{100 * opt.min_effect:.0f}% ({ci})",
               values)


def _across(name: str, bss: list[StepEstimate], c: StepEstimate, opt: GateOptions) -> Row:
    times = np.array([s.step_s for s in bss])
    center, spread = float(np.median(times)), speedups.spread(times)
    change = c.step_s / center - 1
    noise = opt.noise_k * spread / center
    need = max(opt.min_effect, noise)
    values = {"baseline_step_s": times.tolist(), "baseline_center_s": center, "baseline_spread_s": spread,
              "current_step_s": c.step_s, "current_ci95": list(c.ci95), "current_median_s": c.median_s,
              "change": change, "threshold": need, "current_steps": c.n}
    base = f"{_secs(center)} (x{len(bss)}, ±{_secs(spread)})"
    curs, chg = _secs(c.step_s), f"{100 * change:+.1f}%"
    thr = f"±{100 * need:.1f}%"
    if change > need and c.step_s > times.max():
        return Row(name, base, curs, chg, thr, REGRESSION,
                   f"step time {_secs(center)} -> {curs} ({chg}), beyond the baselines' run-to-run spread", values)
    if change < -need and c.step_s < times.min():
        return Row(name, base, curs, chg, thr, IMPROVEMENT, f"step time {_secs(center)} -> {curs} ({chg})", values)
    return Row(name, base, curs, chg, thr, PASS,
               f"step time {chg}, within {thr} (max of {100 * opt.min_effect:.0f}% and {opt.noise_k:g}x "
               "the baselines' spread)", values)


def _verdict(cur: RunData, bases: list[RunData]) -> Row:
    """The verdict in the reports' words (a CPU run's "device" is compute-bound (CPU), not a GPU's);
    values: the bounds themselves."""
    common = Counter(b.verdict for b in bases).most_common(1)[0][0]
    was = bound_words(next(b for b in bases if b.verdict == common))
    c, now = cur.verdict, bound_words(cur)
    values = {"baseline": common, "current": c}
    if c == common:
        return Row("verdict", was, now, "", "", PASS, f"verdict unchanged ({now})", values)
    return Row("verdict", was, now, "changed", "", "warning", f"verdict {was} -> {now}", values)


def _outcome(rows: list[Row]) -> str:
    st = [r.status for r in rows]
    if FAILED in st:
        return FAILED
    if REGRESSION in st:
        return REGRESSION
    if NOT_COMPARABLE in st:
        return NOT_COMPARABLE
    if INCONCLUSIVE in st:
        return INCONCLUSIVE
    if IMPROVEMENT in st:
        return IMPROVEMENT
    return PASS


def _reason(outcome: str, rows: list[Row], cur: RunData) -> str:
    verdict = next((r for r in rows if r.metric == "verdict"), None)
    hits = [r for r in rows if r.status == outcome and r.metric != "verdict"]
    if outcome == PASS:
        text = "no regression: " + "; ".join(r.reason for r in rows if r.status == PASS and r.metric != "verdict")
    else:
        text = "; ".join(r.reason for r in hits)
    if verdict is not None and verdict.status == "warning":
        text += f"; the verdict changed, now {bound_words(cur)}"
    return text
