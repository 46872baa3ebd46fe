"""A ResNet-style CNN (bf16 autocast, channels_last, 64 x 64 images) whose loop evaluates on
eight held-back batches after every 4th training step, in model.eval() and no_grad, reading the
accuracy with .item(). Fix (--fixed): evaluate every 100 steps (never inside the measured
window). Prints `STEADY_MS <ms>` (steady.py)."""
import torch
import torch.nn.functional as F
from steady import ResBlock, arguments, run_steady
from torch import nn

a, dev = arguments(__doc__, steps=80, batch=128)
C, N, S = (8, 1, 16) if a.small else (128, 6, 64)
model = nn.Sequential(nn.Conv2d(3, C, 3, padding=1), *[ResBlock(C) for _ in range(N)],
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(C, 10)).to(dev, memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(a.batch, 3, S, S, device=dev).to(memory_format=torch.channels_last)
y = torch.randint(0, 10, (a.batch,), device=dev)
val = [(torch.randn(a.batch, 3, S, S, device=dev).to(memory_format=torch.channels_last),
        torch.randint(0, 10, (a.batch,), device=dev)) for _ in range(8)]
every = 100 if a.fixed else 4


def evaluate():
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16):
        for vx, vy in val:
            correct += (model(vx).argmax(1) == vy).sum().item()
    model.train()
    return correct / (len(val) * a.batch)


def step(i):
    with torch.autocast(dev, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if (i + 1) % every == 0:
        evaluate()


run_steady(step, a.steps, dev)
