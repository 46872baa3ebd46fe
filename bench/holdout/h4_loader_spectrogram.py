"""Audio-style input: each sample is a 2 s waveform turned into a log-mel-like spectrogram on the
CPU (torch.stft, a filterbank matmul, log), in the trainer's own process (num_workers=0), feeding
a small 2-D CNN on the device. Fix (--fixed): 8 DataLoader workers, pinned memory, non_blocking
copies. Prints `STEADY_MS <ms>` (steady.py)."""
import torch
import torch.nn.functional as F
from steady import arguments, run_steady
from torch import nn
from torch.utils.data import DataLoader, Dataset

a, dev = arguments(__doc__, steps=60, batch=64)
SR, SEC, NFFT, HOP, MELS = (8000, 1, 256, 128, 32) if a.small else (16000, 2, 1024, 160, 128)


class Clips(Dataset):
    def __init__(self, n=1_000_000):
        self.n = n
        self.window = torch.hann_window(NFFT)
        self.bank = torch.rand(NFFT // 2 + 1, MELS) / NFFT

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        wave = torch.randn(SR * SEC, generator=g)
        spec = torch.stft(wave, NFFT, HOP, window=self.window, return_complex=True).abs().pow(2)
        return torch.log1p(spec.T @ self.bank).T[None], i % 50


model = nn.Sequential(nn.Conv2d(1, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 50)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
kw = dict(num_workers=8, pin_memory=dev == "cuda", persistent_workers=True, prefetch_factor=4) if a.fixed else {}
batches = iter(DataLoader(Clips(), batch_size=a.batch, shuffle=True, **kw))


def step(i):
    x, y = next(batches)
    x, y = x.to(dev, non_blocking=a.fixed), y.to(dev, non_blocking=a.fixed)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


run_steady(step, a.steps, dev)
