"""Every step of a run, for pictures: its wall time, its data wait, and what the estimator made of it.

step_series(steps, first, n) -> {"first_step", "k", "ms", "wait_ms", "max_ms", "kind", "steady"}
or None without timed steps. `first`, `n`: the steady window as stats/steptime.py found it
(indices into `steps`).

- ms: each step's wall time; wait_ms: its time inside DataLoader __next__;
- kind: "profiled" (inside the torch.profiler window), "perturbed" (right after the trace
  export), "steady" (in the steady window) or "outside" (warm-up, transients, the partial burst
  cycle at the end);
- steady: [a, b], the bars (indices) of the steady window's first and last steps.

A run of more than MAX_BARS steps is drawn in bins of k consecutive steps: a bin's `ms` and
`wait_ms` are its wall time and wait over its steps (the mean step, never a median: the long
steps carry the waiting) and `max_ms` its longest step, so a long step every N steps stays in
sight. A bin holding a profiled step is "profiled", else one holding a perturbed step
"perturbed", else "steady" when all its steps are, else "outside". `max_ms` is None at k = 1.
"""

from __future__ import annotations

from perfdoctor.analyze.stepwait import positive

MAX_BARS = 600
ORDER = ("profiled", "perturbed", "outside", "steady")      # a bin takes the first kind it holds


def _kind(s: dict, steady: bool) -> str:
    return "profiled" if s.get("profiled") else "perturbed" if s.get("perturbed") else "steady" if steady else "outside"


def step_series(steps: list[dict], first: int, n: int) -> dict | None:
    rows = [(i, s) for i, s in enumerate(steps) if isinstance(s.get("dur"), (int, float)) and s["dur"] > 0]
    if not rows:
        return None
    k = -(-len(rows) // MAX_BARS)
    out: dict = {"first_step": rows[0][1].get("step") if isinstance(rows[0][1].get("step"), int) else None,
                 "k": k, "ms": [], "wait_ms": [], "max_ms": [] if k > 1 else None, "kind": [], "steady": None}
    bars_in_window = []
    for b in range(0, len(rows), k):
        chunk = rows[b:b + k]
        durs = [s["dur"] for _, s in chunk]
        kinds = {_kind(s, first <= i < first + n) for i, s in chunk}
        out["ms"].append(round(1e3 * sum(durs) / len(durs), 4))
        out["wait_ms"].append(round(1e3 * sum(min(positive(s.get("wait")), s["dur"]) for _, s in chunk) / len(durs), 4))
        if k > 1:
            out["max_ms"].append(round(1e3 * max(durs), 4))
        out["kind"].append(next(x for x in ORDER if x in kinds))
        if any(first <= i < first + n for i, _ in chunk):
            bars_in_window.append(len(out["ms"]) - 1)
    if bars_in_window:
        out["steady"] = [bars_in_window[0], bars_in_window[-1]]
    return out
