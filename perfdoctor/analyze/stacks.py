"""Python stacks -> where the steady steps' wall time goes, by frame and by cause.

Input: the chrometrace events py-spy recorded (collect/stacks.py: begin/end events of Python
frames, microseconds from py-spy's start; with --idle every thread is sampled, blocked or not)
and the step records of steps.jsonl. Output: registered `stacks.*` metrics and the top frames.

Steady steps: the final step mode's records after the warm-up (the first max(2, 10%)), without
the profiled and perturbed steps. Long steps stay in: a checkpoint every 100 steps is exactly
such a step. A sample counts where it falls inside a steady step (Unix time t0 + ts).

Every share is a fraction of the sampled steady step time on the trainer's main thread (the
thread that runs the script; py-spy's time base makes sampled ~ wall time), by the cause
analyze/stackcause.py gives each stack. A top frame is (the library function the user's line
called, that line): `torch.save` at `train.py:27`; the user's line alone when its own code is
the leaf; with the cause most of its samples have. Workers (processes running
DataLoader's _worker_loop) get their own top frames: the mean share of their wall time.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field

import numpy as np

from perfdoctor.analyze.arrays import median, unique
from perfdoctor.analyze.callsite import settle_all
from perfdoctor.analyze.gilwait import busy, own_thread
from perfdoctor.analyze.recurrence import recurrent_lines
from perfdoctor.analyze.stackcause import (CAUSES, after_forward, before_forward, classify, forward_lines, results_work,
                                           user_code)
from perfdoctor.analyze.stackmarks import MARKS, Marks

MIN_STEADY_STEPS = 3
MIN_SAMPLED_S = 0.5         # less sampled steady time than this: no shares
TOP = 8                     # trainer frames listed
TOP_WORKER = 4
MIN_TOP_SHARE = 0.01
UNREAD_NOTE = 0.10          # a note when py-spy failed to read this share of its samples or more
# calls of the model a step from which the Python between them may feed the next call (PD352's
# and PD365's rollouts: a REINFORCE loop stepping its environment on `a.numpy()` after each of 16
# policy calls read "log every N steps ~1.56x" as a metric of the step's results)
FEED_CALLS = 8


@dataclass
class StackReport:
    metrics: dict
    top: list[dict] = field(default_factory=list)
    steady_steps: int = 0
    sampled_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def empty_metrics() -> dict:
    return {"stacks.steady_steps": None, "stacks.coverage": None, "stacks.checkpoint_share": None,
            "stacks.checkpoint_interval_steps": None, "stacks.logging_sync_share": None, "stacks.unread_share": None,
            "stacks.python_data_share": None, "stacks.pre_forward_data_share": None, "stacks.evaluation_share": None,
            "stacks.producer_wait_share": None, "stacks.waiting_share": None, "stacks.gc_collect_share": None,
            "stacks.producer_wait_exposed_share": None, "stacks.waiting_exposed_share": None,
            "stacks.own_threads_busy_share": None, "stacks.recurrent_loop_share": None,
            **dict.fromkeys(MARKS)}


def exposed_waits(m: dict) -> dict:
    """The training thread's waits the step cannot hide, from the stacks' waits and the trace's
    device idle time: on a device the trainer may wait (on its producers, on its own line) while
    the device runs the work it queued, so only the wait the device spends idle is on the step's
    path, at most gpu.idle_share; on a CPU, or without a device timeline, the whole wait. One
    place for the line PD369, PD370, PD371 and the verdict's confidence draw alike."""
    idle = m.get("gpu.idle_share")

    def exposed(wait):
        if not isinstance(wait, (int, float)):
            return None
        return min(float(wait), float(idle)) if isinstance(idle, (int, float)) else float(wait)
    return {"stacks.producer_wait_exposed_share": exposed(m.get("stacks.producer_wait_share")),
            "stacks.waiting_exposed_share": exposed(m.get("stacks.waiting_share"))}


def segments(events: list[dict]) -> dict[tuple, list[tuple[int, int, tuple]]]:
    """Chrometrace B/E events -> {(pid, tid): [(start_us, end_us, stack root-first), ...]}."""
    stacks: dict[tuple, list] = {}
    since: dict[tuple, int] = {}
    out: dict[tuple, list] = {}
    for e in events:
        ph = e.get("ph")
        if ph not in ("B", "E"):
            continue
        key = (e.get("pid"), e.get("tid"))
        ts = int(e.get("ts", 0))
        cur = stacks.setdefault(key, [])
        t0 = since.get(key)
        if t0 is not None and ts > t0 and cur:
            out.setdefault(key, []).append((t0, ts, tuple(cur)))
        since[key] = ts
        if ph == "B":
            a = e.get("args") or {}
            cur.append((e.get("name", "?"), a.get("filename") or "", int(a.get("line") or 0)))
        elif cur:
            cur.pop()
    return out


def steady_steps(steps: list[dict]) -> list[dict]:
    if not steps:
        return []
    mode = steps[-1].get("mode")
    recs = [s for s in steps if s.get("mode") == mode]
    warm = max(2, int(np.ceil(0.1 * len(recs))))
    return [s for s in recs[warm:] if not s.get("profiled") and not s.get("perturbed") and s.get("dur", 0) > 0]


class _Windows:
    """Disjoint steady-step intervals (Unix s); overlap(a, b) = steady time inside [a, b)."""

    def __init__(self, steps: list[dict]):
        iv = sorted((s["end"] - s["dur"], s["end"]) for s in steps)
        self.lo = np.array([a for a, _ in iv])
        self.hi = np.array([b for _, b in iv])
        self.cum = np.concatenate([[0.0], np.cumsum(self.hi - self.lo)])

    def before(self, t: np.ndarray) -> np.ndarray:
        n = len(self.lo)
        i = np.searchsorted(self.hi, t, side="right")        # intervals ending at or before t
        j = np.minimum(i, n - 1)
        part = np.where(i < n, np.clip(t - self.lo[j], 0.0, self.hi[j] - self.lo[j]), 0.0)
        return self.cum[i] + part

    def overlap(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.before(b) - self.before(a)


def _main_thread(segs: dict, pid) -> tuple | None:
    """The thread that runs the script: not started by threading (bottom frame), most time."""
    best, best_t = None, -1
    for key, ss in segs.items():
        if key[0] != pid:
            continue
        bottom = next((f for f in ss[0][2] if f[1]), ("", "", 0))
        if bottom[0].endswith("_bootstrap") and bottom[1].endswith("threading.py"):
            continue
        t = sum(b - a for a, b, _ in ss)
        if t > best_t:
            best, best_t = key, t
    return best


def _unread(proc: dict, segs: dict) -> float | None:
    """Samples py-spy failed to read / samples taken, from its own tally of the process (samples
    count one stack per thread: divided by the threads it recorded). None without the tally."""
    samples, errors = proc.get("samples"), proc.get("errors")
    if samples is None or errors is None:
        return None
    threads = max(1, sum(1 for key in segs if key[0] == proc["pid"]))
    taken = samples / threads + errors
    return float(errors / taken) if taken > 0 else None


def _add_save(saves: list[list[float]], sa: float, sb: float, ends: np.ndarray, period: float, win: _Windows) -> None:
    """Add a segment of checkpoint samples to the save episodes (see _save_interval).

    One save = consecutive checkpoint samples inside one step: the training thread records the
    step ends itself, so no save spans one, and a save every step is told from one long save even
    when the sampler saw no other frame between them (a 66 ms save in a 76 ms step, sampled every
    20 ms: one segment can run past a step end). A segment of one stack holds a sample every
    period from its start. Two things bend py-spy's clock against the steps': its time origin is
    taken when it starts (a few ms after perfdoctor's), so a save's first sample can fall just
    before the step end it follows; and under heavy IO it lags, so a save's last frame can persist
    for ~100-200 ms past the end of the save (an H200 run writing 500 MB: one segment over 5 step
    ends of 7 ms steps). So a lone sample before a step end joins the save right after it, and a
    segment over two step ends or more is one save (steps are not that short beside a save)."""
    instants = sa + period * np.arange(max(1, int(round((sb - sa) / period))))
    step = np.searchsorted(ends, instants, side="right")
    stale = int(step[-1]) - int(step[0]) >= 2
    for s in (step[:1] if stale else unique(step)):
        at = instants if stale else instants[step == s]
        pa, pb = float(at[0]), min(float(at[-1]) + period, sb)
        ov = float(win.overlap(np.array([pa]), np.array([pb]))[0])
        last = saves[-1] if saves else None
        adjacent = last is not None and pa - last[0] <= 2.5 * period
        if adjacent and (last[4] == s or stale):
            last[0], last[1], last[2] = pb, last[1] + pb - pa, last[2] + ov
        elif adjacent and last[1] <= period * 1.01 and pa - last[0] <= 0.5 * period:
            last[0], last[1], last[2], last[4] = pb, last[1] + pb - pa, last[2] + ov, int(s)    # a lone head
        else:
            saves.append([pb, pb - pa, ov, pa, int(s)])


def _save_interval(saves: list[list[float]], win: _Windows, covered: float, span: float) -> float | None:
    """Steady steps per checkpoint save.

    With three or more saves seen: the median time between consecutive saves, counted in steady
    time only (steps excluded from the window do not stretch a gap), over the mean steady step
    (wall time / steps). A save that py-spy missed entirely (the sampler not scheduled for longer
    than the save: seen on a loaded machine) doubles one gap and leaves the median alone, where
    counting saves would overstate the interval. With fewer saves: the steady steps over the saves
    seen (a save cut by the window counts by its part)."""
    seen = [s for s in saves if s[2] > 0 and s[1] > 0]
    if len(seen) >= 3 and covered > 0:
        at = win.before(np.array(sorted(s[3] for s in seen)))
        return float(median(np.diff(at)) / (span / covered))
    n_saves = sum(ov / d for _, d, ov, _, _ in seen)
    return covered / n_saves if n_saves > 0.5 else None


def attribute(procs: list[dict], meta: dict, steps: list[dict], source=linecache.getline,
              model_calls: float | None = None) -> StackReport:
    """The steady steps' stacks -> stacks.* metrics and the top frames (see the module docstring).

    procs: one recording per process, {'pid', 'role' (trainer | child), 't0_unix', 'events'}.
    model_calls: the outermost module's calls a step (loop.model_calls_per_step), where the run
    counted them: from FEED_CALLS on, the Python after one call may make the next one's input (an
    environment stepped between a rollout's policy calls), so none of it is read as a metric."""
    m = empty_metrics()
    rep = StackReport(m)
    steady = steady_steps(steps)
    main = next((p for p in procs if p.get("role") == "trainer" or p.get("pid") == meta.get("pid")), None)
    segs = segments(main["events"]) if main else {}
    trainer = _main_thread(segs, main["pid"]) if main else None
    if trainer is None or "t0_unix" not in main:
        ends = [float(s["end"]) for s in steps if isinstance(s.get("end"), (int, float))]
        late = ends[-1] - float(main["t0_unix"]) if main and isinstance(main.get("t0_unix"), (int, float)) and ends else None
        when = (None if late is None or late >= 2.0 else "as the steps ended" if late < 0.05 else
                f"{late:.1f} s before the last step ended")
        rep.notes.append("py-spy recorded no stacks of the training thread" + (
            f": it started sampling {when} (it waits for the first steps): too short a run to name frames"
            if when else ""))
        return rep
    win = _Windows(steady) if steady else None
    segs[trainer] = settle_all(segs[trainer])     # call sites py-spy read after the call returned (callsite.py)

    def tally(ss, t0):
        a = float(t0) + np.array([s[0] for s in ss]) / 1e6
        b = float(t0) + np.array([s[1] for s in ss]) / 1e6
        return a, b, win.overlap(a, b)

    if win is None:
        rep.notes.append("no steady steps to attribute stacks to")
        return rep
    a, b, w = tally(segs[trainer], main["t0_unix"])
    sampled = float(w.sum())
    # steady steps inside the recording (a step cut by its start or end counts by its fraction)
    frac = np.clip((np.minimum(win.hi, b.max()) - np.maximum(win.lo, a.min())) / (win.hi - win.lo), 0.0, 1.0)
    covered, span = float(frac.sum()), float(((win.hi - win.lo) * frac).sum())
    rep.steady_steps, rep.sampled_s = int(round(covered)), sampled
    if covered < MIN_STEADY_STEPS or sampled < MIN_SAMPLED_S:
        rep.notes.append(f"py-spy sampled {sampled:.1f} s of {covered:.0f} steady step(s): too few to attribute "
                         "the step time to Python frames")
        return rep
    causes: dict[str, float] = dict.fromkeys(CAUSES, 0.0)
    frames: dict[tuple, list] = {}
    memo: dict[tuple, tuple] = {}
    saves: list[list[float]] = []       # checkpoint episodes: [end, duration, steady overlap, start, step]
    period = 1.0 / float(meta.get("rate_hz") or 100)
    ends = np.sort(np.array([float(s["end"]) for s in steps if "end" in s]))
    marks = Marks()                     # time in frames a switch removes (analyze/stackmarks.py)
    recurring, looped = 0.0, {}         # time on lines of a loop that carries a value (analyze/recurrence.py)
    # where each of the user's functions first calls the forward pass, for results_work
    first_forward: dict[tuple[str, str], int] = {}
    for (_, _, stack), wt in zip(segs[trainer], w):
        c = memo.get(stack) or memo.setdefault(stack, classify(stack, source))
        if wt > 0 and c[0] == "model":
            for file, func, line in forward_lines(stack):
                first_forward[(file, func)] = min(line, first_forward.get((file, func), line))
    feeds = model_calls is not None and model_calls >= FEED_CALLS
    for stack, c in memo.items():
        if not feeds and c[0] == "python_data" and results_work(stack, first_forward, source):
            memo[stack] = ("step_results", *c[1:])
        elif not feeds and c[0] in ("python_data", "other") and after_forward(stack, first_forward, source):
            memo[stack] = ("loss", *c[1:])
    # the batch made before the forward (not in a rollout, whose next input needs the last output)
    making = {stack for stack, c in memo.items()
              if not feeds and c[0] == "python_data" and before_forward(stack, first_forward, source)}
    pre_forward = 0.0
    for (_, _, stack), sa, sb, wt in zip(segs[trainer], a, b, w):
        c = memo[stack]
        if wt > 0:
            marks.add(stack, wt)
        if c[0] == "checkpoint":
            _add_save(saves, sa, sb, ends, period, win)
        if wt <= 0:
            continue
        causes[c[0]] += wt
        pre_forward += wt if stack in making else 0.0
        if c[0] in ("model", "loss", "python_data"):      # the forward pass and the loop's own tensor work
            if stack not in looped:
                looped[stack] = any(line in recurrent_lines(file) for file, _, line in forward_lines(stack))
            recurring += wt if looped[stack] else 0.0
        _tally_row(frames, c, stack, wt, source)
    interval = _save_interval(saves, win, covered, span)
    share = {k: v / sampled for k, v in causes.items()}
    own = causes["model"] + causes["loss"] + causes["python_data"]     # the loop's tensor work, for recurrence
    unread = _unread(main, segs)
    if unread is not None and unread >= UNREAD_NOTE:
        rep.notes.append(f"py-spy could not read {unread:.0%} of its samples of the trainer (stacks changing under a "
                         f"non-blocking read, or a busy machine): each share below may be off by that much")
    m.update({"stacks.steady_steps": rep.steady_steps, "stacks.coverage": min(1.0, sampled / span) if span else None,
              "stacks.unread_share": unread,
              "stacks.checkpoint_share": float(share["checkpoint"]),
              # an `if step % N` body is a log line's work (with N = 1 it runs every step), and a
              # metric of the step's results read every step is what logging every N steps removes
              "stacks.logging_sync_share": float(share["logging_sync"] + share["periodic"] + share["step_results"]),
              "stacks.python_data_share": float(share["python_data"]),
              "stacks.pre_forward_data_share": pre_forward / sampled,
              "stacks.evaluation_share": float(share["evaluation"]),
              "stacks.producer_wait_share": float(share["producer_wait"]),
              "stacks.waiting_share": float(share["waiting"]),
              "stacks.gc_collect_share": float(share["garbage_collection"]),
              "stacks.checkpoint_interval_steps": interval,
              **marks.shares(sampled),
              "stacks.recurrent_loop_share": recurring / own if own > 0 else None,
              "stacks.own_threads_busy_share": _own_threads_busy(segs, trainer, main["t0_unix"], win, sampled, source)})
    rep.top = _top(frames, sampled, "trainer", TOP)
    rep.top += _workers([p for p in procs if p is not main], tally, source)
    return rep


def _own_threads_busy(segs: dict, trainer: tuple, t0: float, win: _Windows, sampled: float, source) -> float:
    """The share of the sampled steady time in which one of the trainer process's other threads
    (the user's: analyze/gilwait.own_thread) runs a stack that is not blocked: the union of
    their busy segments, inside the steady steps (analyze/gilwait.py)."""
    memo: dict[tuple, bool] = {}
    spans = []
    for key, ss in segs.items():
        if key[0] != trainer[0] or key == trainer or not own_thread(ss[0][2]):
            continue
        for sa, sb, stack in ss:
            ok = memo.get(stack)
            if ok is None:
                ok = memo[stack] = busy(stack, source)
            if ok:
                spans.append((float(t0) + sa / 1e6, float(t0) + sb / 1e6))
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    if not merged or sampled <= 0:
        return 0.0
    lo, hi = np.array([a for a, _ in merged]), np.array([b for _, b in merged])
    return float(min(1.0, win.overlap(lo, hi).sum() / sampled))


def _tally_row(frames: dict, c: tuple, stack: tuple, wt: float, source=linecache.getline) -> None:
    """Add a sample's weight to its row (the frame called from the user's line, and that line),
    and to the row's tally by cause: the stacks under one line can differ in cause (a
    trainer.train() line holds forward, backward and the optimizer). A new row reads the user
    line's text (shown beside it: 't_item.py:13' alone had to be looked up)."""
    entry = frames.get((c[1], c[2]))
    if entry is None:
        entry = frames[(c[1], c[2])] = [0.0, {}, stack[-1], user_code(stack, source) if c[2] else None]
    entry[0] += wt
    entry[1][c[0]] = entry[1].get(c[0], 0.0) + wt


def _top(frames: dict, total: float, role: str, n: int) -> list[dict]:
    """The rows, largest first; each with its main cause and that cause's share of the row."""
    rows = sorted(frames.items(), key=lambda kv: -kv[1][0])
    out = []
    for (called, at), (t, by_cause, leaf, code) in rows[:n]:
        if t / total < MIN_TOP_SHARE:
            break
        cause = max(by_cause, key=by_cause.get)
        out.append({"frame": called, "at": at, "share": float(t / total), "role": role, "cause": cause,
                    "cause_share": round(float(by_cause[cause] / t), 4) if t > 0 else None,
                    "leaf": f"{leaf[0]} ({leaf[1]}:{leaf[2]})", "code": code})
    return out


def _workers(procs: list[dict], tally, source) -> list[dict]:
    """Top frames of the loader workers' main threads (processes running DataLoader's
    _worker_loop): mean share of their sampled steady time."""
    frames: dict[tuple, list] = {}
    memo: dict[tuple, tuple] = {}
    total = 0.0
    for proc in procs:
        for ss in segments(proc["events"]).values():
            if not any("_worker_loop" in f[0] for _, _, st in ss[:50] for f in st):
                continue
            _, _, w = tally(ss, proc["t0_unix"])
            total += float(w.sum())
            for (_, _, stack), wt in zip(ss, w):
                if wt > 0:
                    c = memo.get(stack) or memo.setdefault(stack, classify(stack, source))
                    _tally_row(frames, c, stack, wt, source)
    return _top(frames, total, "worker", TOP_WORKER) if total > 0 else []


def section(rep: StackReport, meta: dict) -> dict:
    """The report's `stacks` section: top frames with their shares, and what they cover."""
    top = [{**t, "share": round(float(t["share"]), 4)} for t in rep.top]
    return {"top": top, "steady_steps": rep.steady_steps, "sampled_s": round(rep.sampled_s, 3),
            "rate_hz": meta.get("rate_hz"), "notes": list(rep.notes)}
