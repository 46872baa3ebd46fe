"""How values print in every output: step times with 3 significant figures (stats.steptime.ms),
seconds as milliseconds, a comparison row's value and change, a tune setting's label. Plain
functions, no rich: the terminal, markdown, HTML, compare, gate and tune renderers share them."""

from __future__ import annotations

from perfdoctor.stats.steptime import ms


def ms_text(v_ms: float | None, unknown: str = "-") -> str:
    """A time in ms: '0.312 ms', '21.0 ms'; `unknown` for None."""
    return unknown if v_ms is None else f"{ms(v_ms)} ms"


def s_as_ms(v_s: float | None, unknown: str = "-") -> str:
    """A time in seconds, printed in ms."""
    return ms_text(None if v_s is None else 1e3 * v_s, unknown)


def number(x: float) -> str:
    """A metric's number in evidence: 4 significant figures ('0.1235', '5.96', '1234'), and
    whole numbers with thousands separators from 10,000 to a billion ('11,260', not 1.126e+04)."""
    return f"{x:,.0f}" if 1e4 <= abs(x) < 1e9 else f"{x:.4g}"


def value(v, unit: str) -> str:
    """A comparison row's value in its unit: ms, steps/s, samples/s, or a share."""
    if v is None:
        return "unknown"
    if unit == "ms":
        return ms_text(v)
    if unit == "steps/s":
        return f"{v:.2f} steps/s"
    if unit == "samples/s":
        return f"{v:.1f} samples/s"
    return f"{100 * v:.1f}%"


def change(row: dict) -> str:
    """A comparison row's change: relative (%) or absolute (points)."""
    c = row["change"]
    if c is None:
        return ""
    return f"{100 * c:+.1f}%" if row["kind"] == "relative" else f"{100 * c:+.1f} pts"


def changes_label(changes: dict) -> str:
    """A tune setting: 'num_workers=2, threads=2'."""
    return ", ".join(f"{k}={v}" for k, v in changes.items())
