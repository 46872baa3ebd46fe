"""Rich terminal rendering of a report document (one screen: verdict, breakdown, flags, gaps)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

BOUND_TITLE = {
    "input_io": "INPUT-BOUND (IO)", "input_cpu": "INPUT-BOUND (CPU)", "input": "INPUT-BOUND",
    "host": "HOST-BOUND", "device": "DEVICE-BOUND", "communication": "COMMUNICATION-BOUND",
    "inconclusive": "INCONCLUSIVE",
}
ROLE_LABEL = {"kernel": "GPU kernels", "memcpy": "memcpy", "memset": "memset",
              "communication": "communication", "runtime": "runtime calls",
              "data_loading": "data loading", "cpu_exec": "CPU ops", "other": "other / untraced"}
CPU_ROLE_LABEL = {**ROLE_LABEL, "cpu_exec": "CPU ops (compute)", "communication": "communication (gloo)"}
SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}
BAR = 28


def render(doc: dict, console: Console | None = None) -> None:
    c = console or Console(highlight=False)
    v = doc["verdict"]
    first = doc["traces"][0]
    m = first["metrics"]
    dev = m.get("trace.device_name") or ("CPU only" if m["trace.platform"] == "cpu" else "device unknown")
    where = f"{len(doc['traces'])} traces" if len(doc["traces"]) > 1 else first["path"]
    c.print(Text.assemble(("perfdoctor ", "bold"), (where, "dim")))
    c.print(Text(f"{m['trace.platform']} · {dev} · {m['steps.count']} step(s) from {m['steps.source']}"
                 f" · median step {m['steps.time_median_ms']:.1f} ms", style="dim"))
    c.print()
    c.print(Text.assemble((f" {BOUND_TITLE[v['bound']]} ", "bold reverse"),
                          (f"  {v['confidence_label']} confidence ({v['confidence']:.2f})", "dim")))
    c.print(v["summary"])
    for n in v["notes"]:
        c.print(Text(f"  note: {n}", style="dim"))
    if doc.get("cross_rank"):
        _ranks(c, doc)
    _breakdown(c, first)
    _flags(c, doc["flags"])
    _gaps(c, first)
    warnings = [w for t in doc["traces"] for w in t["warnings"]]
    for w in dict.fromkeys(warnings):
        c.print(Text(f"warning: {w}", style="yellow"))


def _breakdown(c: Console, t: dict) -> None:
    m = t["metrics"]
    labels = CPU_ROLE_LABEL if m["trace.platform"] == "cpu" else ROLE_LABEL
    n = max(len(t["steps"]), 1)
    c.print()
    title = f"Step breakdown ({t['label']}, mean of {n} step(s))" if t["label"].startswith("rank") else f"Step breakdown (mean of {n} step(s))"
    c.print(Text(title, style="bold"))
    table = Table.grid(padding=(0, 2))
    for role, label in labels.items():
        share = m[f"breakdown.{role}"] or 0.0
        if share < 0.0005:
            continue
        ms = sum(s["breakdown_ms"][role] for s in t["steps"]) / n
        bar = "█" * int(round(share * BAR)) or "▏"
        table.add_row(label, f"{ms:9.2f} ms", f"{100 * share:5.1f}%", Text(bar, style="green"))
    c.print(table)


def _flags(c: Console, flags: list[dict]) -> None:
    if not flags:
        return
    c.print()
    c.print(Text("Flags", style="bold"))
    for f in flags:
        c.print(Text.assemble((f"  [{f['severity']}] ", SEV_STYLE[f["severity"]]), (f["title"], "bold")))
        c.print(f"    {f['summary']}")
        ev = ", ".join(f"{k}={_fmt(k, v)}" for k, v in f["evidence"].items() if v is not None)
        c.print(Text(f"    evidence: {ev}", style="dim"))


def _gaps(c: Console, t: dict) -> None:
    gaps = [g for g in t["idle_gaps"] if g["duration_ms"] >= 0.05]
    if not gaps:
        return
    c.print()
    c.print(Text("Largest idle-GPU gaps", style="bold"))
    table = Table.grid(padding=(0, 2))
    for g in gaps:
        table.add_row(f"step {g['step']}", f"+{g['offset_ms']:.2f} ms", f"{g['duration_ms']:.2f} ms",
                      g["kind"].replace("_", " "), Text(_short(g["host_event"] or g["host_activity"]), style="dim"))
    c.print(table)


def _ranks(c: Console, doc: dict) -> None:
    cr = doc["cross_rank"]
    c.print()
    c.print(Text(f"Across {cr['count']} traces (step-time spread {100 * cr['spread']:.1f}%)", style="bold"))
    table = Table(show_edge=False, box=None, padding=(0, 2))
    for col in ("trace", "median step", "verdict", "flags"):
        table.add_column(col)
    for t in doc["traces"]:
        table.add_row(t["label"], f"{t['metrics']['steps.time_median_ms']:.1f} ms", t["verdict"]["bound"],
                      ", ".join(f["id"] for f in t["flags"]) or "-")
    c.print(table)


def _fmt(name: str, v) -> str:
    if isinstance(v, float) and name.endswith(("_share", "_fraction", "_swing")) or name.endswith("share"):
        return f"{100 * v:.1f}%"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _short(s: str, n: int = 48) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"
