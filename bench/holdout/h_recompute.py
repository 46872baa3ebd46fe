"""A GPT-style stack (bf16, SDPA) with every block under torch.utils.checkpoint, on a GPU with
memory to spare. Fix (--fixed): no checkpointing. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import GPTBlock, arguments, chain, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, batch=8)
D, H, L, T = (64, 4, 2, 64) if a.small else (1024, 16, 8, 1024)


blocks = nn.ModuleList([GPTBlock(D, H) for _ in range(L)]).to(dev)
opt = torch.optim.AdamW(blocks.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, T, D, device=dev)

run_steady(train_step(chain(blocks, lambda: x, not a.fixed), opt, dev), a.steps, dev)
