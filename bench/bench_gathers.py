"""PD386 measured: a message-passing GNN gathering node rows with h[src] against
h.index_select(0, src), beside PD386's ceiling from a `perfdoctor run` of the first.

    python bench/bench_gathers.py [--rounds 3] [--only N:E:F]

Three GraphConv-like layers written with index_add_ over a random edge list (N nodes, E edges,
F features), Adam, full-graph steps on the CPU. Blocks of steps alternate the two versions in one
process; the ratio of their median step times is the fix's gain (the losses are equal: the same
rows are gathered). `--child N:E:F` is the training script perfdoctor runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = ["20000:200000:64", "1000:100000:16", "50000:100000:128"]


def trainer(torch, config: str, select: bool):
    """One training step of the GNN at `config`, gathering with index_select where `select`."""
    nn = torch.nn
    n, e, f = (int(x) for x in config.split(":"))
    torch.manual_seed(0)
    src, dst = torch.randint(0, n, (e,)), torch.randint(0, n, (e,))
    x, y = torch.randn(n, f), torch.randint(0, 7, (n,))
    deg = torch.zeros(n).index_add_(0, dst, torch.ones(e)).clamp(min=1)[:, None]

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(f, f)

        def forward(self, h):
            m = self.lin(h).index_select(0, src) if select else self.lin(h)[src]
            return torch.relu(torch.zeros_like(h).index_add_(0, dst, m) / deg)
    model = nn.Sequential(Layer(), Layer(), Layer(), nn.Linear(f, 7))
    opt = torch.optim.Adam(model.parameters(), 1e-2)

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def ceiling(config: str, tmp: Path) -> float | None:
    out = tmp / config.replace(":", "-")
    subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-stacks", "--out", str(out), __file__, "--child",
                    config], check=True, capture_output=True)
    doc = json.loads((out / "report.json").read_text())
    f = next((f for f in doc["findings"] if f["id"] == "PD386"), None)
    return None if f is None else (f.get("gain") or {}).get("ceiling")


def measured(config: str, rounds: int) -> float:
    import torch
    steps = {sel: trainer(torch, config, sel) for sel in (False, True)}
    assert steps[False]() == steps[True](), "the two versions must train alike"
    times = {sel: [] for sel in steps}
    for _ in range(rounds):
        for sel, s in steps.items():
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 1.5:
                s()
                n += 1
            times[sel].append((time.perf_counter() - t0) / n)
    return statistics.median(times[False]) / statistics.median(times[True])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        import torch
        step = trainer(torch, sys.argv[2], False)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 8:
            step()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    print(f"{'N:E:F':18} {'ceiling':>8} {'measured':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for config in CONFIGS:
            if a.only and a.only != config:
                continue
            cap = ceiling(config, Path(tmp))
            meas = measured(config, a.rounds)
            print(f"{config:18} {f'{cap:.2f}' if cap else '-':>8} {meas:9.2f}", flush=True)


if __name__ == "__main__":
    main()
