"""Self-test of tests/tracegen.py: every format round-trips, and Truth agrees with an independent
re-reading of the generated events (which knows nothing of the generator's internals)."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import sys
import zlib

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tracegen as tg  # noqa: E402

RICH = [
    tg.StepSpec(data_wait_us=300, kernels=12, kernel_us=40, syncs=2, item_syncs=1, pageable_h2d=1,
                pinned_h2d=2, mallocs=1, frees=1, nccl_kernels=2, tensor_core_kernels=3, gemm_ops=4, memsets=1),
    tg.StepSpec(data_wait_us=50, kernels=30, kernel_us=80),          # GPU-bound: spills into the next step
    tg.StepSpec(kernels=4, gemm_ops=6, item_syncs=2, mallocs=2, frees=3, tensor_core_kernels=4),
    tg.StepSpec(data_wait_us=1200.5, kernels=8, syncs=1, nccl_kernels=3, nccl_us=900),
]
COMBOS = list(itertools.product(["kineto", "legacy2021"], ["cuda", "rocm", "cpu"], [False, True]))
GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
RT_CATS = {"cuda_runtime", "Runtime"}
SYNC_NAMES = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "hipDeviceSynchronize", "hipStreamSynchronize"}
TC_NAME = re.compile(r"h884|s884|s16816|xmma|_MI\d+x\d+x\d+")


def spec_for(fmt, device, ns, **kw):
    return tg.TraceSpec(RICH, fmt=fmt, device=device, ns_resolution=ns, memory_events=True,
                        reserved_churn=ns, rank=1 if ns else None, world_size=2, **kw)


def events(obj):
    return obj["traceEvents"] if isinstance(obj, dict) else obj


def ext_of(args):
    return args.get("External id", args.get("external id"))


def union_us(intervals):
    total, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in sorted(intervals):
        if cur_hi is None or lo > cur_hi:
            total += 0 if cur_hi is None else cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    return total + (0 if cur_hi is None else cur_hi - cur_lo)


def recompute(evs, ranges=None):
    """Per-step numbers read back from the events alone. `ranges` = [(lo, hi)] when the trace
    has no ProfilerStep annotations."""
    steps = sorted((e for e in evs if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    ranges = ranges or [(s["ts"], s["ts"] + s["dur"]) for s in steps]
    host = [e for e in evs if e.get("ph") == "X" and e.get("cat") not in GPU_CATS | RT_CATS | {"Trace"}]
    rts = [e for e in evs if e.get("cat") in RT_CATS]
    gpu = {e["args"]["correlation"]: e for e in evs if e.get("cat") in GPU_CATS}
    items = [(e["ts"], e["ts"] + e["dur"]) for e in host if e["name"] == "aten::item"]
    mem = sorted((e for e in evs if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    prev_reserved, out, prev_end = tg.MEM_BASE, {}, float("-inf")
    for lo, hi in ranges:
        inside = lambda e: lo <= e["ts"] < hi  # noqa: E731
        step_rts = [r for r in rts if inside(r)]
        launched = [(r, gpu[r["args"]["correlation"]]) for r in step_rts if r["args"]["correlation"] in gpu]
        kern = [g for _, g in launched if g["cat"].lower() == "kernel"]
        under_item = lambda r: any(a <= r["ts"] < b for a, b in items)  # noqa: E731
        changes = 0
        for m in filter(inside, mem):
            reserved = m["args"].get("Total Reserved", prev_reserved)  # absent in legacy traces
            changes += reserved != prev_reserved
            prev_reserved = reserved
        gpu_end = max([hi] + [g["ts"] + g["dur"] for _, g in launched])
        row = {
            "step_wall_us": hi - lo,
            "step_wall_device_us": gpu_end - max(prev_end, lo),
            "data_wait_us": sum(e["dur"] for e in host if inside(e) and e["name"].startswith("enumerate(DataLoader)")),
            "kernel_busy_us": union_us([(g["ts"], g["ts"] + g["dur"]) for g in kern if not g["name"].startswith("nccl")]),
            "nccl_busy_us": union_us([(g["ts"], g["ts"] + g["dur"]) for g in kern if g["name"].startswith("nccl")]),
            "memcpy_us": sum(g["dur"] for _, g in launched if "Memcpy" in g["name"]),
            "memset_us": sum(g["dur"] for _, g in launched if "Memset" in g["name"]),
            "syncs": sum(r["name"] in SYNC_NAMES for r in step_rts)
            + sum(under_item(r) and g["name"].startswith("Memcpy DtoH") for r, g in launched),
            "pageable_h2d": sum("Pageable -> Device" in g["name"] for _, g in launched),
            "mallocs": sum(r["name"] in ("cudaMalloc", "hipMalloc") for r in step_rts),
            "frees": sum(r["name"] in ("cudaFree", "hipFree") for r in step_rts),
        }
        if mem:
            row["reserved_changes"] = changes
        for k, v in row.items():
            out.setdefault(k, []).append(v)
        prev_end = gpu_end
    kernels = [e for e in evs if e.get("cat") in ("kernel", "Kernel") and not e["name"].startswith("nccl")]
    out["kernel_us_total"] = sum(e["dur"] for e in kernels)
    out["tensor_core_kernel_us"] = sum(e["dur"] for e in kernels if TC_NAME.search(e["name"]))
    out["gemm_op_count"] = sum(e["name"] in ("aten::mm", "aten::addmm") for e in host)
    out["step_ids"] = [int(s["name"].split("#")[1]) for s in steps]
    return out


def check_structure(doc, spec):
    evs = events(doc)
    legacy, gpu_dev = spec.fmt == "legacy2021", spec.device != "cpu"
    host = sorted((e for e in evs if e.get("ph") == "X" and e.get("pid") == spec.pid), key=lambda e: (e["ts"], -e["dur"]))
    stack = []  # host X events (ops, annotations, runtime) must nest properly
    for e in host:
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        assert not stack or e["ts"] + e["dur"] <= stack[-1], e
        stack.append(e["ts"] + e["dur"])
    ops = [e for e in host if e.get("cat") not in RT_CATS]
    rts = [e for e in host if e.get("cat") in RT_CATS]
    for r in rts:  # every runtime call sits inside an op or a step
        assert any(o["ts"] <= r["ts"] and r["ts"] + r["dur"] <= o["ts"] + o["dur"] for o in ops) or not spec.profiler_steps
    by_corr = {r["args"]["correlation"]: r for r in rts}
    assert len(by_corr) == len(rts)
    gpu_evs = [e for e in evs if e.get("cat") in GPU_CATS]
    assert bool(gpu_evs) == gpu_dev and bool(rts) == gpu_dev
    for stream in {e["tid"] for e in gpu_evs}:  # one queue per stream: no overlap
        seq = sorted((e for e in gpu_evs if e["tid"] == stream), key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(seq, seq[1:]))
    for g in gpu_evs:
        r = by_corr[g["args"]["correlation"]]
        assert ext_of(g["args"]) == ext_of(r["args"])
        blocking = r["ts"] + r["dur"] >= g["ts"] + g["dur"]  # synchronous copy: host waits for it
        assert g["ts"] >= (r["ts"] if blocking else r["ts"] + r["dur"])
    flows = [e for e in evs if e.get("ph") in ("s", "f")]
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    ends = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert starts.keys() == ends.keys() == {g["args"]["correlation"] for g in gpu_evs}
    for g in gpu_evs:
        c = g["args"]["correlation"]
        assert starts[c]["ts"] == by_corr[c]["ts"] and ends[c]["ts"] == g["ts"] and ends[c]["bp"] == "e"
    assert evs[-1]["name"] == "Record Window End" and evs[-2]["name"] == "Iteration Start: PyTorch Profiler"
    assert any(e.get("cat") == "Trace" for e in evs)
    labels = {e["args"]["labels"] for e in evs if e.get("name") == "process_labels"}
    assert labels == ({"CPU", "GPU 0"} if gpu_dev else {"CPU"})
    mem = [e for e in evs if e.get("name") == "[memory]"]
    assert mem and all(e["ph"] == "i" and e["s"] == "t" for e in mem)
    if legacy:
        assert "deviceProperties" not in doc
        assert {e["cat"] for e in evs if e.get("ph") == "X"} <= {"Operator", "Runtime", "Kernel", "Memcpy", "Memset", "Trace"}
        assert all(isinstance(e["tid"], str) for e in ops + rts + gpu_evs)
        assert all("external id" in e["args"] and "External id" not in e["args"] for e in rts + gpu_evs)
        assert all("cat" not in e and "Total Reserved" not in e["args"] for e in mem)
    else:
        assert doc["deviceProperties"] == ([] if not gpu_dev else doc["deviceProperties"])
        assert {e["cat"] for e in evs if e.get("ph") == "X"} <= {
            "cpu_op", "user_annotation", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset", "Trace"}
        assert all(e["cat"] == "cpu_instant_event" and "Total Reserved" in e["args"] for e in mem)
        if gpu_dev:
            assert doc["deviceProperties"][0]["totalGlobalMem"] == 32 << 30
    if spec.device == "rocm":
        assert all(r["name"].startswith("hip") for r in rts)
        assert all("Pageable" not in g["name"] for g in gpu_evs)
    times = [e["ts"] for e in evs] + [e["dur"] for e in evs if "dur" in e]
    if spec.ns_resolution:
        assert doc["displayTimeUnit"] == "ns" and any(t != int(t) for t in times)
    else:
        assert all(isinstance(t, int) for t in times) and "displayTimeUnit" not in doc
    if spec.rank is not None:
        assert doc["distributedInfo"] == {"backend": "nccl", "rank": spec.rank, "world_size": spec.world_size}


@pytest.mark.parametrize("fmt,device,ns", COMBOS)
def test_truth_matches_events(fmt, device, ns):
    spec = spec_for(fmt, device, ns)
    doc, truth = tg.build(spec)
    check_structure(doc, spec)
    got = recompute(events(doc))
    assert truth.num_events == len(events(doc))
    assert truth.n_steps == len(RICH) and got["step_ids"] == truth.step_ids == [5, 6, 7, 8]
    for k in ("step_wall_us", "step_wall_device_us", "data_wait_us", "kernel_busy_us", "nccl_busy_us",
              "memcpy_us", "memset_us", "syncs", "pageable_h2d", "mallocs", "frees", "reserved_changes",
              "kernel_us_total", "tensor_core_kernel_us", "gemm_op_count"):
        assert got[k] == getattr(truth, k), k  # exact: times are on a float-exact grid
    if device != "cpu":
        assert truth.syncs == [3, 0, 2, 1] and truth.mallocs == [1, 0, 2, 0] and truth.frees == [1, 0, 3, 0]
        assert truth.pageable_h2d == ([0] * 4 if device == "rocm" else [1, 0, 0, 0])
        assert truth.step_wall_device_us[1] > truth.step_wall_us[1]  # 30 x 80 us of kernels > 1 ms host
        assert truth.kernel_busy_us[1] == 2400 and truth.tensor_core_kernel_us == 3 * 40 + 4 * 50
    assert truth.gemm_op_count == 10
    assert truth.data_wait_us == [300, 50, 0, 1200.5 if ns else 1200]
    if fmt == "kineto":
        assert truth.reserved_changes[0] == 1 and truth.reserved_changes[1] == (59 if ns else 0)
    else:
        assert truth.reserved_changes == [0] * 4


@pytest.mark.parametrize("fmt,device,ns", COMBOS)
@pytest.mark.parametrize("gz,indent,bare", [(False, True, False), (True, True, False), (False, False, False),
                                            (True, False, True), (False, True, True)])
def test_round_trip(tmp_path, fmt, device, ns, gz, indent, bare):
    spec = spec_for(fmt, device, ns)
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    truth = tg.write(spec, path, bare_list=bare, indent=indent)
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b" if gz else raw[:2] != b"\x1f\x8b"
    text = (gzip.decompress(raw) if gz else raw).decode()
    doc, truth2 = tg.build(spec)
    assert truth == truth2  # deterministic
    assert json.loads(text) == (doc["traceEvents"] if bare else doc)
    if indent and not bare:
        assert text.startswith("\n{\n") and '  "traceEvents": [\n  {\n    "ph": "X", "cat": ' in text
        assert "\n  },\n  {\n" in text


def test_no_profiler_steps_and_gap():
    spec = tg.TraceSpec([tg.StepSpec(kernels=5, syncs=1)] * 3, profiler_steps=False, gap_us=700,
                        num_workers=4, first_step=0)
    doc, truth = tg.build(spec)
    evs = events(doc)
    assert truth.n_steps == 0 and truth.step_ids == []
    assert not any(e.get("name", "").startswith("ProfilerStep") for e in evs)
    ranges = [(s, s + w) for s, w in zip(truth.step_start_us, truth.step_wall_us)]
    got = recompute(evs, ranges)
    assert got["syncs"] == truth.syncs == [1, 1, 1] and got["kernel_busy_us"] == truth.kernel_busy_us
    assert all(w >= 1000 + 700 for w in truth.step_wall_us)
    assert truth.host_span_us == ranges[-1][1] - ranges[0][0]

    spec = tg.TraceSpec([tg.StepSpec(data_wait_us=10)], num_workers=4)
    names = {e["name"] for e in events(tg.build(spec)[0])}
    assert "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__" in names


def test_tensor_core_names_follow_compute_capability():
    for major, pat in [(7, "volta_h884gemm"), (8, "s16816gemm"), (9, "sm90_xmma")]:
        spec = tg.TraceSpec([tg.StepSpec(kernels=4, gemm_ops=2, tensor_core_kernels=1)], compute_major=major)
        doc, truth = tg.build(spec)
        names = [e["name"] for e in events(doc) if e.get("cat") == "kernel"]
        assert sum(pat in n for n in names) == 1 and sum("sgemm" in n for n in names) == 1
        assert doc["deviceProperties"][0]["computeMajor"] == major and truth.tensor_core_kernel_us == 50


def test_graph_launches_replay_their_kernels_under_one_correlation():
    """A cudaGraphLaunch (as in the H100 `launch_compiled` run): all its kernels carry its
    correlation and External id, run back to back on the step's stream after it, one flow arrow
    each; compiled steps wrap it in torch.compile's region ops and name the kernels triton_."""
    steps = [tg.StepSpec(kernels=2, kernel_us=3, graph_launches=2, graph_kernels=30, compiled=True),
             tg.StepSpec(kernels=5, kernel_us=3, graph_launches=1, graph_kernels=7)]
    doc, truth = tg.build(tg.TraceSpec(steps, compute_major=9))
    evs = events(doc)
    launches = sorted((e for e in evs if e.get("name") == "cudaGraphLaunch"), key=lambda e: e["ts"])
    assert len(launches) == 3 and all(e["args"]["cbid"] == 311 for e in launches)
    kernels = [e for e in evs if e.get("cat") == "kernel"]
    replayed = []
    for r in launches:
        mine = sorted((k for k in kernels if k["args"]["correlation"] == r["args"]["correlation"]), key=lambda k: k["ts"])
        assert all(ext_of(k["args"]) == ext_of(r["args"]) for k in mine)
        assert mine[0]["ts"] >= r["ts"] + r["dur"]
        assert all(a["ts"] + a["dur"] == b["ts"] for a, b in zip(mine, mine[1:]))     # back to back
        arrows = [e for e in evs if e.get("ph") == "f" and e["id"] == r["args"]["correlation"]]
        assert len(arrows) == len(mine)
        replayed.append(mine)
    assert [len(m) for m in replayed] == [30, 30, 7] and truth.graph_kernels == [60, 7]
    assert all(k["name"].startswith("triton_poi_fused_") for m in replayed[:2] for k in m)
    assert not any(k["name"].startswith("triton_") for k in replayed[2])
    assert sum(e.get("name") == "## Call CompiledFxGraph fx0 ##" for e in evs) == 2     # the compiled step only
    # the step's kernel busy time counts the replayed kernels (one stream: the sum)
    assert truth.kernel_busy_us == [62 * 3, 12 * 3] and truth.kernel_us_total == 74 * 3
    with pytest.raises(ValueError):
        tg.build(tg.TraceSpec([tg.StepSpec(graph_launches=1)], device="rocm"))


def test_bad_specs():
    with pytest.raises(ValueError):
        tg.build(tg.TraceSpec([tg.StepSpec(cpu_ops_us=20, kernels=10)]))
    with pytest.raises(ValueError):
        tg.build(tg.TraceSpec([tg.StepSpec(kernels=2, tensor_core_kernels=3)]))
    with pytest.raises(ValueError):
        tg.build(tg.TraceSpec([tg.StepSpec()], fmt="perfetto"))


@pytest.mark.parametrize("gz,indent", [(False, True), (True, True), (False, False), (True, False)])
def test_truncate(tmp_path, gz, indent):
    spec = spec_for("kineto", "cuda", False)
    full = tg.render(tg.build(spec)[0], indent=indent)
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    tg.write(spec, path, truncate_at=0.6, indent=indent)
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if gz else raw).decode()
    assert full.startswith(text) and len(text) == int(len(full.encode()) * 0.6)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_truncate_gz_stream(tmp_path):
    spec = spec_for("legacy2021", "cuda", True)
    full = tg.render(tg.build(spec)[0])
    path = tmp_path / "t.json.gz"
    tg.write(spec, path, truncate_at=0.6, truncate_gz_stream=True)
    raw = path.read_bytes()
    with pytest.raises(EOFError):
        gzip.decompress(raw)
    partial = zlib.decompressobj(wbits=31).decompress(raw).decode(errors="ignore")
    assert 0 < len(partial) < len(full) and full.startswith(partial)
    with pytest.raises(ValueError):
        tg.write(spec, tmp_path / "x.json", truncate_at=0.5, truncate_gz_stream=True)
