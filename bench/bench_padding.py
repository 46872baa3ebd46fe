"""Calibration of PD395 (batches of similar lengths) on this machine.

    python bench/bench_padding.py [--rounds 3] [--lengths 8-128] [--batch 16] [--updates 40]

A small nn.TransformerEncoder classifier (2 layers, width 128) trains on token sequences of random
lengths, gradient accumulation over 4 micro-batches, padded per batch by a pad_sequence collate
(a key padding mask): once with shuffled batches, once with a batch sampler that sorts each
50 batches' worth of shuffled indices by length. `perfdoctor run` of the shuffled script gives
PD395's padding share, expected gain and ceiling; then the two scripts run bare, interleaved
(`--rounds` pairs), each printing its own ms per update. A row prints the expected gain, its
range and ceiling, and the measured speed-up (median of the pairs, with each pair's).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = r'''
import sys, time, torch, torch.nn as nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, Sampler
torch.manual_seed(0)
LO, HI, B, UPDATES, BUCKET = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
V, D, ACC = 1000, 128, 4
g = torch.Generator().manual_seed(1)
lens = torch.randint(LO, HI + 1, (4000,), generator=g).tolist()
seqs = [torch.randint(1, V, (n,), generator=g) for n in lens]
class Tokens(Dataset):
    def __len__(self): return len(seqs)
    def __getitem__(self, i): return seqs[i], i % 2
def collate(batch):
    x = pad_sequence([s for s, _ in batch], batch_first=True)
    return x, x == 0, torch.tensor([y for _, y in batch])
class Buckets(Sampler):
    def __iter__(self):
        idx = torch.randperm(len(lens)).tolist()
        chunks = [sorted(idx[i:i + B * 50], key=lambda j: lens[j]) for i in range(0, len(idx), B * 50)]
        batches = [c[i:i + B] for c in chunks for i in range(0, len(c), B)]
        for k in torch.randperm(len(batches)).tolist():
            yield batches[k]
    def __len__(self): return (len(lens) + B - 1) // B
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(HI, D) * 0.02)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, 4, 256, dropout=0.0, batch_first=True), 2,
                                         enable_nested_tensor=False)
        self.head = nn.Linear(D, 2)
    def forward(self, x, mask):
        h = self.enc(self.emb(x) + self.pos[:x.shape[1]], src_key_padding_mask=mask)
        return self.head(h.masked_fill(mask[..., None], 0).sum(1) / (~mask).sum(1, keepdim=True))
model = Model()
opt = torch.optim.AdamW(model.parameters(), 3e-4)
loader = (DataLoader(Tokens(), batch_sampler=Buckets(), collate_fn=collate) if BUCKET
          else DataLoader(Tokens(), batch_size=B, shuffle=True, collate_fn=collate))
micro = upd = 0
t0 = None
while upd < UPDATES:
    for x, mask, y in loader:
        nn.functional.cross_entropy(model(x, mask), y).div(ACC).backward()
        micro += 1
        if micro % ACC == 0:
            opt.step(); opt.zero_grad(); upd += 1
            if upd == 5:
                t0 = time.perf_counter()          # the first updates are warm-up
        if upd >= UPDATES:
            break
print(f"ms/update {1e3 * (time.perf_counter() - t0) / (UPDATES - 5):.2f}")
'''


def timed(script: Path, args: list[str]) -> float:
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, check=True).stdout
    return float(re.search(r"ms/update ([\d.]+)", out).group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", default="8-128")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--updates", type=int, default=40)
    o = ap.parse_args()
    lo, hi = o.lengths.split("-")
    args = [lo, hi, str(o.batch), str(o.updates)]
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "padded.py"
        script.write_text(SCRIPT)
        subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(Path(d) / "run"), str(script),
                        *args, "0"], capture_output=True, check=True)
        doc = json.loads((Path(d) / "run" / "report.json").read_text())
        m = doc["traces"][0]["metrics"]
        f = next((f for f in doc["findings"] if f["id"] == "PD395"), None)
        pairs = []
        for _ in range(o.rounds):
            pairs.append(timed(script, args + ["0"]) / timed(script, args + ["1"]))
    g = (f or {}).get("gain") or {}
    rng = g.get("range") or [None, None]
    print("lengths | batch | padding | model ops | expected (range) | ceiling | measured (pairs)")
    expected = (f"{g['expected']:.2f}x" + (f" ({rng[0]:.2f}-{rng[1]:.2f}x)" if None not in rng else "")
                if g.get("expected") else "PD395 not raised")
    ceiling = f"{g['ceiling']:.2f}x" if g.get("ceiling") else "-"
    print(f"{o.lengths} | {o.batch} | {m.get('loop.padding_share') or 0:.1%} | {m.get('share.device') or 0:.1%} | "
          f"{expected} | {ceiling}")
    print(f"    measured {statistics.median(pairs):.2f}x ({', '.join(f'{p:.2f}' for p in pairs)})")


if __name__ == "__main__":
    main()
