"""PD385's expected gain against the measured one: a doubled batch on small CPU models.

    python bench/bench_larger_batch.py [--rounds 3] [--only NAME]

For each workload (a model, its batch size B, a DataLoader or a loop that makes its own batches):
`perfdoctor run` records it at batch B and PD385's expected gain is read from its report; then one
process trains it at B and at 2B in alternating blocks of steps, and the ratio of samples per
second (2B over B, medians of the blocks) is the measured gain of the doubling. Printed side by side
with the ratio expected / measured. `--child NAME B STEPS` is the training script perfdoctor runs.
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

# name: (model, batch, loader): loader True feeds it from a DataLoader over a TensorDataset
WORKLOADS = {
    "mlp-b1-loader": ("mlp", 1, True),
    "mlp-b8-loader": ("mlp", 8, True),
    "mlp-b64": ("mlp", 64, False),
    "cnn-b4": ("cnn", 4, False),
    "gru-b2": ("gru", 2, False),
    "wide-b16": ("wide", 16, False),
}


def build(torch, kind: str):
    """(model, make a batch of n samples) for a workload's model."""
    nn = torch.nn
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
        return model, lambda n: (torch.randn(n, 128), torch.randint(0, 10, (n,)))
    if kind == "wide":
        model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
        return model, lambda n: (torch.randn(n, 512), torch.randint(0, 10, (n,)))
    if kind == "cnn":
        model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(32, 10))
        return model, lambda n: (torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,)))

    class Gru(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.rnn, self.out = nn.Embedding(1000, 64), nn.GRU(64, 128, batch_first=True), nn.Linear(128, 5)

        def forward(self, x):
            return self.out(self.rnn(self.emb(x))[0][:, -1])
    return Gru(), lambda n: (torch.randint(0, 1000, (n, 40)), torch.randint(0, 5, (n,)))


def trainer(torch, name: str, batch: int):
    """A function that runs one training step at `batch` and returns nothing."""
    kind, _, loader = WORKLOADS[name]
    torch.manual_seed(0)
    model, make = build(torch, kind)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    F = torch.nn.functional
    if loader:
        from torch.utils.data import DataLoader, TensorDataset
        x, y = make(8192)
        dl = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, drop_last=True)
        it = iter(dl)

    def step():
        nonlocal it
        if loader:
            try:
                xb, yb = next(it)
            except StopIteration:
                it = iter(dl)
                xb, yb = next(it)
        else:
            xb, yb = make(batch)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def child(name: str, batch: int, steps: int) -> None:
    import torch
    step = trainer(torch, name, batch)
    for _ in range(steps):
        step()


def expected(name: str, batch: int, tmp: Path) -> float | None:
    out = tmp / name
    steps = 3000 if batch <= 8 else 400
    subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-stacks", "--out", str(out), __file__, "--child",
                    name, str(batch), str(steps)], check=True, capture_output=True)
    doc = json.loads((out / "report.json").read_text())
    f = next((f for f in doc["findings"] if f["id"] == "PD385"), None)
    return None if f is None else (f.get("gain") or {}).get("expected")


def measured(name: str, batch: int, rounds: int) -> float:
    """Samples per second at 2B over those at B: alternating ~1 s blocks in one process."""
    import torch
    steps = {b: trainer(torch, name, b) for b in (batch, 2 * batch)}
    rate = {b: [] for b in steps}
    for b, s in steps.items():          # warm up both
        for _ in range(20):
            s()
    for _ in range(rounds):
        for b, s in steps.items():
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 1.0:
                s()
                n += 1
            rate[b].append(b * n / (time.perf_counter() - t0))
    return statistics.median(rate[2 * batch]) / statistics.median(rate[batch])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    print(f"{'workload':16} {'B':>3} {'expected':>9} {'measured':>9} {'exp/meas':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (_, batch, _) in WORKLOADS.items():
            if a.only and a.only != name:
                continue
            exp = expected(name, batch, Path(tmp))
            meas = measured(name, batch, a.rounds)
            ratio = f"{exp / meas:9.2f}" if exp else f"{'-':>9}"
            print(f"{name:16} {batch:3d} {exp or 0:9.2f} {meas:9.2f} {ratio}", flush=True)


if __name__ == "__main__":
    main()
