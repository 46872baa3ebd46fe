"""Compute-bound: the model's math fills the step (on this CPU-only machine, "device" = CPU ops).

    python examples/compute_bound.py [--steps N] [--width N] [--batch-size N]

The data is a small in-memory TensorDataset (num_workers=0: loading a batch is a slice of
a tensor, microseconds), and the model is an MLP with 2048-wide layers at batch 256, so each
step is a handful of large matrix multiplies (about 20 GFLOP forward + backward). Python and
dispatch overhead are a few hundred microseconds next to tens of milliseconds of GEMMs, so
over 80% of the step is inside the model's ops: perfdoctor reports it compute-bound on the CPU.
The fixes are about the math itself (smaller model, lower precision, faster hardware).
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps (default: ~60 s)")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    print(f"compute_bound: MLP width {args.width}, batch {args.batch_size}", flush=True)
    torch.manual_seed(0)
    w = args.width
    # 4096 samples of synthetic features, already in memory: the input pipeline costs nothing.
    data = TensorDataset(torch.randn(4096, w), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = nn.Sequential(nn.Linear(w, 2 * w), nn.ReLU(), nn.Linear(2 * w, w), nn.ReLU(),
                          nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == args.steps:
                break
    print(f"compute_bound: done, {step} steps, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
