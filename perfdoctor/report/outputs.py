"""Which renderer writes where, for the CLI's --format / -o / --details / --annotate (cli.py stays
a thin layer): terminal (rich), json, html (one self-contained file), markdown (PR comments, job
summaries); and the files every `perfdoctor run` leaves in its run directory."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from perfdoctor import inputjson
from perfdoctor.errors import PerfdoctorError

RUN_HTML = "report.html"
RUN_ANNOTATED = "annotated.pt.trace.json.gz"   # beside trace/, so `report RUN_DIR` never reads it as a trace


def rendered(doc: dict, fmt: str, tune: dict | None = None, kind: str = "report") -> bytes:
    """The document in fmt (json, html, markdown); kind: report, compare or tune."""
    if fmt == "json":
        from perfdoctor.report.json_out import to_json
        return to_json(doc)
    if fmt == "html":
        from perfdoctor.report.html import render
        return render(doc, tune).encode()
    from perfdoctor.report import markdown
    return {"report": lambda: markdown.report(doc, tune), "compare": lambda: markdown.compare(doc),
            "tune": lambda: markdown.tune(doc)}[kind]().encode()


def check_writable(path: Path, reads: Iterable[Path] = ()) -> None:
    """Refuse an -o FILE that cannot be written before a long command (tune: its whole budget)
    starts: a missing or read-only directory, or a directory where the file should be. Nothing is
    created here (an interrupted command leaves no empty file); `write` still reports what fails late.
    Also refused: a FILE that is one of `reads`, the command's inputs (`report t.json -f json -o
    t.json` replaced the trace with its report; `run -o train.py train.py` the script)."""
    import os

    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    denied = not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK))
    why = ("is a directory" if p.is_dir() else "No such file or directory" if not parent.is_dir()
           else "Permission denied" if denied else None)
    if why:
        raise PerfdoctorError(f"cannot write {path}: {why}")
    for r in reads if p.exists() else ():
        try:
            same = os.path.samefile(p, r)
        except OSError:
            same = False
        if same:
            which = "" if Path(r) == p else f"it is {r}, "
            raise PerfdoctorError(f"cannot write {path}: {which}an input of this command (the output would "
                                  "replace it); write it elsewhere")


def report_inputs(path: Path) -> list[Path]:
    """The files `perfdoctor report PATH` reads: PATH, or the files of the directory PATH and of
    its trace/ folder, less a run directory's own outputs (report.json, report.html and the
    annotated trace, which a report may write anew)."""
    from perfdoctor.collect.rundir import is_run_dir

    p = Path(path)
    if not p.is_dir():
        return [p]
    outputs = {"report.json", RUN_HTML, RUN_ANNOTATED} if is_run_dir(p) else set()
    try:
        return [f for d in (p, p / "trace") if d.is_dir() for f in d.iterdir()
                if f.name not in outputs and f.is_file()]
    except OSError:
        return []


def write(path: Path, data: bytes) -> None:
    try:
        Path(path).write_bytes(data)
    except OSError as exc:
        raise PerfdoctorError(f"cannot write {path}: {exc.strerror or exc}") from None


SUFFIX_FORMATS = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown"}


def format_for(fmt: str, output: Path | None, choices: tuple = ("html", "markdown")) -> str:
    """The format asked; with the default one (terminal) and an -o FILE named .html or .md, that
    file's format (`-o report.html` had written JSON into it, with no word: a user trial)."""
    if fmt != "terminal" or output is None:
        return fmt
    named = SUFFIX_FORMATS.get(Path(output).suffix.lower())
    return named if named in choices else fmt


def emit(doc: dict, fmt: str, output: Path | None, details: bool = False, tune: dict | None = None,
         stderr: bool = False) -> None:
    """report (stdout) and run (stderr: stdout is the script's). terminal: the rich report, and -o
    FILE gets the JSON; json/html/markdown: -o FILE gets that format, else the stream does (run
    prints the terminal report beside an -o file)."""
    stream = sys.stderr if stderr else sys.stdout
    where = None
    if stderr and output is None and fmt in ("html", "json"):
        # run: report.html and report.json are in the run directory already (stdout is the script's)
        where = Path(str((doc.get("run") or {}).get("dir") or "the run directory")) / f"report.{fmt}"
        fmt = "terminal"
    if fmt == "terminal":
        if output is not None:
            write(output, rendered(doc, "json"))
    else:
        data = rendered(doc, fmt, tune)
        if output is not None:
            write(output, data)
            if not stderr:
                return
        else:
            stream.flush()
            stream.buffer.write(data)
            stream.flush()
            return
    from perfdoctor.report.sanitize import console
    from perfdoctor.report.terminal import render
    render(doc, console(stderr=stderr), details=details, tune=tune)
    if where is not None:
        from perfdoctor.report.sanitize import terminal
        print(terminal(f"the {where.suffix[1:]} report: {where} (-o FILE writes a copy)"), file=stream)


def tune_baseline(path: Path) -> tuple[Path, dict, str] | None:
    """`report TUNE_DIR` (or its tune.json): (the tune's baseline run, which the report diagnoses
    with the gains the tune measured under its fixes, tune's JSON as tune_for reads it, the note
    that says so); None for anything else (tune.json had been read as a trace: exit 2). A tune
    whose baseline run is gone is a one-line error (errors.exit_with sanitises it)."""
    from perfdoctor.collect.rundir import is_run_dir

    p = Path(path)
    found = p / "tune.json" if p.is_dir() else p
    if is_run_dir(p) or found.name != "tune.json" or not found.is_file():
        return None
    try:
        doc = inputjson.loads(inputjson.read_bytes(found))
    except (OSError, ValueError, RecursionError):
        return None
    if not inputjson.perfdoctor_doc(doc, "tune"):
        return None
    # the traced baseline whose report gave the fixes tune measured (baseline/, also where tune timed
    # the baseline again in baseline-2/: that run, without a trace, has no fixes of its own to show)
    shown, timed = _baseline_dirs(doc)
    base = found.parent / (shown or timed or "baseline")     # a tune that failed: its baseline run's failure
    if not base.is_dir():
        raise PerfdoctorError(f"{path}: a tune whose baseline run {base} is not there (moved or deleted): give "
                              "`perfdoctor report` that run")
    from perfdoctor.report.sanitize import terminal
    what = "a tune directory" if p.is_dir() else "a tune's result"
    measured = any(isinstance(t, dict) and isinstance(t.get("speedup"), (int, float)) for t in doc["trials"])
    note = (f"{terminal(str(path))} is {what}: the report of its baseline run ({terminal(str(base))}), "
            + ("with the gains the tune measured under the fixes" if measured else "the tune measured no fix"))
    step = doc["baseline"].get("step_time_s") if isinstance(doc.get("baseline"), dict) else None
    if shown and timed and timed != shown and isinstance(step, (int, float)):
        note += (f"; that run had too few steady steps for a step time, and tune timed the baseline again "
                 f"without a trace: {1e3 * step:.0f} ms/step ({terminal(timed)})")
    return base, {**doc, "trials": _trials(doc["trials"])}, note


def _baseline_dirs(tune: dict) -> tuple[str | None, str | None]:
    """The names of tune's diagnosed baseline run (report_dir; a file from before report_dir: tune's
    first run, always baseline/) and of its timed one (dir); None for a tune without a baseline."""
    base = tune.get("baseline") if isinstance(tune, dict) else None
    if not isinstance(base, dict):
        return None, None
    rep, timed = (Path(d).name if isinstance(d, str) and d else None for d in (base.get("report_dir"), base.get("dir")))
    return (rep or ("baseline" if "report_dir" not in base else None)), timed


def tune_for(path: Path, explicit: Path | None) -> dict | None:
    """tune's JSON: the one given, or the tune.json of the tune directory a run directory sits in."""
    cand = explicit if explicit is not None else (Path(path).resolve().parent / "tune.json" if Path(path).is_dir() else None)
    if cand is None or not cand.is_file():
        if explicit is not None:
            raise PerfdoctorError(f"--tune {explicit}: no such file")
        return None
    try:
        data = inputjson.loads(inputjson.read_bytes(cand))
    except (OSError, ValueError, RecursionError) as exc:
        if explicit is not None:
            raise PerfdoctorError(f"--tune {explicit}: not tune's JSON ({exc})") from None
        return None
    ok = isinstance(data, dict) and isinstance(data.get("trials"), list)
    if not ok and explicit is not None:
        raise PerfdoctorError(f"--tune {explicit}: not tune's JSON (no trials list)")
    if not ok or not (explicit is not None or Path(path).resolve().name in _tune_runs(data)):
        return None
    return {**data, "trials": _trials(data["trials"])}


def _trials(trials: list) -> list[dict]:
    """tune's trials as the report reads them: the file is untrusted (a trial that was not an
    object, a speed-up or a rule of another type, a model check as a string were exit 70), so a
    field of another type reads as unknown and a trial that is not an object is left out."""
    from perfdoctor.diagnose.runfiles import ANY, NUM, STR, conform

    shape = [{"rule": STR, "speedup": NUM, "status": STR, "label": STR, "ci95": [NUM], "dir": STR,
              "model_check": {"text": STR, "*": ANY}}]
    out = conform(trials, shape)
    for tr in out:
        if tr.get("ci95") is not None and len(tr["ci95"]) != 2:
            tr["ci95"] = None
    return out


def _tune_runs(tune: dict) -> set[str]:
    """The names of the run directories a tune made (baseline, its repeats, each trial): a tune.json
    found beside a run directory is that run's tune only if the run is one of them (a run next to
    another script's `tune -o tune.json` drew that tune's measurements on its own fixes)."""
    base = tune.get("baseline") if isinstance(tune.get("baseline"), dict) else {}
    dirs = [r.get("dir") for r in base.get("repeats") or [] if isinstance(r, dict)]
    dirs += [t.get("dir") for t in tune.get("trials") or [] if isinstance(t, dict)]
    return {Path(d).name for d in dirs if isinstance(d, str) and d} | {d for d in _baseline_dirs(tune) if d}


def run_files(doc: dict, run_dir: Path) -> list[str]:
    """report.html and the annotated trace in a run directory; returns notes for what failed
    (the run's report still prints)."""
    notes = []
    try:
        (run_dir / RUN_HTML).write_bytes(rendered(doc, "html"))
    except OSError as exc:
        notes.append(f"report.html not written: {exc.strerror or exc}")
    traced = len(doc.get("traces") or []) == 1 and doc["traces"][0].get("origin_us") is not None
    if traced:
        from perfdoctor.report.annotate import write_annotated
        try:
            write_annotated(doc, run_dir / RUN_ANNOTATED)
        except PerfdoctorError as exc:
            notes.append(f"{RUN_ANNOTATED} not written: {exc}")
    return notes
