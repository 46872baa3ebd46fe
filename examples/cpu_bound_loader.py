"""Input-bound on CPU: the DataLoader's per-sample transforms cost more than the training step.

    python examples/cpu_bound_loader.py [--workers N] [--steps N]

Each sample is a synthetic 3x256x256 uint8 image (generated in memory: no file IO at all) put
through a deliberately heavy augmentation pipeline in pure torch: random crop to 224, float
conversion, three Gaussian blurs (5x5 depthwise convolutions), brightness jitter and
normalisation. The model is tiny, so the trainer spends most of each step waiting for batches.

--workers 0 (default): the trainer's own thread runs the transforms, so the profiler trace shows
the conv/blur ops inside the DataLoader's __next__ (perfdoctor: input-bound, CPU).
--workers 2: two worker processes run them, each using about 100% of a core (DataLoader workers
run torch single-threaded), which saturates a 2-core machine; the trainer waits on the queue.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def gaussian_kernel(size: int = 5, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float32) - size // 2
    g = torch.exp(-x ** 2 / (2 * sigma ** 2))
    k = torch.outer(g, g) / g.sum() ** 2
    return k.expand(3, 1, size, size).contiguous()      # one filter per channel (depthwise)


class AugmentedImages(Dataset):
    def __init__(self, n: int = 2048):
        self.n, self.kernel = n, gaussian_kernel()
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        img = torch.randint(0, 256, (3, 256, 256), dtype=torch.uint8, generator=g)  # "decoded" image
        top, left = torch.randint(0, 33, (2,), generator=g).tolist()
        x = img[:, top:top + 224, left:left + 224].float() / 255          # random crop + to float
        for _ in range(3):                                                # blur augmentation
            x = F.conv2d(F.pad(x[None], (2, 2, 2, 2), mode="reflect"), self.kernel, groups=3)[0]
        x = (x * (0.8 + 0.4 * torch.rand(1, generator=g))).clamp_(0, 1)   # brightness jitter
        return (x - self.mean) / self.std, i % 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=900, help="optimizer steps (default: ~60 s)")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    print(f"cpu_bound_loader: workers={args.workers}, batch {args.batch_size}", flush=True)
    torch.manual_seed(0)
    # DataLoader workers run torch single-threaded (it calls torch.set_num_threads(1) in each).
    # The trainer does too: with --workers 0 it then does the same work per sample as one worker,
    # and with --workers N its idle OpenMP threads do not spin on the cores the workers need.
    torch.set_num_threads(1)
    loader = DataLoader(AugmentedImages(), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    # Tiny model: pool to 3x8x8, then a small MLP. The step is cheap next to the transforms.
    model = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(192, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == args.steps:
                break
    print(f"cpu_bound_loader: done, {step} steps, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
