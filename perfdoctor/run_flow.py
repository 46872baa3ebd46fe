"""What `perfdoctor run` does once its options are parsed: start the script (one process, ranks
through torchrun, or one rank of the user's own launcher), diagnose it, report, and gate it
against baselines. The script's exit code is the command's: a diagnosis that fails says so in
one line on stderr and never replaces it (stdout belongs to the script).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from perfdoctor.errors import PerfdoctorError, end_by_signal
from perfdoctor.report.sanitize import terminal as _safe


@dataclass(frozen=True)
class Output:
    """run's report options: -o FILE, --format, --details, --rules."""
    file: Path | None
    fmt: str
    details: bool
    rules_dirs: list[str]


def run_script(cfg, out: Output, dist: list, nproc_per_node: str | None, baselines: list[Path],
               strict: bool) -> int:
    """The exit code of `perfdoctor run`. `cfg`: a collect.launcher.RunConfig; `dist`: the
    torchrun options other than --nproc-per-node (DistOptions' order), None where not given."""
    from perfdoctor.collect.ranks import DistOptions, check_rank_counts, identity, one_node, torchrun_passthrough

    for b in baselines:
        if not b.exists():
            raise PerfdoctorError(f"no such baseline: {b}")
    if cfg.module in ("torch.distributed.run", "torchrun"):   # `perfdoctor run -m torch.distributed.run ... SCRIPT`
        # torchrun options written before the first unknown one were taken as perfdoctor's: hand them back
        given = DistOptions(nproc_per_node, *dist).flags()
        line = torchrun_passthrough(given + cfg.argv[1:])
        _multi_rank_checks(cfg.duration, baselines, one_node(line.nnodes))
        return _run_ranks(replace(cfg, argv=line.script, module=line.script[0] if line.is_module else None),
                          line.opts, out)
    if nproc_per_node is not None or any(v is not None for v in dist):
        if nproc_per_node is None:
            raise PerfdoctorError("--nnodes, --node-rank, --master-addr/--master-port and --rdzv-* need --nproc-per-node")
        _multi_rank_checks(cfg.duration, baselines, one_node(dist[0] if dist else None))
        check_rank_counts(nproc_per_node, dist[0] if dist else None)
        return _run_ranks(cfg, DistOptions(nproc_per_node, *dist), out)
    ident = identity()
    if ident is not None:                    # started once per rank by the user's launcher
        if ident.world_size > 1:
            _multi_rank_checks(cfg.duration, baselines, ident.local_world_size == ident.world_size)
        return _run_one_rank(cfg, ident, out)
    return _run_one(cfg, out, baselines, strict)


def _run_one(cfg, out: Output, baselines: list[Path], strict: bool) -> int:
    from perfdoctor.collect.child import NO_MODULE
    from perfdoctor.collect.launcher import launch
    from perfdoctor.collect.rundir import discard

    res = launch(cfg)
    code = res.exit_code
    fresh_line()
    if res.child.get("outcome") == NO_MODULE:   # as `python -m`: its one line (the child printed it), exit 1,
        discard(res.run_dir, res.created)        # and no run directory: nothing ran
        return code
    try:
        _report_run(res, out)
        if baselines and code == 0:
            code = _gate_run(res.run_dir, baselines, strict)
    except PerfdoctorError as exc:
        print(f"perfdoctor: error: {_safe(exc)}", file=sys.stderr)
        code = code or exc.exit_code
    except Exception as exc:  # the script's exit code wins over a diagnosis bug
        _internal_error(exc)
    if res.signal == signal.SIGINT and code == res.exit_code:
        end_by_signal(signal.SIGINT)        # as python: killed by SIGINT, which stops a shell loop around us
    return code


def fresh_line(stream=None) -> None:
    """Start the report on a line of its own in a terminal whose cursor the script's output left
    mid-line (its last print without a newline): the width of the terminal less one in spaces,
    then a carriage return (as zsh does for its prompt). From column 0 that stays on the line and
    returns to its start; from any other column it wraps to the next line first. In a file the
    script's output left mid-line: a newline."""
    stream = stream or sys.stderr
    try:
        if stream.isatty():
            stream.write(" " * (shutil.get_terminal_size().columns - 1) + "\r")
            stream.flush()
        elif _file_ends_mid_line(stream):
            stream.write("\n")
            stream.flush()
    except (OSError, ValueError, AttributeError):
        pass


def _file_ends_mid_line(stream) -> bool:
    """A regular file (`2> log`, `> log 2>&1`) whose byte before the write position is not a
    newline: the script's last write (a `\r` progress bar, a print without end) left the line open.
    A pipe cannot be read back: False."""
    stream.flush()
    fd = stream.fileno()
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return False
    import fcntl
    # where the report lands: the end for `2>>` (O_APPEND), the shared offset the script's writes moved for `2>`
    pos = os.fstat(fd).st_size if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND else os.lseek(fd, 0, os.SEEK_CUR)
    if pos <= 0:
        return False
    rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)   # the stream is often opened write-only
    try:
        return os.pread(rfd, 1, pos - 1) not in (b"\n", b"")
    finally:
        os.close(rfd)


def _multi_rank_checks(duration: float | None, baselines: list[Path], one_node: bool) -> None:
    if duration is not None and not one_node:
        # the ranks agree on their last step through a file of the node's run directory (sharedstop.py)
        raise PerfdoctorError("--duration stops the ranks of one node together, not those of several nodes "
                              "(the others would wait in their collectives); use --max-steps across nodes")
    if baselines:
        raise PerfdoctorError("--baseline gates a single-process run; gate a multi-rank run's ranks/rank-K "
                              "directories with `perfdoctor gate`")


def _run_ranks(cfg, dist, out: Output) -> int:
    """--nproc-per-node: torchrun starts the ranks; the merged report once it returns."""
    from perfdoctor.collect.ranks import launch_ranks
    res = launch_ranks(cfg, dist)
    fresh_line()
    _report_ranks(res.run_dir, out)
    return res.exit_code


def _run_one_rank(cfg, ident, out: Output) -> int:
    """One rank of a job started by the user's launcher: the node's last rank to finish merges."""
    from perfdoctor.collect.ranks import run_rank
    res, last = run_rank(replace(cfg, progress=False), ident)
    if last:
        _report_ranks(res.run_dir.parent.parent, out)
    return res.exit_code


def _report_ranks(run_dir: Path, out: Output) -> None:
    try:
        from perfdoctor.diagnose.ranks import diagnose_ranks
        from perfdoctor.report.json_out import to_json
        from perfdoctor.report.outputs import emit, run_files
        doc = diagnose_ranks(run_dir, out.rules_dirs)
        (run_dir / "report.json").write_bytes(to_json(doc))
        for n in run_files(doc, run_dir):
            print(f"perfdoctor: note: {_safe(n)}", file=sys.stderr)
        emit(doc, out.fmt, out.file, out.details, stderr=True)
    except PerfdoctorError as exc:
        print(f"perfdoctor: error: {_safe(exc)}", file=sys.stderr)
    except Exception as exc:  # the script's exit code wins over a diagnosis bug
        _internal_error(exc)


def _internal_error(exc: Exception) -> None:
    """A diagnosis bug: one line (with PERFDOCTOR_DEBUG=1 its traceback first); the script's exit
    code stays perfdoctor's either way."""
    if os.environ.get("PERFDOCTOR_DEBUG") == "1":
        import traceback
        traceback.print_exception(exc, file=sys.stderr)
    print(f"perfdoctor: internal error while diagnosing: {type(exc).__name__}: {_safe(exc)} "
          "(set PERFDOCTOR_DEBUG=1 for the traceback)", file=sys.stderr)


def _gate_run(run_dir: Path, baselines: list[Path], strict: bool) -> int:
    from perfdoctor.gate.gate import gate_paths
    from perfdoctor.gate.render import github, render_terminal
    from perfdoctor.report.sanitize import console

    res = gate_paths(run_dir, baselines)
    github(res, strict, sys.stderr)          # stdout belongs to the script
    render_terminal(res, console(stderr=True))
    return res.exit_code(strict)


def _report_run(res, out: Output) -> None:
    from perfdoctor.diagnose.live import diagnose_run, write_run_events
    from perfdoctor.report.json_out import to_json
    from perfdoctor.report.outputs import emit, run_files

    doc = diagnose_run(res, out.rules_dirs)
    try:      # a full disk: the report still reaches the terminal, and the script's exit code stays
        (res.run_dir / "report.json").write_bytes(to_json(doc))
        write_run_events(res.run_dir)
    except OSError as exc:
        print(f"perfdoctor: note: the run directory {_safe(res.run_dir)} could not be completed "
              f"({_safe(exc.strerror or exc)}): report.json or the TensorBoard events are missing", file=sys.stderr)
    for n in run_files(doc, res.run_dir):
        print(f"perfdoctor: note: {_safe(n)}", file=sys.stderr)
    emit(doc, out.fmt, out.file, out.details, stderr=True)
