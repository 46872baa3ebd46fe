"""The fused optimizer on the CPU, inside a training loop: optimizer-step and whole-step ratios.

    python bench/bench_fused_cpu.py [--steps 160] [--only Adam AdamW ...] [--base foreach]

For each model (MLPs of 512, 64 and 2048-wide layers, a small transformer encoder) and optimizer
class (Adam, AdamW, SGD with and without momentum, Adagrad), two copies of the same model train
in one process, one with the for-loop implementation (foreach=False) and one with fused=True,
stepped alternately (the order flips every step), so the shared machine's noise hits both
(--base foreach: the multi-tensor implementation, foreach=True, in place of the for-loop). Each
step's forward and backward run between the optimizer steps, as in training: the optimizer's
tensors are not warm in cache the way a loop of bare optimizer steps keeps them.

Printed per pair: the base optimizer's share of the step, its time, the optimizer-step ratio
base / fused, the whole-step ratio, and the Amdahl bound of the optimizer ratio on that
share (the whole-step ratio should match it: fusing changes only the optimizer's time).
analyze/fusedcpu.py's table (PD338's expected gain on the CPU) comes from these ratios.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from perfdoctor.rules.gain import amdahl


def mlp(width: int, layers: int) -> nn.Module:
    mods: list = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()]
    return nn.Sequential(*mods, nn.Linear(width, 10))


def encoder(d: int = 256, layers: int = 4) -> nn.Module:
    layer = nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True, dropout=0.0)
    return nn.Sequential(nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.Flatten(),
                         nn.LazyLinear(10))


MODELS = {"mlp 512x6, batch 32": (lambda: mlp(512, 6), (32, 512)),
          "mlp 64x12, batch 16": (lambda: mlp(64, 12), (16, 64)),
          "encoder 256x4, 8x32": (encoder, (8, 32, 256)),
          "mlp 2048x3, batch 64": (lambda: mlp(2048, 3), (64, 2048))}
CLASSES = [("Adam", torch.optim.Adam, {}), ("AdamW", torch.optim.AdamW, {}),
           ("SGD+momentum", torch.optim.SGD, {"momentum": 0.9}), ("SGD", torch.optim.SGD, {}),
           ("Adagrad", torch.optim.Adagrad, {})]
WARMUP = 20


def pair(make, shape, cls, kw: dict, steps: int, base: str = "loop") -> dict:
    x, y = torch.randn(*shape), torch.randint(0, 10, (shape[0],))
    arms = {}
    for impl, flag in ((base, {"foreach": base == "foreach"}), ("fused", {"fused": True})):
        torch.manual_seed(0)
        model = make()
        model(x)                          # lazy modules get their shapes
        arms[impl] = (model, cls(model.parameters(), lr=1e-4, **flag, **kw))
    times = {k: {"opt": 0.0, "step": 0.0} for k in arms}
    for i in range(steps + WARMUP):
        order = list(arms.items()) if i % 2 else list(reversed(arms.items()))
        for impl, (model, opt) in order:
            t0 = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            t1 = time.perf_counter()
            opt.step()
            t2 = time.perf_counter()
            if i >= WARMUP:
                times[impl]["opt"] += t2 - t1
                times[impl]["step"] += t2 - t0
    loop, fused = times[base], times["fused"]
    share = loop["opt"] / loop["step"]
    r_opt = loop["opt"] / fused["opt"]
    return {"share": share, "opt_ms": 1e3 * loop["opt"] / steps, "r_opt": r_opt, "r_step": loop["step"] / fused["step"],
            "amdahl": amdahl(share, r_opt)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--only", nargs="*", default=None, help="optimizer classes to run (default: all)")
    ap.add_argument("--base", choices=["loop", "foreach"], default="loop",
                    help="the implementation fused=True is compared with (default: the for-loop)")
    a = ap.parse_args()
    base = {"loop": "for-loop", "foreach": "foreach"}[a.base]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ratios: {base} / fused")
    for model_name, (make, shape) in MODELS.items():
        for name, cls, kw in CLASSES:
            if a.only and name not in a.only:
                continue
            r = pair(make, shape, cls, kw, a.steps, a.base)
            print(f"{model_name:22s} {name:13s} optimizer {r['share']:5.1%} of the step ({r['opt_ms']:7.3f} ms): "
                  f"optimizer {r['r_opt']:5.2f}x, step {r['r_step']:5.2f}x (Amdahl of the optimizer's {r['amdahl']:5.2f}x)",
                  flush=True)


if __name__ == "__main__":
    main()
