"""Time the script's recurrent layer both ways: once per time step, and once over the sequence.

A loop that calls its model once per time step, passing the state on (PD388), pays each call's
fixed cost of the RNN layer T times a step: dispatch, the layer's setup (oneDNN builds its
primitive and reorders the weights on every call on a CPU), the autograd graph per call; one call
over the sequence pays it once. How much that is depends on the layer, the sizes, the dtype and
the device, and no trace tells it from the work (bench/bench_rnn_sequence_call.py: LSTM 3.0-8.0x,
GRU 1.5x). So it is measured: after the script has ended, a separate process builds the same
layer again (collect/rebuild.py: class, sizes, options, dtype, device, torch's thread count, the
batch and time steps of its calls), with the layers the loop calls as often around it that it can
build (an embedding, dropout, a linear output layer, layer norm), and times, forward and backward,
T calls of each, one call's time steps each, the state passed on, against one call of each over
all T of them, in alternating repetitions. The layers are called each on an input of the shape the
script gave it (not on each other's outputs). The script's own run is over by then: its steps
are not slowed.

The same holds for a loop over the RNN layer inside one model call (a decoder's per-token nn.GRU
calls: PD391) and over an RNN cell (nn.LSTMCell...: PD387, against nn.LSTM over the T steps).

maybe_probe(run_dir, child) runs it where the census saw such a loop (the step's most-called RNN
module called MIN_CALLS times or more, most calls taking the state the call before returned:
wanted), writes RUN_DIR/rnn_probe.json and returns a note; analyze/rnnsequence.py turns it into
the layer's share of the step and what one call does to it.

    python -m perfdoctor.collect.rnnprobe CONFIG.json OUT.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

PROBE_FILE = "rnn_probe.json"
MIN_CALLS = 8            # PD353's and PD388's floor: fewer calls a step are no loop worth the rewrite
CHAINED = 0.5            # most calls take the state the call before returned (PD388's condition)
BUDGET_S = 2.0           # measuring time, after a warm-up of each way
MIN_PAIRS, MAX_PAIRS = 3, 20
TIMEOUT_S = 60           # torch's import and the device's start included


def wanted(child: dict) -> tuple[dict, int] | None:
    """(the layer's configuration, its calls a step) where the step called its RNN module (the
    one it called most) MIN_CALLS times or more, most calls taking the state the one before
    returned and not most of them on an input made from its last output: a loop over time steps
    one call over the sequence can run, outside the model (PD388) or inside it (PD391; an RNN
    cell: PD387). Else None."""
    rc = child.get("root_calls") or {}
    cfg, n, chained, back = rc.get("rnn"), rc.get("rnn_calls"), rc.get("rnn_chained"), rc.get("rnn_fed_back") or 0
    if not isinstance(cfg, dict) or not all(isinstance(v, int) for v in (n, chained, back)) or n < MIN_CALLS:
        return None
    # an input made from the layer's last output (attention queried with its state): no rule's fix
    return (cfg, n) if chained >= CHAINED * (n - 1) and back < CHAINED * (n - 1) else None


def maybe_probe(run_dir: Path, child: dict) -> str | None:
    """Run the probe in its own process where it is wanted; the note it leaves, or None."""
    found = wanted(child)
    if found is None:
        return None
    cfg, calls = found
    layers = [c for c in (child.get("root_calls") or {}).get("rnn_layers") or [] if isinstance(c, dict)]
    src, out = run_dir / "rnn_probe.config.json", run_dir / PROBE_FILE
    t0 = time.monotonic()
    try:
        src.write_text(json.dumps({"config": cfg, "calls": calls, "layers": layers}))
        p = subprocess.run([sys.executable, "-m", "perfdoctor.collect.rnnprobe", str(src), str(out)],
                           capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the {cfg.get('kind')} layer could not be timed over the whole sequence ({type(exc).__name__})"
    finally:
        src.unlink(missing_ok=True)
    if p.returncode != 0 or not out.exists():
        last = (p.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return f"the {cfg.get('kind')} layer could not be timed over the whole sequence ({last})"
    kinds = ", ".join(str(c.get("kind")) for c in layers)
    return (f"timed the script's {cfg.get('kind')} layer" + (f" and the layers called as often around it ({kinds})"
                                                             if layers else "")
            + f" after the run ({time.monotonic() - t0:.1f} s, in a separate process): their calls one time step "
            "at a time against one call each over the sequence")


def measure(cfg: dict, calls: int, budget_s: float = BUDGET_S, layers: list | tuple = ()) -> dict:
    """Forward and backward of `calls` chained calls against one call over their time steps, of
    the RNN layer and of `layers` (rebuild.config of the layers called as often: each T times on
    one call's input against once on the whole sequence's): {"per_call_ms", "whole_ms" (each a
    whole step's worth), "ratio" (total time one way over the other), "ratio_low", "ratio_high"
    (of the alternating pairs), "pairs", "batch", "steps", "layers" (the kinds built)}."""
    import torch

    from perfdoctor.collect.rebuild import build_layer, build_rnn, layer_input, rnn_call_shape, whole_shape
    torch.set_num_threads(max(1, int(cfg.get("threads") or 1)))
    step, whole = build_rnn(torch, cfg)
    batch, per = rnn_call_shape(cfg)
    device, dtype = next(whole.parameters()).device, next(whole.parameters()).dtype
    x = torch.randn(batch, calls * per, cfg["input_size"], device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    cell = cfg["kind"].endswith("Cell")
    around = []                                        # (layer, per-call inputs, whole input)
    for lc in layers:
        shape = lc.get("input_shape")
        if not shape:
            continue
        layer = build_layer(torch, lc)
        full = layer_input(torch, lc, whole_shape(shape, calls * per), device)
        pieces = [_piece(full, shape, i, per).clone() for i in range(calls)]
        around.append((layer, pieces, full))
    params = [*step.parameters(), *whole.parameters(), *(p for layer, _, _ in around for p in layer.parameters())]

    def per_call() -> None:
        state, outs = None, []
        for i in range(calls):
            if cell:
                state = step(x[:, i], state)
                outs.append(state[0] if isinstance(state, tuple) else state)
            else:
                out, state = step(x[:, i * per:(i + 1) * per], state)
                outs.append(out)
        total = torch.stack(outs).sum()
        for layer, pieces, _ in around:
            total = total + torch.stack([layer(p) for p in pieces]).sum()
        total.backward()

    def one_call() -> None:
        out, _ = whole(x)
        total = out.sum()
        for layer, _, full in around:
            total = total + layer(full).sum()
        total.backward()

    def timed(fn) -> float:
        for p in params:
            p.grad = None
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t

    timed(per_call), timed(one_call)                     # warm-up: the first call builds what it caches
    pairs: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    while len(pairs) < MAX_PAIRS and (len(pairs) < MIN_PAIRS or time.perf_counter() - t0 < budget_s):
        if len(pairs) % 2:                               # alternate which way goes first
            b = timed(one_call)
            a = timed(per_call)
        else:
            a = timed(per_call)
            b = timed(one_call)
        pairs.append((a, b))
    a_sum, b_sum = sum(a for a, _ in pairs), sum(b for _, b in pairs)
    ratios = [a / b for a, b in pairs if b > 0]
    return {"per_call_ms": 1e3 * a_sum / len(pairs), "whole_ms": 1e3 * b_sum / len(pairs),
            "ratio": a_sum / b_sum if b_sum > 0 else None, "ratio_low": min(ratios), "ratio_high": max(ratios),
            "pairs": len(pairs), "batch": batch, "steps": calls * per, "calls": calls, "kind": cfg["kind"],
            "device": str(device), "dtype": cfg["dtype"], "layers": [type(layer).__name__ for layer, _, _ in around]}


def _piece(full, shape: list[int], i: int, per: int):
    """Call i's input, cut from the whole sequence's as the script's call had it: [batch, per, ...]
    where its second dimension was the time steps, else [batch, ...] (one time step, squeezed)."""
    if len(shape) >= 2 and shape[1] == per:
        return full[:, i * per:(i + 1) * per]
    return full[:, i] if full.dim() >= 2 else full[i]


def main(argv: list[str]) -> int:
    src, out = Path(argv[0]), Path(argv[1])
    job = json.loads(src.read_text())
    out.write_text(json.dumps(measure(job["config"], int(job["calls"]), layers=job.get("layers") or ())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
