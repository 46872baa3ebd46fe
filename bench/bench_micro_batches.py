"""PD394's case measured: a step that accumulates gradients over K micro-batches of B samples,
against the same K x B samples in K/2 micro-batches of 2B and in one of K x B.

    python bench/bench_micro_batches.py [--rounds 3] [--steps 4] [--only NAME]

One process per workload trains the three settings in alternating blocks of steps (a slow stretch of
the machine hits each alike) and prints, per round and as the median over rounds, each merged
setting's speed-up over K micro-batches (step time over step time: the samples per step are the
same). PD394 models no expected gain, only its bound, K; this is what the merging measures.
"""

from __future__ import annotations

import argparse
import statistics
import time

BLOCK_S = 1.0           # the least time of a block of steps of one setting
# name: (model, micro-batches K, micro-batch B)
WORKLOADS = {
    "gpt-like-16x16": ("tx128", 16, 16),
    "tx-small-8x4": ("tx64", 8, 4),
    "mlp-8x8": ("mlp", 8, 8),
}


def build(torch, kind: str):
    """(model, make a micro-batch of n samples: input, target)."""
    nn = torch.nn
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
        return model, lambda n: (torch.randn(n, 128), torch.randint(0, 10, (n,)))
    width, seq = (128, 64) if kind == "tx128" else (64, 16)
    model = nn.Sequential(nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True),
                          nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True),
                          nn.Linear(width, 65))
    return model, lambda n: (torch.randn(n, seq, width), torch.randint(0, 65, (n, seq)))


def trainer(torch, name: str):
    """step(k, b): one optimizer step over k micro-batches of b samples."""
    kind, _, _ = WORKLOADS[name]
    torch.manual_seed(0)
    model, make = build(torch, kind)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    F = torch.nn.functional

    def step(k: int, b: int) -> None:
        for _ in range(k):
            x, y = make(b)
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)) / k
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def measure(name: str, rounds: int, steps: int) -> None:
    import torch

    _, k, b = WORKLOADS[name]
    settings = [(k, b), (k // 2, 2 * b), (1, k * b)]
    step = trainer(torch, name)
    for kk, bb in settings:                    # warm-up: each shape's first steps allocate
        step(kk, bb)
    t0 = time.perf_counter()
    step(k, b)
    steps = max(steps, round(BLOCK_S / (time.perf_counter() - t0)))    # blocks of about a second or more
    times: dict[tuple, list[float]] = {s: [] for s in settings}
    for r in range(rounds):
        for s in (settings if r % 2 == 0 else settings[::-1]):
            t0 = time.perf_counter()
            for _ in range(steps):
                step(*s)
            times[s].append((time.perf_counter() - t0) / steps)
        base = times[settings[0]][-1]
        print(f"{name} round {r + 1}: {k}x{b} {1e3 * base:.1f} ms/step; "
              + "; ".join(f"{kk}x{bb} {base / times[(kk, bb)][-1]:.2f}x" for kk, bb in settings[1:]), flush=True)
    med = {s: statistics.median(v) for s, v in times.items()}
    print(f"{name} median: " + "; ".join(f"{kk}x{bb} {med[settings[0]] / med[(kk, bb)]:.2f}x"
                                         for kk, bb in settings[1:]) + f" (PD394's bound: {k}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4, help="the least steps a block (blocks last BLOCK_S or more)")
    ap.add_argument("--only", choices=sorted(WORKLOADS))
    a = ap.parse_args()
    for name in [a.only] if a.only else WORKLOADS:
        measure(name, a.rounds, a.steps)


if __name__ == "__main__":
    main()
