"""Decoding one piece of a trace's JSON (a chunk of events, the header, a whole small document)
into events, leniently: the typed msgspec decode first; events whose fields have odd types
through an untyped decode and coerce_events; a piece msgspec refuses retried with lone surrogate
escapes or bytes that are not UTF-8 replaced (trace/surrogates.py) and odd number tokens quoted
(trace/oddnumbers.py), each with its warning. Where the pieces are cut is trace/reader.py's.
"""

from __future__ import annotations

from typing import Any

import msgspec

from perfdoctor.trace import oddnumbers, schema
from perfdoctor.trace.oddnumbers import as_float
from perfdoctor.trace.source import ReadState
from perfdoctor.trace.surrogates import not_utf8_replaced_or_none, replaced_or_none


def decode_events(chunk: bytes, state: ReadState) -> list[schema.Event]:
    """Decode `[chunk]`; raises msgspec.DecodeError on syntax errors (bad cut / corrupt data)."""
    return decode_payload(b"[" + chunk + b"]", state)


def decode_span(buf, start: int, end: int, state: ReadState) -> list[schema.Event]:
    """Decode buf[start:end] as a list without copying: the bytes just outside the span (a
    separator or whitespace) are swapped for brackets during the decode and then restored."""
    before, after = buf[start - 1], buf[end]
    buf[start - 1], buf[end] = 0x5B, 0x5D  # '[' ']'
    try:
        with memoryview(buf) as mv:
            return decode_payload(mv[start - 1:end + 1], state)
    finally:
        buf[start - 1], buf[end] = before, after


def decode_payload(payload, state: ReadState) -> list[schema.Event]:
    """Typed events, else untyped ones coerced; retried with lone surrogate escapes replaced
    and with odd number tokens quoted. msgspec.DecodeError when none of that reads."""
    try:
        return schema.EVENTS_DECODER.decode(payload)
    except msgspec.ValidationError:          # (a DecodeError subclass: caught first)
        items = _untyped(payload, state)
    except msgspec.DecodeError:
        fixed = _fixed_or_none(payload, state)
        if fixed is None:
            raise
        return decode_payload(fixed, state)
    state.untyped_chunks += 1
    return coerce_events(items, state)


def _fixed_or_none(payload, state: ReadState) -> bytes | None:
    """`payload` (which msgspec refused) with what strict JSON or UTF-8 lacks made readable: lone
    surrogate escapes or bytes that are not UTF-8 as U+FFFD, odd number tokens quoted (each with
    its warning); None when it holds none of them. One at a time: the retry fixes the next."""
    return (replaced_or_none(payload, state) or not_utf8_replaced_or_none(payload, state)
            or oddnumbers.quoted_or_none(payload, state))


def _untyped(payload, state: ReadState):
    """The JSON value of `payload`, with numbers beyond a float's range read as strings."""
    try:
        return schema.ANY_DECODER.decode(payload)
    except msgspec.ValidationError:             # "Number out of range" (1e999)
        fixed = oddnumbers.quoted_or_none(payload, state, out_of_range=True)
        if fixed is None:
            raise msgspec.DecodeError("a number out of range") from None
        return _untyped(fixed, state)


def coerce_events(items: list, state: ReadState) -> list[schema.Event]:
    """Slow path for events whose field types do not match the schema (odd producers)."""
    out = []
    bad = 0
    for d in items:
        if not isinstance(d, dict):
            bad += 1
            continue
        try:
            out.append(schema.Event(
                ph=str(d.get("ph", "")), cat=str(d.get("cat") or ""), name=str(d.get("name", "")),
                pid=_id(d.get("pid", 0)), tid=_id(d.get("tid", 0)),
                ts=_time(d.get("ts")), dur=_time(d.get("dur")),
                args=_coerce_args(d.get("args"))))
        except (TypeError, ValueError):
            bad += 1
    if bad:
        state.warnings.append(f"skipped {bad} malformed events")
    return out


def _time(v: Any) -> float:
    """A start or duration; NaN (absent, as the typed path reads it) for null or an empty string."""
    return schema.NAN if v is None or v == "" else as_float(v)


def _id(v: Any) -> int | str:
    return v if isinstance(v, (int, str)) and not isinstance(v, bool) else str(v)


def _coerce_args(a: Any) -> schema.Args:
    if not isinstance(a, dict):
        return schema.NO_ARGS
    kw = {}
    for f in schema.Args.__struct_fields__:
        key = schema.Args.__struct_encode_fields__[schema.Args.__struct_fields__.index(f)]
        v = a.get(key)
        if f in ("label", "labels", "dtype"):
            kw[f] = v if isinstance(v, str) else None
        elif f == "input_type":
            kw[f] = [x if isinstance(x, str) else "" for x in v] if isinstance(v, list) else None
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            kw[f] = as_float(v)
        elif f == "stream" and isinstance(v, str):
            kw[f] = v
    return schema.Args(**kw)


def decode_header(header: bytes, state: ReadState) -> None:
    text = header.rstrip()
    text = text[:-1] if text.endswith(b",") else text
    try:
        doc = schema.DOC_DECODER.decode(text + b"}")
    except msgspec.ValidationError:          # a field of another type (deviceProperties an object): the rest reads
        try:
            obj = _untyped(text + b"}", state)
        except msgspec.DecodeError:
            obj = None
        if isinstance(obj, dict):
            merge_fields(obj, state)
            return
        state.warnings.append("could not read the trace header (deviceProperties etc.)")
        return
    except msgspec.DecodeError:
        # a device name that is not UTF-8, or holds a lone surrogate escape
        fixed = replaced_or_none(text, state) or not_utf8_replaced_or_none(text, state)
        if fixed is not None:
            return decode_header(fixed, state)
        state.warnings.append("could not read the trace header (deviceProperties etc.)")
        return
    merge_meta(doc, state)


def merge_meta(doc: schema.TraceDoc, state: ReadState) -> None:
    for f in schema.META_FIELDS:
        v = getattr(doc, f)
        if v is not None:
            state.meta[f] = v


def merge_fields(obj: dict, state: ReadState) -> None:
    """The metadata fields of an untyped trace object, each on its own: one of an unexpected
    type is left out, with a warning naming it, and the others are kept."""
    odd = []
    for k in schema.META_FIELDS:
        if k in obj:
            try:
                merge_meta(msgspec.convert({k: obj[k]}, schema.TraceDoc), state)
            except msgspec.ValidationError:
                odd.append(k)
    if odd:
        state.warnings.append(f"the trace's {', '.join(odd)} of an unexpected type: left out")


def decode_document(doc_bytes: bytes, state: ReadState) -> list[schema.Event]:
    """The events of a whole trace object (its metadata merged into `state`), with the retries
    `decode_payload` makes. msgspec.DecodeError when none of them reads."""
    try:
        doc = schema.DOC_DECODER.decode(doc_bytes)
    except msgspec.ValidationError:          # (a DecodeError subclass: caught first)
        obj = _untyped(doc_bytes, state)
        obj = obj if isinstance(obj, dict) else {}
        state.untyped_chunks += 1
        merge_fields(obj, state)     # metadata of unexpected types: left out, the events are still read
        events = obj.get("traceEvents")
        return coerce_events(events if isinstance(events, list) else [], state)
    except msgspec.DecodeError:
        fixed = _fixed_or_none(doc_bytes, state)
        if fixed is None:
            raise
        return decode_document(fixed, state)
    merge_meta(doc, state)
    return doc.traceEvents
