"""Parsed rule files, cached between commands.

Parsing 69 TOML files costs ~30 ms per command (tomllib is pure Python), a twentieth of a whole
`perfdoctor report`. The cache holds the parsed TOML tables, not validated rules: validation
still runs every time (it depends on the metric registry of the installed version), and the
cache is plain JSON, so a stale or tampered file can at worst hold wrong rule text, never code.

An entry is valid while the same files (by path) have exactly the same contents: the entry
keeps each file's text and compares it (reading 69 small files costs ~1 ms; no hashing, so no
hashlib import either). A file that fails to parse is never cached. Anything wrong with the
cache (unreadable, corrupt, a directory that cannot be written) means parsing as before.

Location: $PERFDOCTOR_CACHE_DIR, else $XDG_CACHE_HOME/perfdoctor, else ~/.cache/perfdoctor;
PERFDOCTOR_CACHE_DIR=off (or empty) turns it off.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Callable

import msgspec

from perfdoctor import inputjson

VERSION = 2
ENV = "PERFDOCTOR_CACHE_DIR"


def cache_dir() -> Path | None:
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip() in ("", "off", "0") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "perfdoctor"


def _stamp(files: list[Path]) -> list[list] | None:
    try:
        return [[str(f.resolve()), inputjson.read_bytes(f).decode("utf-8", "surrogateescape")] for f in files]
    except OSError:
        return None


def parse_all(files: list[Path], parse: Callable[[Path], tuple[dict | None, object]]) -> list[tuple]:
    """[(file, (data, problem))] for `files`, as `parse(file)` would give, from the cache when
    it is valid. `parse` returns (data, None) or (None, problem)."""
    where = cache_dir()
    stamp = _stamp(files) if where is not None and files else None
    if stamp is None:
        return [(f, parse(f)) for f in files]
    name = format(zlib.crc32("\0".join(s[0] for s in stamp).encode()), "08x")  # which rule set
    path = where / f"rules-{name}.json"
    try:
        cached = msgspec.json.decode(path.read_bytes())
        if cached.get("version") == VERSION and cached.get("stamp") == stamp:
            return [(f, (data, None)) for f, data in zip(files, cached["data"])]
    except (OSError, msgspec.DecodeError, AttributeError, TypeError):
        pass
    parsed = [(f, parse(f)) for f in files]
    if all(prob is None for _, (_, prob) in parsed):
        _store(path, {"version": VERSION, "stamp": stamp, "data": [d for _, (d, _) in parsed]})
    return parsed


def _store(path: Path, entry: dict) -> None:
    try:
        blob = msgspec.json.encode(entry)
        if msgspec.json.decode(blob)["data"] != entry["data"]:
            return  # a value JSON cannot carry as it is (TOML dates): keep parsing
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)
    except (OSError, TypeError, msgspec.EncodeError):
        pass
