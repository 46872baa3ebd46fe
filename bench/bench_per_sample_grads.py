"""PD382's fix measured: per-sample gradients by a loop of torch.autograd.grad calls against one
torch.func vmap(grad(...)) call, over batch sizes and model widths.

    python bench/bench_per_sample_grads.py [--threads 2] [--rounds 6]

A DP-SGD step (per-sample gradients, each clipped to norm 1, summed, noised, one SGD step) on an
MLP 64-W-W-10 or a small conv net, at batch B. Blocks of steps alternate the loop and the vmapped
version in one process; the ratio of the medians is the fix's measured gain, printed beside
PD382's ceiling (B: a batched call costs at least one per-sample call) and B x parameters, the
numbers the batched version writes as per-sample gradients each step. The fix wins while those
stay small and loses where they do not (measured on a 2-core VM: W=1024, B=32, 35M numbers: 0.29x).
"""

from __future__ import annotations

import argparse
import statistics
import time

CONFIGS = [(8, 256, False), (32, 64, False), (32, 256, False), (128, 256, False), (32, 1024, False),
           (32, 256, True), (16, 512, True)]


def build(torch, width: int, conv: bool):
    nn = torch.nn
    if conv:
        c = width // 16
        model = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))
        return model, torch.randn(1024, 3, 16, 16)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    return model, torch.randn(1024, 64)


def steps(torch, batch: int, width: int, conv: bool):
    """(loop_step, vmap_step, parameter count): two callables that each run one DP-SGD step."""
    from torch.func import functional_call, grad, vmap
    F = torch.nn.functional
    model, X = build(torch, width, conv)
    Y = torch.randint(0, 10, (len(X),))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]

    def loss_one(ps, x, y):
        return F.cross_entropy(functional_call(model, dict(zip(names, ps)), (x.unsqueeze(0),)), y.unsqueeze(0))
    per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def finish(summed):
        for q, s in zip(params, summed):
            q.grad = (s + 0.1 * torch.randn_like(s)) / batch
        opt.step()

    def loop_step():
        idx = torch.randint(0, len(X), (batch,))
        xb, yb = X[idx], Y[idx]
        summed = [torch.zeros_like(q) for q in params]
        for i in range(batch):
            gs = torch.autograd.grad(F.cross_entropy(model(xb[i:i + 1]), yb[i:i + 1]), params)
            scale = torch.clamp(1.0 / (torch.sqrt(sum((g * g).sum() for g in gs)) + 1e-6), max=1.0)
            for s, g in zip(summed, gs):
                s.add_(g * scale)
        finish(summed)

    def vmap_step():
        idx = torch.randint(0, len(X), (batch,))
        xb, yb = X[idx], Y[idx]
        gs = per_sample([q.detach() for q in params], xb, yb)
        scale = torch.clamp(1.0 / (torch.sqrt(sum((g * g).flatten(1).sum(1) for g in gs)) + 1e-6), max=1.0)
        finish([(g * scale.view(-1, *[1] * (g.dim() - 1))).sum(0) for g in gs])

    return loop_step, vmap_step, sum(q.numel() for q in params)


def block_ms(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) * 1e3 / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    print(f"{'model':<10} {'B':>4} {'params':>8} {'B x params':>11}  {'loop ms':>8} {'vmap ms':>8}  "
          f"{'measured':>8}  {'PD382 max':>9}")
    for batch, width, conv in CONFIGS:
        loop_step, vmap_step, count = steps(torch, batch, width, conv)
        loop_step(), vmap_step()                       # warm-up: vmap's first call traces its rules
        n = max(2, 400 // batch)
        a, b = [], []
        for _ in range(args.rounds):                   # alternating blocks: a slow stretch hits both
            a.append(block_ms(loop_step, n))
            b.append(block_ms(vmap_step, n))
        la, lb = statistics.median(a), statistics.median(b)
        name = f"conv {width // 16}" if conv else f"mlp {width}"
        print(f"{name:<10} {batch:>4} {count:>8} {batch * count / 1e6:>10.1f}M  {la:>8.2f} {lb:>8.2f}  "
              f"{la / lb:>7.2f}x  {batch:>8}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
