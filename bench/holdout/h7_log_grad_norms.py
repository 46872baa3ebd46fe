"""A GPT-style stack (8 blocks of width 512, sequences of 256, bf16 autocast, fused AdamW) whose
loop logs, after every step, the loss and each parameter's gradient norm as Python floats
(one .item() per tensor, ~100 of them). Fix (--fixed): log every 50 steps (never inside the
measured window). Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import GPTBlock, arguments, run_steady
from torch import nn

a, dev = arguments(__doc__, steps=80, batch=16)
D, H, L, T = (64, 4, 2, 32) if a.small else (512, 8, 8, 256)
model = nn.Sequential(*[GPTBlock(D, H) for _ in range(L)]).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, T, D, device=dev)
every = 50 if a.fixed else 1
log = []


def step(i):
    with torch.autocast(dev, dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if (i + 1) % every == 0:
        log.append({"loss": loss.item(), **{n: p.grad.norm().item() for n, p in model.named_parameters()}})
    opt.step()


run_steady(step, a.steps, dev)
