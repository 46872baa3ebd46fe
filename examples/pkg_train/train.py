"""`python -m pkg_train.train [--steps N]`: a tiny training loop inside a package."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from . import make_model        # relative import: needs __package__ set, as `-m` does


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    print(f"pkg_train: training {args.steps} steps as module {__name__} (package {__package__})", flush=True)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == args.steps:
                break
    print(f"pkg_train: done, {step} steps, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
