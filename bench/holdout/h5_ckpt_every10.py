"""A wide MLP stack (~100M parameters, bf16 autocast, batch of 8192 rows) that saves its model
state with torch.save every 10th step: a few long steps among many short ones. Fix (--fixed):
every 100 steps (never inside the measured window). Checkpoints go to a temporary directory that
is removed. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import arguments, run_saving, train_step
from torch import nn

a, dev = arguments(__doc__, steps=100, batch=8192)
D, L = (64, 1) if a.small else (2048, 3)
model = nn.Sequential(*[nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D)) for _ in range(L)]).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, D, device=dev)
run_saving(train_step(lambda: model(x), opt, dev), model.state_dict, 100 if a.fixed else 10, a.steps, dev)
