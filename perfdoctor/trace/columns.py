"""Decoded event chunks -> typed columns, without numpy.

`Columns` turns chunks of Event structs into one array.array per column (flow events counted,
not stored; strings interned to int32 codes in first-seen order; M-event labels by row), and
`part()` hands them over as a `Part`: what one pass over a byte range of the trace produced.
No numpy here, so a helper process can decode from the moment a load starts instead of first
spending 0.1-0.2 s importing numpy; perfdoctor.trace.assemble makes numpy tables of the parts.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter

import msgspec

from perfdoctor.trace import schema
from perfdoctor.trace.reader import ReadState

STRING_COLUMNS = ("cat", "name", "pid", "tid")
# column -> array typecode (numpy: uint8, int32, float64)
LAYOUT = {"ph": "B", **{k: "i" for k in STRING_COLUMNS}, "ts": "d", "dur": "d",
          **{k: "d" for k in schema.NUMERIC_ARGS + schema.DERIVED_ARGS}}
ARG_FIELDS = schema.Args.__struct_fields__
_NUMERIC_ARG_INDEX = [(ARG_FIELDS.index(k), k) for k in schema.NUMERIC_ARGS]
_LABEL, _LABELS = ARG_FIELDS.index("label"), ARG_FIELDS.index("labels")
_DTYPE = ARG_FIELDS.index("dtype")
_INPUT_TYPE = ARG_FIELDS.index("input_type")
assert array("i").itemsize == 4 and array("d").itemsize == 8


class Interner(dict):
    """str/int -> dense code; `intern.__getitem__` is a C-speed map function."""

    def __missing__(self, key):
        code = self[key] = len(self)
        return code

    def values_list(self) -> list:
        out = [None] * len(self)
        for k, v in self.items():
            out[v] = k
        return out


class Columns:
    """Columns of the chunks decoded so far (file order), their string tables, M-event labels."""

    def __init__(self):
        self.interners = {k: Interner() for k in STRING_COLUMNS}
        self.cols = {k: array(t) for k, t in LAYOUT.items()}
        self.labels: dict[int, str] = {}
        self.n_flow = 0
        self.shapes = False     # some op recorded its inputs' types (record_shapes=True)
        self.rows = 0

    def add(self, events: list[schema.Event]) -> None:
        """Append a chunk. Flow events (ph s/f/t: a third of a kineto trace's events) are dropped
        first, by a C-level filter on their phase, so no work is spent transposing them; the rest
        is transposed at C speed (astuple + zip) and each column converted in one call."""
        n_all = len(events)
        kept = list(map(_KEPT_PHASE.__getitem__, map(_PH, events)))
        if not all(kept):
            events = list(compress(events, kept))
        n = len(events)
        self.n_flow += n_all - n
        if n == 0:
            return
        ph, cat, name, pid, tid, ts, dur, args = zip(*map(msgspec.structs.astuple, events))
        cols = self.cols
        codes = array("B", list(map(_PHASE_CODE.__getitem__, ph)))
        cols["ph"].extend(codes)
        for key, values in zip(STRING_COLUMNS, (cat, name, pid, tid)):
            cols[key].extend(array("i", list(map(self.interners[key].__getitem__, values))))
        cols["ts"].extend(_floats(ts))
        cols["dur"].extend(_floats(dur))
        arg_cols = list(zip(*map(msgspec.structs.astuple, args)))
        for i, key in _NUMERIC_ARG_INDEX:
            values = arg_cols[i]
            # Most args are absent from most events: a column of defaults is copied, not converted.
            cols[key].extend(_NAN_ROW * n if values.count(schema.NAN) == n else _floats(values))
        dtypes = arg_cols[_DTYPE]
        cols["dtype_bytes"].extend(_NAN_ROW * n if dtypes.count(None) == n
                                   else array("d", map(_DTYPE_SIZE.__getitem__, dtypes)))
        input_types = arg_cols[_INPUT_TYPE]
        col = _NAN_ROW * n
        if input_types.count(None) != n:      # record_shapes: the copy ops' rows only (a C-level filter)
            self.shapes = True
            for row in compress(range(n), map(_COPY_SOURCE.__contains__, name)):
                types, at = input_types[row], _COPY_SOURCE[name[row]]
                if types is not None and len(types) > at:
                    col[row] = _TENSOR_TYPE[types[at]]
        cols["copy_src"].extend(col)
        flags = codes.tobytes()
        row = flags.find(b"M")
        while row >= 0:
            lab = arg_cols[_LABELS][row] or arg_cols[_LABEL][row]
            if lab is not None:
                self.labels[self.rows + row] = lab
            row = flags.find(b"M", row + 1)
        self.rows += n

    def part(self, state: ReadState, ended_at: int | None) -> Part:
        return Part(cols=self.cols, rows=self.rows,
                    strings={k: self.interners[k].values_list() for k in STRING_COLUMNS},
                    labels=self.labels, n_flow=self.n_flow,
                    meta={**state.meta, INPUT_SHAPES: True} if self.shapes else state.meta, warnings=state.warnings,
                    truncated=state.truncated, ended_at=ended_at)


INPUT_SHAPES = "perfdoctor_input_shapes"      # a part's meta key: its ops recorded input types


@dataclass
class Part:
    """One pass's output. `cols`: LAYOUT's columns (array.array or numpy arrays), `strings`: the
    values the codes of each string column index, `ended_at`: the offset of the cut the pass
    stopped at, None if it read to the end of the file."""

    cols: dict
    rows: int
    strings: dict[str, list]
    labels: dict[int, str] = field(default_factory=dict)
    n_flow: int = 0
    meta: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    truncated: bool = False
    ended_at: int | None = None

    def header(self) -> dict:
        """Everything but the column buffers (which travel raw, in LAYOUT order)."""
        return {"rows": self.rows, "strings": self.strings, "labels": self.labels,
                "n_flow": self.n_flow, "meta": self.meta, "warnings": self.warnings,
                "truncated": self.truncated, "ended_at": self.ended_at}

    def buffers(self) -> list:
        return [self.cols[k] for k in LAYOUT]


class _KeptPhase(dict):
    """phase -> False for flow events (s, f, t), True otherwise; filled on first sight."""

    def __missing__(self, ph):
        kept = self[ph] = not (isinstance(ph, str) and ph[:1] in ("s", "f", "t"))
        return kept


class _PhaseCode(dict):
    """phase -> the byte stored for it: its first letter ('?' when none fits in a byte)."""

    def __missing__(self, ph):
        code = self[ph] = ord(ph[0]) if ph and ord(ph[0]) < 256 else 63
        return code


class _DtypeSize(dict):
    """dtype arg ("Float", "c10::BFloat16", None) -> bytes per element, NaN when absent or unknown."""

    def __missing__(self, dtype):
        key = str(dtype).lower().rsplit("::", 1)[-1]
        size = self[dtype] = float(schema.DTYPE_BYTES.get(key, _NAN)) if dtype is not None else _NAN
        return size


class _TensorType(dict):
    """An "Input type" entry ("float", "unsigned char", "c10::BFloat16") -> its code in
    schema.TENSOR_TYPES; 0 ("other") for a type not listed, NaN for "" / "Scalar" (no tensor)."""

    def __missing__(self, cpp):
        key = cpp.lower().rsplit("::", 1)[-1] if isinstance(cpp, str) else ""
        name = schema.CPP_TYPE.get(key, "other" if key not in ("", "scalar") else None)
        code = self[cpp] = float(schema.TENSOR_TYPES.index(name)) if name else _NAN
        return code


_KEPT_PHASE = _KeptPhase()
_TENSOR_TYPE = _TensorType()
_COPY_SOURCE = schema.COPY_SOURCE
_DTYPE_SIZE = _DtypeSize()
_PHASE_CODE = _PhaseCode()
_PH = attrgetter("ph")
_NAN = float("nan")
_NAN_ROW = array("d", [_NAN])


def _floats(values: tuple) -> array:
    try:
        return array("d", values)
    except TypeError:  # a string among numbers (e.g. ROCm "stream"), or None
        return array("d", [v if isinstance(v, (int, float)) else _NAN for v in values])
