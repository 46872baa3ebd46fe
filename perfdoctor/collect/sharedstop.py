"""--duration across the ranks of one node: every rank stops after the same step.

A rank stopped on its own clock would leave the others waiting in their next collective (and a
rank's clock is its own launch's, a little apart from the others'). So in a multi-rank run the
first rank whose stop request comes (its launcher's --duration) picks a step a little ahead of its
own, and writes it into a file in the node's run directory (RUN_DIR/ranks/.stop-<launch>); every
rank looks for that file at its step boundaries, at most once per CHECK_S of wall time, and stops
at the end of that step. A rank whose own request comes later takes the step already written.

How far ahead: in data-parallel training each step ends in a collective, so no rank ends step n+1
before the first one has begun it: a rank that looks at every boundary sees a step written at the
first one's boundary n by its own boundary n+1. One that looks only every CHECK_S (steps shorter
than that) may pass CHECK_S / (its shortest step) boundaries first. The ranks' steps end in the
same collectives, so the writing rank's shortest recent step (of the last RECENT) stands for the
others', and a rank's step can be half of it (a rank late for one collective catches up in the
next step, which is then its own work alone): the step written is the first rank's plus
LEAD_STEPS plus 2 x ceil(CHECK_S / shortest) + 1. (It took the writer's last step alone: a 4 ms
step wrote ~12 steps ahead while a rank at 2 ms steps passed 25 between its looks, and left the
writer's collective unanswered.) A job whose ranks are not kept in step (no collective each step)
can still stop apart; the launcher's grace then interrupts the others, and says so. Stdlib only
(it runs in the script's process).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque

CHECK_S = 0.05          # a rank looks for the written step at most this often
LEAD_STEPS = 1          # beyond the boundaries a rank may pass without looking
MAX_LEAD = 100_000
RECENT = 64             # the steps whose shortest sets the lead


def lead(step_s: float | None) -> int:
    """Steps between the first request and the stop: LEAD_STEPS, plus the boundaries a rank may
    pass without looking when the shortest recent step `step_s` is shorter than CHECK_S (twice
    CHECK_S / step_s: another rank's step may be half as long; one more for the rounding)."""
    if not step_s or step_s <= 0 or not math.isfinite(step_s):
        return LEAD_STEPS + 1
    return LEAD_STEPS + (0 if step_s >= CHECK_S else min(MAX_LEAD, 2 * math.ceil(CHECK_S / step_s) + 1))


class SharedStop:
    """The step every rank stops after, agreed through `path` (module docstring)."""

    def __init__(self, path: str):
        self.path = path
        self.at: int | None = None        # the agreed step, once known
        self.checked = 0.0                # perf_counter of the last look at the file
        self.requested = False            # this rank's own stop request came (it may have written the step)
        self.recent: deque[float] = deque(maxlen=RECENT)     # the last steps' durations

    @classmethod
    def from_cfg(cls, cfg: dict) -> "SharedStop | None":
        path = cfg.get("stop_file")
        return cls(path) if isinstance(path, str) and path else None

    def due(self, steps: int, requested: bool, step_s: float | None, now: float | None = None) -> bool:
        """At a step boundary (`steps` counted so far): whether this rank stops now. `requested`:
        its own launcher asked it to stop; `step_s`: the step that just ended."""
        if isinstance(step_s, (int, float)) and step_s > 0 and math.isfinite(step_s):
            self.recent.append(float(step_s))
        if self.at is None and requested:
            self.requested = True
            self.at = self.agree(steps + lead(min(self.recent, default=None)))
        elif self.at is None:
            now = time.perf_counter() if now is None else now
            if now - self.checked >= CHECK_S:
                self.checked = now
                self.at = self.read()
        return self.at is not None and steps >= self.at

    def read(self) -> int | None:
        """The step written, or None (no file yet, or not a whole number: a write cut short)."""
        try:
            with open(self.path) as f:
                text = f.read()
        except OSError:
            return None
        return int(text) if text.strip().isdigit() else None

    def agree(self, step: int) -> int:
        """Write `step` unless a rank wrote one first; the step written. The file appears whole
        (written aside, then linked: a link fails where the file exists)."""
        tmp = f"{self.path}.{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                f.write(str(step))
            os.link(tmp, self.path)
            return step
        except FileExistsError:
            first = self.read()
            return step if first is None else first
        except OSError:                   # not writable: this rank stops on its own clock
            return step
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def info(self) -> dict:
        """child.json "shared_stop": the agreed step and whether this rank's own request came first
        or at all (a rank that stopped at a step another wrote stopped for --duration all the same)."""
        return {"step": self.at, "requested": self.requested}
