"""A GPT-style stack (~85M parameters, bf16 autocast) that saves model and optimizer state with
torch.save every 25th step: three long steps in the 80 measured, which a profiler window of a
few steps may not hold. Fix (--fixed): every 100 steps (never inside the measured window).
Checkpoints go to a temporary directory that is removed. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import GPTBlock, arguments, run_saving, train_step
from torch import nn

a, dev = arguments(__doc__, steps=100, batch=16)
D, H, L, T = (64, 4, 2, 32) if a.small else (768, 12, 12, 512)
model = nn.Sequential(*[GPTBlock(D, H) for _ in range(L)]).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, T, D, device=dev)
state = lambda: {"model": model.state_dict(), "opt": opt.state_dict()}  # noqa: E731
run_saving(train_step(lambda: model(x), opt, dev), state, 100 if a.fixed else 25, a.steps, dev)
