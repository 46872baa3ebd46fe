"""A GPT-style stack (bf16, SDPA) with every block under torch.utils.checkpoint, on a GPU with
memory to spare. Fix (--fixed): no checkpointing. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
import torch.nn.functional as F
from steady import arguments, run_steady, train_step
from torch import nn
from torch.utils.checkpoint import checkpoint

a, dev = arguments(__doc__, batch=8)
D, H, L, T = (64, 4, 2, 64) if a.small else (1024, 16, 8, 1024)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, D))
        return x + self.mlp(self.ln2(x))


blocks = nn.ModuleList([Block() for _ in range(L)]).to(dev)
opt = torch.optim.AdamW(blocks.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, T, D, device=dev)


def forward():
    h = x
    for blk in blocks:
        h = blk(h) if a.fixed else checkpoint(blk, h, use_reentrant=False)
    return h


run_steady(train_step(forward, opt, dev), a.steps, dev)
