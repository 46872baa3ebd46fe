"""Input-bound on storage IO: the DataLoader waits on the disk, not on the CPU.

    python examples/io_bound_loader.py [--workers N] [--steps N] [--data-dir DIR]

Each sample is a raw 3x768x768 uint8 image (1.7 MiB) read with O_DIRECT from a data file, in
shuffled order. O_DIRECT bypasses the page cache, so every read goes to the block device and
the reading process sleeps in uninterruptible disk wait (state 'D'), with high read bytes and
visible system iowait. Decoding is a cheap strided thumbnail and the model is tiny, so the
trainer spends most of each step waiting for the next batch: real IO wait, not a simulation.
With --workers 0 the trainer itself is in 'D'; with --workers N the workers are.

The data file (--size-mb, default 384) is written at start (~0.5 s) into a temporary directory,
removed at exit (also after an exception; not after SIGTERM/SIGKILL), or into --data-dir, where
it is kept and reused. Where O_DIRECT is refused, reads fall back to buffered reads after
posix_fadvise(DONTNEED); on tmpfs the data lives in RAM and no IO wait can occur.
"""

import argparse, contextlib, mmap, os, tempfile

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

SHAPE = (3, 768, 768)                       # 1.7 MiB, a multiple of 4096 as O_DIRECT needs
RECORD = int(np.prod(SHAPE))


def make_data_file(path: str, size_mb: int) -> int:
    """Write size_mb of random records (skipped if already there); returns the record count."""
    n = (size_mb << 20) // RECORD
    if os.path.exists(path) and os.path.getsize(path) == n * RECORD:
        return n
    buf = mmap.mmap(-1, RECORD)             # page-aligned, as O_DIRECT needs
    buf.write(np.random.default_rng(0).integers(0, 256, RECORD, dtype=np.uint8).tobytes())
    try:                                    # O_DIRECT writes leave nothing in the page cache
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    except OSError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for i in range(n):
        buf[:8] = i.to_bytes(8, "little")   # records differ, so nothing can dedupe them
        os.pwritev(fd, [buf], i * RECORD)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    return n


class RawImages(Dataset):
    def __init__(self, path: str, n: int):
        self.path, self.n, self.fd, self.direct, self.buf = path, n, None, True, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.fd is None:                 # opened lazily: once per worker process
            self.buf = mmap.mmap(-1, RECORD)
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            except OSError:
                self.fd, self.direct = os.open(self.path, os.O_RDONLY), False
        if not self.direct:                 # drop cached pages so the read hits the device
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.preadv(self.fd, [self.buf], i * RECORD)         # the wait: blocks in state 'D'
        img = torch.frombuffer(self.buf, dtype=torch.uint8).view(SHAPE)
        return img[:, ::24, ::24].clone(), i % 10   # cheap "decode": 3x32x32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2400, help="optimizer steps (default: ~60 s)")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--size-mb", type=int, default=384)
    ap.add_argument("--data-dir", help="keep (and reuse) the data file here")
    args = ap.parse_args()
    # The model is tiny: intra-op threads buy nothing, and idle OpenMP threads spin-wait on a core
    # between ops, which would make the trainer look CPU-busy while it really waits on the disk.
    torch.set_num_threads(1)
    # The data file lives in a temporary directory removed on the way out, also when the run
    # ends in an exception (a tool stopping it after N steps); --data-dir keeps it for reuse.
    with contextlib.nullcontext(args.data_dir) if args.data_dir else \
            tempfile.TemporaryDirectory(prefix="io_bound_") as data_dir:
        train(os.path.join(data_dir, "raw_images.bin"), args)


def train(path: str, args: argparse.Namespace) -> None:
    n = make_data_file(path, args.size_mb)
    print(f"io_bound_loader: {n} records of {RECORD >> 10} KiB in {path}, workers={args.workers}", flush=True)
    loader = DataLoader(RawImages(path, n), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.float() / 255), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == args.steps:
                break
    print(f"io_bound_loader: done, {step} steps, loss {loss.item():.3f}")

if __name__ == "__main__":
    main()
