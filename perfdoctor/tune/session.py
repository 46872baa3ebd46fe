"""`perfdoctor tune`: the baseline, the trials, the combination of the winners, within a budget.

1. Baseline: the script as it is (with a trace, so the report's fixes and their expected gains
   are known), measured with the step-time estimator. A baseline that fails ends the tune.
2. Noise: the baseline runs a second time (without a trace) before any trial. Two runs of the
   same command differ by more than either run's interval on a shared machine (the same script
   at 107 and 168 ms/step), so every speed-up interval also spans the run-to-run spread of the
   baseline runs so far (stats.speedups.run_spread, with_run_spread): a trial is faster or
   slower only beyond what rerunning the unchanged script does. When that spread exceeds
   NOISY_RUNS, when other processes used a material share of the cores during a run (the
   baseline or any trial), or when the baseline's own 95% interval is wide (unless its second
   run, paired with the first by step number, agrees within NOISY_CI: the width was the steps'
   own work varying, which repeats in every run), the machine is noisy: from then on the
   baseline is run again after every trial (interleaved), and each trial is compared with the
   steps of the baseline runs just before and after it, pooled, so that a load that comes and
   goes weighs on both sides. Every speed-up interval pairs the trial
   with the baseline by step number (measure.speedup): a script that seeds its per-step work
   (image sizes, data order) repeats it step for step in every run, and it cancels.
3. Trials (plan.py), each a fresh child run in its own directory, as long as the baseline; a trial
   starts only when the time left covers it and the runs it leaves after it (Tuner._reserve), each
   as long as the longest so far but compile trials; the others are skipped for lack of budget.
4. Refinements of the best loader setting.
5. The closing baseline (verify.py): the baseline runs again, and each trial that was compared
   with the baseline runs before it only is compared with those and this one, pooled, so that a
   drift of the machine during the trials weighs on both sides. Trials skipped for the budget
   then run where it covers them now (a faster trial judged inconclusive by the closing run
   frees the runs held back to confirm it: Tuner._skipped_again). Then the winners of the
   different groups combined and measured together. The best setting is the fastest measured
   one whose interval lies above 1.
6. Confirmation: the baseline and then the best setting run once more, back to back (the same
   command differs between runs by more than one run's interval: 72 and 196 ms/step). The
   second run is compared with the fresh baseline and weighed with the first (stats/speedups.
   two_runs); the first was the fastest of several, so the setting stays faster only when the
   second run found a gain and no material loss and both together lie above 1. Otherwise the
   next best is confirmed in turn; the trials leave two runs of the budget for this, and one for
   the baseline run after them (Tuner._reserve). The setting recommended is the fastest
   confirmed one, one measured once (said so) only when none was.
A baseline with too few steady steps once its trace window is left out is run again without a
trace, and every run from then on is twice as long (unless --duration fixed the length).
Every run's files stay in the tune directory: baseline/, NN-<change>/, baseline-N/ (repeats).
"""

from __future__ import annotations

import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from perfdoctor.errors import PerfdoctorError
from perfdoctor.report.sanitize import terminal as _terminal
from perfdoctor.stats.speedups import run_spread, with_run_spread
from perfdoctor.tune import plan as planmod, predict
from perfdoctor.tune.noise import NOISY_CI, NOISY_RUNS, baseline_noise, busy as _busy, own_half as _own_half
from perfdoctor.tune.measure import (LOSS_CHECKED, LOSS_REQUIRED, Measured, _read_json, judged, longer_runs, loss_drift,
                                     no_drift_reason, output_tail, run_once, speedup)
from perfdoctor.tune.verify import CONFIRM_RUNS, Outcome, Verification, _ms, add_reason as _add_reason

RUN_S_MIN, RUN_S_MAX, RUNS_PER_BUDGET = 8.0, 45.0, 8
OUTPUT = "output.log"        # each run's stdout and stderr, in its directory (unless --show-output)
EXIT_SCRIPT_FAILED, EXIT_NOT_MEASURABLE = 1, 3


class TuneFailed(PerfdoctorError):
    """The baseline cannot be tuned: the script failed (exit 1) or could not be measured (exit 3)."""


@dataclass
class TuneOptions:
    argv: list[str]
    module: str | None = None
    budget_s: float = 300.0
    out: Path | None = None
    run_s: float | None = None          # --duration: each run's length
    max_steps: int | None = None
    allow_numerics: bool = False
    allow_compile: bool = False
    rule_dirs: list = field(default_factory=list)
    stacks: bool | None = None          # the baseline's Python stacks: None auto (as `run`), True on, False off
    only: frozenset[str] | None = None  # --only: the trial groups and fix ids to try (plan.only_names)
    show_output: bool = False           # --show-output: every run's output through, not to output.log
    dist: list[str] | None = None       # a job's torchrun options (--nproc-per-node: tune/job.py), None: one process


class Tuner(Verification):
    def __init__(self, opts: TuneOptions, log=None):
        self.o = opts
        self.t0 = time.monotonic()
        self.log = log or (lambda s: print(f"[perfdoctor tune] {_terminal(s)}", file=sys.stderr, flush=True))
        self.dir = opts.out or _default_dir(opts)
        self.run_s = opts.run_s or min(RUN_S_MAX, max(RUN_S_MIN, opts.budget_s / RUNS_PER_BUDGET))
        self.baselines: list[Measured] = []
        self.outcomes: list[Outcome] = []
        self.longest = 0.0
        self.last: Measured | None = None   # the last run launched
        self.closing: Measured | None = None  # the baseline run after the trials (verify.py)
        self.n = 0
        self.noisy = False
        self.noise_head = ""                # how the noise was judged (the machine, the baseline's interval)
        self.spread: float | None = None    # run-to-run spread of the baseline runs (stats.speedups.run_spread)
        self.spread_text = ""
        self.doc: dict = {}
        self.diagnosed: Path | None = None       # the run whose report gives the fixes and predictions
        self.facts: planmod.Facts | None = None
        self.fixes: dict = {}

    # -- the whole tune -------------------------------------------------------------------
    def run(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._baseline()
        first = planmod.plan(self.facts, allow_numerics=self.o.allow_numerics, allow_compile=self.o.allow_compile,
                             only=self.o.only)
        self._room(first)
        for t in first:
            out = self._trial(t)
            if out.run is not None and not out.run.ok and (again := planmod.fallback(t)) is not None:
                self._trial(again)         # the run itself failed (not a loss refusal): try again
        best_loader = self._best("loader")
        workers = [o for o in self.outcomes if o.trial.group == "loader" and "num_workers" in o.trial.changes]
        measured = any(o.status not in ("skipped", "failed") for o in workers)
        failed = any(o.status == "failed" for o in workers)
        for t in planmod.refinements(self.facts, best_loader.trial.changes if best_loader else None, measured,
                                     failed, self.o.only):
            self._trial(t)
        self._close()                        # before the winners are picked: they may change
        self._skipped_again()
        winners = [o for g in dict.fromkeys(o.trial.group for o in self.outcomes) if (o := self._best(g))]
        if len(winners) >= 2:
            combo = {}
            for w in winners:
                combo.update(w.trial.changes)
            self._trial(planmod.Trial(combo, "combined", label="combined: " + planmod.describe(combo)))
        self._confirm_best()

    def _baseline(self) -> None:
        from perfdoctor.diagnose.live import diagnose_run
        from perfdoctor.report.json_out import to_json
        from perfdoctor.diagnose.ranks import diagnose_ranks

        self.log(f"baseline: the script as it is, {self.run_s:.0f} s per run, budget {self.o.budget_s:.0f} s"
                 + ("" if self.o.show_output else f"; each run's output goes to {OUTPUT} in its directory under "
                    f"{self.dir} (--show-output shows it here instead)"))
        res: list = []
        # with Python stacks as `run` records them (auto: where a core is idle), or --only's: without
        # them the fixes the stacks find (PD369, PD351/352/354, PD379) were never raised nor listed
        b = self._launch(self.dir / "baseline", {}, trace=True, result=res,
                         stacks=planmod.baseline_stacks(self.o.stacks, self.o.only))
        if res and b.steps:
            try:
                self.doc = (diagnose_ranks(b.run_dir, self.o.rule_dirs) if self.o.dist
                            else diagnose_run(res[0], self.o.rule_dirs))
                (b.run_dir / "report.json").write_bytes(to_json(self.doc))
                self.diagnosed = b.run_dir
            except Exception as exc:   # no report: trials still run, without predictions
                self.log(f"the baseline's diagnosis failed ({type(exc).__name__}: {exc}); no predictions")
        if b.error and b.error.startswith("the script failed"):
            self._tail(b)
            raise TuneFailed(f"baseline: {b.error}; nothing to tune (run directory {b.run_dir})", EXIT_SCRIPT_FAILED)
        if b.error and not self.o.run_s and self.elapsed() + 2 * self.longest <= self.o.budget_s:
            # too few steady steps once the trace window is left out: every run gets twice as long
            self.run_s *= 2
            self.log(f"baseline: {b.error}; again without a trace, {self.run_s:.0f} s per run from now on")
            b = self._launch(self.dir / "baseline-2", {})
        if b.error:
            raise TuneFailed(f"baseline: {b.error} (run directory {b.run_dir}); "
                             + longer_runs(b, RUNS_PER_BUDGET, self.o.max_steps), EXIT_NOT_MEASURABLE)
        self.baselines.append(b)
        self.fixes = {f.get("id"): f for f in self.doc.get("findings") or [] if f.get("id")}
        self.facts = self._facts(b)
        self.noisy, self.noise_head = baseline_noise(b)
        self.log(f"baseline: {_ms(b.step_s)}/step ({b.estimate.n} steady steps"
                 + (f"; the slowest of {b.ranks} ranks, rank {b.pace_rank}" if b.ranks > 1 else "") + "); verdict "
                 f"{self.verdict_title()}; {self.noise_text}")
        if self._fits(3):                    # a second run, then at least one trial and the run after it
            again = self._repeat_baseline()
            if again is not None:
                self._paired_noise(b, again)
                self.log(f"baseline again: {_ms(again.step_s)}/step; {self.noise_text}")
        if self.spread is None:
            self.spread_text = "run-to-run spread unknown (one baseline run)"

    def verdict_title(self) -> str:
        return predict.verdict_title(self.doc)

    def _facts(self, b: Measured) -> planmod.Facts:
        f = predict.facts(self.doc, self.fixes, b)
        f.cores = max(1, f.cores // b.ranks)           # a job's ranks share the node's cores
        if predict.WORKERS_RULE in self.fixes:
            f.modelled_workers = predict.modelled_workers(self.doc, self.o.rule_dirs)
        return f

    def _prediction(self, t: planmod.Trial) -> tuple[str | None, float | None]:
        """The rule a trial tests and its expected gain: the report's, or for a worker count the
        rule's model at that count (t.gain, which the trial's model check then holds it to)."""
        rule, pred = predict.prediction(t, self.fixes, predict.applicable(self.doc, self.facts, self.o.rule_dirs),
                                        cuda=self.facts.cuda if self.facts is not None else None)
        loader = (self.facts.loader if self.facts is not None else None) or {}
        t.gain = (predict.trial_gain(self.doc, self.o.rule_dirs, rule, t.changes, int(loader.get("num_workers") or 0))
                  if rule in self.fixes else None)
        return rule, (t.gain["expected"] if t.gain else pred)

    def _paired_noise(self, first: Measured, again: Measured) -> None:
        """A wide baseline interval with a quiet machine may be the steps' own work varying (image
        sizes from a seeded generator: 4x between steps), which repeats step for step in every
        run: the two baseline runs, paired by step number (measure.speedup), then agree closely,
        and the machine is quiet after all (an H200 multi-scale CNN: +-13% alone, three runs
        within 0.2%). Judged only where the wide interval alone made the machine noisy."""
        own = _own_half(first)
        if not self.noisy or _busy(first) or _busy(again) or (self.spread or 0) > NOISY_RUNS or own <= NOISY_CI:
            return
        ratio, (plo, phi) = speedup([first], again)
        half = max(phi / ratio - 1, 1 - plo / ratio)
        if half <= NOISY_CI:
            self.noisy = False
            self.noise_head = (f"quiet machine: the baseline's +-{100 * own:.0f}% interval is its steps' own work "
                               f"varying, which repeats step for step (two baseline runs paired by step number: "
                               f"+-{100 * half:.1f}%)")
        else:
            self.noise_head = (f"noisy machine: the baseline's 95% interval is +-{100 * own:.0f}%, and two baseline "
                               f"runs paired by step number differ by +-{100 * half:.1f}%; each trial is compared with "
                               "the baseline runs just before and after it")

    def _update_spread(self) -> None:
        """The run-to-run spread of the baseline runs so far; past NOISY_RUNS the machine is noisy."""
        self.spread = run_spread([x.step_s for x in self.baselines])
        if self.spread is None:
            return
        times = ", ".join(_ms(x.step_s) for x in self.baselines[:4]) + (", ..." if len(self.baselines) > 4 else "")
        self.spread_text = f"baseline runs {times}/step: run-to-run spread +-{100 * self.spread:.1f}%, in every interval"
        if self.spread > NOISY_RUNS and not self.noisy:
            self.noisy = True
            self.noise_head = "noisy machine: each trial is compared with the baseline runs just before and after it"

    @property
    def noise_text(self) -> str:
        return "; ".join(x for x in (self.noise_head, self.spread_text) if x)

    # -- runs ----------------------------------------------------------------------------
    def _launch(self, run_dir: Path, changes: dict, trace: bool = False, result=None,
                stacks: bool | None = False) -> Measured:
        t, got = time.monotonic(), ([] if result is None else result)
        m = run_once(self.o.argv, self.o.module, run_dir, changes, run_s=self.run_s, max_steps=self.o.max_steps,
                     trace=trace, result=got, stacks=stacks, output=None if self.o.show_output else run_dir / OUTPUT,
                     dist=self.o.dist)
        # a traced run's tail (trace_tail) and a compile trial's compiling (57 s, others 31-38 s) are no run to come
        if not changes.get("compile"):
            self.longest = max(self.longest, time.monotonic() - t - (got[0].tail_s if got else 0.0))
        self.last = m
        if _read_json(run_dir / ("ranks.json" if self.o.dist else "run.json")).get("forwarded_signals"):
            raise KeyboardInterrupt           # Ctrl-C / SIGTERM reached the script: stop tuning (exit 130)
        return m

    def _tail(self, m: Measured, lines: int = 12) -> None:
        """The last lines of a failed run's output, when tune kept it in a file: what the script said
        before it failed (a script that exits 1 after printing its error left only "exit code 1")."""
        path = m.run_dir / OUTPUT
        if self.o.show_output or not path.is_file():   # --show-output: it passed through already
            return
        tail, own = output_tail(path, lines)
        if tail is None:
            return
        self.log(f"the last {len(tail)} line(s) of its output ({path}):" if tail else f"it printed nothing ({path})")
        for line in own + tail:
            self.log("  " + line)

    def _next_dir(self, changes: dict, kind: str = "") -> Path:
        """NN-<kind><change>: the directory of the next trial run, numbered in the order run."""
        self.n += 1
        name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", planmod.describe(changes))[:60 - len(kind)]
        return self.dir / f"{self.n:02d}-{kind}{name}"

    def _room(self, trials: list[planmod.Trial]) -> None:
        """Said before the trials: how many of those planned the budget leaves room for, where it
        does not for all (users' 60-120 s budgets on a noisy machine tested one fix, and said so
        only at the end, as "skipped: budget"); the report's first-ranked fix's trial runs first."""
        n = sum(1 for t in trials if t.skip is None)
        per = self.longest * (2 if self.noisy else 1)          # a noisy machine's baseline again after each
        if not n or per <= 0:
            return
        # as _trial decides: a trial runs while it and the runs it leaves (a noisy machine's baseline
        # after it, or a quiet one's closing run) fit; a faster trial's confirmation (two runs) comes out
        # of what is left then ("room for about 0", then a trial ran: it had been counted up front)
        left = self.o.budget_s - self.elapsed() - (0 if self.noisy else self.longest)
        room = max(0, int(left // per))
        if room >= n:
            return
        need = self.budget_for(n)
        self.log(f"the budget leaves room for about {room} of the {n} trials planned (a run takes ~{self.longest:.0f} s"
                 + (", and each trial a baseline run again on this noisy machine" if self.noisy else "")
                 + f"; fewer once a faster one takes {CONFIRM_RUNS} runs to confirm); "
                 f"--budget ~{need:.0f} would run them all")

    def budget_for(self, n: int) -> float | None:
        """About how large a --budget runs `n` more trials: the time spent, and a run as long as
        the longest for each (two on a noisy machine: the baseline again after it), the closing
        baseline run on a quiet machine where none ran (its time is spent where one did), and the
        best setting's confirmation. None when there are none, or no run was timed."""
        if not n or self.longest <= 0:
            return None
        runs = n * (2 if self.noisy else 1) + (0 if self.noisy or self.closing is not None else 1) + CONFIRM_RUNS
        return float(math.ceil((self.elapsed() + runs * self.longest) / 10) * 10)

    def _fits(self, runs: int = 1) -> bool:
        return self.elapsed() + runs * self.longest <= self.o.budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _repeat_baseline(self) -> Measured | None:
        i = 2
        while (self.dir / f"baseline-{i}").exists():
            i += 1
        b = self._launch(self.dir / f"baseline-{i}", {})
        if not b.ok:
            self.log(f"baseline again ({i}): {b.error}")
            return None
        self.baselines.append(b)
        self._update_spread()
        return b

    def _skipped_again(self) -> None:
        """Trials skipped for the budget run after the closing baseline where it now covers them:
        the runs held back for confirming a faster trial are free again when the closing run
        judged it inconclusive (a drift of the machine), and a user's budget is not left unspent
        beside trials said to lack it. Each keeps its place among the outcomes."""
        for i, o in enumerate(list(self.outcomes)):
            if o.status == "skipped" and o.reason == "budget" and self._fits(1 + self._reserve()):
                self.outcomes.remove(o)
                again = self._trial(o.trial)
                self.outcomes.remove(again)
                self.outcomes.insert(i, again)

    def _reserve(self) -> int:
        """The runs a trial leaves in the budget after it: a baseline run after it (a noisy machine's
        after each trial, or the closing run of a quiet one until it ran: the combined trial comes
        after it), and once a trial was faster, its confirmation (a fresh baseline, then it again)."""
        return (1 if self.noisy or self.closing is None else 0) + (CONFIRM_RUNS if self.best() is not None else 0)

    def _judge(self, out: Outcome) -> None:
        """A measured trial's speed-up against its baseline runs (pooled), its interval widened by the
        run-to-run spread so far, and the status that interval gives."""
        out.ratio, ci = speedup(out.bases, out.run)
        out.ci95 = with_run_spread(out.ratio, ci, self.spread)
        out.status = judged(*out.ci95)

    def _trial(self, t: planmod.Trial) -> Outcome:
        t.rule, pred = self._prediction(t)
        offered = bool(t.rule) and all(r in self.fixes for r in t.rule.split("+"))
        out = Outcome(t, "skipped", t.skip, predicted=pred, offered=offered)
        self.outcomes.append(out)
        if t.skip:
            return out
        if not self._fits(1 + self._reserve()):
            out.reason = "budget"
            return out
        before = self.baselines[-1]
        m = out.run = self._launch(self._next_dir(t.changes), t.changes)
        noisy_now = _busy(m) or _busy(before)
        if noisy_now and not self.noisy:
            self.noisy = True
            self.noise_head = (f"other processes used {max(m.other_load or 0, before.other_load or 0):.1f} cores "
                               "during a run: noisy machine, each trial is compared with the baseline runs "
                               "just before and after it")
            self.log(self.noise_text)
        after = self._repeat_baseline() if self.noisy and m.ok and self._fits() else None
        out.bases = [before, after] if after else [before]
        if not m.ok:
            out.status, out.reason = "failed", m.error
        else:
            self._judge(out)
            if LOSS_CHECKED & set(t.changes):
                out.loss = loss_drift(self.baselines[0], m)
                if out.loss is None and LOSS_REQUIRED & set(t.changes):
                    out.status, out.reason = "failed", no_drift_reason(self.baselines[0], m)
                elif out.loss is not None and out.loss["diverged"]:
                    out.status, out.reason = "failed", "refused: " + out.loss["text"]
            missing = [k for k in t.changes if k not in (m.inject.get("applied") or [])]
            if missing and out.status != "failed":
                why = "; ".join(m.inject.get("notes") or []) or "the script never reached it"
                out.status, out.reason = "failed", f"not applied: {', '.join(missing)} ({why})"
        if t.bound and out.status != "failed":
            _add_reason(out, t.bound)
        loads = [x.other_load for x in (before, m, after) if x is not None and _busy(x)]
        if loads:
            _add_reason(out, f"other processes used up to {max(loads):.1f} cores meanwhile")
        self.log(f"{t.label}: {_ms(m.step_s)}/step"
                 + (f" against the baseline's {'/'.join(_ms(b.step_s) for b in out.bases)}, {out.ratio:.2f}x "
                    f"[{out.ci95[0]:.2f}, {out.ci95[1]:.2f}]" if out.ratio else "")
                 + f" -> {out.status}" + (f": {out.reason}" if out.reason else ""))
        if not m.ok and m.error.startswith("the script failed"):
            self._tail(m, 5)
        return out

def _default_dir(o: TuneOptions) -> Path:
    from perfdoctor.collect.launcher import RunConfig, default_run_dir
    d = default_run_dir(RunConfig(argv=o.argv, module=o.module))
    return d.with_name(d.name + "-tune")

