"""Several ranks under one `perfdoctor run`: who this process is, where each rank writes, who merges.

Layout of a multi-rank run directory:

    RUN_DIR/ranks.json             how the job was launched (written by `--nproc-per-node`'s parent)
    RUN_DIR/ranks/rank-K/          rank K's own run directory (run.json, child.json, steps.jsonl,
                                   samples.json, trace/ ...), exactly what a single `run` writes,
                                   plus rank.json: rank, world size, local rank, node, host, exit code
    RUN_DIR/ranks/.done-<host>-<job>  one line per finished rank of that launch on that node
                                   (appended under flock)

Two ways in, one layout:
- `perfdoctor run --nproc-per-node N ... SCRIPT` starts torch's own launcher
  (`python -m torch.distributed.run ... -m perfdoctor.collect.ranks`): each worker torchrun starts is
  perfdoctor's per-rank launcher (this module's `run_rank`), which starts the script in its own
  child with the hooks and samples it, as a single `run` does. The parent waits for torchrun,
  takes its exit code, and merges.
- The user's launcher starts `perfdoctor run` once per rank (`torchrun --no-python perfdoctor run
  ...`, Slurm `srun perfdoctor run ...`): the rank comes from RANK / WORLD_SIZE / LOCAL_RANK (or
  SLURM_PROCID / SLURM_STEP_NUM_TASKS / SLURM_LOCALID in an srun step) and the same `run_rank` runs;
  the last rank to finish on a node merges what is there.

Nothing here reads a trace or formats a report (diagnose/ranks.py merges). Stdlib only.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

from perfdoctor.collect.launcher import RunConfig, RunResult, forward_signals, launch, restore_signals
from perfdoctor.collect.rundir import claim, is_run_dir
from perfdoctor.errors import PerfdoctorError

CFG_ENV = "PERFDOCTOR_RANKS"             # the run configuration handed to every rank (JSON)
RANK_RX = re.compile(r"^rank-(\d+)$")


@dataclass
class RankId:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    node: str | None                     # GROUP_RANK / SLURM_NODEID when known
    source: str                          # "torchrun" | "slurm"


def identity(env: dict | None = None) -> RankId | None:
    """This process's rank, from the environment its launcher set; None outside a launcher."""
    env = os.environ if env is None else env

    def num(name):
        try:
            return int(env[name])
        except (KeyError, ValueError):
            return None
    rank, world = num("RANK"), num("WORLD_SIZE")
    if rank is not None and world is not None and 0 <= rank < world:
        local = num("LOCAL_RANK")
        return RankId(rank, world, local if local is not None else rank, num("LOCAL_WORLD_SIZE"),
                      env.get("GROUP_RANK"), "torchrun")
    rank, world = num("SLURM_PROCID"), num("SLURM_STEP_NUM_TASKS")   # set in srun steps only
    if rank is not None and world is not None and world > 1 and 0 <= rank < world:
        local = num("SLURM_LOCALID")
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE", "")
        m = re.match(r"^(\d+)", per_node)
        return RankId(rank, world, local if local is not None else rank, int(m.group(1)) if m else None,
                      env.get("SLURM_NODEID"), "slurm")
    return None


def rank_dir(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "ranks" / f"rank-{rank}"


def rank_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(rank, directory) of the ranks present under run_dir/ranks, by rank; or directly under
    run_dir when it has no ranks/ (`RUN_DIR/ranks` itself, or the nodes' rank-K/ copied into one
    directory)."""
    base = Path(run_dir) / "ranks"
    if not base.is_dir():
        base = Path(run_dir)
    try:
        names = os.listdir(base)
    except OSError:
        return []
    out = []
    for n in names:
        m = RANK_RX.match(n)
        if m and is_run_dir(base / n):
            out.append((int(m.group(1)), base / n))
    return sorted(out)


def is_multi_rank(path: str | Path) -> bool:
    return Path(path).is_dir() and bool(rank_dirs(path))


def default_dir(cfg: RunConfig, env: dict | None = None) -> Path:
    """A run directory every rank of one job agrees on without talking to each other: named after
    the job (Slurm job and step, torchrun's run id) or, failing that, the local launcher's pid."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", cfg.module or Path(cfg.argv[0]).stem)
    return Path("perfdoctor-runs") / f"{stem}-{job_key(env)}"


def job_key(env: dict | None = None) -> str:
    """What the ranks of one launch share: the Slurm job and step, torchrun's run id, else the
    local launcher's pid (torchrun's agent: the parent of every local rank)."""
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_ID"):
        job = f"slurm-{env['SLURM_JOB_ID']}-{env.get('SLURM_STEP_ID', '0')}"
    elif env.get("TORCHELASTIC_RUN_ID") not in (None, "", "none"):
        job = f"torchrun-{env['TORCHELASTIC_RUN_ID']}"
    else:
        job = f"torchrun-pid{os.getppid()}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", job)


# -- one rank -------------------------------------------------------------------------------
def run_rank(cfg: RunConfig, ident: RankId) -> tuple[RunResult, bool]:
    """Run this rank's script into RUN_DIR/ranks/rank-K as a single `run` would. Returns the
    result and whether this rank is the last of its node to finish (it merges)."""
    top = Path(cfg.run_dir) if cfg.run_dir else default_dir(cfg)
    try:
        top.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PerfdoctorError(f"cannot create the run directory {top}: {exc.strerror or exc}") from None
    mine = rank_dir(top, ident.rank)
    claim(mine, cfg.force)
    if cfg.duration and ident.world_size > 1 and not cfg.stop_file:     # started by the user's launcher
        cfg = replace(cfg, stop_file=str(top.resolve() / "ranks" / f".stop-{job_key()}"))
    res = launch(replace(cfg, run_dir=mine, force=True))
    info = {**asdict(ident), "host": socket.gethostname(), "pid": os.getpid(), "exit_code": res.exit_code,
            "signal": res.signal, "wall_s": round(res.wall_s, 3), "end_unix": round(time.time(), 3),
            "tail_s": round(res.tail_s, 3)}
    (mine / "rank.json").write_text(json.dumps(info, indent=1))
    last = _last_on_node(top, ident)
    if last and cfg.stop_file:
        Path(cfg.stop_file).unlink(missing_ok=True)      # the node's ranks are done with it
    return res, last


def _last_on_node(top: Path, ident: RankId) -> bool:
    """Append this rank to the node's done list (under a lock); True for the node's last rank."""
    path = top / "ranks" / f".done-{_safe_host()}-{job_key()}"     # a rerun with --force starts a new list
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(f"{ident.rank}\n")
        f.flush()
        f.seek(0)
        done = {x.strip() for x in f.read().splitlines() if x.strip()}
        fcntl.flock(f, fcntl.LOCK_UN)
    expected = ident.local_world_size or ident.world_size
    return len(done) >= expected


def _safe_host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"


def config_from_env() -> RunConfig:
    d = json.loads(os.environ.pop(CFG_ENV))
    d["run_dir"] = Path(d["run_dir"]) if d.get("run_dir") else None
    return RunConfig(**d)


# -- the parent of `--nproc-per-node` ---------------------------------------------------------
@dataclass
class DistOptions:
    nproc_per_node: str | None
    nnodes: str | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_backend: str | None = None
    rdzv_id: str | None = None

    def flags(self) -> list[str]:
        """The options given, as torchrun flags."""
        out = [] if self.nproc_per_node is None else ["--nproc-per-node", str(self.nproc_per_node)]
        for flag, val in (("--nnodes", self.nnodes), ("--node-rank", self.node_rank),
                          ("--master-addr", self.master_addr), ("--master-port", self.master_port),
                          ("--rdzv-endpoint", self.rdzv_endpoint), ("--rdzv-backend", self.rdzv_backend),
                          ("--rdzv-id", self.rdzv_id)):
            if val is not None:
                out += [flag, str(val)]
        return out

    def torchrun_args(self) -> list[str]:
        out = self.flags()
        if self.rdzv_endpoint and not self.rdzv_backend:
            out += ["--rdzv-backend", "c10d"]
        if self.nnodes in (None, "1", "1:1") and not (self.rdzv_endpoint or self.master_addr):
            out += ["--standalone"]       # one node: a free port, no rendezvous server to name
        return out


class TorchrunLine(NamedTuple):
    """A torchrun command line split: its own options, [SCRIPT, *ARGS], whether SCRIPT is a
    module, and its --nnodes (torch's default "1:1" when not given)."""
    opts: list[str]
    script: list[str]
    is_module: bool
    nnodes: str


def torchrun_passthrough(argv: list[str]) -> TorchrunLine:
    """`perfdoctor run -m torch.distributed.run [TORCHRUN OPTIONS] SCRIPT ARGS` (or `-m torchrun`),
    parsed by torchrun's parser; the options then start perfdoctor's per-rank launcher instead of
    the script."""
    from torch.distributed.run import get_args_parser
    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:
        raise PerfdoctorError("torch.distributed.run could not parse its arguments (see its message above)") from None
    if args.no_python:
        raise PerfdoctorError("--no-python: perfdoctor can only watch a Python script or module under torchrun; "
                              "use `torchrun --no-python perfdoctor run SCRIPT` instead")
    script = [args.training_script, *args.training_script_args]
    cut = len(argv) - len(script)
    if cut < 0 or argv[cut:] != script:
        raise PerfdoctorError("cannot tell torch.distributed.run's options from the script's arguments")
    opts = [a for a in argv[:cut] if a not in ("-m", "--module")]
    if not args.module and not Path(script[0]).is_file():
        raise PerfdoctorError(f"can't open file {script[0]!r}: no such file")
    return TorchrunLine(opts, script, bool(args.module), str(args.nnodes))


def one_node(nnodes: str | None) -> bool:
    return nnodes is None or str(nnodes) in ("1", "1:1")


NPROC = re.compile(r"[1-9][0-9]{0,5}|auto|cpu|gpu|xpu")      # what torchrun's --nproc-per-node takes
NNODES = re.compile(r"[1-9][0-9]{0,5}(?::[1-9][0-9]{0,5})?")   # N or MIN:MAX


def check_rank_counts(nproc: str, nnodes: str | None) -> None:
    """A rank count torchrun would refuse with a traceback: one line before anything starts."""
    if not NPROC.fullmatch(str(nproc)):
        raise PerfdoctorError(f"--nproc-per-node {nproc!r}: give a number of ranks of 1 or more (or auto, cpu, gpu)")
    if nnodes is not None and not NNODES.fullmatch(str(nnodes)):
        raise PerfdoctorError(f"--nnodes {nnodes!r}: give a number of nodes of 1 or more, or MIN:MAX")


def launch_ranks(cfg: RunConfig, dist: DistOptions | list[str]) -> RunResult:
    """Start the script on every local rank through torch.distributed.run (with DistOptions, or
    torchrun's own options as given); exit as torchrun does."""
    top = Path(cfg.run_dir) if cfg.run_dir else _default_parent_dir(cfg)
    claim(top, cfg.force)
    rank_cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    # --duration: each rank's launcher keeps the clock, and the ranks agree on the step to stop
    # after through a file of this launch (collect/sharedstop.py)
    stop = top.resolve() / "ranks" / f".stop-{os.getpid()}-{time.time_ns()}" if cfg.duration else None
    rank_cfg.update(run_dir=str(top.resolve()), force=cfg.force, progress=False, stop_file=stop and str(stop))
    opts = dist.torchrun_args() if isinstance(dist, DistOptions) else list(dist)
    cmd = [sys.executable, "-m", "torch.distributed.run", *opts, "-m", "perfdoctor.collect.ranks"]
    env = dict(os.environ, **{CFG_ENV: json.dumps(rank_cfg)})
    t0 = time.monotonic()
    # `output` (tune's runs): torchrun's own lines go where the ranks' output goes (each rank's
    # launcher appends its script's there)
    log = open(cfg.output, "ab", buffering=0) if cfg.output is not None else None
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
    finally:
        if log is not None:
            log.close()
    forwarded, old = forward_signals(proc)
    try:
        code = proc.wait()
    finally:
        restore_signals(old)
        if stop is not None:
            stop.unlink(missing_ok=True)
    sig = -code if code < 0 else None
    exit_code = 128 + sig if sig else code
    if forwarded and code != 0:
        # Ctrl-C (or a SIGTERM) reached the job: torchrun then exits 1; the shell's 128 + N, as a
        # single run and every other command exit when interrupted
        exit_code = 128 + forwarded[0]
    wall = time.monotonic() - t0
    (top / "ranks.json").write_text(json.dumps({
        "argv": cfg.argv, "module": cfg.module, "launcher": "torch.distributed.run", "command": cmd[1:],
        "exit_code": exit_code, "signal": sig, "wall_s": round(wall, 3), "forwarded_signals": forwarded,
        "dist": asdict(dist) if isinstance(dist, DistOptions) else {"torchrun_options": opts}}, indent=1))
    return RunResult(top, exit_code, sig, wall, {}, None, [], tail_s=_tail_s(top))


def _tail_s(top: Path) -> float:
    """The longest time a rank's trace_tail kept it past its duration (rank.json)."""
    out = 0.0
    for _, d in rank_dirs(top):
        try:
            v = json.loads((d / "rank.json").read_text()).get("tail_s")
        except (OSError, ValueError, AttributeError):
            continue
        out = max(out, v) if isinstance(v, (int, float)) and not isinstance(v, bool) else out
    return out


def _default_parent_dir(cfg: RunConfig) -> Path:
    from perfdoctor.collect.launcher import default_run_dir
    return default_run_dir(cfg)


def main() -> None:
    """Entry point of each worker torchrun starts (`-m perfdoctor.collect.ranks`)."""
    cfg = config_from_env()
    ident = identity()
    if ident is None:
        print("perfdoctor: error: perfdoctor.collect.ranks runs under torch.distributed.run only", file=sys.stderr)
        sys.exit(2)
    try:
        res, _ = run_rank(cfg, ident)
    except PerfdoctorError as exc:
        print(f"perfdoctor: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    if res.signal:                       # die of the same signal, as the script did
        die_of(res.signal)
    sys.exit(res.exit_code)


def die_of(sig: int) -> None:
    """End this process by signal `sig`, so that torchrun sees the rank die of what killed its
    script (SIGKILL: the OOM killer) and names it. SIGKILL takes no handler (setting one raises
    OSError) and needs none: it cannot be caught. Returns only if the signal did not end the
    process (the caller then exits with 128 + sig, as a shell reports it)."""
    if sig != signal.SIGKILL:
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):    # not a signal a handler can be set for: send it as is
            pass
    os.kill(os.getpid(), sig)


if __name__ == "__main__":
    main()
