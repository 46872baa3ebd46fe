"""DataLoader workers started with multiprocessing_context="spawn" (num_workers=2).

    python examples/spawn_workers.py [--steps N] [--workers N]

Spawned workers start a fresh interpreter and re-import the main module (as __mp_main__) to
unpickle the Dataset, so the Dataset class must live at module level and the training code
under `if __name__ == "__main__":`. For testing that a tool running this script as __main__
keeps it importable by the workers, and that it sees the worker processes.
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Noise(Dataset):
    """Defined at module level: spawned workers import it by name from the main module."""

    def __len__(self) -> int:
        return 2048

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), i % 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    print(f"spawn_workers: {args.workers} spawned workers", flush=True)
    torch.manual_seed(0)
    loader = DataLoader(Noise(), batch_size=32, shuffle=True, num_workers=args.workers,
                        multiprocessing_context="spawn", persistent_workers=True)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
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
    print(f"spawn_workers: done, {step} steps, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
