"""Calibration of PD346 (threads for idle cores) on this machine's CPU.

    python bench/bench_threads.py [--pairs 3] [--only NAME ...] [--threads-to N]

Each workload is a small CPU training loop that calls torch.set_num_threads(1), as scripts
written for data-parallel ranks or copied from a launcher's environment do. For each one:

1. it runs with 1 thread and with --threads-to threads (default: the usable CPUs), in
   interleaved pairs (order alternating), each printing its own steady step time; measured
   speed-up = mean 1-thread / mean N-thread;
2. `perfdoctor run --no-stacks` on the 1-thread script reads PD346's expected gain, its range
   and its ceiling from report.json (or why it did not fire: the metrics it reads);
3. prints expected vs measured and the error against the issue's 25% bar.

The workloads span what intra-op threads do well and badly: wide GEMMs (near-linear), small
GEMMs and elementwise ops under torch's grain size (little), convolutions, an LSTM (sequential
small matmuls) and a Transformer layer. A busy machine makes the idle-core evidence (and the
measured speed-up) smaller: run it on a quiet one and read the ratios, not the times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PRELUDE = """
import sys, time, torch, torch.nn as nn
threads, steps = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(threads)
"""
LOOP = """
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
t0 = None
for i in range(steps):
    if i == 10:
        t0 = time.perf_counter()
    loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
print(f"STEADY_MS {1000 * (time.perf_counter() - t0) / (steps - 10):.3f}", flush=True)
"""
WORKLOADS = {
    "mlp_wide": "model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024))\n"
                "x = torch.randn(256, 1024)",
    "mlp_small": "model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(64, 64), nn.Tanh())])\n"
                 "x = torch.randn(16, 64)",
    "cnn": "model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),\n"
           "                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))\n"
           "x = torch.randn(32, 3, 32, 32)",
    "lstm": "class M(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__(); self.rnn = nn.LSTM(128, 256, batch_first=True)\n"
            "    def forward(self, x):\n"
            "        return self.rnn(x)[0]\n"
            "model = M()\nx = torch.randn(16, 32, 128)",
    "transformer": "model = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)\n"
                   "x = torch.randn(16, 64, 256)",
}
STEPS = {"mlp_wide": 60, "mlp_small": 400, "cnn": 60, "lstm": 60, "transformer": 80}
TOLERANCE = 0.25


def script(name: str, root: Path) -> Path:
    p = root / f"{name}.py"
    p.write_text(PRELUDE + WORKLOADS[name] + "\n" + LOOP)
    return p


def timed(path: Path, threads: int, steps: int) -> float:
    r = subprocess.run([sys.executable, str(path), str(threads), str(steps)], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("STEADY_MS "):
            return float(line.split()[1])
    raise SystemExit(f"{path.name} failed ({r.returncode}): {r.stderr[-1500:]}")


def measure(path: Path, steps: int, n: int, pairs: int) -> tuple[float, float, float]:
    """(measured speed-up, its lowest and highest pair ratio)."""
    one, many, ratios = [], [], []
    for i in range(pairs):
        arms = (1, n) if i % 2 == 0 else (n, 1)
        got = {t: timed(path, t, steps) for t in arms}
        one.append(got[1])
        many.append(got[n])
        ratios.append(got[1] / got[n])
    return statistics.mean(one) / statistics.mean(many), min(ratios), max(ratios)


def predicted(path: Path, steps: int, root: Path) -> dict:
    out = root / f"run-{path.stem}"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-stacks", "--out", str(out),
                        str(path), "1", str(steps * 3)], capture_output=True, text=True)
    try:
        doc = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        raise SystemExit(f"perfdoctor run failed on {path.name} ({r.returncode}): {r.stderr[-1500:]}")
    m = doc["traces"][0]["metrics"] if doc.get("traces") else {}
    fix = next((f for f in doc.get("findings", []) if f.get("id") == "PD346"), None)
    keys = ("machine.torch_threads", "machine.physical_cores", "machine.free_cores", "share.device")
    return {"gain": (fix or {}).get("gain") or {}, "fired": fix is not None,
            "rank": next((i + 1 for i, f in enumerate(doc.get("findings", [])) if f.get("id") == "PD346"), None),
            "why": ", ".join(f"{k.split('.', 1)[1]}={m.get(k)}" for k in keys)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--only", nargs="*", choices=sorted(WORKLOADS))
    ap.add_argument("--threads-to", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    if args.threads_to < 2:
        print("one usable CPU: nothing to calibrate here")
        return
    print(f"1 thread -> {args.threads_to} threads, {args.pairs} interleaved pairs each\n")
    print(f"{'workload':<12} {'measured':>9} {'pairs':>12} {'expected':>9} {'range':>12} {'ceiling':>8} "
          f"{'error':>7}  evidence")
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        root = Path(tmp)
        for name in args.only or WORKLOADS:
            path = script(name, root)
            steps = STEPS[name]
            meas, lo, hi = measure(path, steps, args.threads_to, args.pairs)
            p = predicted(path, steps, root)
            g = p["gain"]
            exp, ceil = g.get("expected"), g.get("ceiling")
            rng = "{:.2f}-{:.2f}".format(*g["range"]) if g.get("range") else "-"
            err = f"{100 * (exp - meas) / (meas - 1):+.0f}%" if exp and meas > 1.02 else "n/a"
            flag = "" if not p["fired"] else (" CEILING BEATEN" if ceil and meas > ceil * 1.02 else "")
            print(f"{name:<12} {meas:>8.2f}x {lo:>5.2f}-{hi:<5.2f}  "
                  f"{(f'{exp:.2f}x' if exp else ('-' if p['fired'] else 'not fired')):>9} {rng:>12} "
                  f"{(f'{ceil:.2f}x' if ceil else '-'):>8} {err:>7}  {p['why']}{flag}", flush=True)
    print(textwrap.dedent(f"""
        error = (expected - measured) / (measured - 1): the share of the measured gain the model
        missed (bar: within {100 * TOLERANCE:.0f}%); n/a where nothing measurable was gained."""))


if __name__ == "__main__":
    main()
