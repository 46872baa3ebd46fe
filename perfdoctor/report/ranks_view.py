"""Terminal view of the `ranks` section of a multi-rank run's report (diagnose/ranks.py)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfdoctor.analyze.straggler import MATERIAL
from perfdoctor.report.labels import WAIT_CAUSE, rank_bound, uneven_detail
from perfdoctor.report.sanitize import text


def cell_ms(x) -> str:
    """A rank table's time in ms, to 0.1 ms ("-" where unknown): the terminal's and markdown's."""
    return f"{x:.1f}" if isinstance(x, (int, float)) else "-"


def _short(s: str, n: int = 12) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def cell_pct(x) -> str:
    return f"{100 * x:.0f}%" if isinstance(x, (int, float)) else "-"


def render_ranks(c: Console, sec: dict) -> None:
    m = sec.get("metrics") or {}
    c.print()
    # the steady steps' times: the step breakdown below is the traced steps', longer under the profiler
    c.print(Text(rank_title(sec) + " (steady steps; wait = exposed collective time per step, own work = step - wait)",
                 style="bold"))
    hosts = several_hosts(sec)
    table = Table(show_edge=False, box=None, padding=(0, 1))
    for col in ("rank",) + (("host",) if hosts else ()) + ("step ms", "own ms", "wait ms", "for slower",
                                                           "data wait", "verdict", "exit"):
        table.add_column(col, no_wrap=True)
    for r in sec["per_rank"]:
        mark = "*" if r["rank"] == sec.get("slowest_rank") and m.get("ranks.wait_cause") == "straggler" else ""
        table.add_row(text(f"{r['rank']}{mark}"), *((text(_short(r.get("host") or "-")),) if hosts else ()), cell_ms(r["step_time_ms"]),
                      cell_ms(r["busy_ms"]), f"{cell_ms(r['collective_wait_ms'])} {cell_pct(r['collective_wait_share'])}"
                      if r["collective_wait_ms"] is not None else "-",
                      cell_ms(r["straggler_wait_ms"]), cell_pct(r["data_wait_share"]), text(rank_bound(r)),
                      text("-" if r.get("exit_code") is None else r["exit_code"]))
    c.print(table)
    for line, dim in rank_notes(sec):
        c.print(text(line, style="dim" if dim else ""))


def several_hosts(sec: dict) -> bool:
    """The ranks ran on more than one host: the rank tables (terminal and HTML) get a host column."""
    return len({r.get("host") for r in sec.get("per_rank") or []}) > 1


def rank_title(sec: dict) -> str:
    """'Across 2 rank(s) of 128': the ranks read, and the job's size where it is larger."""
    world = sec.get("world_size")
    return f"Across {sec['count']} rank(s)" + (f" of {world}" if world and world != sec["count"] else "")


def rank_notes(sec: dict) -> list[tuple[str, bool]]:
    """The lines under the rank table, as (plain text, dim): what the wait is and how much of it
    every rank pays; the terminal and the HTML report print the same (each escapes them)."""
    m = sec.get("metrics") or {}
    cause = m.get("ranks.wait_cause")
    if cause is None:
        # a job's rank directories not all here (another node's) is not a rank without a trace
        world, count = sec.get("world_size"), sec.get("count")
        why = (f"{count} of the job's {world} ranks here" if isinstance(world, int) and isinstance(count, int)
               and count < world else "no trace on some rank")
        return [(f"  collective waits unknown ({why}): straggler and network waits not separated", True)]
    steps = {r["steps"] for r in sec["per_rank"] if isinstance(r.get("steps"), int)}
    if not m.get("ranks.comm_wait_share_mean") and cause == "none":
        # no collective in any rank's traced steps: nothing to pair, nobody waits for anybody
        return [("  no rank ran a collective in its traced steps: the ranks did not wait for each other "
                 "(independent processes?)" + (f"; they ran {min(steps)}-{max(steps)} steps" if len(steps) > 1 else ""),
                 False)]
    line = f"  the wait is {WAIT_CAUSE.get(cause, cause)}"
    if cause == "straggler" and m.get("ranks.slowest_ratio") is not None:
        line += (f" (*): rank {m['ranks.slowest_rank']} is busy {m['ranks.slowest_ratio']:.2f}x as long per step "
                 f"as rank {m['ranks.fastest_rank']}, which waits {cell_pct(m['ranks.straggler_wait_share_max'])} "
                 "of its step for it")
    elif cause == "network" and (m.get("ranks.straggler_wait_share_max") or 0) >= MATERIAL:
        # the transfer is the larger part, not all of it: a rank waits that much more than the others;
        # called slower only where it is step after step (a balanced run's rank 1, at 5.3 ms to rank
        # 0's 5.4, had read "also slower than the other" from a few traced steps)
        line += f"; the waits differ by up to {cell_pct(m['ranks.straggler_wait_share_max'])} of the step: " + (
            f"rank {m['ranks.slowest_rank']} is also slower than the {'other' if sec.get('count') == 2 else 'others'}"
            if m.get("ranks.straggler_consistent") else "no rank is slower step after step (turns, or a noisy machine)")
    elif cause == "straggler":
        line += f" (*): rank {sec.get('slowest_rank')}"
    line += uneven_detail(m)
    out = [(line, False), *_off_cpu(m, cause),
           (f"  every rank waits at least {cell_pct(m.get('ranks.network_wait_share'))} of the step (the "
            f"collective itself); waiting for slower ranks: {cell_pct(m.get('ranks.straggler_wait_share'))} on average"
            + (f" (paired over {m['ranks.paired_steps']} profiled steps)" if m.get("ranks.paired_steps") else ""),
            True)]
    if steps and max(steps) - min(steps) > 1:       # one step apart: ranks stopped mid-step, not uneven data
        counts = ", ".join(f"rank {r['rank']} {r['steps']}" for r in sec["per_rank"] if isinstance(r.get("steps"), int))
        out.append((f"  the ranks ran different numbers of steps ({counts}): uneven inputs (a rank that ran out of "
                    "batches joined, under torch.distributed.algorithms.Join, or left); each rank's figures are "
                    "over its own steps", False))
    return out


def _off_cpu(m: dict, cause: str) -> list[tuple[str, bool]]:
    """A straggler whose step thread used about as much CPU per step as the others' (its CPU time
    beyond their mean under MATERIAL of its step): its extra time is not more work of its own on
    that thread. A user's balanced DDP job under another job's load read 'rank 0 does 1.85x the
    work' with 2.7% of a step more CPU time; a rank that sleeps or waits for its data reads so too."""
    extra = m.get("ranks.slowest_extra_cpu_share")
    if cause != "straggler" or extra is None or extra >= MATERIAL:
        return []
    return [(f"  rank {m.get('ranks.slowest_rank')}'s step thread used about as much CPU per step as the others' "
             f"(+{cell_pct(extra)} of its step): its extra time was spent off that CPU, waiting (storage, a sleep, "
             "its loader's workers, other threads) or slowed by other load on its cores, not in more work of its own",
             True)]
