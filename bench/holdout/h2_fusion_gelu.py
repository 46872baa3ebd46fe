"""A bf16 pre-LayerNorm MLP stack built from library modules (LayerNorm, Linear, GELU with the
tanh approximation, Dropout, residual adds): the short memory-bound chains of a Transformer's
feed-forward half on a device-bound step. Fix (--fixed): torch.compile(model).
Prints `STEADY_MS <ms>` (steady.py: the compiling happens in the warm-up steps)."""
import torch
from steady import arguments, train_stack
from torch import nn

a, dev = arguments(__doc__, batch=64)
D, L, T = (64, 2, 16) if a.small else (1024, 6, 512)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(approximate="tanh"), nn.Dropout(0.1),
                                nn.Linear(4 * D, D), nn.Dropout(0.1))

    def forward(self, x):
        return x + self.ff(self.ln(x))


x = torch.randn(a.batch, T, D, device=dev)
train_stack([Block() for _ in range(L)], x, a, dev, "compile")
