"""What the held-out scripts share: their command line, their training step and its timing,
and the pre-LayerNorm GPT block two of them train (`GPTBlock`).

Each script builds its model, then hands one training step to `run_steady`, which runs it
--steps times and prints `STEADY_MS <ms>`: wall time per step after WARMUP steps, the device
synchronised at both ends (bench/validate_holdout.py reads that line)."""
import argparse
import shutil
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

WARMUP = 20      # steps before the clock starts (compiling, allocator and cuDNN warm-up happen here)
SMALL_BATCH = 4  # --small: a CPU check that the script runs, not a measurement


def arguments(doc: str, steps: int = 80, batch: int = 8, **extra: int):
    """(parsed --steps --batch --small --fixed and the script's own int options, device)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--batch", type=int, default=None, help=f"batch size (default {batch}; {SMALL_BATCH} with --small)")
    for name, default in extra.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--small", action="store_true", help="tiny sizes (a CPU check of the harness)")
    ap.add_argument("--fixed", action="store_true", help="apply the textbook fix")
    a = ap.parse_args()
    if a.batch is None:
        a.batch = SMALL_BATCH if a.small else batch
    return a, "cuda" if torch.cuda.is_available() else "cpu"


def run_steady(step, steps: int, dev: str) -> None:
    """step(i) for i in range(steps); print the steady ms/step after WARMUP steps (half the steps
    when there are fewer than twice that: a --small check of the harness)."""
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    warm = min(WARMUP, steps // 2)
    t0 = None
    for i in range(steps):
        if i == warm:
            sync()
            t0 = time.perf_counter()
        step(i)
    sync()
    print(f"STEADY_MS {1000 * (time.perf_counter() - t0) / (steps - warm):.2f}", flush=True)


def run_saving(step, state, every: int, steps: int, dev: str, save=torch.save) -> None:
    """run_steady(step) with save(state(), path) (torch.save unless given) after every `every`-th
    step, into a temporary directory removed at the end (the checkpoint scripts)."""
    out = tempfile.mkdtemp(prefix="perfdoctor-holdout-ckpt-")

    def saving(i):
        step(i)
        if (i + 1) % every == 0:
            save(state(), f"{out}/ckpt.pt")
    try:
        run_steady(saving, steps, dev)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def train_step(forward, opt, dev: str, autocast: bool = True):
    """A step for run_steady: forward() under bf16 autocast (when asked), a mean-square loss of
    its output, backward, the optimizer's step."""
    def step(i):
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
            loss = forward().float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def train_stack(blocks: list, x, a, dev: str, fix: str | None, *extra) -> None:
    """Train the blocks, run one after another from x (each block(h, *extra)), with fused AdamW
    (train_step under bf16 autocast) for --steps. `fix`: what --fixed changes, "compile" (the
    stack compiled as one module), "recompute" (every block under torch.utils.checkpoint unless
    --fixed), or None (the blocks read a.fixed themselves)."""
    stack = nn.Sequential(*blocks).to(dev)
    opt = torch.optim.AdamW(stack.parameters(), lr=1e-4, fused=dev == "cuda")
    if fix == "compile":
        model = torch.compile(stack) if a.fixed else stack
        forward = lambda: model(x)  # noqa: E731
    else:
        forward = chain(stack, lambda: x, fix == "recompute" and not a.fixed, *extra)
    run_steady(train_step(forward, opt, dev), a.steps, dev)


def chain(blocks, first, checkpointed: bool, *extra):
    """forward() through blocks from first() (each block(h, *extra)), every block under
    torch.utils.checkpoint (non-reentrant) when checkpointed."""
    def forward():
        h = first()
        for blk in blocks:
            h = checkpoint(blk, h, *extra, use_reentrant=False) if checkpointed else blk(h, *extra)
        return h
    return forward


class ResBlock(nn.Module):
    """conv-BN-ReLU-conv-BN with the identity added, then ReLU (c channels)."""

    def __init__(self, c: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return torch.relu(x + self.body(x))


class GPTBlock(nn.Module):
    """A pre-LayerNorm GPT block of width d with h heads; `attend(q, k, v)` (causal SDPA here)
    is what a script may replace."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.d, self.h = d, h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, self.d // self.h).permute(2, 0, 3, 1, 4)
        x = x + self.proj(self.attend(q, k, v).transpose(1, 2).reshape(b, t, self.d))
        return x + self.mlp(self.ln2(x))
