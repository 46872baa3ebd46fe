"""`perfdoctor tune` on a data-parallel job of one node: every run (the baseline, each trial) is
the whole job, its ranks started through torchrun (collect/ranks.py), each change injected in
every rank, and --duration's clock kept by each rank's launcher while the ranks agree on the
step to stop after (collect/sharedstop.py), so they stop together and none waits in a collective
for a rank that left.

What a run of the job measures:
- Its step time is its slowest rank's (the pace-setting rank, as the merged diagnosis takes it):
  ranks that synchronise every step run at that pace, and a rank that waits in the all-reduce
  counts its wait in its step. That rank's steady window and steps are compared with the
  baseline's, paired by step number, as one process's are.
- A change is applied only when every rank applied it (one rank that never reached its
  DataLoader has not been changed, and the job's pace is the unchanged rank's).
- The loss drift of a change that alters numerics is rank 0's loss against rank 0's (each rank
  trains on its own shard: another rank's loss is other data).
- A rank that failed fails the run, named; so does torchrun's failure when no rank says why.
- The plan's cores are the node's shared by its ranks: each rank's workers and threads are
  planned from its share.
Across nodes the runs could not stop together (the shared stop is the node's file), and a tune
started once per rank by the user's launcher would be one tune per rank: both refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from perfdoctor.errors import PerfdoctorError
from perfdoctor.script_argv import TORCHRUN

SEVERAL_NODES = ("tune runs a job's ranks on this node only (its runs stop together through a file of the node); "
                 "tune one node's job (--nproc-per-node N, no --nnodes), or use `perfdoctor run --max-steps` "
                 "across nodes before and after a change, and `perfdoctor compare`")
UNDER_LAUNCHER = ("tune starts the job's ranks itself: run it once, not once per rank (`perfdoctor tune "
                  "--nproc-per-node N train.py`, or `perfdoctor tune torchrun --nproc-per-node N train.py`)")


def job_command(argv: list[str], module: str | None, nproc: str | None) -> tuple[list[str], str | None,
                                                                              list[str] | None]:
    """(the script's argv, its module, torchrun's options; None for one process) from tune's
    command line: `--nproc-per-node N SCRIPT`, or a torchrun command line (`torchrun [OPTIONS]
    SCRIPT`, `-m torch.distributed.run ...`; --nproc-per-node given to tune goes first)."""
    from perfdoctor.collect.ranks import DistOptions, check_rank_counts, identity, one_node, torchrun_passthrough

    ident = identity()
    if ident is not None and ident.world_size > 1:
        raise PerfdoctorError(UNDER_LAUNCHER)
    if module in (TORCHRUN, "torchrun"):
        given = ["--nproc-per-node", str(nproc)] if nproc is not None else []
        line = torchrun_passthrough(given + argv[1:])
        if not one_node(line.nnodes):
            raise PerfdoctorError(SEVERAL_NODES)
        named = {o.split("=", 1)[0].replace("_", "-") for o in line.opts}
        # as DistOptions.torchrun_args: a free port on this node unless the line names where to meet
        local = not named & {"--standalone", "--rdzv-endpoint", "--master-addr", "--master-port"}
        return line.script, line.script[0] if line.is_module else None, line.opts + ["--standalone"] * local
    if nproc is None:
        return argv, module, None
    check_rank_counts(nproc, None)
    return argv, module, DistOptions(nproc).torchrun_args()


def measure_job(top: Path, changes: dict, exit_code: int, wall_s: float):
    """The job's run as one Measured (tune/measure.py): its slowest rank's, under the job's
    directory, exit code and wall time; the first failed rank's error, named."""
    from perfdoctor.analyze.system import ranks_other_cores
    from perfdoctor.collect.ranks import rank_dirs
    from perfdoctor.tune.measure import Measured, _read_json, measure_dir, stopped_late, system_of

    ranks, systems, any_late = [], [], False
    for k, d in rank_dirs(top):
        info, run = _read_json(d / "rank.json"), _read_json(d / "run.json")
        code = info.get("exit_code") if isinstance(info.get("exit_code"), int) else exit_code
        late = stopped_late(run.get("stopped_by"), run.get("notes") or [])
        any_late |= late
        systems.append(system_of(d))
        ranks.append((k, measure_dir(d, changes, code, _read_json(d / "child.json"), wall_s, stopped_late=late,
                                     system=systems[-1])))
    if not ranks:
        m = Measured(top, dict(changes), exit_code, "killed", wall_s)
        m.error = f"the script failed (torchrun exit code {exit_code}; no rank's run directory)"
        return m
    failed = [(k, m) for k, m in ranks if not m.ok]
    k, pace = failed[0] if failed else max(ranks, key=lambda r: r[1].step_s)
    job = replace(pace, run_dir=top, exit_code=exit_code, wall_s=wall_s, inject=_job_inject(ranks),
                  other_load=ranks_other_cores(systems),
                  ranks=len(ranks), pace_rank=k)
    if failed:
        job.error = f"{pace.error} on rank {k}"
    elif exit_code != 0 and not any_late:    # a rank perfdoctor interrupted after the stop's grace did not fail
        job.error = f"the script failed (torchrun exit code {exit_code})"
    return job


def _job_inject(ranks: list) -> dict:
    """The ranks' inject.json as the job's: the changes every rank applied, every rank's notes
    once, rank 0's losses; the rest (loaders, optimizers, threads) rank 0's. `ranks`: (rank, Measured)."""
    first = dict(ranks[0][1].inject)
    asked = first.get("applied") or []
    first["applied"] = [a for a in asked if all(a in (m.inject.get("applied") or []) for _, m in ranks)]
    notes = [n for _, m in ranks for n in m.inject.get("notes") or []]
    for k, m in ranks:
        if missing := [a for a in asked if a not in (m.inject.get("applied") or [])]:
            notes.append(f"rank {k} did not apply {', '.join(missing)}")
    first["notes"] = list(dict.fromkeys(notes))
    return first

