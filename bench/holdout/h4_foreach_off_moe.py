"""Launch-bound: a mixture of 64 small expert MLPs (each Linear(128, 256)-GELU-Linear(256, 128),
all run on every token, outputs averaged) with Adam(foreach=False): the optimizer launches its
kernels one parameter tensor at a time (256 tensors). Fix (--fixed): Adam(fused=True).
Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import arguments, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, steps=100, batch=256)
E, D = (4, 16) if a.small else (64, 128)


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
                                     for _ in range(E))

    def forward(self, x):
        return torch.stack([e(x) for e in self.experts]).mean(0)


model = Experts().to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if a.fixed and dev == "cuda" else {"foreach": False}))
x = torch.randn(a.batch, D, device=dev)
run_steady(train_step(lambda: model(x), opt, dev, autocast=False), a.steps, dev)
