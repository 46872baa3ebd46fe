"""EventTable: a trace's events as numpy columns with interned string codes.

One row per event (flow events `s`/`f`/`t` are counted, not stored). Strings (name, cat, pid,
tid) are stored as int32 codes into per-table lists, so selecting "all cudaLaunchKernel rows"
is one lookup-table index, not a Python loop. Timestamps are float64 microseconds as written in
the trace (sub-microsecond "ns-resolution" traces keep their fraction in `dur`; absolute `ts`
keeps ~0.25 us at epoch magnitudes, far below any threshold perfdoctor uses).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

# A step's range as torch.profiler names it. 1-18 ASCII digits: a step number fits an int64; a
# 4,301-digit one made int() raise (exit 70).
STEP_RX = re.compile(r"^ProfilerStep#([0-9]{1,18})$")


@dataclass
class TraceMeta:
    path: str = ""
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    distributed_info: dict[str, Any] = field(default_factory=dict)
    display_time_unit: str | None = None
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False
    n_flow_events: int = 0
    cut_s: float | None = None      # recording stopped inside the last step, this long after it began
    base_time_ns: float | None = None   # kineto's clock base (baseTimeNanoseconds), None when absent
    notes: list[str] = field(default_factory=list)    # how the table was put together (joined windows)
    windows: int = 1                # profiler windows of one process in this table
    input_shapes: bool = False      # ops recorded their inputs (record_shapes=True)

    @property
    def rank(self) -> int | None:
        r = self.distributed_info.get("rank")
        return r if isinstance(r, int) else None


@dataclass
class EventTable:
    ph: np.ndarray          # uint8: ord of the phase letter ('X', 'i', 'M', ...)
    cat: np.ndarray         # int32 codes into cats
    name: np.ndarray        # int32 codes into names
    pid: np.ndarray         # int32 codes into pids
    tid: np.ndarray         # int32 codes into tids
    ts: np.ndarray          # float64 us
    dur: np.ndarray         # float64 us (0 where absent)
    args: dict[str, np.ndarray]   # float64, NaN where absent (see schema.NUMERIC_ARGS)
    cats: list[str]
    names: list[str]
    pids: list
    tids: list
    meta: TraceMeta = field(default_factory=TraceMeta)
    str_args: dict[str, dict] = field(default_factory=dict)   # {"labels": {row: process/thread label of M events}}

    def __len__(self) -> int:
        return len(self.ts)

    # -- selection helpers -------------------------------------------------------------------
    def name_mask(self, pred: Callable[[str], bool]) -> np.ndarray:
        """Rows whose name satisfies pred (evaluated once per distinct name)."""
        lut = np.fromiter((bool(pred(n)) for n in self.names), bool, len(self.names))
        return lut[self.name] if len(lut) else np.zeros(len(self), bool)

    def name_regex(self, pattern: str) -> np.ndarray:
        rx = re.compile(pattern)
        return self.name_mask(lambda n: rx.search(n) is not None)

    def cat_mask(self, *cats: str) -> np.ndarray:
        wanted = {c.lower() for c in cats}
        lut = np.fromiter((c.lower() in wanted for c in self.cats), bool, len(self.cats))
        return lut[self.cat] if len(lut) else np.zeros(len(self), bool)

    def arg(self, key: str) -> np.ndarray:
        return self.args[key]

    def end(self) -> np.ndarray:
        return self.ts + self.dur
