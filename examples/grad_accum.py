"""Gradient accumulation with two optimizers and skipped updates: opt.step() != iteration.

    python examples/grad_accum.py [--steps N] [--accum K] [--skip-every S]

--steps counts micro-batches (DataLoader iterations, default 40). Gradients accumulate over
--accum micro-batches (default 4); at each accumulation boundary the body (SGD) and the head
(Adam) have their own optimizer, so one update is two opt.step() calls. Every --skip-every-th
boundary (default 5: boundaries 5, 10, ...) skips both steps and drops the gradients: a
deterministic stand-in for GradScaler's "inf/NaN gradients: skip this step", done by hand.

Default counts: 40 micro-batches -> 10 boundaries -> 8 updates (2 skipped) -> 16 calls to
Optimizer.step. The last line prints all four, so a step counter can be checked against them.
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="micro-batches")
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--skip-every", type=int, default=5)
    args = ap.parse_args()
    print(f"grad_accum: {args.steps} micro-batches, accumulate {args.accum}, "
          f"skip every {args.skip_every}th update", flush=True)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 32), torch.randint(0, 10, (1024,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    body = nn.Sequential(nn.Linear(32, 128), nn.ReLU())
    head = nn.Linear(128, 10)
    opt_body = torch.optim.SGD(body.parameters(), lr=0.05, momentum=0.9)
    opt_head = torch.optim.Adam(head.parameters(), lr=1e-3)
    micro = boundaries = updates = step_calls = 0
    while micro < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(head(body(x)), y) / args.accum
            loss.backward()                              # gradients add up across micro-batches
            micro += 1
            if micro % args.accum == 0:
                boundaries += 1
                if boundaries % args.skip_every != 0:   # skipped boundaries: no step at all
                    opt_body.step()
                    opt_head.step()
                    updates, step_calls = updates + 1, step_calls + 2
                opt_body.zero_grad()
                opt_head.zero_grad()
            if micro == args.steps:
                break
    print(f"grad_accum: done, {micro} micro-batches, {boundaries} boundaries, {updates} updates "
          f"({boundaries - updates} skipped), {step_calls} optimizer.step() calls")


if __name__ == "__main__":
    main()
