"""Image input augmented on the CPU in the trainer's own process (num_workers=0): each 3 x 160 x
160 uint8 image is cropped at random, flipped, colour-jittered and normalised with torch ops,
feeding a ViT-style encoder (12 blocks of width 768 on 9 x 9 patches, bf16 autocast) whose
device work is a sizeable part of the step. Fix (--fixed): 8 DataLoader workers, pinned memory,
non_blocking copies. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
import torch.nn.functional as F
from steady import GPTBlock, arguments, run_steady
from torch import nn
from torch.utils.data import DataLoader, Dataset

a, dev = arguments(__doc__, steps=60, batch=128)
S, C, P, D, H, L = (32, 28, 8, 64, 4, 1) if a.small else (160, 144, 16, 768, 12, 12)


class Augmented(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.randint(0, 256, (3, S, S), dtype=torch.uint8, generator=g)
        y0, x0 = (int(v) for v in torch.randint(0, S - C + 1, (2,), generator=g))
        x = img[:, y0:y0 + C, x0:x0 + C].float() / 255
        if torch.rand(1, generator=g) < 0.5:
            x = x.flip(-1)
        x = (x * (0.8 + 0.4 * torch.rand(3, 1, 1, generator=g))).clamp(0, 1)
        x = F.interpolate(x[None], size=(C // P * P, C // P * P), mode="bilinear", align_corners=False)[0]
        return (x - 0.45) / 0.225, i % 100


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, D, P, stride=P)
        self.blocks = nn.Sequential(*[GPTBlock(D, H) for _ in range(L)])
        self.head = nn.Linear(D, 100)

    def forward(self, x):
        return self.head(self.blocks(self.patch(x).flatten(2).transpose(1, 2)).mean(1))


model = ViT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
kw = dict(num_workers=8, pin_memory=dev == "cuda", persistent_workers=True, prefetch_factor=4) if a.fixed else {}
batches = iter(DataLoader(Augmented(), batch_size=a.batch, shuffle=True, **kw))


def step(i):
    x, y = next(batches)
    x, y = x.to(dev, non_blocking=a.fixed), y.to(dev, non_blocking=a.fixed)
    with torch.autocast(dev, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).float(), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


run_steady(step, a.steps, dev)
