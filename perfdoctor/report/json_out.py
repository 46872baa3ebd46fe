"""JSON rendering of a report document."""

from __future__ import annotations

import msgspec


def to_json(doc: dict) -> bytes:
    return msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"
