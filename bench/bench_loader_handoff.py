"""What a batch costs the trainer when a DataLoader worker hands it over (PD301's handoff).

A trainer that only draws batches (no model) from a TensorDataset, with num_workers=0 and with
1 and 2 persistent workers, interleaved (0, 1, 2, 0): the time per batch, and each worker
setting's time as a ratio of the in-trainer time. With workers the trainer still receives each
batch: a queue get, unpickling, one shared-memory handle per tensor. Where that costs more than
making the batch, workers slow the loop down; PD301 calls the gain unknown below 1 ms of wait a
batch, since the handoff ranges from 0.08 ms (an H100 host) to several ms (a small VM).

    python bench/bench_loader_handoff.py [--batches N]
"""

from __future__ import annotations

import argparse
import time

SHAPES = [(20,), (3, 32, 32), (3, 128, 128)]


def per_batch_ms(torch, ds, batch: int, workers: int, n: int) -> float:
    from torch.utils.data import DataLoader
    dl = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    it = iter(dl)
    for _ in range(20):                  # workers started, the prefetch queue filled
        next(it)
    t = time.perf_counter()
    for _ in range(n):
        try:
            next(it)
        except StopIteration:
            it = iter(dl)
            next(it)
    return (time.perf_counter() - t) / n * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200, help="batches timed per setting (a quarter for the largest)")
    a = ap.parse_args(argv)
    import torch
    from torch.utils.data import TensorDataset
    torch.set_num_threads(1)
    print("| sample shape | batch | in-trainer ms/batch | 1 worker | 2 workers |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        ds = TensorDataset(torch.randn(4096, *shape), torch.randint(0, 10, (4096,)))
        n = a.batches if shape[-1] < 100 else max(10, a.batches // 4)
        t = {w: [] for w in (0, 1, 2)}
        for w in (0, 1, 2, 0):
            t[w].append(per_batch_ms(torch, ds, 64, w, n))
        base = sum(t[0]) / len(t[0])
        print(f"| {shape} | 64 | {base:.3f} | {t[1][0]:.3f} ({t[1][0] / base:.1f}x) | {t[2][0]:.3f} "
              f"({t[2][0] / base:.1f}x) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
