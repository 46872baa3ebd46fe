"""msgspec schemas for the parts of a Chrome trace perfdoctor reads.

Typed decoding is the fast path: msgspec skips every field not named here (Input Dims, grid, ...)
without building Python objects for it. Values whose type varies between Kineto versions are
declared as unions; anything that still fails validation sends the loader to its untyped path.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

NAN = float("nan")
Num = float  # JSON ints are accepted; NaN marks "absent" so columns convert at C speed
IntOrStr = Union[int, str]


class Args(msgspec.Struct, frozen=True, gc=False):
    """The event `args` perfdoctor uses. Field order is the column order of EventTable.args."""

    external_id: Num = msgspec.field(name="External id", default=NAN)
    external_id_legacy: Num = msgspec.field(name="external id", default=NAN)
    correlation: Num = NAN
    device: Num = NAN
    stream: Union[float, str] = NAN
    total_reserved: Num = msgspec.field(name="Total Reserved", default=NAN)
    total_allocated: Num = msgspec.field(name="Total Allocated", default=NAN)
    nbytes: Num = msgspec.field(name="Bytes", default=NAN)
    device_type: Num = msgspec.field(name="Device Type", default=NAN)
    device_id: Num = msgspec.field(name="Device Id", default=NAN)
    label: Union[str, None] = msgspec.field(name="name", default=None)   # M events: process/thread name
    labels: Union[str, None] = None                                      # M events: "CPU", "GPU 0"
    in_nelems: Num = msgspec.field(name="In msg nelems", default=NAN)    # collectives (kernel / record_param_comms)
    group_size: Num = msgspec.field(name="Group size", default=NAN)
    dtype: Union[str, None] = None                                       # collectives: "Float", "BFloat16", ...
    # record_shapes=True: each input's C++ type ("float", "unsigned char", "c10::BFloat16", "Scalar", "");
    # read into a column only for the copy ops of COPY_SOURCE (columns.py), so other ops cost a list each
    input_type: Union[list[str], None] = msgspec.field(name="Input type", default=None)
    # an op that recorded an autograd node (the training forward): no_grad forward ops have none
    seq: Num = msgspec.field(name="Sequence number", default=NAN)


NO_ARGS = Args()
NUMERIC_ARGS = ("external_id", "external_id_legacy", "correlation", "device", "stream",
                "total_reserved", "total_allocated", "nbytes", "device_type", "device_id",
                "in_nelems", "group_size", "seq")
# Columns computed from string args while decoding: dtype -> bytes per element (NaN: absent/unknown);
# copy_src: the copy ops' source tensor type as a code into TENSOR_TYPES (NaN: not a copy op or no types).
DERIVED_ARGS = ("dtype_bytes", "copy_src")
# The ops that copy a tensor (to another device or type) -> the position of the source in "Input type":
# aten::copy_(self, src, non_blocking) copies into self; aten::to / _to_copy copy their first input.
COPY_SOURCE = {"aten::copy_": 1, "aten::to": 0, "aten::_to_copy": 0}
# copy_src codes. The C++ type names torch's profiler writes (c10:: dropped, lower case) -> code.
TENSOR_TYPES = ("other", "float32", "float64", "float16", "bfloat16", "uint8", "int8", "bool", "int16",
                "int32", "int64", "float8")
CPP_TYPE = {"float": "float32", "double": "float64", "half": "float16", "bfloat16": "bfloat16",
            "unsigned char": "uint8", "signed char": "int8", "char": "int8", "bool": "bool", "short": "int16",
            "int": "int32", "long int": "int64", "long": "int64", "long long": "int64", "int64_t": "int64",
            "float8_e4m3fn": "float8", "float8_e5m2": "float8", "float8_e4m3fnuz": "float8",
            "float8_e5m2fnuz": "float8"}
DTYPE_BYTES = {"float": 4, "float32": 4, "f32": 4, "int": 4, "int32": 4, "uint32": 4, "double": 8,
               "float64": 8, "long": 8, "int64": 8, "uint64": 8, "half": 2, "float16": 2, "f16": 2,
               "bfloat16": 2, "bf16": 2, "short": 2, "int16": 2, "char": 1, "byte": 1, "int8": 1,
               "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: IntOrStr = 0
    tid: IntOrStr = 0
    ts: float = NAN      # absent: the table drops an X event without it, reads 0 for other phases
    dur: float = NAN
    args: Args = NO_ARGS


class TraceDoc(msgspec.Struct):
    """A whole trace file (the object form). Unknown top-level keys are ignored."""

    traceEvents: list[Event] = []
    deviceProperties: Union[list[dict[str, Any]], None] = None
    distributedInfo: Union[dict[str, Any], None] = None
    displayTimeUnit: Union[str, None] = None
    schemaVersion: Union[int, str, None] = None
    traceName: Union[str, None] = None
    # `perfdoctor run` stopped recording inside a step (its memory budget): seconds into it
    perfdoctor_cut_s: Union[str, float, None] = None
    # kineto's clock base: one value per process, so the windows of one process share it
    baseTimeNanoseconds: Union[int, float, None] = None
    # torch's own note of the profiler option (some versions write it beside deviceProperties)
    record_shapes: Union[int, bool, str, None] = None


META_FIELDS = ("deviceProperties", "distributedInfo", "displayTimeUnit", "schemaVersion", "traceName",
               "perfdoctor_cut_s", "baseTimeNanoseconds", "record_shapes")

class _Decoder:
    """A msgspec decoder whose recursion limit is a decode error: msgspec raises RecursionError
    on JSON nested deeper than Python's recursion limit (`[[[[...` 100k deep), and the reader
    treats such a chunk as it treats any other it cannot decode. Strings that are not UTF-8 are
    a decode error too (msgspec 0.23: DecodeError "Invalid UTF-8 encoded string"; a
    UnicodeDecodeError is made one): the reader retries with the bad bytes as U+FFFD
    (perfdoctor.trace.surrogates)."""

    __slots__ = ("_decode",)

    def __init__(self, *args):
        self._decode = msgspec.json.Decoder(*args).decode

    def decode(self, buf):
        try:
            return self._decode(buf)
        except RecursionError:
            raise msgspec.DecodeError("JSON nested too deeply") from None
        except UnicodeDecodeError:
            raise msgspec.DecodeError("Invalid UTF-8 encoded string") from None


EVENTS_DECODER = _Decoder(list[Event])
DOC_DECODER = _Decoder(TraceDoc)
ANY_DECODER = _Decoder()
