"""Host-bound: per-op overhead (Python, module calls, dispatch) dominates, not the math.

    python examples/overhead_bound.py [--steps N] [--layers N] [--batch-size N]

The model is a Python loop over 200 tiny residual blocks (Linear(8, 8) + Tanh + add) at batch 4:
about 600 forward ops, 800 backward nodes and 200 parameter updates per step. Each op does a
few hundred FLOPs (nanoseconds of math) but costs microseconds of overhead: nn.Module.__call__,
argument parsing, dispatch, autograd graph building and engine bookkeeping. A CPU trace counts
an op's own dispatch inside the op, so the ops still fill about 60% of the step; the other
~40% is Python and autograd-engine time between ops, and input is ~0. So the step is far from
the 80% "compute-bound" line and the largest idle cause is the host: perfdoctor reports it
host-bound. The loader is trivial (an in-memory TensorDataset, num_workers=0). The fixes are
fewer, larger ops: a bigger batch, fused layers, or torch.compile to remove the Python between
ops.
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class TinyBlocks(nn.Module):
    """200 residual blocks x + tanh(W x), W 8x8: nanoseconds of math, microseconds of calls each."""

    def __init__(self, n: int, dim: int = 8):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(dim, dim, bias=False), nn.Tanh())
                                    for _ in range(n))
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:       # one Python iteration (3 module calls, 3 ops) per block
            x = x + block(x)
        return self.head(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4000, help="optimizer steps (default: ~60 s)")
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args()
    print(f"overhead_bound: {args.layers} blocks of Linear(8, 8) + Tanh, batch {args.batch_size}", flush=True)
    torch.manual_seed(0)
    # 8x8 ops gain nothing from intra-op threads; on a busy machine their wake-ups and barriers
    # inside each op (a thread preempted by another process) inflate op times erratically.
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(1024, 8), torch.randint(0, 10, (1024,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = TinyBlocks(args.layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
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
    print(f"overhead_bound: done, {step} steps, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
