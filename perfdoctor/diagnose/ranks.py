"""The merged diagnosis of a multi-rank run directory (layout: collect/ranks.py).

Each rank is diagnosed as a single run (diagnose/live.py: its steps, samples and trace), and its
report is written to its own ranks/rank-K/report.json. Then across the ranks (analyze/straggler.py):
per-rank steady step time, collective wait and own work, the slowest rank and by how much, and
whether the wait comes from that rank (straggler) or from the transfer (every rank waits alike).

The cluster verdict and fixes come from the rules evaluated on the pace-setting rank's metrics
(the slowest rank: the whole job runs at its pace, and its own collective wait is the transfer
itself) together with the ranks.* metrics, so a straggler (PD115, PD360) comes before what the
waiting ranks alone would suggest, and every gain is capped by the measured wait. The document
is the single-run document of that rank with the cluster's verdict, fixes and flags, the run
section of the job, and a `ranks` section (docs/commands.md, "Several ranks").
"""

from __future__ import annotations

import os

from pathlib import Path

from perfdoctor import inputjson
from perfdoctor.analyze import registry
from perfdoctor.analyze.straggler import PARTS, RankInput, cross_rank
from perfdoctor.analyze.system import ranks_other_cores
from perfdoctor.collect.ranks import rank_dirs
from perfdoctor.diagnose.confidence import label
from perfdoctor.diagnose.live import StepsOnly, diagnose_dir
from perfdoctor.diagnose.rankfailure import before_first_step, consequence, job_failure, rank_exit_code, uneven_hint
from perfdoctor.diagnose.runfiles import RANK, record
from perfdoctor.errors import PerfdoctorError
from perfdoctor.diagnose.document import build_document
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.loader import load_rules
from perfdoctor.rules.model import target_of


def diagnose_ranks(run_dir: str | Path, rule_dirs: list[str] | None = None) -> dict:
    run_dir = Path(run_dir)
    found = rank_dirs(run_dir)
    if not found:
        raise PerfdoctorError(f"{run_dir} holds no ranks/rank-K run directories")
    rules = load_rules(rule_dirs)
    docs, infos = [], []
    for rank, d in found:
        doc = diagnose_dir(d, rule_dirs)
        _write(d / "report.json", doc)
        docs.append(doc)
        # the directory names the rank; rank.json (any JSON) only adds what it holds in the right shape
        infos.append({**record(_read_json(d / "rank.json"), RANK), "rank": rank})
    world = max((i.get("world_size") or 0 for i in infos), default=0) or None
    inputs = [_rank_input(i["rank"], doc, *_sched_ms(d)) for i, doc, (_, d) in zip(infos, docs, found)]
    ranks_m, rows = cross_rank(inputs, world)
    out = _merge(str(run_dir), docs, infos, [str(d) for _, d in found], ranks_m, rows, rules)
    out["run"] = _run_section(run_dir, out.get("run") or {}, infos, docs)
    if failure := before_first_step(out["run"], docs):
        out["verdict"] = {**out["verdict"], "summary": failure, "notes": [], "secondary": []}
    return out


def merge_rank_traces(input_path: str, results: list, rules) -> tuple[dict | None, str | None]:
    """`perfdoctor report` on one trace per rank (a directory of them, no run directory): the
    same merge as a multi-rank run's, from what the traces hold (their steady step time is the
    traced steps' mean; no run-queue readings, so no contention call). Traces without a rank (a
    stub, another process's trace) are left out of the merge and named, as long as two ranks
    remain. (None, why) when the traces are not one job's ranks (a rank twice, world sizes that
    differ), their collective waits are unknown, or no rank ran a collective (independent
    processes: no rank sets a pace for the others): the caller keeps the plain multi-trace
    document and adds `why` to its notes when there is one."""
    ranked = [(a, d) for a, d in results if isinstance(a.metrics.get("trace.rank"), int)]
    if len(ranked) < 2:
        return None, None
    ranks = [a.metrics.get("trace.rank") for a, _ in ranked]
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        names = [os.path.basename(a.path) for a, _ in ranked if a.metrics.get("trace.rank") == twice[0]]
        return None, (f"{len(names)} traces hold rank {twice[0]} ({', '.join(names)}): traces of different jobs or runs, "
                      "so the ranks are not merged as one job's")
    worlds = sorted({w for a, _ in ranked if isinstance(w := a.metrics.get("trace.world_size"), int)})
    if len(worlds) > 1:
        return None, (f"the traces come from jobs of different sizes (world size {', '.join(map(str, worlds))}), "
                      "so the ranks are not merged as one job's")
    world = worlds[0] if worlds else None
    outside = sorted(r for r in ranks if r < 0 or (world is not None and r >= world))
    if outside:
        # a job of world size 2 has no rank 7: relabelled or damaged traces, not one job's ranks
        return None, (f"rank {', '.join(map(str, outside))} is outside the job's ranks (world size "
                      f"{world if world is not None else 'unknown'}: ranks 0 to {'N-1' if world is None else world - 1}), "
                      "so the traces are not merged as one job's")
    docs = [build_document(a.path, [(a, d)]) for a, d in ranked]
    infos = [{"rank": r} for r in ranks]
    ranks_m, rows = cross_rank([_rank_input(r, doc, None) for r, doc in zip(ranks, docs)], world)
    if ranks_m["ranks.wait_cause"] is None or not ranks_m["ranks.comm_wait_share_mean"]:
        return None, None               # waits unknown, or no collective at all: not one synchronous job
    out = _merge(input_path, docs, infos, [a.path for a, _ in ranked], ranks_m, rows, rules)
    left = [os.path.basename(a.path) for a, _ in results if not isinstance(a.metrics.get("trace.rank"), int)]
    if left:
        out["verdict"]["notes"].append(f"left out of the rank merge (no rank in the trace: a stub, or another "
                                       f"process's trace?): {', '.join(left)}")
    return out, None


def _merge(input_path: str, docs: list[dict], infos: list[dict], dirs: list[str], ranks_m: dict, rows, rules) -> dict:
    """The pace-setting rank's document with the cluster's verdict, flags and fixes: the rules on
    its metrics and the ranks.* metrics; its trace first, then the others, each labelled; and the
    `ranks` section (each rank's row, `dirs` where its run directory or trace is)."""
    pace = _pace_index(infos, ranks_m)
    # other processes' cores with every rank's own CPU left out (each rank's report takes its
    # siblings to use what it does)
    host = {} if (other := _host_other_cores(docs, infos, pace)) is None else {"system.other_cores": other}
    m = {k: v for k, v in docs[pace]["traces"][0]["metrics"].items() if k in registry.REGISTRY}
    m.update(ranks_m, **host)
    registry.check(m)
    cluster = build_document(input_path, [(StepsOnly(input_path, m), evaluate(rules, m))])
    out = dict(docs[pace])
    for k in ("verdict", "flags", "findings"):
        out[k] = cluster[k]
    own, rank = docs[pace]["verdict"], infos[pace]["rank"]
    if out["verdict"].get("rule") == "PD115":
        out["verdict"] = _straggler_verdict(out["verdict"], ranks_m, own, rank)
    elif out["verdict"].get("bound") == own.get("bound"):
        out["verdict"] = _no_surer(out["verdict"], own, rank)
    out["input"] = input_path
    pace_trace = dict(out["traces"][0], metrics={**out["traces"][0]["metrics"], **ranks_m, **host})
    out["traces"] = [pace_trace] + [doc["traces"][0] for i, doc in enumerate(docs) if i != pace]
    for t, i in zip(out["traces"], [pace] + [i for i in range(len(docs)) if i != pace]):
        t["label"] = f"rank {infos[i]['rank']}"
    out["ranks"] = _ranks_section(dirs, infos, docs, rows, ranks_m, pace)
    return out


def _host_other_cores(docs: list[dict], infos: list[dict], pace: int) -> float | None:
    """Other processes' cores on the pace rank's host, from the system metrics of every rank there
    (analyze/system.ranks_other_cores); None for one rank there, or traces alone (no host)."""
    host = infos[pace].get("host")
    same = [d["traces"][0]["metrics"] for d, i in zip(docs, infos) if host and i.get("host") == host]
    return ranks_other_cores(same) if len(same) > 1 else None


def _straggler_verdict(v: dict, m: dict, own: dict, rank: int) -> dict:
    """The job waits for one rank: its bound is that rank's own bound (the job runs at its pace,
    so what limits that rank limits the job: a rank starved by its data loading makes an
    input-bound job, not a communication-bound one), with the straggler's summary first and the
    waiting ranks' collective wait as the secondary cause; when the slow rank's own verdict is
    inconclusive the straggler stays a communication-bound verdict. What the slow rank does more
    of than the others (analyze/straggler.py, ranks.slowest_extra_part: compute, data loading or
    other host time) is said, and where it is not what the rank's own verdict names (that
    verdict names the largest share of its step: a rank given 4x the batch reads input-bound by
    its data wait, though its compute grew more), the job is bound by it; a rank whose own
    verdict is communication, and whose extra work is not another part, keeps the job
    communication-bound.

    Confidence as diagnose/confidence.py for a cause against its runner-up: 0.4 when the wait for
    the straggler ties the wait every rank has (the transfer), 1.0 when it is at least twice that;
    capped at 0.6 with fewer than 5 paired steps; and no more than the slow rank's confidence in
    its own verdict (the job's bound is what bounds that rank), unless that rank judged nothing
    (inconclusive: the straggler, measured across the ranks, is then all there is to say)."""
    v = _straggler_confidence(v, m)
    bound = own.get("bound")
    if bound in (None, "inconclusive"):
        return v
    v = _no_surer(v, own, rank)
    extra, part = _extra_text(m), m.get("ranks.slowest_extra_part")
    itself = f"Rank {rank} itself: {own.get('summary', '')}".rstrip()
    if part is not None and part != target_of(bound):
        # its own verdict names the largest share of its step, not what it does more of than the
        # others (4x the batch: its data wait outgrows the transfer, its compute grows more)
        # the rank's own notes on how near its verdict came to the device line judged that verdict
        notes = [n for n in v.get("notes", []) if not _line_note(n)]
        return {**v, "bound": part, "secondary": ["communication"], "summary": _join(v["summary"], extra, itself),
                "notes": notes}
    if bound == "communication":
        return {**v, "summary": _join(v["summary"], extra)}
    return {**v, "bound": bound, "secondary": ["communication"], "summary": _join(v["summary"], extra, itself)}


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


PART_WORDS = {"device": "compute", "input": "data loading", "host": "other host time"}


def _extra_text(m: dict) -> str:
    """'Its own work beyond rank 0's: compute +17.5 ms a traced step, data loading +9.9 ms, other host
    time +2.6 ms: mostly compute.' ('' when the parts are unknown.)"""
    extra = {p: m.get(f"ranks.slowest_extra_{p}_ms") for p in PARTS}
    if any(v is None for v in extra.values()):
        return ""
    order = sorted(PARTS, key=lambda p: -abs(extra[p]))
    items = [f"{PART_WORDS[p]} {extra[p]:+.1f} ms" + (" a traced step" if i == 0 else "") for i, p in enumerate(order)]
    whom = (f"rank {m['ranks.fastest_rank']:.0f}'s" if m.get("ranks.count") == 2 and m.get("ranks.fastest_rank") is not None
            else "the other ranks' mean")
    part = m.get("ranks.slowest_extra_part")
    tail = f": mostly {PART_WORDS[part]}" if part else ": no part holds most of it"
    return f"Its own work beyond {whom}: {', '.join(items)}{tail}."


def _no_surer(v: dict, own: dict, rank: int) -> dict:
    """The job's verdict no surer than the pace rank's own (docs/commands.md: the job runs at that
    rank's pace, so its verdict rests on that rank's evidence), with that rank's notes on why."""
    conf = own.get("confidence")
    if own.get("bound") in (None, "inconclusive") or not isinstance(conf, (int, float)):
        return v
    notes = v.get("notes", []) + [n for n in own.get("notes", []) if n not in v.get("notes", [])]
    if conf < v["confidence"]:
        notes.append(f"no surer than rank {rank}'s own verdict ({own.get('bound')}, {conf:.2f}), "
                     "whose pace the job runs at")
        v = {**v, "confidence": conf, "confidence_label": label(conf)}
    return {**v, "notes": notes}


def _line_note(note: str) -> bool:
    """diagnose/confidence.py's note on how near a verdict is to the device (or CPU compute) line."""
    return "of the step, " in note and "that would make the step" in note


def _straggler_confidence(v: dict, m: dict) -> dict:
    st, nw = m["ranks.others_wait_share"], m["ranks.network_wait_share"]
    conf = 0.4 + 0.6 * min(1.0, max(0.0, (st - nw) / st) / 0.5) if st > 0 else 0.4
    # the single-rank confidence's notes on how near its cause is to another (the device line)
    # judged a communication-bound rank; the straggler's confidence replaces them
    notes = [n for n in v.get("notes", []) if "untraced host time" not in n and not _line_note(n)]
    if (m.get("ranks.paired_steps") or 0) < 5:
        conf = min(conf, 0.6)
        notes.append(f"only {m.get('ranks.paired_steps')} profiled steps paired across the ranks")
    conf = round(conf, 2)
    return {**v, "confidence": conf, "confidence_label": label(conf), "notes": notes, "secondary": []}


def _rank_input(rank: int, doc: dict, runq_ms: float | None, cpu_ms: float | None = None) -> RankInput:
    t = doc["traces"][0]
    m = t["metrics"]
    step = m.get("run.step_time_ms")
    if step is None:
        step = m.get("steps.time_mean_ms")
    wait = m.get("share.communication") if t.get("steps") else None
    steps = {}
    for s in t.get("steps") or []:
        bd = s.get("breakdown_ms") or {}
        if s.get("duration_ms") and bd.get("communication") is not None:
            steps[str(s.get("label"))] = (s["duration_ms"], bd["communication"])
    return RankInput(rank, step, wait, steps, runq_ms, cpu_ms, _parts_ms(m) if t.get("steps") else None)


def _parts_ms(m: dict) -> dict[str, float] | None:
    """The rank's own work per traced step by part: share.device, share.input and share.host of its
    traced mean step (None when a share or the traced step is unknown)."""
    step = m.get("steps.time_mean_ms")
    shares = {p: m.get(f"share.{p}") for p in PARTS}
    if not isinstance(step, (int, float)) or any(not isinstance(v, (int, float)) for v in shares.values()):
        return None
    return {p: v * step for p, v in shares.items()}


def _sched_ms(d: Path) -> tuple[float | None, float | None]:
    """Mean run-queue wait and CPU time of the step thread per profiled step, from steps.jsonl
    (`runq`, `cpu`; each None when no profiled step has it)."""
    runq, cpu = [], []
    try:
        lines = inputjson.read_text(d / "steps.jsonl", errors="replace").splitlines()
    except OSError:
        return None, None
    for ln in lines:
        try:
            r = inputjson.loads(ln)
        except ValueError:
            continue
        if isinstance(r, dict) and r.get("profiled") is True and isinstance(r.get("runq"), (int, float)):
            runq.append(1e3 * r["runq"])
            if isinstance(r.get("cpu"), (int, float)) and not isinstance(r.get("cpu"), bool):
                cpu.append(1e3 * r["cpu"])
    mean = (lambda v: sum(v) / len(v) if v else None)
    return mean(runq), (mean(cpu) if len(cpu) == len(runq) else None)


def _pace_index(infos: list[dict], m: dict) -> int:
    """The slowest rank's position (its own work is the largest), else the lowest rank."""
    ranks = [i["rank"] for i in infos]
    return ranks.index(m["ranks.slowest_rank"]) if m.get("ranks.slowest_rank") in ranks else 0


def _run_section(run_dir: Path, base: dict, infos: list[dict], docs: list[dict]) -> dict:
    """The job's run section: the pace rank's with how the job ended told by the rank that
    failed first (diagnose/rankfailure.py: its outcome and error, named; the exit code and
    signal both the job's, or both that rank's), every failed rank's code in a note."""
    job = _read_json(run_dir / "ranks.json")
    notes = list(base.get("notes") or [])
    notes += [f"rank {i['rank']} exited with code {c}" + (f" ({why})" if (why := consequence(i, d)) else "")
              for i, d in zip(infos, docs) if (c := rank_exit_code(i, d))]
    if hint := uneven_hint(infos, docs):
        # first: the terminal shows one note by default, and the header names the rank that
        # failed in its collective, not the rank that ran out of batches before it
        notes.insert(0, hint)
    world = max((i.get("world_size") or 0 for i in infos), default=0)
    if world and len(infos) < world:
        missing = sorted(set(range(world)) - {i["rank"] for i in infos})
        notes.append(f"{len(infos)} of {world} ranks found in {run_dir}/ranks (missing: "
                     + ", ".join(map(str, missing[:16])) + ("..." if len(missing) > 16 else "")
                     + "): other nodes' ranks/rank-K directories can be copied in, then `perfdoctor report` merges them")
    ended = job_failure(job, infos, docs)       # no rank failed: the pace rank's outcome stays
    return {**base, "dir": str(run_dir), **ended, "notes": notes,
            "wall_s": job.get("wall_s", base.get("wall_s")),
            "launcher": job.get("launcher") or (infos[0].get("source") if infos else None)}


def _ranks_section(dirs: list[str], infos, docs, rows, m: dict, pace: int) -> dict:
    per = []
    for info, doc, row, where in zip(infos, docs, rows, dirs):
        tm = doc["traces"][0]["metrics"]
        per.append({"rank": info["rank"], "host": info.get("host"), "local_rank": info.get("local_rank"),
                    "dir": where,
                    "exit_code": info.get("exit_code", doc.get("run", {}).get("exit_code")),
                    "steps": tm.get("run.steps"), "steady_steps": tm.get("run.steady_steps"),
                    "step_time_ms": row.step_ms, "step_time_ci95_ms": tm.get("run.step_time_ci95_ms"),
                    "collective_wait_ms": row.wait_ms, "collective_wait_share": row.wait_share,
                    "busy_ms": row.busy_ms, "straggler_wait_ms": row.straggler_wait_ms,
                    # a trace alone: the traced data-loading share of the step
                    "data_wait_share": tm.get("breakdown.data_loading") if tm.get("run.data_wait_share") is None
                    else tm["run.data_wait_share"],
                    "verdict": doc["verdict"]["bound"], "platform": tm.get("trace.platform"), "rule": doc["verdict"]["rule"],
                    "summary": doc["verdict"]["summary"]})
    return {"count": len(infos), "world_size": m.get("ranks.world_size"), "pace_rank": infos[pace]["rank"],
            "slowest_rank": m.get("ranks.slowest_rank"), "fastest_rank": m.get("ranks.fastest_rank"),
            "wait_cause": m.get("ranks.wait_cause"), "metrics": {k: v for k, v in m.items()},
            "per_rank": per}


def _read_json(path: Path) -> dict:
    try:
        data = inputjson.loads(inputjson.read_bytes(path))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, doc: dict) -> None:
    from perfdoctor.report.json_out import to_json
    try:
        path.write_bytes(to_json(doc))
    except OSError:
        pass
