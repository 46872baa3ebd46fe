"""A GPT-style stack (6 blocks of width 768, sequences of 512, bf16 autocast) trained with
`torch.autograd.set_detect_anomaly(True)` left on from debugging. Fix (--fixed): anomaly
detection off. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import GPTBlock, arguments, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, steps=50, batch=16)
D, H, L, T = (64, 4, 2, 32) if a.small else (768, 12, 6, 512)
torch.autograd.set_detect_anomaly(not a.fixed)
model = nn.Sequential(*[GPTBlock(D, H) for _ in range(L)]).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, T, D, device=dev)
run_steady(train_step(lambda: model(x), opt, dev), a.steps, dev)
