"""Calibration of the report's gains against measured ones, through `perfdoctor tune`'s trials.

    python bench/bench_gains.py [--budget 240] [--only NAME] [--allow-numerics] [--allow-compile] [-o FILE]

For each example it runs `perfdoctor tune` (the baseline's report ranks the fixes; tune measures
the zero-code change that each fix stands for), then prints, for every fix the report ranked
and every trial that tests a fix: the report's expected speed-up, its ceiling (Amdahl bound),
the measured speed-up with its 95% interval, and the errors:
- points: 100 x (1/expected - 1/measured), the error in the predicted step time as points of the
  baseline step (positive: the report was optimistic);
- gain error: |expected - measured| / (measured - 1), the issue's goal being <= 25% of the
  measured gain for every fix that has a model (n/a when nothing was measured faster).
A fix with a speed claim but no zero-code trial (offline preprocessing, faster hardware...) is
listed as such; a trial whose fix the report did not rank is listed with no prediction.

Numbers depend on the machine and on its load: tune repeats the baseline around each trial when
other processes take the cores, but a shared 2-core VM still moves by 10-20% between minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

EXAMPLES = {
    "cpu_bound_loader": ["examples/cpu_bound_loader.py", "--workers", "0"],
    "io_bound_loader": ["examples/io_bound_loader.py", "--workers", "0"],
    "overhead_bound": ["examples/overhead_bound.py"],
    "compute_bound": ["examples/compute_bound.py", "--steps", "100000"],
    "checkpoint_every_step": ["examples/checkpoint_every_step.py", "--every", "1", "--steps", "100000"],
}


def calibrate(name: str, argv: list[str], args, root: Path) -> list[dict]:
    from perfdoctor.tune.session import TuneOptions, Tuner

    t = Tuner(TuneOptions(argv=[str(REPO / argv[0]), *argv[1:]], budget_s=args.budget, out=root / name,
                          allow_numerics=args.allow_numerics, allow_compile=args.allow_compile))
    t.run()
    rows, tested = [], set()
    ran = [o for o in t.outcomes if o.ratio is not None and o.trial.rule]
    for rid, fix in t.fixes.items():
        g = fix.get("gain") or {}
        if g.get("expected") is None and g.get("ceiling") is None:
            continue                   # advice without a speed claim: nothing to calibrate
        trials = [o for o in ran if o.trial.rule == rid]
        best = max(trials, key=lambda o: o.ratio, default=None)
        tested.add(rid)
        planned = [o for o in t.outcomes if o.trial.rule == rid]
        note = None if trials else ("trial " + (planned[0].status + ": " + (planned[0].reason or "")
                                                if planned else "none: no zero-code change for this fix"))
        rows.append(_row(name, rid, g, best, note))
    for o in ran:                      # trials whose fix the report did not rank (prediction: none)
        if o.trial.rule not in tested:
            tested.add(o.trial.rule)
            best = max((x for x in ran if x.trial.rule == o.trial.rule), key=lambda x: x.ratio)
            rows.append(_row(name, o.trial.rule, {}, best, "not ranked by the report"))
    baseline = t.baselines[0]
    print(f"{name}: baseline {baseline.step_s * 1e3:.1f} ms/step, verdict "
          f"{(t.doc.get('verdict') or {}).get('bound')}, {t.noise_text}", file=sys.stderr)
    return rows


def _row(example: str, rid: str, g: dict, o, note: str | None) -> dict:
    exp, ceil = g.get("expected"), g.get("ceiling", g.get("bound"))
    meas = o.ratio if o else None
    row = {"example": example, "rule": rid, "change": o.trial.label if o else None, "expected": exp,
           "ceiling": ceil, "measured": meas, "ci95": list(o.ci95) if o else None,
           "status": o.status if o else None, "note": note, "points": None, "gain_error": None}
    if exp and meas:
        row["points"] = 100 * (1 / exp - 1 / meas)
        row["gain_error"] = abs(exp - meas) / (meas - 1) if meas > 1 and o.status == "faster" else None
    return row


def show(rows: list[dict]) -> None:
    def f(x, fmt):
        return "-" if x is None else fmt.format(x)
    head = f"{'example':<18} {'fix':<6} {'change':<34} {'expected':>8} {'ceiling':>8} {'measured':>9} " \
           f"{'95% CI':>11} {'points':>7} {'gain err':>8}  note"
    print(head)
    print("-" * len(head))
    for r in rows:
        ci = f"{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}" if r["ci95"] else "-"
        print(f"{r['example']:<18} {r['rule']:<6} {(r['change'] or '-')[:34]:<34} {f(r['expected'], '{:.2f}x'):>8} "
              f"{f(r['ceiling'], '{:.2f}x'):>8} {f(r['measured'], '{:.2f}x'):>9} {ci:>11} "
              f"{f(r['points'], '{:+.1f}'):>7} {f(r['gain_error'], '{:.0%}'):>8}  "
              f"{r['status'] or ''}{'; ' + r['note'] if r['note'] else ''}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=240, help="tune budget per example, seconds")
    ap.add_argument("--only", action="append", choices=sorted(EXAMPLES), help="run only these examples")
    ap.add_argument("--allow-numerics", action="store_true")
    ap.add_argument("--allow-compile", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("perfdoctor-runs/bench-gains"))
    ap.add_argument("-o", "--output", type=Path, help="also write the rows as JSON")
    args = ap.parse_args()
    rows = []
    for name in args.only or list(EXAMPLES):
        try:
            rows += calibrate(name, EXAMPLES[name], args, args.out)
        except Exception as exc:   # one example failing does not end the calibration
            print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    show(rows)
    if args.output:
        args.output.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
