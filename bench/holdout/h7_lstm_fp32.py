"""A two-layer LSTM language model in fp32 (vocabulary 8192, embedding and hidden width 1024,
sequences of 256 tokens): cuDNN's recurrent kernels and the output projection run in fp32.
Fix (--fixed): bf16 autocast around the model. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
import torch.nn.functional as F
from steady import arguments, run_steady
from torch import nn

a, dev = arguments(__doc__, steps=60, batch=64)
V, E, T = (256, 32, 16) if a.small else (8192, 1024, 256)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.rnn = nn.LSTM(E, E, num_layers=2, batch_first=True)
        self.out = nn.Linear(E, V)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(h)


model = LM().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev == "cuda")
tokens = torch.randint(0, V, (a.batch, T + 1), device=dev)


def step(i):
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=a.fixed):
        logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, V), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


run_steady(step, a.steps, dev)
