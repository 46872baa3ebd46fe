"""A GPT-style language model (6 blocks of width 384, bf16 autocast) whose step reads three
numbers back to the host: the loss, the gradient norm after clipping and the token accuracy, each
with .item(), and whose batch of token ids is built in pageable memory and copied blocking.
Fix (--fixed): the metrics stay on the device and are read every 50 steps; the batch is staged in
pinned memory and copied non_blocking. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
import torch.nn.functional as F
from steady import GPTBlock, arguments, run_steady
from torch import nn

a, dev = arguments(__doc__, steps=120, batch=16, compile=0)
V, D, H, L, T = (500, 64, 4, 2, 32) if a.small else (8192, 384, 6, 6, 256)

emb, head = nn.Embedding(V, D), nn.Linear(D, V)
model = nn.Sequential(emb, *[GPTBlock(D, H) for _ in range(L)], nn.LayerNorm(D), head).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev == "cuda")
host = torch.randint(0, V, (a.batch, T + 1))
if a.fixed and dev == "cuda":
    host = host.pin_memory()
kept = torch.zeros(3, device=dev)
# --compile 1: the model under torch.compile, 2: with mode="reduce-overhead" (CUDA graphs); the
# measurements of 2026-12-01 (bench/holdout/h200-2026-12-01.json)
forward = torch.compile(model, mode="reduce-overhead" if a.compile == 2 else None) if a.compile else model


def step(i):
    host.random_(0, V)                       # the next batch, written by the CPU
    ids = host.to(dev, non_blocking=a.fixed)
    x, y = ids[:, :-1], ids[:, 1:]
    with torch.autocast(dev, dtype=torch.bfloat16):
        logits = forward(x)
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    acc = (logits.argmax(-1) == y).float().mean()
    if a.fixed:
        kept.add_(torch.stack([loss.detach(), norm, acc]))
        if i % 50 == 49:
            print("loss %.3f norm %.3f acc %.3f" % tuple((kept / 50).tolist()), flush=True)
            kept.zero_()
    else:
        stats = (loss.item(), norm.item(), acc.item())
        if i % 50 == 49:
            print("loss %.3f norm %.3f acc %.3f" % stats, flush=True)


run_steady(step, a.steps, dev)
