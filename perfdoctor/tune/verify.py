"""After tune's trials (tune/session.py, steps 5 and 6): the baseline once more, the trials that
were compared with baseline runs before them only judged again, and the best setting run a
second time.

The closing baseline. On a machine that looked quiet the baseline runs only before the trials,
and each trial is compared with the last of those runs; a machine whose speed drifts during the
tune moves every trial alike (a tune of a CNN on this project's 2-core VM read all six trials
0.77-0.82x, "slower": the unchanged script had slowed as much by then). So once the trials and
the loader's refinements are done the baseline runs again (the trials keep a run of the budget
for it), and each trial compared with earlier runs only is compared with those and this one,
pooled: a drift between them weighs on both sides about alike, and it widens every interval
through the run-to-run spread of the baseline runs, which now holds the closing run. Then every
measured trial is judged again with that spread (an interleaved trial's interval had the spread
of the runs before it), its status following; a trial refused for its loss or for a change not
applied stays failed. On a noisy machine each trial already has a baseline run after it, and
only one the budget left without one gets the closing run. The winners combined are picked
after this, and the combined trial runs after the closing run, compared with it.

Confirmation: a fresh baseline and then the best setting once more, back to back (session.py,
step 6). A baseline run shared by the two comparisons would make them look more independent
than they are (stats.speedups.two_runs weighs them as independent): only a best not compared
with the closing run (interleaved on a noisy machine) starts from it, when it was the last run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfdoctor.report.values import s_as_ms
from perfdoctor.stats.speedups import two_runs, with_run_spread
from perfdoctor.tune import plan as planmod
from perfdoctor.tune.measure import MIN_EFFECT, Measured, judged, speedup
from perfdoctor.tune.noise import busy

CONFIRM_RUNS = 2             # a fresh baseline and the best setting again


@dataclass
class Outcome:
    trial: planmod.Trial
    status: str                          # faster | slower | no change | inconclusive | failed | skipped
    reason: str | None = None
    run: Measured | None = None
    bases: list = field(default_factory=list)   # the baseline runs it was compared with
    ratio: float | None = None
    ci95: tuple | None = None
    predicted: float | None = None
    offered: bool = False                # the baseline's report has the fix (each one, combined) it tests
    loss: dict | None = None
    confirm: dict | None = None          # the second run of a best setting: dir, speedup, ci95


def add_reason(o: Outcome, text: str) -> None:
    o.reason = f"{o.reason}; {text}" if o.reason else text


def _judgement(o: Outcome) -> str:
    return f"{o.ratio:.2f}x [{o.ci95[0]:.2f}, {o.ci95[1]:.2f}] {o.status}"


def _ms(s: float | None) -> str:
    return s_as_ms(s, "?")


class Verification:
    """The Tuner's steps after its trials (module docstring); mixed into tune.session.Tuner."""

    def _close(self) -> None:
        """The closing baseline, each trial compared with baseline runs before it only judged again
        against those and it, and every measured trial's interval widened by the spread of all the
        baseline runs so far (module docstring). No closing run when no trial needs one or none fits."""
        alone = [o for o in self.outcomes if o.run is not None and o.run.ok and len(o.bases) == 1
                 and o.status != "failed"]
        if alone and self._fits(1):
            start, noisy = alone[0].bases[0].step_s, self.noisy
            c = self._repeat_baseline()
            if c is not None:
                self.closing = c
                drift = c.step_s / start - 1
                if not noisy and self.noisy:     # the closing run's spread made the machine noisy: a drift
                    self.noise_head = (f"the machine drifted during the trials: the baseline ran at {_ms(start)}/step "
                                       f"before them and {_ms(c.step_s)}/step after ({100 * drift:+.1f}%); each "
                                       "trial is compared with the baseline runs before and after it")
                for o in alone:
                    o.bases = [*o.bases, c]
                    if busy(c):
                        add_reason(o, f"other processes used {c.other_load:.1f} cores during the baseline run "
                                      "after the trials")
                self.log(f"baseline after the trials: {_ms(c.step_s)}/step ({100 * drift:+.1f}% from the run before "
                         f"them); {len(alone)} trial(s) compared with both, pooled; {self.noise_text}")
        changed = []
        for o in self.outcomes:
            if o.run is None or not o.run.ok or o.status == "failed" or not o.bases:
                continue
            was = _judgement(o)
            self._judge(o)
            if was != _judgement(o):
                changed.append(f"{o.trial.label} {was} -> {_judgement(o)}")
        if changed:
            self.log("judged again against the baseline runs around them and the spread of all of them: "
                     + "; ".join(changed))

    def _confirm_best(self) -> None:
        while (best := self._unconfirmed_best()) is not None and self._fits(1 if self._reuse(best) else CONFIRM_RUNS):
            self._confirm(best)
        for o in self.outcomes:              # the other "faster" rows rest on one run: say so
            if o.status == "faster" and o.confirm is None and not o.trial.bound:
                add_reason(o, "one run, not confirmed")

    def _confirm(self, best: Outcome) -> None:
        """Run the baseline (unless _reuse), then the best setting, once more and compare the two
        (module docstring)."""
        before = self.closing if self._reuse(best) else self._repeat_baseline()
        if before is None:                   # the baseline failed this time: nothing to compare with
            best.confirm = {"dir": None, "speedup": None, "ci95": None}
            best.status, best.reason = "failed", "the baseline failed when run again to confirm this"
            return
        m = self._launch(self._next_dir(best.trial.changes, "confirm-"), best.trial.changes)
        if not m.ok:
            best.confirm = {"dir": str(m.run_dir), "speedup": None, "ci95": None}
            best.status, best.reason = "failed", f"a second run failed: {m.error}"
        else:
            r2, ci2 = speedup([before], m)
            lo2, hi2 = with_run_spread(r2, ci2, self.spread)
            best.confirm = {"dir": str(m.run_dir), "speedup": r2, "ci95": (lo2, hi2), "step_time_s": m.step_s,
                            "baseline_step_time_s": before.step_s}
            best.ratio, best.ci95, consistent = two_runs(best.ratio, best.ci95, r2, (lo2, hi2))
            second = f"{r2:.2f}x [{lo2:.2f}, {hi2:.2f}]"
            both = f"both runs: {best.ratio:.2f}x [{best.ci95[0]:.2f}, {best.ci95[1]:.2f}]"
            # the first run was picked as the fastest of several (its estimate leans high): the
            # second run confirms when it found a gain and no material loss, and both together
            # lie above 1
            if not consistent and best.ci95[0] > 1:
                # faster both times, by amounts the intervals do not share (a 34x [27, 44] trial, then
                # 15x): the gain is measured, its size is not; the interval spans both runs
                add_reason(best, f"a second run measured {second}, beyond the first run's interval: faster "
                                 f"both times, by how much the runs disagree; both runs: {best.ratio:.2f}x "
                                 f"[{best.ci95[0]:.2f}, {best.ci95[1]:.2f}]")
            elif not consistent:
                best.status = "inconclusive"
                best.reason = f"a second run measured {second}, beyond the first run's interval: the runs disagree"
            elif r2 > 1 and lo2 >= 1 / (1 + MIN_EFFECT) and best.ci95[0] > 1:
                add_reason(best, f"a second run: {second}; {both}")
            else:
                best.status = "inconclusive" if judged(lo2, hi2) == "inconclusive" else "no change"
                best.reason = f"a second run measured {second}: not confirmed"
            # as a trial's: other processes' load in either run is what the user reads next
            # (a confirm run at 760 ms/step for a 20 ms step, 0.8 of 2 cores taken, said only
            # "the runs disagree")
            loads = [x.other_load for x in (before, m) if busy(x)]
            if loads:
                add_reason(best, f"other processes used up to {max(loads):.1f} cores during the second run")
        self.log(f"{best.trial.label}, again: {_ms(m.step_s)}/step -> {best.status}"
                 + (f": {best.reason}" if best.reason else ""))

    def _reuse(self, best: Outcome) -> bool:
        """The closing run was the last run launched and `best` was not compared with it (it ran
        between baseline runs of a noisy machine): it is the fresh baseline of best's second run.
        A trial compared with it gets a baseline run of its own: the two comparisons stay independent."""
        c = self.closing
        return c is not None and self.last is c and not any(x is c for x in best.bases)

    def _unconfirmed_best(self) -> Outcome | None:
        """The fastest faster setting not yet run a second time that measured faster than every
        confirmed one (the next to confirm), or None."""
        done = max((o.ratio for o in self.outcomes if o.status == "faster" and (o.confirm or {}).get("speedup")),
                   default=0.0)
        cands = [o for o in self.outcomes if o.status == "faster" and not o.trial.bound and o.confirm is None
                 and o.ratio > done]
        return max(cands, key=lambda o: o.ratio, default=None)

    def _best(self, group: str | None = None) -> Outcome | None:
        cands = [o for o in self.outcomes
                 if o.status == "faster" and not o.trial.bound and (group is None or o.trial.group == group)]
        return max(cands, key=lambda o: o.ratio, default=None)

    def best(self) -> Outcome | None:
        """The setting to recommend: the fastest confirmed in two runs, if any; else the fastest
        measured once (said unconfirmed). A single run against the first baseline does not beat
        a setting faster in both runs."""
        confirmed = [o for o in self.outcomes if o.status == "faster" and (o.confirm or {}).get("speedup")]
        return max(confirmed, key=lambda o: o.ratio, default=None) or self._best()
