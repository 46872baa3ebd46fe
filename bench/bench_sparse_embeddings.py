"""PD383's expected gain against the measured one: embedding tables trained with dense gradients,
then with sparse=True and an optimizer that takes sparse gradients.

    python bench/bench_sparse_embeddings.py [--pairs 2] [--configs 250000:adam,2000000:adam,1000000:sgd]

A recommender (a user table of 100K x 64 rows, an item table of ROWS x 64, an MLP over both,
batch 1024 of random ids) trained with Adam (sparse: SparseAdam for the tables, Adam for the MLP)
or SGD with momentum 0 (which takes sparse gradients itself). For each configuration:
`perfdoctor run` on the dense script gives PD383's expected gain; then bare runs of the dense and
the sparse script alternate (--pairs pairs, separate processes), each printing its steady
ms/step, and the ratio of their means is the measured gain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

WORKLOAD = r'''
import sys, time, torch
from torch import nn
rows, opt_name, sparse, steps = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "sparse", int(sys.argv[4])
torch.manual_seed(0)
class Rec(nn.Module):
    def __init__(self):
        super().__init__()
        self.users = nn.Embedding(100_000, 64, sparse=sparse)
        self.items = nn.Embedding(rows, 64, sparse=sparse)
        self.mlp = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 1))
    def forward(self, u, i):
        return self.mlp(torch.cat([self.users(u), self.items(i)], 1)).squeeze(1)
model = Rec()
tables = list(model.users.parameters()) + list(model.items.parameters())
if opt_name == "sgd":
    opts = [torch.optim.SGD(model.parameters(), lr=0.01)]
elif sparse:
    opts = [torch.optim.SparseAdam(tables, lr=1e-3), torch.optim.Adam(model.mlp.parameters(), lr=1e-3)]
else:
    opts = [torch.optim.Adam(model.parameters(), lr=1e-3)]
t0 = None
for step in range(steps):
    if step == 3:
        t0 = time.perf_counter()
    u, i = torch.randint(0, 100_000, (1024,)), torch.randint(0, rows, (1024,))
    loss = nn.functional.binary_cross_entropy_with_logits(model(u, i), torch.rand(1024))
    for o in opts:
        o.zero_grad()
    loss.backward()
    for o in opts:
        o.step()
print(f"steady {(time.perf_counter() - t0) * 1e3 / (steps - 3):.3f} ms/step")
'''


def bare(script: Path, *args: str) -> float:
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise SystemExit(r.stderr)
    return float(r.stdout.split("steady ", 1)[1].split(" ms/step", 1)[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--configs", default="250000:adam,2000000:adam,1000000:sgd")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="perfdoctor-bench-"))
    script = tmp / "rec.py"
    script.write_text(WORKLOAD)
    print(f"{'rows':>8} {'optimizer':<9} {'dense ms':>9} {'sparse ms':>9}  {'measured':>8}  {'expected':>8}  "
          f"{'first fix':<6}")
    for cfg in args.configs.split(","):
        rows, opt = cfg.split(":")
        out = tmp / f"run-{rows}-{opt}"
        steps = "20" if int(rows) >= 1_000_000 else "40"
        r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), str(script), rows, opt,
                            "dense", steps], capture_output=True, text=True, timeout=900, cwd=REPO)
        if r.returncode:
            raise SystemExit(r.stderr)
        doc = json.loads((out / "report.json").read_text())
        fix = next((f for f in doc["findings"] if f["id"] == "PD383"), None)
        expected = fix["gain"]["expected"] if fix else None
        dense, sparse = [], []
        for k in range(args.pairs):                  # alternating, the order swapped each pair
            order = (("dense", dense), ("sparse", sparse)) if k % 2 == 0 else (("sparse", sparse), ("dense", dense))
            for kind, into in order:
                into.append(bare(script, rows, opt, kind, steps if kind == "dense" else "200"))
        d, s = statistics.mean(dense), statistics.mean(sparse)
        exp = f"{expected:.1f}x" if expected else "none"
        print(f"{rows:>8} {opt:<9} {d:>9.1f} {s:>9.2f}  {d / s:>7.1f}x  {exp:>8}  {doc['findings'][0]['id']:<6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
