"""Read what `compare` and `gate` need from a run directory or a report JSON file, and the run's
steady-state step time (perfdoctor.stats.steptime, the same estimator as `run`'s summary)."""

from __future__ import annotations

import math
import posixpath
import re
import shlex
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from perfdoctor import inputjson
from perfdoctor.collect.ranks import is_multi_rank, rank_dirs
from perfdoctor.collect.rundir import is_run_dir
from perfdoctor.errors import PerfdoctorError
from perfdoctor.trace.loader import checked_input_path, plain_head
from perfdoctor.trace.source import GZIP_MAGIC
from perfdoctor.stats.steptime import StepEstimate, estimate

# What must match for absolute step times to be comparable: (key, label).
FINGERPRINT = (("device", "device model"), ("device_count", "device count"), ("torch", "torch version"),
               ("cpu_count", "CPU count"), ("batch_size", "batch size"))
_BATCH = re.compile(r"--batch[-_]size(?:=|\s+)(\d+)\b")
# Settings of the run itself that change its speed: a difference is told, never blocking (it may
# be the change under test, e.g. torch.set_num_threads as PD348 advises).
SETTINGS = (("machine.torch_threads", "torch threads"),)


@dataclass
class RunData:
    """One side of a comparison: the report document, the step records (None without a run
    directory), the environment fingerprint (None = unknown) and the DataLoader's num_workers /
    prefetch_factor where known (they tell the estimator how many batches may wait at the start)."""

    label: str
    doc: dict
    steps: list | None = None
    fingerprint: dict = field(default_factory=dict)
    loader: dict = field(default_factory=dict)
    read_note: str | None = None            # how the report or the steps were found, when not plainly
    _steady: StepEstimate | None = field(default=None, repr=False)

    @property
    def steady(self) -> StepEstimate | None:
        """The steady-state step time of the step records (None without them)."""
        if self._steady is None and self.steps is not None:
            nw = self.loader.get("num_workers")
            self._steady = estimate(self.steps, num_workers=nw if nw is not None else self.metrics.get("loader.workers"),
                                    prefetch_factor=self.loader.get("prefetch_factor"))
        return self._steady

    @property
    def metrics(self) -> dict:
        traces = self.doc.get("traces") or [{}]
        return traces[0].get("metrics") or {}

    def time_ms(self, key: str) -> float | None:
        """A time metric of the report as a positive finite number of ms, else None (a report
        edited by hand can hold "fast", NaN, true or a negative time)."""
        v = self.metrics.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            return None
        return float(v)

    @property
    def schema_note(self) -> str | None:
        """A line when the report's schema_version is not the one this perfdoctor writes (a newer
        or older perfdoctor's report, or a hand edit): its fields are read as far as they are known."""
        from perfdoctor.diagnose.document import SCHEMA_VERSION

        v = self.doc.get("schema_version")
        if v == SCHEMA_VERSION and not isinstance(v, bool):
            return None
        shown = str(v)[:20] if isinstance(v, (int, float, str)) and not isinstance(v, bool) else "unreadable"
        return (f"{self.label}: report schema_version {shown}, not {SCHEMA_VERSION} as this perfdoctor writes: "
                "compared on the fields it knows")

    @property
    def verdict(self) -> str | None:
        return (self.doc.get("verdict") or {}).get("bound")

    @property
    def command(self) -> str | None:
        """The run's command line as its report records it ('train.py --lr 0.1', '-m pkg.train'),
        None for the report of a bare trace."""
        c = (self.doc.get("run") or {}).get("command")
        return c if isinstance(c, str) and c.strip() else None

    @property
    def fix_ids(self) -> list[str]:
        return [f.get("id") for f in self.doc.get("findings") or [] if f.get("id")]

    @property
    def unevaluated(self) -> set[str]:
        """Rule ids no trace of the report could evaluate (a metric they need is unknown: a tune
        trial's run without a trace): their absence says nothing."""
        out = None
        for t in self.doc.get("traces") or []:
            skipped = t.get("skipped") if isinstance(t, dict) else None
            ids = {s["rule"] for s in (skipped if isinstance(skipped, list) else [])
                   if isinstance(s, dict) and isinstance(s.get("rule"), str)}      # a report is input
            out = ids if out is None else out & ids
        return out or set()

    @property
    def flags(self) -> dict[str, str]:
        """The report's flags: id -> 'severity: title' (strings as the report holds them)."""
        out = {}
        for f in self.doc.get("flags") or []:
            if isinstance(f, dict) and isinstance(f.get("id"), str):
                out[f["id"]] = f"{f.get('severity') or '?'}: {f.get('title') or ''}"
        return out


def load_run(path: str | Path) -> RunData:
    """A run directory (report.json + steps.jsonl + child.json) or a report JSON file. A report
    file inside a run directory also gets that directory's step records. A run directory without
    report.json (an older perfdoctor's, a copy of the run files alone) is diagnosed again, as
    `perfdoctor report DIR` does. A multi-rank run directory's step records are the pace-setting
    rank's (ranks/rank-K/steps.jsonl): in a synchronous job every rank steps at the job's pace."""
    p = checked_input_path(path)     # missing, a dangling or looping link, a FIFO: said so, one line
    notes: list[str] = []
    if p.is_dir():
        run_dir, report = p, p / "report.json"
        doc = _read_report(report) if report.is_file() else _diagnosed(p, notes)
    else:
        report = p
        run_dir = p.parent if (p.parent / "steps.jsonl").is_file() or is_multi_rank(p.parent) else None
        doc = _read_report(report)
    from perfdoctor.diagnose.runfiles import CHILD, record, report as conform_report
    doc = conform_report(doc)           # untrusted: fields of the wrong type read as unknown
    steps = None
    child: dict = {}
    loader: dict = {}
    if run_dir is not None and is_multi_rank(run_dir):
        run_dir = _pace_dir(run_dir, doc, notes)
    if run_dir is not None:
        from perfdoctor.diagnose.live import loader_settings, read_steps
        damaged: list[str] = []         # step records left out: said, as `report RUN_DIR` says it
        steps = read_steps(run_dir, damaged) if (run_dir / "steps.jsonl").is_file() else None
        notes += [f"{run_dir}: {w}" for w in damaged]
        try:
            child = record(inputjson.loads(inputjson.read_bytes(run_dir / "child.json")), CHILD)
        except (OSError, ValueError, RecursionError):
            child = {}
        metrics = ((doc.get("traces") or [{}])[0].get("metrics")) or {}
        loader = loader_settings(run_dir, metrics)
    return RunData(label=str(p), doc=doc, steps=steps, fingerprint=fingerprint(doc, child), loader=loader,
                   read_note="; ".join(dict.fromkeys(notes)) or None)


def _trace_not_report(report: Path, kind: str = "") -> PerfdoctorError:
    # a trace inside a run directory (RUN/trace/x.pt.trace.json.gz): the run directory holds the
    # step records a step time needs, which a report of the trace alone lacks
    run = next((d for d in list(report.parents)[:3] if (d / "steps.jsonl").is_file()), None)
    if run is not None:
        return PerfdoctorError(f"{report}: a {kind}trace, not a perfdoctor report: give its run directory "
                               f"({shlex.quote(str(run))}), which holds the step records")
    return PerfdoctorError(f"{report}: a {kind}trace, not a perfdoctor report: diagnose it first "
                           f"(`perfdoctor report {shlex.quote(str(report))} -f json -o report.json`) and give the "
                           "report (a trace has no step records: a run directory of `perfdoctor run` gives a "
                           "step time with its interval)")


def _read_report(report: Path) -> dict:
    """The JSON document of a report file; PerfdoctorError (one line) for anything else, a trace
    (gzip-compressed or not) named as such."""
    try:
        raw = inputjson.read_bytes(report)
    except OSError as exc:
        raise PerfdoctorError(f"cannot read {report}: {exc.strerror or exc}") from None
    if raw[:2] == GZIP_MAGIC:          # perfdoctor writes no compressed reports: a .json.gz trace?
        try:
            head = plain_head(raw[:1 << 16], 1 << 16)
        except zlib.error:
            head = b""
        if b'"traceEvents"' in head or head.lstrip()[:1] == b"[":
            raise _trace_not_report(report, "gzip-compressed ")
        raise PerfdoctorError(f"{report}: gzip-compressed, not a perfdoctor report")
    try:
        doc = inputjson.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise PerfdoctorError(f"{report}: not a JSON document (not UTF-8 text)") from None
    except (ValueError, RecursionError) as exc:
        raise PerfdoctorError(f"{report}: not a JSON document ({exc})") from None
    if (isinstance(doc, dict) and "traceEvents" in doc) or (
            isinstance(doc, list) and doc and isinstance(doc[0], dict) and "ph" in doc[0]):   # a bare-list trace
        raise _trace_not_report(report)
    if not isinstance(doc, dict) or "schema_version" not in doc or not isinstance(doc.get("traces"), list):
        raise PerfdoctorError(f"{report}: not a perfdoctor report (no schema_version/traces)")
    return doc


def _diagnosed(p: Path, notes: list[str]) -> dict:
    """The report of a run directory that has none, made as `perfdoctor report DIR` makes it."""
    if not (is_run_dir(p) or is_multi_rank(p)):
        if (p / "tune.json").is_file():
            try:
                runs = sorted(d.name for d in p.iterdir() if is_run_dir(d) or is_multi_rank(d))
            except OSError:
                runs = []
            raise PerfdoctorError(f"{p}: a tune directory, not a run: give one of its runs ("
                                  + (", ".join(runs[:4]) + (", ..." if len(runs) > 4 else "") if runs else "none left")
                                  + f" in {p})")
        raise PerfdoctorError(f"{p}: no report.json and no run files in this directory (is it a `perfdoctor run` "
                              "directory?)")
    from perfdoctor.diagnose.offline import diagnose_path

    notes.append(f"{p}: no report.json, diagnosed again from its run files")
    doc = diagnose_path(str(p))
    # what the diagnosis left out (a damaged run file, a trace it could not read), named as report names it
    notes += [f"{p}: {w}" for t in doc.get("traces") or [] for w in t.get("warnings") or []]
    return doc


def _pace_dir(run_dir: Path, doc: dict, notes: list[str]) -> Path:
    """The pace-setting rank's run directory of a multi-rank run (its report's `ranks.pace_rank`,
    else the first rank found)."""
    dirs = dict(rank_dirs(run_dir))
    pace = (doc.get("ranks") or {}).get("pace_rank") if isinstance(doc.get("ranks"), dict) else None
    rank = pace if isinstance(pace, int) and not isinstance(pace, bool) and pace in dirs else min(dirs)
    notes.append(f"{run_dir}: step times of rank {rank} (the pace-setting rank) of {len(dirs)}")
    return dirs[rank]


def fingerprint(doc: dict, child: dict | None = None) -> dict:
    """Device model and count, torch version, CPU count and batch size; None where unknown.
    Batch size: the training loader's batch_size as `perfdoctor run` recorded it
    (input.loader_batch_size), else a --batch-size/--batch_size on the command line."""
    m = ((doc.get("traces") or [{}])[0].get("metrics")) or {}
    platform = m.get("trace.platform")
    device = m.get("trace.device_name") or ("cpu" if platform == "cpu" else None)
    count = m.get("trace.devices_used")
    if count is None and platform == "cpu":
        count = 0
    bs = m.get("input.loader_batch_size")
    bs = bs if isinstance(bs, int) and not isinstance(bs, bool) and bs > 0 else None
    command = (doc.get("run") or {}).get("command") or ""
    hit = _BATCH.search(command) if bs is None else None
    if hit:
        bs = int(hit.group(1))
    return {"device": device, "device_count": count, "torch": (child or {}).get("torch_version"),
            "cpu_count": m.get("machine.cpu_count"), "batch_size": bs}


def settings_diff(a: RunData, b: RunData) -> list[str]:
    """'torch threads 2 vs 1' for each setting known on both sides that differs."""
    out = []
    for key, label in SETTINGS:
        x, y = a.metrics.get(key), b.metrics.get(key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x != y:
            out.append(f"{label} {x:g} vs {y:g}")
    return out


def fingerprint_diff(a: dict, b: dict) -> tuple[list[str], list[str]]:
    """(differences, unknowns): fields known on both sides that differ, and fields unknown on a side."""
    diffs, unknown = [], []
    for key, label in FINGERPRINT:
        x, y = a.get(key), b.get(key)
        if x is None or y is None:
            unknown.append(label)
        elif x != y:
            diffs.append(f"{label} {x} vs {y}")
    return diffs, unknown


def command_key(command: str) -> tuple[str, ...]:
    """What two runs must share to have run the same command: the script's file name (not its
    directory: checkouts and CI workspaces differ) or `-m` and the module, and every argument."""
    try:
        words = shlex.split(command)        # recorded shell-quoted (a path with spaces is one word)
    except ValueError:                      # an unbalanced quote in a hand-edited report
        words = command.split()
    if words and words[0] != "-m":
        words[0] = posixpath.basename(words[0]) or words[0]
    return tuple(words)


def same_command(a: RunData, b: RunData) -> bool:
    """Both runs recorded their command and it is the same (command_key): then step n of one runs
    the same code path as step n of the other, and with a seeded data order the same work, so
    compare and gate pair their step times by step number (stats.speedups.speedup's `by_step`).
    Unknown or different commands (train.py vs train_amp.py) are not paired."""
    return a.command is not None and b.command is not None and command_key(a.command) == command_key(b.command)


def command_warning(bases: list[RunData], cur: RunData,
                    sides: tuple[str, str] = ("baseline", "current")) -> tuple[bool | None, str | None]:
    """(differ, line): whether a baseline ran another command than the current run (None when the
    current's or every baseline's command is unknown), and the one line every output prints when
    one did: 'the runs ran different commands: baseline `python -m dcgan --niter 4` vs current
    `python hf_trainer.py 100`'. Different commands can be meant (train.py vs train_amp.py), so it
    is said, never refused. The line holds the commands as recorded: renderers sanitise it."""
    known = [b.command for b in bases if b.command is not None]
    if cur.command is None or not known:
        return None, None
    other = list(dict.fromkeys(c for c in known if command_key(c) != command_key(cur.command)))
    if not other:
        return False, None
    label = sides[0] + ("s" if len(other) > 1 else "")
    return True, (f"the runs ran different commands: {label} " + ", ".join(f"`python {c}`" for c in other)
                  + f" vs {sides[1]} `python {cur.command}`")


def other_load_of(m: dict) -> tuple[float | None, int | None]:
    """Cores used by processes other than the trainer and its loader workers during a run (as its
    report measured them: analyze/system.other_cores), and the machine's cores."""
    from perfdoctor.analyze.system import other_cores

    cores = m.get("machine.cpu_count")
    other = m.get("system.other_cores")          # as the run measured it (sibling ranks left out)
    return (other if other is not None else other_cores(m)), (int(cores) if cores else cores)


def busy_texts(runs: list[tuple[str, "RunData"]], max_other_load: float | None = None) -> list[str]:
    """'before: 0.9 of 2 cores' for each (label, run) whose other processes used more of the machine
    than max_other_load of its cores (analyze/system.shared_by_others; None: its SHARED_SHARE, gate's
    default): gate calls their step times inconclusive, compare says so beside its numbers."""
    from perfdoctor.analyze.system import SHARED_SHARE, shared_by_others

    share = SHARED_SHARE if max_other_load is None else max_other_load
    return [f"{label}: {load:.1f} of {cores or '?'} cores" for label, r in runs
            for load, cores in [other_load_of(r.metrics)] if shared_by_others(load, cores, share)]


QUEUED = 0.10          # the training thread queued for a CPU this share of its steps' time (PD214's threshold)
NEIGHBOUR_CORES = 0.25  # ... while other processes used at least this many cores: the wait is the machine's


def queued_texts(runs: list[tuple[str, "RunData"]]) -> list[str]:
    """'before: its training thread waited for a CPU 16% of its steps' time while other processes
    used 0.46 of 2 cores' for each run slowed by a neighbour below busy_texts' threshold (a user
    trial: a neighbour's half core made the before run 1.6x slower than the script alone, and
    compare called channels_last's 1.3x a 2.3x change, "beyond noise")."""
    out = []
    for label, r in runs:
        q, (other, cores) = r.metrics.get("run.runq_share"), other_load_of(r.metrics)
        if isinstance(q, (int, float)) and q >= QUEUED and other is not None and other >= NEIGHBOUR_CORES:
            out.append(f"{label}: its training thread waited for a CPU {100 * q:.0f}% of its steps' time while "
                       f"other processes used {other:.2f} of {cores or '?'} cores (PD214)")
    return out


BOUND_WORDS = {"input": "input-bound", "input_cpu": "input-bound (CPU)", "input_io": "input-bound (IO)",
               "host": "host-bound", "device": "device-bound", "communication": "communication-bound",
               "inconclusive": "inconclusive"}


def bound_words(run: RunData) -> str:
    """The run's verdict in words; a CPU-only run's device is the CPU (compute-bound)."""
    v = run.verdict
    if v == "device" and run.metrics.get("trace.platform") == "cpu":
        return "compute-bound (CPU)"
    return BOUND_WORDS.get(v, str(v))
