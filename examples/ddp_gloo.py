"""Data-parallel training on the CPU (DDP over gloo), with an optional slow rank.

    torchrun --nproc-per-node 2 examples/ddp_gloo.py [--steps 60] [--slow-rank 1 --slow-ms 30]
    perfdoctor run --nproc-per-node 2 examples/ddp_gloo.py --slow-rank 1 [--slow-in data]

Every rank trains the same small MLP on its shard of a synthetic dataset (DistributedSampler);
DDP all-reduces the gradients once per step, so all ranks run at the pace of the slowest. With
--slow-rank K, rank K sleeps --slow-ms milliseconds per step before its forward pass (a rank with
more work: a longer shard, rank-0-only logging, a slower host): the others wait for it in the
all-reduce. With --slow-in data the time is spent in rank K's data loading instead (its dataset
takes --slow-ms per batch to produce a batch, in the main process: num_workers=0, the default). --exit-code N makes --exit-rank exit with status N after its steps.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class SlowSamples(torch.utils.data.Dataset):
    """A dataset whose every sample costs `seconds` to produce (decoding, augmenting)."""

    def __init__(self, data, seconds: float):
        self.data, self.seconds = data, seconds

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:      # busy, as a decode is: not a sleep
            pass
        return self.data[i]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-ms", type=float, default=30.0)
    ap.add_argument("--slow-in", choices=("step", "data"), default="step")
    ap.add_argument("--exit-rank", type=int, default=-1)
    ap.add_argument("--exit-code", type=int, default=0)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(4096, args.width), torch.randint(0, 10, (4096,)))
    if rank == args.slow_rank and args.slow_in == "data":
        data = SlowSamples(data, args.slow_ms / 1e3 / 32)
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, world, rank, drop_last=True))
    model = DDP(nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        for x, y in loader:
            if rank == args.slow_rank and args.slow_in == "step":
                time.sleep(args.slow_ms / 1e3)
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break
    print(f"ddp_gloo rank {rank}/{world}: {step} steps, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: with torch 2.13's gloo, a rank that exits normally
    # right after destroy_process_group() sometimes aborts in a C++ destructor ("terminate called
    # without an active exception", SIGABRT): 1 run in ~10 of this script under plain torchrun on
    # a loaded 2-core machine. Everything this script writes is flushed by then.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(args.exit_code if rank == args.exit_rank else 0)


if __name__ == "__main__":
    main()
