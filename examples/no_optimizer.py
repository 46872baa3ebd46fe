"""No optimizer: forward-only evaluation over a DataLoader (no opt.step() to count).

    python examples/no_optimizer.py [--steps N] [--workers N]

torch's global optimizer hooks never fire here, so a step counter must fall back to
DataLoader iterations: this script runs exactly --steps batches (default 200) through the
model under torch.no_grad(), then prints the accuracy.
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Features(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), i % 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="batches to evaluate")
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    print(f"no_optimizer: evaluating {args.steps} batches, workers={args.workers}", flush=True)
    torch.manual_seed(0)
    loader = DataLoader(Features(), batch_size=32, num_workers=args.workers)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).eval()
    correct = seen = batches = 0
    with torch.no_grad():
        while batches < args.steps:                  # repeat the data set if --steps asks for more
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum().item()
                seen += len(y)
                batches += 1
                if batches == args.steps:
                    break
    print(f"no_optimizer: done, {batches} batches, accuracy {correct / seen:.3f}")


if __name__ == "__main__":
    main()
