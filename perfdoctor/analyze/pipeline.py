"""analyze(table) -> TraceAnalysis: every registered metric for one trace, plus details."""

from __future__ import annotations

import re

from dataclasses import dataclass, field

import numpy as np

from perfdoctor.analyze import registry
from perfdoctor.analyze.arrays import median, percentile, unique
from perfdoctor.analyze.allocator import allocator_metrics, allocator_segments
from perfdoctor.analyze.anomaly import anomaly_metrics
from perfdoctor.analyze.embeddinggrads import embedding_grad_metrics
from perfdoctor.analyze.gathers import gather_metrics
from perfdoctor.analyze.attention import attention_metrics
from perfdoctor.analyze.comm import comm_metrics
from perfdoctor.analyze.compiletime import compile_metrics
from perfdoctor.analyze.cpuops import compute_share, cpu_op_metrics
from perfdoctor.analyze.device import device_metrics
from perfdoctor.analyze.evalforward import nograd_forward_metrics
from perfdoctor.analyze.gaps import TOP_GAPS, Gap, idle_gaps
from perfdoctor.analyze.host import host_metrics
from perfdoctor.analyze.kinds import Kinds, classify
from perfdoctor.analyze.loaderkinds import iterable_replayed, traced_dataset_kind
from perfdoctor.analyze.loaderops import loader_op_metrics
from perfdoctor.analyze.memory import memory_metrics
from perfdoctor.analyze.patterns import pattern_metrics
from perfdoctor.analyze.fusion import fusion_metrics
from perfdoctor.analyze.archnames import capability_floor
from perfdoctor.analyze.devicetime import TENSOR_CORE_CLASSES
from perfdoctor.analyze.launches import clock_check, clock_warning
from perfdoctor.analyze.precision import kernel_class, peak_ratios, precision_metrics, tensor_cores
from perfdoctor.analyze.recompute import recompute_metrics
from perfdoctor.analyze.replicas import critical_device, replica_metrics, replica_shares, replica_step_device_ms
from perfdoctor.analyze.sampleloop import sample_loop_metrics
from perfdoctor.analyze.tensorloops import tensor_loop_metrics
from perfdoctor.analyze.steps import Steps, find_steps
from perfdoctor.analyze.stepview import step_view
from perfdoctor.analyze.tables import detail_tables
from perfdoctor.analyze.threads import thread_metrics
from perfdoctor.analyze.timeline import BREAKDOWN, Timeline, breakdown_matrix, build_timeline
from perfdoctor.errors import TraceFormatError
from perfdoctor.trace.table import EventTable

CUT_NOTE = "`perfdoctor run` stopped this trace inside its last step"   # the run's own note says it (live.py)

MARKED_GAPS = 200      # idle gaps kept for the annotated trace (longest first)


@dataclass
class TraceAnalysis:
    path: str
    metrics: dict
    steps: Steps
    step_breakdown_ms: np.ndarray          # (steps, 8) in BREAKDOWN order
    gaps: list[Gap] = field(default_factory=list)
    memory_series: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tables: dict = field(default_factory=dict)   # kernels, ops, annotations, launches, collectives (tables.py)
    view: dict | None = None                      # the representative step as lanes (stepview.py)
    marked_gaps: list[Gap] = field(default_factory=list)  # longest non-kernel-wait gaps, for --annotate
    step_device_ms: np.ndarray | None = None      # DataParallel: per step, the mean device's busy ms (replicas.py)

    @property
    def rank(self):
        return self.metrics.get("trace.rank")


def analyze(t: EventTable) -> TraceAnalysis:
    k = classify(t)
    steps = find_steps(t, k)
    if len(steps) == 0 and steps.cut_off:
        return _cut_off(t, k, steps)
    if len(steps) == 0 or float(steps.duration.sum()) <= 0:
        why = steps.notes[0] if steps.notes and steps.notes[0].startswith("nothing to analyse") else \
            "no timed (complete 'X') events to analyse"
        raise TraceFormatError(f"{t.meta.path}: {why}")
    tl = build_timeline(t, k, steps)
    bm = breakdown_matrix(tl, len(steps))
    total = float(steps.duration.sum())
    m: dict = dict.fromkeys(registry.names())
    m.update(_trace_metrics(t, k))
    early = clock_check(t, k)
    m["trace.clock_early_share"] = early[0]
    m.update(_step_metrics(steps))
    m.update({f"breakdown.{r}": float(v) / total for r, v in zip(BREAKDOWN, bm.sum(axis=0))})
    m["untraced.unnamed_share"] = m["breakdown.other"]     # a live run names part of it (callshares.combined)
    m.update(_input_metrics(t, k, tl, total))
    m["input.dataset_kind"] = traced_dataset_kind(t)      # a live run's own reading replaces it
    m["input.iterable_replayed"] = iterable_replayed(m)    # False for a map-style one, else unknown here
    m.update(loader_op_metrics(t, k, steps))
    m.update(comm_metrics(t, k, steps, tl, total))
    gaps, series, marked = [], {}, []
    if k.platform != "cpu":
        m.update(device_metrics(t, k, steps))
        gap_metrics, marked = idle_gaps(t, k, steps, tl, top=MARKED_GAPS)
        gaps = marked[:TOP_GAPS]
        marked = [g for g in marked if g.kind != "kernel_wait"]
        m.update(gap_metrics)
        m.update(host_metrics(t, k, steps, tl, claimed=allocator_segments(t, k, steps, tl)))
        m.update(allocator_metrics(t, k, steps, tl))
        m.update(replica_metrics(t, k, steps))
    m.update(pattern_metrics(t, k, steps))
    on, on_share = critical_device(t, k, m)      # DataParallel: the busiest replica alone
    attention, math_path = attention_metrics(t, k, steps, on, None if m["trace.capability_from_kernels"]
                                             else peak_ratios(m["trace.compute_capability"], m["trace.device_name"]))
    m.update(attention)
    m.update(verdict_shares(m))
    crit = m["share.device"] if on is None else on_share
    m.update(precision_metrics(t, k, steps, m["trace.compute_capability"], crit, on, m["trace.device_name"],
                               ratios_known=not m["trace.capability_from_kernels"], math_path=math_path)
             if k.platform == "cuda" else {})
    m.update(fusion_metrics(t, k, steps, crit, on) if k.platform in ("cuda", "rocm", "cpu") else {})
    m.update(recompute_metrics(t, k, steps, crit, on))
    m.update(replica_shares(m))     # share.device becomes the mean replica's; the weightings above use the busiest
    m.update(compile_metrics(t, k, steps))
    m.update(thread_metrics(t, k, steps))
    m.update(cpu_op_metrics(t, k, steps))
    m.update(compute_share(m))
    m.update(nograd_forward_metrics(t, k, steps))
    m["evaluation.share"] = m["evaluation.nograd_forward_share"]    # a run adds its own measures (callshares)
    m.update(sample_loop_metrics(t, k, steps))
    m.update(tensor_loop_metrics(t, k, steps))
    m.update(anomaly_metrics(t, k, steps))
    m.update(embedding_grad_metrics(t, k, steps))
    m.update(gather_metrics(t, k, steps))
    mem, series = memory_metrics(t, k, steps)
    if k.platform == "cpu":  # CPU [memory] events carry no device allocator information
        mem = {key: v for key, v in mem.items() if key == "memory.events"}
    m.update(mem)
    registry.check(m)
    notes = list(t.meta.notes) + list(steps.notes)
    if t.meta.cut_s is not None:
        notes.append(f"{CUT_NOTE}, {t.meta.cut_s:.1f} s after recording "
                     "began (the profiler's memory budget): that step is cut short, so its shares hold and its length "
                     "does not")
    return TraceAnalysis(path=t.meta.path, metrics=m, steps=steps, step_breakdown_ms=bm / 1e3,
                         gaps=gaps, memory_series=series if k.platform != "cpu" else {},
                         notes=notes, warnings=list(t.meta.warnings) + [w for w in (clock_warning(*early),) if w],
                         tables=detail_tables(t, k, steps, m["trace.world_size"]),
                         view=step_view(steps, tl, k.platform, m["trace.devices_used"]), marked_gaps=marked,
                         step_device_ms=replica_step_device_ms(k, m))


def _cut_off(t: EventTable, k: Kinds, steps: Steps) -> TraceAnalysis:
    """A truncated file cut off before any step was complete: no step metric (0 steps, the rest
    unknown), so the verdict is inconclusive (PD100) rather than one read from part of a step."""
    m: dict = dict.fromkeys(registry.names())
    m.update(_trace_metrics(t, k))
    m.update({"steps.count": 0, "steps.source": steps.source})
    registry.check(m)
    return TraceAnalysis(path=t.meta.path, metrics=m, steps=None, step_breakdown_ms=None,
                         notes=list(steps.notes), warnings=list(t.meta.warnings))


def _trace_metrics(t: EventTable, k: Kinds) -> dict:
    dev = _device_of_the_kernels(t, k) if k.platform != "cpu" else {}
    cc = _compute_capability(dev) if k.platform == "cuda" else None
    name = dev.get("name") if isinstance(dev.get("name"), str) else None
    cores, floor = tensor_cores(cc, name), None
    if k.platform == "cuda" and cc is None:     # no GPU named: what its kernels were built for
        kernels = [t.names[c] for c in unique(t.name[k.kernel])]
        cc = floor = capability_floor(kernels)
        # a floor of 7.x may be a Turing part without tensor cores: only its kernels can say
        cores = True if any(kernel_class(n) in TENSOR_CORE_CLASSES for n in kernels) else None
    info = t.meta.distributed_info
    return {"trace.events": len(t), "trace.platform": k.platform,
            "trace.device_name": name, "trace.compute_capability": cc,
            "trace.capability_from_kernels": (floor is not None) if k.platform == "cuda" else None,
            "trace.tensor_cores": cores,
            "trace.untraced_device": _untraced_device(t, k),
            "trace.device_memory_bytes": dev.get("totalGlobalMem"),
            "trace.rank": t.meta.rank,
            "trace.world_size": info.get("world_size") if isinstance(info.get("world_size"), int) else None,
            "trace.truncated": t.meta.truncated, "trace.cut_s": t.meta.cut_s, "trace.windows": t.meta.windows,
            "trace.profiler_options": _profiler_options(t, k)}


def _profiler_options(t: EventTable, k: Kinds) -> str | None:
    """The profiler options that add work to every op, as the trace shows them: its ops' input
    types (record_shapes), Python frames (with_stack), allocator events (profile_memory)."""
    on = [name for name, seen in (("record_shapes", t.meta.input_shapes),
                                  ("with_stack", bool(t.cat_mask("python_function").any())),
                                  ("profile_memory", bool(k.memory.any()))) if seen]
    return ", ".join(on) or None


def _device_of_the_kernels(t: EventTable, k: Kinds) -> dict:
    """The deviceProperties entry of the device that ran the most kernel time: a machine's GPUs
    are all listed, and the first need not be the one trained on (a workstation's display GPU
    beside its compute GPU); the first entry when the kernels name no listed device."""
    props = t.meta.device_properties
    if not props:
        return {}
    kr = np.flatnonzero(k.kernel)
    ids = t.args["device"][kr]
    known = ~np.isnan(ids)
    if known.any():
        found = unique(ids[known])
        busy = [float(t.dur[kr[known][ids[known] == d]].sum()) for d in found]
        top = int(found[int(np.argmax(busy))])
        for p in props:
            if p.get("id") == top and not isinstance(p.get("id"), bool):
                return p
    return props[0]


def _compute_capability(dev: dict) -> float | None:
    """major.minor from deviceProperties; None unless both are small non-negative integers (a
    missing minor reads 0): a file may hold anything there."""
    major, minor = dev.get("computeMajor"), dev.get("computeMinor", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 for v in (major, minor)):
        return None
    return float(f"{major}.{minor}")


GPU_LABEL = re.compile(r"GPU \d{1,3}")


def _untraced_device(t: EventTable, k: Kinds) -> str | None:
    """The device the trace lists (deviceProperties) when it holds no device activity and no
    runtime call at all: recorded without the device's activity (torch.profiler without
    ProfilerActivity.CUDA), so whether its ops ran on that device is unknown. A script trained on
    the CPU of a GPU machine and profiled with both activities has the profiler's own runtime
    calls (its device sync as it stops), so it is not this."""
    props = t.meta.device_properties
    if k.platform != "cpu" or k.runtime.any() or k.device_activity.any():
        return None
    if props:
        return str(props[0].get("name") or "a device")
    # an older torch writes no deviceProperties, but a process label for each GPU it found
    # ("GPU 0" ... "GPU 7" beside the host's "CPU"), whatever activities it recorded
    gpus = sorted({int(lab[4:]) for lab in t.str_args.get("labels", {}).values()
                   if isinstance(lab, str) and GPU_LABEL.fullmatch(lab)})
    if not gpus:
        return None
    return f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPU {gpus[0]}-{gpus[-1]}"


def verdict_shares(m: dict) -> dict:
    """The four competing shares of the step; the verdict rules compare them."""
    b = {r: m[f"breakdown.{r}"] or 0.0 for r in BREAKDOWN}
    if m["trace.platform"] == "cpu":
        device, host = b["cpu_exec"] + b["kernel"], b["runtime"] + b["other"]
    else:
        device, host = b["kernel"] + b["memcpy"] + b["memset"], b["runtime"] + b["cpu_exec"] + b["other"]
    return {"share.device": device, "share.input": b["data_loading"], "share.host": host,
            "share.communication": b["communication"]}


def _step_metrics(steps: Steps) -> dict:
    d = steps.duration / 1e3
    return {"steps.count": len(steps), "steps.source": steps.source,
            "steps.time_mean_ms": float(d.mean()), "steps.time_median_ms": median(d),
            "steps.time_p90_ms": percentile(d, 90), "steps.time_min_ms": float(d.min()),
            "steps.time_max_ms": float(d.max()),
            "steps.time_cv": float(d.std() / d.mean()) if d.mean() > 0 else 0.0}


def _input_metrics(t: EventTable, k: Kinds, tl: Timeline, total: float) -> dict:
    loader_names = {t.names[c] for c in unique(t.name[k.dataloader])}
    if any("_SingleProcessDataLoaderIter" in n for n in loader_names):
        loader, nw0 = "single_process", True
    elif any("_MultiProcessingDataLoaderIter" in n for n in loader_names):
        loader, nw0 = "multi_process", False
    elif any("DataPipe" in n for n in loader_names):
        loader, nw0 = "datapipe", None
    else:
        loader, nw0 = None, None
    wait = tl.cover["data_loading"]
    wait_t = tl.total(wait)
    return {"input.data_wait_share": tl.total(tl.role == BREAKDOWN.index("data_loading")) / total,
            "input.data_wait_host_share": wait_t / total, "input.loader": loader,
            "input.num_workers_zero": nw0,
            "input.traced_op_share_of_wait": tl.total(wait & tl.cover["cpu_exec"]) / wait_t if wait_t else None}

