"""Profiles itself: runs its own torch.profiler (schedule + tensorboard_trace_handler).

    python examples/self_profiling.py --trace-dir DIR [--steps N]

The common case of a script that already has a profiler in its loop: it records steps
wait+warmup .. wait+warmup+active (1 + 1 + 3 by default) into --trace-dir as a
*.pt.trace.json.gz file, calling prof.step() once per iteration. For testing that a tool
which also profiles (`perfdoctor run`) copes with a profiler that is already active, and that
the script's own trace still gets written.
"""

import argparse
import os

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace-dir", default="self_profiling_trace")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--active", type=int, default=3, help="profiled steps")
    args = ap.parse_args()
    print(f"self_profiling: profiling {args.active} steps into {args.trace_dir}", flush=True)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1024, 64), torch.randint(0, 10, (1024,)))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=1, warmup=1, active=args.active, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(args.trace_dir, use_gzip=True)) as prof:
        while step < args.steps:
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                prof.step()
                step += 1
                if step == args.steps:
                    break
    files = sorted(os.listdir(args.trace_dir)) if os.path.isdir(args.trace_dir) else []
    print(f"self_profiling: done, {step} steps, trace files: {files}")


if __name__ == "__main__":
    main()
