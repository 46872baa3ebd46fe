"""What bounds the training step, decided from the step breakdown.

Every step is device-busy time plus device-idle time, and idle time has a cause on the host:
waiting for input, host overhead (launches, Python, syncs, untraced work), or exposed
communication. So:
1. device-busy >= DEVICE_BOUND (80%): the device is the bottleneck ("device"); removing every
   other cost could gain at most 1/0.8 = 1.25x. On CPU-only runs "device" is the CPU running
   the model's ops ("compute-bound on the CPU").
2. otherwise the largest idle cause is the verdict: input, host or communication.
An input-bound verdict is split into input_cpu only when the trace itself shows the loading
work (num_workers=0 and traced ops cover most of the wait); the IO side needs system samples
(`perfdoctor run`), so trace-only input-bound runs say "input".
Confidence grows with the margin over the runner-up and falls with weak step evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEVICE_BOUND = 0.80
MIN_EVIDENCE_US = 100.0        # less analysed time than this says nothing
INPUT_CPU_TRACED_SHARE = 0.5


@dataclass
class Verdict:
    bound: str                  # input_io | input_cpu | input | host | device | communication | inconclusive
    confidence: float           # 0..1
    summary: str
    evidence: dict = field(default_factory=dict)
    secondary: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def confidence_label(self) -> str:
        return "high" if self.confidence >= 0.75 else "medium" if self.confidence >= 0.5 else "low"


def shares(m: dict) -> dict[str, float]:
    """The four competing shares of the step (they sum to 1)."""
    b = {k.split(".", 1)[1]: (v or 0.0) for k, v in m.items() if k.startswith("breakdown.")}
    if m["trace.platform"] == "cpu":
        return {"device": b["cpu_exec"] + b["kernel"], "input": b["data_loading"],
                "communication": b["communication"], "host": b["runtime"] + b["other"]}
    return {"device": b["kernel"] + b["memcpy"] + b["memset"], "input": b["data_loading"],
            "communication": b["communication"], "host": b["runtime"] + b["cpu_exec"] + b["other"]}


def decide(m: dict) -> Verdict:
    total_us = (m["steps.time_mean_ms"] or 0.0) * 1e3 * (m["steps.count"] or 0)
    if not m["steps.count"] or total_us < MIN_EVIDENCE_US:
        return Verdict("inconclusive", 0.0, "Not enough traced time to judge (less than 0.1 ms).")
    sh = shares(m)
    ev = {f"{k}_share": round(v, 4) for k, v in sh.items()}
    ev["step_time_median_ms"] = m["steps.time_median_ms"]
    cpu = m["trace.platform"] == "cpu"
    causes = {k: sh[k] for k in ("input", "host", "communication")}
    ranked = sorted(causes, key=causes.get, reverse=True)
    secondary = [c for c in ranked if causes[c] >= 0.05]
    if sh["device"] >= DEVICE_BOUND:
        conf = 0.6 + 0.4 * min(1.0, (sh["device"] - DEVICE_BOUND) / 0.1)
        v = Verdict("device", conf, _device_summary(sh, cpu), ev, secondary)
    else:
        top, runner = ranked[0], ranked[1]
        margin = (causes[top] - causes[runner]) / causes[top] if causes[top] > 0 else 0.0
        conf = 0.4 + 0.6 * min(1.0, margin / 0.5)
        bound = _input_split(m) if top == "input" else top
        v = Verdict(bound, conf, _summary(bound, sh, m, cpu), ev, [c for c in secondary if c != top])
    _weaken(v, m)
    return v


def _input_split(m: dict) -> str:
    traced = m["input.traced_op_share_of_wait"]
    if m["input.num_workers_zero"] and traced is not None and traced >= INPUT_CPU_TRACED_SHARE:
        return "input_cpu"
    return "input"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _device_summary(sh: dict, cpu: bool) -> str:
    if cpu:
        return (f"Compute-bound on the CPU: the model's ops run {_pct(sh['device'])} of each step; "
                "input, communication and overhead are small.")
    return (f"GPU-bound: the device is busy {_pct(sh['device'])} of each step; removing all other "
            f"costs could gain at most {1 / max(sh['device'], 1e-9):.2f}x, so speed up the kernels.")


def _summary(bound: str, sh: dict, m: dict, cpu: bool) -> str:
    dev = "the CPU computes" if cpu else "the device is busy"
    if bound.startswith("input"):
        how = {"input_cpu": " The loading work (transforms, collate) runs on the trainer's own CPU thread.",
               "input": " A trace alone cannot tell whether the loader waits on storage or on CPU; "
                        "`perfdoctor run` samples the workers to split IO from CPU."}[bound]
        nw = " The DataLoader runs with num_workers=0." if m["input.num_workers_zero"] else ""
        return (f"Input-bound: the trainer waits for the next batch {_pct(sh['input'])} of each step "
                f"while {'nothing else runs' if cpu else 'the device idles'}; {dev} {_pct(sh['device'])}.{nw}{how}")
    if bound == "host":
        b = {k.split('.', 1)[1]: (v or 0.0) for k, v in m.items() if k.startswith("breakdown.")}
        parts = [("runtime calls", b["runtime"]), ("traced CPU ops", b["cpu_exec"] if not cpu else 0.0),
                 ("untraced host time", b["other"])]
        detail = ", ".join(f"{n} {_pct(v)}" for n, v in sorted(parts, key=lambda x: -x[1]) if v >= 0.005)
        where = "the CPU runs untraced Python/overhead" if cpu else "the device idles while the host works"
        return f"Host-bound: {where} {_pct(sh['host'])} of each step ({detail}); {dev} {_pct(sh['device'])}."
    if bound == "communication":
        return (f"Communication-bound: collectives not hidden behind compute take {_pct(sh['communication'])} "
                f"of each step; {dev} {_pct(sh['device'])}.")
    return ""


def _weaken(v: Verdict, m: dict) -> None:
    """Lower confidence where the step evidence is thin, and say why."""
    if m["steps.source"] != "ProfilerStep":
        v.confidence = min(v.confidence, 0.5)
        v.notes.append(f"steps come from {m['steps.source']}, not ProfilerStep annotations")
    elif (m["steps.count"] or 0) < 3:
        v.confidence = min(v.confidence, 0.6)
        v.notes.append(f"only {m['steps.count']} step(s) traced; record 3 or more for a firm verdict")
    if m["trace.truncated"]:
        v.confidence = min(v.confidence, 0.6)
        v.notes.append("the trace file was truncated; the verdict uses the events before the cut")
    if (m["breakdown.other"] or 0) > 0.5:
        v.confidence = min(v.confidence, 0.4)
        v.notes.append("most of the step is untraced host time (Python outside ops, compilation, waits); "
                       "profile with Python stacks to see it")
    v.confidence = round(v.confidence, 2)
