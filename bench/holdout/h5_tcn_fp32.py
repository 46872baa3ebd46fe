"""A temporal convolution network in fp32 (8 residual blocks of dilated Conv1d, 256 channels,
BatchNorm1d, GELU, on sequences of 4096 samples): cuDNN runs the convolutions in TF32. Fix
(--fixed): bf16 autocast. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import arguments, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, steps=60, batch=32)
C, N, T = (16, 2, 64) if a.small else (256, 8, 4096)


class Dilated(nn.Module):
    def __init__(self, c: int, dilation: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(c, c, 3, padding=dilation, dilation=dilation), nn.BatchNorm1d(c),
                                  nn.GELU(), nn.Conv1d(c, c, 1))

    def forward(self, x):
        return x + self.body(x)


model = nn.Sequential(nn.Conv1d(1, C, 7, padding=3), *[Dilated(C, 2 ** (i % 6)) for i in range(N)],
                      nn.Conv1d(C, 1, 1)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev == "cuda")
x = torch.randn(a.batch, 1, T, device=dev)
run_steady(train_step(lambda: model(x), opt, dev, autocast=a.fixed), a.steps, dev)
