"""A ResNet-style CNN (bf16 autocast, channels_last) with every residual stage under
torch.utils.checkpoint at a batch that keeps the device busy. Fix (--fixed): no checkpointing.
Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import ResBlock, arguments, chain, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, batch=128)
C, N, S = (16, 2, 32) if a.small else (128, 6, 64)


stem = nn.Conv2d(3, C, 3, padding=1).to(dev)
blocks = nn.ModuleList([ResBlock(C) for _ in range(N)]).to(dev, memory_format=torch.channels_last)
params = list(stem.parameters()) + list(blocks.parameters())
opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
x = torch.randn(a.batch, 3, S, S, device=dev).to(memory_format=torch.channels_last)

run_steady(train_step(chain(blocks, lambda: stem(x), not a.fixed), opt, dev), a.steps, dev)
