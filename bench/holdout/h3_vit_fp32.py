"""A small ViT (patch embedding, 8 encoder blocks of width 512, SDPA attention) trained in fp32
with PyTorch's default matmul precision (TF32 off: the SIMT cores).
Fix (--fixed): bf16 autocast. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
import torch.nn.functional as F
from steady import arguments, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, batch=64)
D, H, L, IMG = (64, 4, 2, 32) if a.small else (512, 8, 8, 224)
P = 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, D))
        return x + self.mlp(self.n2(x))


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(3, D, P, stride=P)
        self.pos = nn.Parameter(torch.zeros(1, (IMG // P) ** 2, D))
        self.blocks = nn.Sequential(*[Block() for _ in range(L)])
        self.head = nn.Linear(D, 1000)

    def forward(self, img):
        x = self.embed(img).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.blocks(x).mean(1))


model = ViT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
img = torch.randn(a.batch, 3, IMG, IMG, device=dev)

run_steady(train_step(lambda: model(img), opt, dev, autocast=a.fixed), a.steps, dev)
