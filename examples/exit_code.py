"""Exits with a chosen status: calls sys.exit(--code, default 3) after --exit-after steps (default 5).

    python examples/exit_code.py [--exit-after N] [--code N]

For testing that `perfdoctor run` hands the script's own exit status back unchanged
(SystemExit from inside the training loop, not an exception traceback).
"""

import argparse
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--exit-after", type=int, default=5)
    ap.add_argument("--code", type=int, default=3)
    args = ap.parse_args()
    print(f"exit_code: training, will exit with status {args.code} after {args.exit_after} steps", flush=True)
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
            if step == args.exit_after:
                print(f"exit_code: sys.exit({args.code}) after {step} steps", flush=True)
                sys.exit(args.code)
            if step == args.steps:
                break
    print(f"exit_code: done, {step} steps (no exit: --exit-after > --steps)")


if __name__ == "__main__":
    main()
