"""Text input tokenised in Python: each sample is a generated paragraph, lower-cased, split into
words and looked up word by word in a vocabulary dict, then padded to T tokens, in the trainer's
own process (num_workers=0), feeding a small bf16 Transformer on the device. Fix (--fixed): 8
DataLoader workers, pinned memory, non_blocking copies. Prints `STEADY_MS <ms>` (steady.py)."""
import random

import torch
import torch.nn.functional as F
from steady import GPTBlock, arguments, run_steady
from torch import nn
from torch.utils.data import DataLoader, Dataset

a, dev = arguments(__doc__, steps=60, batch=64)
V, D, H, L, T = (512, 64, 4, 1, 32) if a.small else (16384, 256, 4, 4, 512)
WORDS = [f"Word{i}" for i in range(4 * V)]          # a quarter of them are in the vocabulary


class Paragraphs(Dataset):
    def __init__(self, n=1_000_000):
        self.n = n
        self.vocab = {w.lower(): i for i, w in enumerate(WORDS[:V - 1], start=1)}   # 0: unknown/padding

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = random.Random(i)
        text = " ".join(rng.choice(WORDS) for _ in range(T + 1)) + "."
        ids = [self.vocab.get(w.strip(".,").lower(), 0) for w in text.split()][:T + 1]
        ids += [0] * (T + 1 - len(ids))
        return torch.tensor(ids)


model = nn.Sequential(nn.Embedding(V, D), *[GPTBlock(D, H) for _ in range(L)], nn.LayerNorm(D),
                      nn.Linear(D, V)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev == "cuda")
kw = dict(num_workers=8, pin_memory=dev == "cuda", persistent_workers=True, prefetch_factor=4) if a.fixed else {}
batches = iter(DataLoader(Paragraphs(), batch_size=a.batch, shuffle=True, **kw))


def step(i):
    ids = next(batches).to(dev, non_blocking=a.fixed)
    with torch.autocast(dev, dtype=torch.bfloat16):
        logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


run_steady(step, a.steps, dev)
