"""A GPT-style stack (bf16, SDPA) with every block under torch.utils.checkpoint, on a GPU with
memory to spare. Fix (--fixed): no checkpointing. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import GPTBlock, arguments, train_stack

a, dev = arguments(__doc__, batch=8)
D, H, L, T = (64, 4, 2, 64) if a.small else (1024, 16, 8, 1024)
x = torch.randn(a.batch, T, D, device=dev)
train_stack([GPTBlock(D, H) for _ in range(L)], x, a, dev, "recompute")
