"""A Transformer encoder in fp32 (matmuls on the SIMT cores: TF32 off, PyTorch's default).
Fix (--fixed): bf16 autocast. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import arguments, run_steady, train_step
from torch import nn

a, dev = arguments(__doc__, batch=32)
D, L, T = (64, 2, 32) if a.small else (1024, 4, 256)
layer = nn.TransformerEncoderLayer(D, nhead=max(D // 64, 1), dim_feedforward=4 * D, batch_first=True)
model = nn.TransformerEncoder(layer, L, enable_nested_tensor=False).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
x = torch.randn(a.batch, T, D, device=dev)


run_steady(train_step(lambda: model(x), opt, dev, autocast=a.fixed), a.steps, dev)
