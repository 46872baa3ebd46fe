"""PD380's expected gain against the measured one: an EMA of the weights updated tensor by tensor.

    python bench/bench_tensor_loops.py [--threads 2] [--rounds 40]

A 24-block MLP (Linear, LayerNorm, GELU: 98 tensors) trained with Adam; after each step its EMA
copy is updated by a Python loop (mul_, add_ per tensor). The script records a trace of a few
steps, reads PD380's expected gain and ceiling from it, then times blocks of 20 steps in one
process, alternating the loop, torch._foreach_lerp_ (the fix) and no EMA at all, and prints the
ratios of the medians: loop/foreach is the fix's measured gain, loop/none the most any fix of
the loop can give.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args(argv)
    import torch
    from torch import nn

    from perfdoctor.diagnose.offline import diagnose_path
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = nn.Sequential(*[m for _ in range(24) for m in (nn.Linear(128, 128), nn.LayerNorm(128), nn.GELU())],
                          nn.Linear(128, 10))
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
    pe, pm = list(ema.parameters()), list(model.parameters())

    def step(mode: str) -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            if mode == "loop":
                for e, p in zip(ema.parameters(), model.parameters()):
                    e.mul_(0.999).add_(p, alpha=0.001)
            elif mode == "foreach":
                torch._foreach_lerp_(pe, pm, 0.001)

    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "ema.json"
        with torch.profiler.profile(schedule=torch.profiler.schedule(wait=2, warmup=2, active=5),
                                    on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:
            for _ in range(9):
                step("loop")
                prof.step()
        doc = diagnose_path(str(trace))
    m = doc["traces"][0]["metrics"]
    fix = next((f for f in doc["findings"] if f["id"] == "PD380"), None)
    print(f"trace: loop {m['tensorloop.share']:.1%} of the step over {m['tensorloop.tensors']:.0f} tensors, "
          f"gaps {m['tensorloop.gap_share']:.1%}")
    if fix is not None:
        print(f"PD380 expected {fix['gain']['expected']:.3f}x, ceiling {fix['gain']['ceiling']:.3f}x")
    else:
        print("PD380 did not fire")
    times: dict[str, list[float]] = {"loop": [], "foreach": [], "none": []}
    for r in range(args.rounds):
        for mode in (("loop", "foreach", "none") if r % 2 else ("none", "foreach", "loop")):
            t0 = time.perf_counter()
            for _ in range(20):
                step(mode)
            if r >= 4:
                times[mode].append((time.perf_counter() - t0) / 20)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("ms/step: " + ", ".join(f"{k} {1e3 * v:.3f}" for k, v in med.items()))
    print(f"measured: loop/foreach {med['loop'] / med['foreach']:.3f}x (the fix), "
          f"loop/none {med['loop'] / med['none']:.3f}x (no EMA at all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
