"""The memory format the convolutions' inputs come in: what the module census sees of them.

A 2-D (or 3-D) convolution runs on an NCHW tensor unless the model and its batches were put in
channels_last (NHWC). On the CPU oneDNN's convolutions, and the batch norms and pools between
them, often run faster on channels_last tensors (a DCGAN on this project's 2-core VM: 1.33x;
depthwise convolutions slower: 0.77x), so the fix (PD392) is offered where they are not, and
tune measures it. A trace cannot tell the two formats apart (the same ops run), so during the
census step (modules.Census) each call of a convolution module is seen, its input's format
read (child.json "root_calls" "conv_layout"):

    calls:          the convolution calls whose 4-D (5-D) input is in one format only
    channels_last:  of them, those in channels_last (channels_last_3d)

An input that is both (one channel, or 1 x 1 images: the first layer of a DCGAN's generator)
or neither (a strided view) tells nothing and is not counted.
"""

from __future__ import annotations

MAX_CALLS = 10_000


class ConvLayouts:
    def __init__(self, torch=None, types: tuple = ()):
        self.torch = torch
        self.types = types               # (nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d, nn.ConvTranspose3d), or ()
        self.calls = 0
        self.channels_last = 0

    def call(self, module, args, kwargs) -> None:
        if not self.types or not isinstance(module, self.types) or self.calls >= MAX_CALLS:
            return
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, self.torch.Tensor) or x.dim() not in (4, 5):
            return
        fmt = self.torch.channels_last if x.dim() == 4 else self.torch.channels_last_3d
        nhwc, nchw = x.is_contiguous(memory_format=fmt), x.is_contiguous()
        if nhwc != nchw:
            self.calls += 1
            self.channels_last += nhwc

    def result(self) -> dict | None:
        return {"calls": self.calls, "channels_last": self.channels_last} if self.calls else None
