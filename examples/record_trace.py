"""Record a small torch.profiler trace of a CPU training loop whose DataLoader is the bottleneck.

    python examples/record_trace.py OUT_DIR [--workers N] [--steps N]
    perfdoctor report OUT_DIR

The dataset does real CPU work per sample (a few small matmuls), so with --workers 0 the
trainer spends most of each step producing batches: perfdoctor reports it input-bound (CPU).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader, Dataset


class TransformHeavy(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int):
        x = torch.randn(64, 64)
        for _ in range(12):                 # stands in for decoding + augmentation
            x = torch.tanh(x @ x.T / 64)
        return x[0], i % 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4, help="profiled (active) steps")
    args = ap.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(TransformHeavy(), batch_size=32, num_workers=args.workers)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = schedule(wait=1, warmup=1, active=args.steps, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, profile_memory=True,
                 on_trace_ready=tensorboard_trace_handler(args.out_dir, use_gzip=True)) as prof:
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
            if i == args.steps + 1:
                break
    print(f"trace written to {args.out_dir}/")


if __name__ == "__main__":
    main()
