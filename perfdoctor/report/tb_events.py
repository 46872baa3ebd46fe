"""TensorBoard scalar event files, written without TensorBoard or TensorFlow installed.

An event file is a sequence of TFRecords (length, masked CRC32C of the length, payload, masked
CRC32C of the payload); each payload is a serialised `tensorflow.Event` protobuf. We encode the
three message types we need by hand: Event{wall_time=1, step=2, file_version=3, summary=5},
Summary{value=1}, Summary.Value{tag=1, simple_value=2}. `tensorboard --logdir RUN_DIR` shows
the result; tests read it back with TensorBoard's own EventAccumulator.
"""

from __future__ import annotations

import os
import socket
import struct
import time

_CRC_TABLE: list[int] = []


def _crc32c(data: bytes) -> int:
    if not _CRC_TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC_TABLE.append(c)
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, *, file_version: str | None = None,
           scalars: dict[str, float] | None = None) -> bytes:
    msg = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if file_version is not None:
        msg += _ld(3, file_version.encode())
    if scalars:
        values = b"".join(_ld(1, _ld(1, tag.encode()) + b"\x15" + struct.pack("<f", float(v)))
                          for tag, v in scalars.items())
        msg += _ld(5, values)
    return msg


def _record(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return (header + struct.pack("<I", _masked(_crc32c(header))) + payload
            + struct.pack("<I", _masked(_crc32c(payload))))


class EventWriter:
    """Append scalar events to one new event file in `logdir`."""

    def __init__(self, logdir: str | os.PathLike):
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.perfdoctor"
        self.path = os.path.join(logdir, name)
        self._f = open(self.path, "wb")
        self._f.write(_record(_event(time.time(), 0, file_version="brain.Event:2")))

    def scalars(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        clean = {k: v for k, v in values.items() if v is not None and v == v}
        if clean:
            self._f.write(_record(_event(wall_time or time.time(), step, scalars=clean)))

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
