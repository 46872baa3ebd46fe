"""A small CNN (~7M parameters) that saves its state_dict (and the optimizer's) with torch.save
after every step. Fix (--fixed): save every 100 steps. Checkpoints go to a temporary directory
that is removed. Prints `STEADY_MS <ms>` (steady.py; with --fixed, exactly one save every 100)."""
import torch
from steady import arguments, run_saving
from torch import nn

a, dev = arguments(__doc__, steps=120, batch=64)
size, batch = (32, 8) if a.small else (128, a.batch)


def stage(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]


model = nn.Sequential(*stage(3, 64), *stage(64, 128), *stage(128, 256), *stage(256, 512),
                      nn.Conv2d(512, 512, 3, padding=1), nn.ReLU(), nn.Conv2d(512, 512, 3, padding=1),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 100)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(batch, 3, size, size, device=dev)
y = torch.randint(0, 100, (batch,), device=dev)


def step(i):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


run_saving(step, lambda: {"model": model.state_dict(), "opt": opt.state_dict()}, 100 if a.fixed else 1, a.steps, dev)
