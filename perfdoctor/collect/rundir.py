"""The run directory of `perfdoctor run`: what a run writes there, and claiming one for a new run.

A run directory holds one run, never parts of two: `claim` refuses a directory that already holds
a run (exit 2, old files intact) unless `force`, which first removes the old run's files (and
only those: other files the user keeps there stay). `discard` takes a run back out of its
directory (a `-m` module that does not exist ran nothing). Stdlib only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from perfdoctor.errors import PerfdoctorError

# What `perfdoctor run` writes into its directory (files, then folders).
RUN_FILES = ("run.json", "child.json", "steps.jsonl", "samples.json", "report.json",
             "inject.json",                      # inject.json: under `perfdoctor tune`
             "worker_info.marker",               # a loader worker read get_worker_info() (hooks.py)
             "rank.json", "ranks.json",          # a rank of a multi-rank run; its parent (collect/ranks.py)
             "report.html", "annotated.pt.trace.json.gz",   # report/outputs.py
             "loaderfetch.jsonl", "rnn_probe.json")   # forked loader workers' totals; PD388's probe
RUN_DIRS = ("trace", "stacks", "tensorboard", "ranks", "forked")
# Any of these marks a directory as a run directory (report.json alone is a report, not a run).
MARKERS = ("run.json", "child.json", "steps.jsonl", "samples.json")


def run_entries(path: Path) -> list[Path]:
    """The run's own files and folders present in `path`."""
    return [path / n for n in RUN_FILES + RUN_DIRS if (path / n).exists() or (path / n).is_symlink()]


def is_run_dir(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and any((p / n).is_file() for n in MARKERS)


def claim(path: Path, force: bool = False) -> None:
    """Make `path` ready for a new run: create it, or refuse/replace an old run in it."""
    if path.exists() and not path.is_dir():
        raise PerfdoctorError(f"--out {path} is a file, not a directory")
    old = run_entries(path) if path.is_dir() else []
    if old and not force:
        names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in old)
        raise PerfdoctorError(f"--out {path} already holds a run ({names}); choose another directory, "
                              "or add --force to replace it")
    for p in old:
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError as exc:
            raise PerfdoctorError(f"--force: cannot remove {p}: {exc.strerror or exc}") from None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PerfdoctorError(f"cannot create the run directory {path}: {exc.strerror or exc}") from None


def discard(path: Path, created: list[Path]) -> None:
    """Remove the run's own files from `path`, then the folders the run created (`created`,
    deepest first) that are left empty; a folder that holds anything else stays."""
    for p in run_entries(path):
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError:
            pass
    for d in created:
        try:
            d.rmdir()
        except OSError:
            break
