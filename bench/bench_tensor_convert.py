"""A batch converted by torch.tensor from Python lists every step against the data made a tensor
once and indexed (PD389), on this CPU.

For each shape (rows in the dataset, features a row, batch) an MLP trains in one process on
random batches, in alternating blocks of steps: the rows converted from lists of floats each step
(`torch.tensor([rows[i] for i in idx])`), then indexed out of a tensor made once
(`rows_t[idx]`). The conversion's time is timed as `perfdoctor run` times it, so its share of the
step gives PD389's expected gain (the share at 100x) and the Amdahl bound the share alone would
set (which a CPU run beats: the rest of the step speeds up too, so PD389 has no ceiling there).

    python bench/bench_tensor_convert.py [--blocks 4] [--steps 60]
"""

from __future__ import annotations

import argparse
import random
import time

import torch
import torch.nn as nn

from perfdoctor.rules.gain import amdahl       # the rule engine's, as PD389's gain is computed

SHAPES = [(4096, 256, 128), (4096, 64, 32), (8192, 32, 512), (2048, 1024, 16), (4096, 8, 64)]


def trainer(n: int, width: int, batch: int):
    rng = random.Random(0)
    rows = [[rng.random() for _ in range(width)] for _ in range(n)]
    labels = [rng.randrange(10) for _ in range(n)]
    rows_t, labels_t = torch.tensor(rows), torch.tensor(labels)
    model = nn.Sequential(nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    conv = [0.0]

    def step(once: bool) -> None:
        idx = rng.sample(range(n), batch)
        if once:
            x, y = rows_t[idx], labels_t[idx]
        else:
            picked, ys = [rows[i] for i in idx], [labels[i] for i in idx]
            t = time.perf_counter()
            x, y = torch.tensor(picked), torch.tensor(ys)
            conv[0] += time.perf_counter() - t
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step, conv


def block(step, conv, once: bool, steps: int) -> tuple[float, float]:
    """Seconds a step and the conversion's seconds a step, over `steps` steps after two warm-up ones."""
    for _ in range(2):
        step(once)
    conv[0] = 0.0
    t = time.perf_counter()
    for _ in range(steps):
        step(once)
    return (time.perf_counter() - t) / steps, conv[0] / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    print(f"{'rows x width, batch':>22}  {'step':>8}  {'share':>5}  {'expected':>8}  {'Amdahl':>7}  measured")
    for n, width, batch in SHAPES:
        step, conv = trainer(n, width, batch)
        lists, once, shares = [], [], []
        for _ in range(a.blocks):
            s, c = block(step, conv, False, a.steps)
            lists.append(s)
            shares.append(c / s)
            once.append(block(step, conv, True, a.steps)[0])
        ratios = sorted(x / y for x, y in zip(lists, once))
        share = sum(shares) / len(shares)
        print(f"{n:>8} x {width:<5} {batch:>6}  {1e3 * sum(lists) / len(lists):6.2f}ms  {share:5.2f}  "
              f"{amdahl(share, 100):7.2f}x  {amdahl(share, float('inf')):6.2f}x  "
              f"{ratios[0]:.2f}-{ratios[-1]:.2f}x")


if __name__ == "__main__":
    main()
