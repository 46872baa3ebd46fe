"""A ResNet-style CNN (bf16 autocast) that writes its weights with safetensors' save_file every
2nd step. Fix (--fixed): every 100 steps. The files go to a temporary directory that is removed.
Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from safetensors.torch import save_file
from steady import ResBlock, arguments, run_saving, train_step
from torch import nn

a, dev = arguments(__doc__, steps=100, batch=64)
C, N, S = (16, 2, 32) if a.small else (256, 8, 32)


model = nn.Sequential(nn.Conv2d(3, C, 3, padding=1), *[ResBlock(C) for _ in range(N)]).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(a.batch, 3, S, S, device=dev)


def state():
    return {k: v.contiguous() for k, v in model.state_dict().items()}


run_saving(train_step(lambda: model(x), opt, dev), state, 100 if a.fixed else 2, a.steps, dev,
           save=save_file)
