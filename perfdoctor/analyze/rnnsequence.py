"""What one call over the whole sequence saves a step, from the probe `perfdoctor run` made.

collect/rnnprobe.py timed the script's RNN layer, built again in a separate process after the run,
forward and backward: the step's calls one time step (or one call's slice) at a time, the state
passed on, against one call over all of them. Its per-call time, a whole step's worth, over the
run's un-profiled step time is the share of the step that layer's calls take (at most the step
outside the wait for data); the two ways' ratio is what one call does to that share (PD388's
expected gain). The other layers the loop calls once per time step (an embedding, an output
layer, dropout) also run once over the sequence after the rewrite, and their share is not taken:
a low estimate (bench/bench_rnn_sequence_call.py: 1.23-2.60x expected where 1.46-5.71x was measured).
"""

from __future__ import annotations

import math

NAMES = ("rnn.probe_speedup", "rnn.probe_speedup_low", "rnn.probe_layer_share", "rnn.probe_saved_ms")


def probe_metrics(probe: dict | None, m: dict) -> dict:
    """rnn.probe_* from RUN_DIR/rnn_probe.json and the run's step time and data wait."""
    out = dict.fromkeys(NAMES)
    if not isinstance(probe, dict):
        return out
    per, whole, ratio, low = (probe.get(k) for k in ("per_call_ms", "whole_ms", "ratio", "ratio_low"))
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (per, whole, ratio, low)):
        return out
    out["rnn.probe_speedup"], out["rnn.probe_speedup_low"] = float(ratio), float(min(low, ratio))
    out["rnn.probe_saved_ms"] = max(0.0, per - whole)
    step, wait = m.get("run.step_time_ms"), m.get("run.data_wait_share") or 0.0
    if isinstance(step, (int, float)) and step > 0:
        out["rnn.probe_layer_share"] = min(per / step, max(0.0, 1.0 - wait))
    return out
