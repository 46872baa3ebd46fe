"""PyTorch Lightning `Trainer.fit` on a tiny MLP, unmodified (no perfdoctor code in it).

    python examples/lightning_fit.py [--steps 40] [--load-ms 2] [--accumulate 1]

Each sample costs --load-ms of loading time in the DataLoader (num_workers=0: the trainer
waits for it), so the run is input-bound when that dominates. --accumulate N accumulates
gradients over N batches (Lightning's accumulate_grad_batches).
"""

import argparse
import time

import lightning as L
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n: int, load_ms: float):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randint(0, 4, (n,), generator=g)
        self.load_s = load_ms / 1e3

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.load_s:
            time.sleep(self.load_s)
        return self.x[i], self.y[i]


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4))

    def training_step(self, batch, i):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--load-ms", type=float, default=2.0)
    ap.add_argument("--accumulate", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Slow(8 * args.steps * args.accumulate + 64, args.load_ms), batch_size=8, num_workers=0)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        accumulate_grad_batches=args.accumulate)
    trainer.fit(Net(), loader)
    print(f"lightning_fit: {trainer.global_step} optimizer steps", flush=True)


if __name__ == "__main__":
    main()
