"""A physics-informed MLP trained in float64, as scientific code often is (8 tanh layers of
width 1024 on 16384 collocation points, the residual of a PDE from autograd's input gradients,
Adam): every GEMM runs in double precision. Fix (--fixed): the model and the points in
float32. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
from steady import arguments, run_steady
from torch import nn

a, dev = arguments(__doc__, steps=60, batch=16384)
W, L = (32, 2) if a.small else (1024, 8)
dtype = torch.float32 if a.fixed else torch.float64

layers = [nn.Linear(2, W), nn.Tanh()]
for _ in range(L - 1):
    layers += [nn.Linear(W, W), nn.Tanh()]
model = nn.Sequential(*layers, nn.Linear(W, 1)).to(dev, dtype)
opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=dev == "cuda")
pts = torch.rand(a.batch, 2, device=dev, dtype=dtype)


def step(i):
    xy = pts.clone().requires_grad_(True)
    u = model(xy)
    g, = torch.autograd.grad(u.sum(), xy, create_graph=True)
    residual = g[:, 0] + u[:, 0] * g[:, 1] - torch.sin(xy[:, 0])      # a transport equation
    loss = residual.pow(2).mean() + u[:10].pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


run_steady(step, a.steps, dev)
