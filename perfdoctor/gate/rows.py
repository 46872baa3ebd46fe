"""What a gate decides, row by row: the statuses and their exit codes, the options, and a row of
the gate's table (gate.py assembles them; shares.py makes the share rows)."""

from __future__ import annotations

from dataclasses import dataclass, field

from perfdoctor.analyze.system import SHARED_SHARE
from perfdoctor.stats import steptime

PASS, REGRESSION, IMPROVEMENT, INCONCLUSIVE, NOT_COMPARABLE, FAILED = (
    "pass", "regression", "improvement", "inconclusive", "not comparable", "failed")
EXIT = {PASS: 0, IMPROVEMENT: 0, REGRESSION: 1, FAILED: 1, INCONCLUSIVE: 3, NOT_COMPARABLE: 3}
SCRIPT = "script"
STEP_TIME = "step time"
SHARES = (("share.input", "traced data wait"), ("gpu.idle_share", "idle device"))   # the traced steps' shares


@dataclass
class GateOptions:
    min_effect: float = steptime.MATERIAL  # relative step-time change that matters
    min_share: float = 0.10      # absolute share change that matters (0.10 = 10 points)
    noise_k: float = 3.0         # with several baselines: times their spread
    level: float = 0.95          # one baseline: the CI of the ratio / of the share change
    min_steps: int = steptime.MIN_STEPS
    max_other_load: float = SHARED_SHARE  # share of the machine's cores other processes may use during a run


@dataclass
class Row:
    metric: str
    baseline: str
    current: str
    change: str
    threshold: str
    status: str            # pass, regression, improvement, inconclusive, not comparable, warning, info
    reason: str
    values: dict = field(default_factory=dict)


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.0f}%"
