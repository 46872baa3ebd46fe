"""A ResNet-style CNN (bf16 autocast) on images whose size changes every step (96 to 224 pixels,
multi-scale training) that calls torch.cuda.empty_cache() after every step. Fix (--fixed): no
empty_cache. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import ResBlock, arguments, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, steps=100, batch=64)
C, N, SIZES = (16, 1, (16, 24, 32)) if a.small else (128, 6, tuple(range(96, 225, 32)))

model = nn.Sequential(nn.Conv2d(3, C, 3, padding=1), *[ResBlock(C) for _ in range(N)],
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(C, 100)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator().manual_seed(0)
images = {s: torch.randn(a.batch, 3, s, s, device=dev) for s in SIZES}
inner = train_step(lambda: model(images[SIZES[int(torch.randint(len(SIZES), (1,), generator=g))]]), opt, dev)


def step(i):
    inner(i)
    if not a.fixed and dev == "cuda":
        torch.cuda.empty_cache()


run_steady(step, a.steps, dev)
