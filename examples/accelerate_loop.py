"""A plain loop under Hugging Face `accelerate` with gradient accumulation, unmodified.

    python examples/accelerate_loop.py [--steps 40] [--load-ms 2] [--accumulate 2]

accelerator.prepare wraps the model, optimizer and DataLoader; accelerator.accumulate(model)
skips the optimizer step on all but every --accumulate-th batch. Each sample costs --load-ms
of loading time (num_workers=0).
"""

import argparse
import time

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n: int, load_ms: float):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randint(0, 4, (n,), generator=g)
        self.load_s = load_ms / 1e3

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.load_s:
            time.sleep(self.load_s)
        return self.x[i], self.y[i]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--load-ms", type=float, default=2.0)
    ap.add_argument("--accumulate", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Slow(8 * args.steps * args.accumulate, args.load_ms), batch_size=8, num_workers=0)
    model, opt, loader = acc.prepare(model, opt, loader)
    updates = 0
    for x, y in loader:
        with acc.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            updates += int(acc.sync_gradients)
    print(f"accelerate_loop: {updates} optimizer steps", flush=True)


if __name__ == "__main__":
    main()
