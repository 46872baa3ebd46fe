"""A bf16 MLP stack written op by op (x * sigmoid(1.702 x) activations, LayerNorm, dropout,
residuals): many memory-bound elementwise kernels on a device-bound step.
Fix (--fixed): torch.compile(model). Prints `STEADY_MS <ms>` (steady.py: the compiling happens
in the warm-up steps)."""
import torch
from steady import arguments, train_stack
from torch import nn

a, dev = arguments(__doc__, batch=16384)
D, L, B = (64, 2, 256) if a.small else (1024, 8, a.batch)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h = self.fc1(self.ln(x))
        h = h * torch.sigmoid(1.702 * h)
        h = self.drop(h) * 0.5 + 0.5 * h
        return x + self.drop(self.fc2(h))


x = torch.randn(B, D, device=dev)
train_stack([Block() for _ in range(L)], x, a, dev, "compile")
