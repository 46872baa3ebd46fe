"""What the RNN benches share: two training steps timed in alternating blocks, and the gain the
RNN probe's model expects (collect/rnnprobe.py, analyze/rnnsequence.py) beside it."""

from __future__ import annotations

import argparse
import time


def options(steps: int = 8):
    """--blocks (alternating blocks of each version, default 4) and --steps (steps a block)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=steps)
    return ap.parse_args()


def alternate(before, after, blocks: int, steps: int) -> tuple[float, float]:
    """Seconds per step of `before` and `after`, one warm-up step each, then `blocks` blocks of
    `steps` steps each in turn (a noisy machine slows both alike)."""
    times = [0.0, 0.0]
    for f in (before, after):
        f()
    for _ in range(blocks):
        for i, f in enumerate((before, after)):
            t0 = time.perf_counter()
            for _ in range(steps):
                f()
            times[i] += time.perf_counter() - t0
    return times[0] / (blocks * steps), times[1] / (blocks * steps)


def probed(cfg: dict, calls: int, layers: list, step_s: float, span: float = 1.0) -> tuple[float, float, float]:
    """(expected gain, probed share of the step, the probe's ratio): the probe's per-call time
    over the step, within `span` of it (PD387: the loop's share), at its ratio."""
    from perfdoctor.collect.rnnprobe import measure
    probe = measure(cfg, calls, layers=layers)
    share = min(1.0, probe["per_call_ms"] / (1e3 * step_s), span)
    return 1 / (1 - share + share / probe["ratio"]), share, probe["ratio"]
