"""An MLP-Mixer-style stack in fp32 with TF32 matmuls allowed (torch.backends.cuda.matmul
.allow_tf32 = True): the GEMMs already run on the tensor cores, at half the bf16 rate.
Fix (--fixed): bf16 autocast. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import arguments, run_steady, train_step
from torch import nn

torch.backends.cuda.matmul.allow_tf32 = True
a, dev = arguments(__doc__, batch=64)
D, P, L = (64, 16, 2) if a.small else (768, 196, 8)


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.tok = nn.Sequential(nn.Linear(P, 4 * P), nn.GELU(), nn.Linear(4 * P, P))
        self.ch = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.tok(self.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ch(self.n2(x))


model = nn.Sequential(*[Mixer() for _ in range(L)]).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, P, D, device=dev)

run_steady(train_step(lambda: model(x), opt, dev, autocast=a.fixed), a.steps, dev)
