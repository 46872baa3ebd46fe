"""A ResNet-style CNN (bf16 autocast) on images whose size changes every step (96 to 224 pixels,
multi-scale training) that calls torch.cuda.empty_cache() after every step. Fix (--fixed): no
empty_cache. Prints `STEADY_MS <ms>` (steady.py).

Options for the channels_last measurements of 2026-12-01 (bench/holdout/h200-2026-12-01.json;
the defaults are the script as first run): --channels_last 1 (model and images channels_last),
--autocast 0 (fp32: TF32 convolutions, cuDNN batch norm), --channels, --blocks, --min_size,
--max_size, --size_step (the image sizes: range(min, max + 1, step))."""
import torch
from steady import ResBlock, arguments, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, steps=100, batch=64, channels_last=0, autocast=1, channels=128, blocks=6,
                   min_size=96, max_size=224, size_step=32)
C, N, SIZES = (16, 1, (16, 24, 32)) if a.small else \
    (a.channels, a.blocks, tuple(range(a.min_size, a.max_size + 1, a.size_step)))

model = nn.Sequential(nn.Conv2d(3, C, 3, padding=1), *[ResBlock(C) for _ in range(N)],
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(C, 100)).to(dev)
layout = torch.channels_last if a.channels_last else torch.contiguous_format
model = model.to(memory_format=layout)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator().manual_seed(0)
images = {s: torch.randn(a.batch, 3, s, s, device=dev).contiguous(memory_format=layout) for s in SIZES}
inner = train_step(lambda: model(images[SIZES[int(torch.randint(len(SIZES), (1,), generator=g))]]), opt, dev,
                   autocast=bool(a.autocast))


def step(i):
    inner(i)
    if not a.fixed and dev == "cuda":
        torch.cuda.empty_cache()


run_steady(step, a.steps, dev)
