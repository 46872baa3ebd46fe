"""A ResNet-style CNN (bf16 autocast, channels_last) with every residual stage under
torch.utils.checkpoint at a batch that keeps the device busy. Fix (--fixed): no checkpointing.
Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import arguments, run_steady, train_step
from torch import nn
from torch.utils.checkpoint import checkpoint

a, dev = arguments(__doc__, batch=128)
C, N, S = (16, 2, 32) if a.small else (128, 6, 64)


class Res(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(C, C, 3, padding=1, bias=False), nn.BatchNorm2d(C), nn.ReLU(),
                                  nn.Conv2d(C, C, 3, padding=1, bias=False), nn.BatchNorm2d(C))

    def forward(self, x):
        return torch.relu(x + self.body(x))


stem = nn.Conv2d(3, C, 3, padding=1).to(dev)
blocks = nn.ModuleList([Res() for _ in range(N)]).to(dev, memory_format=torch.channels_last)
params = list(stem.parameters()) + list(blocks.parameters())
opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
x = torch.randn(a.batch, 3, S, S, device=dev).to(memory_format=torch.channels_last)


def forward():
    h = stem(x)
    for blk in blocks:
        h = blk(h) if a.fixed else checkpoint(blk, h, use_reentrant=False)
    return h


run_steady(train_step(forward, opt, dev), a.steps, dev)
