"""Crashes mid-training: raises RuntimeError after --crash-after optimizer steps (default 5).

    python examples/crash.py [--crash-after N] [--steps N]

For testing that `perfdoctor run` passes the script's traceback and non-zero exit status
(1, as for any uncaught exception) through, and still reports on the steps that did run.
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--crash-after", type=int, default=5)
    args = ap.parse_args()
    print(f"crash: training, will fail after {args.crash_after} steps", flush=True)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == args.crash_after:
                print(f"crash: raising after {step} steps", flush=True)
                raise RuntimeError(f"simulated training failure at step {step}")
            if step == args.steps:
                break
    print(f"crash: done, {step} steps (no crash: --crash-after > --steps)")


if __name__ == "__main__":
    main()
