"""JSON rendering of a report document."""

from __future__ import annotations

import msgspec


def to_json(doc: dict) -> bytes:
    """Indented JSON; strings from input are data, with the characters a terminal would act on
    escaped (perfdoctor/report/sanitize.py), also in valid JSON."""
    from perfdoctor.report.sanitize import json_bytes, json_safe

    try:
        raw = msgspec.json.encode(doc)
    except UnicodeEncodeError:          # a lone surrogate: a path with bytes that are not UTF-8
        raw = msgspec.json.encode(json_safe(doc))
    return json_bytes(msgspec.json.format(raw, indent=2)) + b"\n"
