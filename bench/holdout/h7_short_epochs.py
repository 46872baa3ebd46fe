"""Short epochs of a DataLoader with 8 workers and persistent_workers=False: each epoch of 10
batches (uint8 images decoded from bytes and normalised in the workers) starts its 8 worker
processes again, feeding a small CNN (bf16 autocast). Fix (--fixed): persistent_workers=True.
Prints `STEADY_MS <ms>` (steady.py)."""
import torch
import torch.nn.functional as F
from steady import ResBlock, arguments, run_steady
from torch import nn
from torch.utils.data import DataLoader, Dataset

a, dev = arguments(__doc__, steps=80, batch=64)
C, N, S = (8, 1, 16) if a.small else (64, 4, 96)


class Images(Dataset):
    def __len__(self):
        return 10 * a.batch

    def __getitem__(self, i):
        raw = torch.randint(0, 256, (3 * S * S,), dtype=torch.uint8).numpy().tobytes()
        img = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(3, S, S)
        return (img.float() / 255 - 0.5) / 0.25, i % 10


model = nn.Sequential(nn.Conv2d(3, C, 3, padding=1), *[ResBlock(C) for _ in range(N)],
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(C, 10)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev == "cuda")
loader = DataLoader(Images(), batch_size=a.batch, shuffle=True, num_workers=2 if a.small else 8,
                    pin_memory=dev == "cuda", persistent_workers=a.fixed)


def batches():
    while True:                 # an epoch after another
        yield from loader


it = batches()


def step(i):
    x, y = next(it)
    x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    with torch.autocast(dev, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


run_steady(step, a.steps, dev)
