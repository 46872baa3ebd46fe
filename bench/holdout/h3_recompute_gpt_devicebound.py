"""A GPT-style stack (bf16, SDPA, 12 blocks of width 768) with every block under
torch.utils.checkpoint at a batch that keeps the device busy, on a GPU with memory to spare.
Fix (--fixed): no checkpointing. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import GPTBlock, arguments, train_stack

a, dev = arguments(__doc__, batch=32)
D, H, L, T = (64, 4, 2, 32) if a.small else (768, 12, 12, 1024)
x = torch.randn(a.batch, T, D, device=dev)
train_stack([GPTBlock(D, H) for _ in range(L)], x, a, dev, "recompute")
