"""A UNet-style encoder-decoder (bf16 autocast, 3x3 convolutions with BatchNorm at 64-256
channels, on 256 x 256 images) left in the default NCHW layout. Fix (--fixed): model and images
in channels_last. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
import torch.nn.functional as F
from steady import arguments, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, steps=60, batch=16)
C, S = (8, 32) if a.small else (64, 256)


def conv(i, o):
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(),
                         nn.Conv2d(o, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())


class UNet(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.d1, self.d2, self.d3 = conv(3, c), conv(c, 2 * c), conv(2 * c, 4 * c)
        self.u2, self.u1 = conv(6 * c, 2 * c), conv(3 * c, c)
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x):
        h1 = self.d1(x)
        h2 = self.d2(F.max_pool2d(h1, 2))
        h3 = self.d3(F.max_pool2d(h2, 2))
        u2 = self.u2(torch.cat([F.interpolate(h3, scale_factor=2.0), h2], 1))
        return self.out(self.u1(torch.cat([F.interpolate(u2, scale_factor=2.0), h1], 1)))


layout = torch.channels_last if a.fixed else torch.contiguous_format
model = UNet(C).to(dev).to(memory_format=layout)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev == "cuda")
x = torch.randn(a.batch, 3, S, S, device=dev).contiguous(memory_format=layout)
run_steady(train_step(lambda: model(x), opt, dev), a.steps, dev)
