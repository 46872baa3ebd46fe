"""The detail tables of one trace (TraceAnalysis.tables): kernels, device time per op and per
annotation, host self time per op, launch delay and queue depth, collectives. Lists, not
registered metrics: the rules never read them; the report shows them (JSON `traces[].tables`, a
line or two in the terminal)."""

from __future__ import annotations

from perfdoctor.analyze.devicetime import device_time_tables, kernel_table
from perfdoctor.analyze.collectives import collective_table
from perfdoctor.analyze.hostops import host_op_table
from perfdoctor.analyze.kinds import Kinds
from perfdoctor.analyze.launches import launch_stats
from perfdoctor.analyze.steps import Steps
from perfdoctor.trace.table import EventTable


def detail_tables(t: EventTable, k: Kinds, steps: Steps, world_size: int | None) -> dict:
    device = k.platform != "cpu"
    out = {"kernels": kernel_table(t, k, steps) if device else None,
           "launches": launch_stats(t, k, steps) if device else None,
           "collectives": collective_table(t, k, steps, world_size)}
    out.update(device_time_tables(t, k, steps) if device else {"ops": [], "annotations": []})
    out["host_ops"] = host_op_table(t, k, steps)
    return out
