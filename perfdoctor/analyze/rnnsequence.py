"""What one call over the whole sequence saves a step, from the probe `perfdoctor run` made.

collect/rnnprobe.py timed the script's RNN layer and the layers the loop calls as often around it
(collect/rebuild.py), built again in a separate process after the run, forward and backward: the
step's calls one time step (or one call's slice) at a time, the state passed on, against one
call of each over all of them. Its per-call time, a whole step's worth, over the run's
un-profiled step time is the share of the step those calls take (at most the step outside the
wait for data); the two ways' ratio is what one call does to that share (the expected gain of
PD388, PD391 and PD387). The rest of the loop (modules it cannot build, the functions between
them) is taken to stay: the benches' expected gains run from 0.47x the measured one to 1.09x it,
mostly below (bench/bench_rnn_sequence_call.py, bench_rnn_decoder.py, bench_cell_loops.py).
"""

from __future__ import annotations

import math

NAMES = ("rnn.probe_speedup", "rnn.probe_speedup_low", "rnn.probe_layer_share", "rnn.probe_saved_ms")
CALL_NAMES = ("rnn.layer_kind", "rnn.layer_calls_per_step", "rnn.layer_chained_share", "rnn.layer_fed_sliced_share",
              "rnn.layer_fed_back_share")


def layer_call_metrics(root_calls: dict | None) -> dict:
    """rnn.layer_*: the RNN module the counted step called most (collect/chainedcalls.py), from
    child.json's root_calls: its torch class, its calls, and the shares of its calls after the
    first that took the state the call before returned, and whose inputs were the next slice of
    one tensor (the most of any module called as often: a decoder's embedding of the next target
    token), and whose input was made from the module's last output (attention queried with its
    hidden state: a recurrence beyond the layer)."""
    out = dict.fromkeys(CALL_NAMES)
    rc = root_calls if isinstance(root_calls, dict) else {}
    cfg, n = rc.get("rnn"), rc.get("rnn_calls")
    if not isinstance(cfg, dict) or not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return out
    kind = cfg.get("kind")
    out["rnn.layer_kind"] = kind if isinstance(kind, str) else None
    out["rnn.layer_calls_per_step"] = n
    for key, name in (("rnn_chained", "rnn.layer_chained_share"), ("rnn_fed_sliced", "rnn.layer_fed_sliced_share"),
                      ("rnn_fed_back", "rnn.layer_fed_back_share")):
        k = rc.get(key)
        if isinstance(k, int) and not isinstance(k, bool) and k >= 0 and n > 1:
            out[name] = min(1.0, k / (n - 1))
    return out


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
