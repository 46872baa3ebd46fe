"""Calibration of PD355 (no peek iterator), PD356 (persistent_workers=True) and PD347 (num_workers=0) on this machine.

    python bench/bench_loader_starts.py [--pairs 6] [--epochs 12] [--workers 2]

The workload is the single-process script of pytorch/examples' DDP tutorial, rewritten here (a
Linear(20, 1) on 2048 random samples, batches of 32, SGD, a checkpoint every 2nd epoch) with
its peek before each epoch, `len(next(iter(loader))[0])`, and `--workers` DataLoader workers.
Four variants run in interleaved rounds (order rotating), each printing its training time:
bare, without the peek (`loader.batch_size`), with persistent_workers=True, and with
num_workers=0 (the batches made in the trainer). Measured
speed-up = median over rounds of bare / variant (the rounds' spread is printed: a shared 2-core
VM moves single rounds by 20-30%). `perfdoctor run --no-stacks` on the bare script gives each
rule's expected gain and ceiling; prints them against the measurement and the 25% bar.
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

SCRIPT = """
import sys, time, torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

class Data(Dataset):
    def __init__(self, n):
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(n)]
    def __len__(self):
        return len(self.data)
    def __getitem__(self, i):
        return self.data[i]

def main(epochs, workers, variant):
    model = torch.nn.Linear(20, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    extra = {"persistent_workers": True} if variant == "persistent" else {}
    workers = 0 if variant == "noworkers" else workers
    loader = DataLoader(Data(2048), batch_size=32, shuffle=True, num_workers=workers, **extra)
    t0 = time.perf_counter()
    for epoch in range(epochs):
        b_sz = loader.batch_size if variant == "nopeek" else len(next(iter(loader))[0])
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        if epoch % 2 == 0:
            torch.save(model.state_dict(), "checkpoint.pt")
    print(f"TRAIN_S {time.perf_counter() - t0:.4f}", flush=True)

if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
"""
VARIANTS = {"nopeek": "PD355", "persistent": "PD356", "noworkers": "PD347"}


def train_time(script: Path, args: list[str], cwd: Path) -> float:
    """The TRAIN_S the script prints (its training time, in seconds)."""
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, cwd=cwd, timeout=600)
    for line in r.stdout.splitlines():
        if line.startswith("TRAIN_S "):
            return float(line.split()[1])
    raise SystemExit(f"{script.name} {' '.join(args)} printed no TRAIN_S:\n{r.stderr[-2000:]}")


def slowdown(script: Path, name: str, slow: str, fast: str, n: str, cwd: Path, round_no: int) -> float:
    """One interleaved round: the script's training time with `slow` over that with `fast` (its
    args: name, variant, steps), the order alternating with the round so drift weighs on both."""
    order = [slow, fast] if round_no % 2 == 0 else [fast, slow]
    t = {d: train_time(script, [name, d, n], cwd) for d in order}
    return t[slow] / t[fast]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6, help="interleaved rounds of the variants")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pd-bench-starts-") as tmp:
        tmp = Path(tmp)
        script = tmp / "train.py"
        script.write_text(textwrap.dedent(SCRIPT))
        args = [str(a.epochs), str(a.workers)]
        names = ["bare", *VARIANTS]
        times: dict[str, list[float]] = {n: [] for n in names}
        for i in range(a.pairs):
            k = i % len(names)
            order = names[k:] + names[:k]
            for n in order:
                times[n].append(train_time(script, [*args, n], tmp))
            print(f"round {i + 1}: " + "  ".join(f"{n} {times[n][-1]:.2f} s" for n in names), flush=True)
        out = tmp / "run"
        r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-stacks", "--out", str(out), str(script),
                            *args, "bare"], capture_output=True, text=True, cwd=tmp, timeout=900)
        try:
            doc = json.loads((out / "report.json").read_text())
        except (OSError, ValueError):
            raise SystemExit(f"perfdoctor run wrote no report (exit {r.returncode}):\n{r.stderr[-2000:]}")
        found = {f["id"]: f for f in doc["findings"]}
        m = doc["traces"][0]["metrics"]
        print("  ".join(f"{k} {m.get(k)}" for k in ("loop.peek_share", "loader.restart_share", "loader.fetch_ms",
                                                    "loader.fetch_share", "run.outside_loader_share",
                                                    "run.runq_runnable_share")))
        print(f"{'variant':<12}{'rule':<7}{'measured':>9}{'rounds':>14}{'expected':>10}{'ceiling':>9}{'error':>8}")
        for n, rule in VARIANTS.items():
            ratios = [b / v for b, v in zip(times["bare"], times[n])]
            meas = statistics.median(ratios)
            f = found.get(rule)
            exp = (f or {}).get("gain", {}).get("expected")
            cap = (f or {}).get("gain", {}).get("ceiling")
            err = f"{(exp - meas) / meas:+.0%}" if exp else "-"
            print(f"{n:<12}{rule:<7}{meas:>8.2f}x{min(ratios):>7.2f}-{max(ratios):.2f}x"
                  f"{(f'{exp:.2f}x' if exp else 'silent'):>10}{(f'{cap:.2f}x' if cap else '-'):>9}{err:>8}")


if __name__ == "__main__":
    main()
