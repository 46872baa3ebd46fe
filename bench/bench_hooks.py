"""Cost of `perfdoctor run`'s step hooks per step, on a loop whose step is tiny (~0.4 ms on CPU).

    python bench/bench_hooks.py [--pairs 4] [--steps 6000]

A step this short makes the hooks' own cost visible: the optimizer-step hooks (a steps.jsonl
line, the clock and the thread's schedstat at each boundary), the DataLoader and backward
wrappers. Each pair runs the same self-timed loop twice in fresh interpreters, bare and with the
hooks installed in process (collect/hooks.Session, trace off, no samplers), interleaved, and
prints the difference in microseconds per step (steady steps: after the first 1000). The cost a
real step pays is that difference over its step time: 50 us is 0.5% of a 10 ms step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from bench_run import SELF_TIMED_LOOP  # noqa: E402  (the same timed loop as bench_run's workload)

LOOP = textwrap.dedent("""
    import json, sys, tempfile, time
    import torch
    if sys.argv[3] == "hooks":
        from perfdoctor.collect import hooks
        hooks.Session({"run_dir": tempfile.mkdtemp(), "trace": False}).install(torch)
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.set_num_threads(1)
    steps, out = int(sys.argv[1]), sys.argv[2]
    data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=32, shuffle=True, drop_last=True)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
""") + SELF_TIMED_LOOP


def once(loop: Path, steps: int, mode: str, out: Path) -> float:
    subprocess.run([sys.executable, str(loop), str(steps), str(out), mode], check=True, cwd=REPO)
    t = json.loads(out.read_text())[1000:]
    return 1e6 * sum(t) / len(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6000)
    args = ap.parse_args(argv)
    diffs = []
    with tempfile.TemporaryDirectory() as d:
        loop = Path(d) / "loop.py"
        loop.write_text(LOOP)
        for i in range(args.pairs):
            order = ("bare", "hooks") if i % 2 == 0 else ("hooks", "bare")
            us = {m: once(loop, args.steps, m, Path(d) / f"{m}.json") for m in order}
            diffs.append(us["hooks"] - us["bare"])
            print(f"  pair {i + 1}: bare {us['bare']:.1f} us/step, hooks {us['hooks']:.1f} us/step "
                  f"(+{diffs[-1]:.1f} us)", flush=True)
    print(f"hooks cost per step: median +{statistics.median(diffs):.1f} us "
          f"(pairs {' '.join(f'{x:+.1f}' for x in diffs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
