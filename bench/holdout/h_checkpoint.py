"""A small CNN (~7M parameters) that saves its state_dict (and the optimizer's) with torch.save after every step.
Fix (--fixed): save every 100 steps. Checkpoints go to a temporary directory that is removed.
Prints `STEADY_MS <ms>` over steps 20..steps (with --fixed, exactly one save every 100)."""
import argparse
import shutil
import tempfile
import time

import torch
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=120)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--small", action="store_true", help="tiny sizes (a CPU check of the harness)")
ap.add_argument("--fixed", action="store_true")
a = ap.parse_args()
dev = "cuda" if torch.cuda.is_available() else "cpu"
size, batch = (32, 8) if a.small else (128, a.batch)
def stage(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]


model = nn.Sequential(*stage(3, 64), *stage(64, 128), *stage(128, 256), *stage(256, 512),
                      nn.Conv2d(512, 512, 3, padding=1), nn.ReLU(), nn.Conv2d(512, 512, 3, padding=1),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 100)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(batch, 3, size, size, device=dev)
y = torch.randint(0, 100, (batch,), device=dev)
every = 100 if a.fixed else 1
out = tempfile.mkdtemp(prefix="perfdoctor-holdout-ckpt-")
t0 = None
try:
    for step in range(a.steps):
        if step == 20:
            torch.cuda.synchronize() if dev == "cuda" else None
            t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"{out}/ckpt.pt")
    torch.cuda.synchronize() if dev == "cuda" else None
    print(f"STEADY_MS {1000 * (time.perf_counter() - t0) / (a.steps - 20):.2f}", flush=True)
finally:
    shutil.rmtree(out, ignore_errors=True)
