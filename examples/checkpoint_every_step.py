"""A training loop that saves a ~200 MB checkpoint with torch.save on the training thread.

The model is a large sparse embedding table (most of the checkpoint's bytes) under a small MLP,
trained with SGD on random batches. `--every N` saves after every N-th step (1: every step, the
slow pattern; 100: the usual fix). Checkpoints go to a fresh temporary directory (or `--dir`),
overwriting one file, and the temporary directory is removed when the script ends.

At the end it prints its own steady-state time per step: wall time over the steps after
`--warmup`, checkpoints included (so every-100 runs should cover a few hundred steps).

    python examples/checkpoint_every_step.py --every 1 --steps 60
    python examples/checkpoint_every_step.py --every 100 --steps 300
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, rows: int, dim: int, hidden: int):
        super().__init__()
        self.table = nn.EmbeddingBag(rows, dim, mode="mean", sparse=True)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 10))

    def forward(self, idx):
        return self.mlp(self.table(idx))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--every", type=int, default=1, help="save a checkpoint after every N-th step")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--mb", type=float, default=200.0, help="checkpoint size in MB (the embedding table)")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--hidden", type=int, default=1024, help="MLP width (the compute per step)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steadier on a shared machine)")
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory, removed at the end)")
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    dim = 64
    rows = int(args.mb * 1e6 / (4 * dim))
    model = Model(rows, dim, args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    out_dir = args.dir or tempfile.mkdtemp(prefix="perfdoctor-ckpt-")
    path = os.path.join(out_dir, "checkpoint.pt")
    try:
        t_start = None
        for step in range(args.steps):
            if step == args.warmup:
                t_start = time.perf_counter()
            idx = torch.randint(0, rows, (args.batch, 8))
            y = torch.randint(0, 10, (args.batch,))
            loss = loss_fn(model(idx), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if (step + 1) % args.every == 0:
                torch.save({"model": model.state_dict(), "step": step}, path)
        if t_start is not None and args.steps > args.warmup:
            ms = (time.perf_counter() - t_start) * 1e3 / (args.steps - args.warmup)
            print(f"steady {ms:.2f} ms/step over {args.steps - args.warmup} steps (checkpoint every {args.every})")
    finally:
        if args.dir is None:
            shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
