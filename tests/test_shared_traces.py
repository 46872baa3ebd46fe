"""Integration tests on the real traces in ../shared/traces (skipped when that folder is absent).

Reference numbers are from ../shared/traces/MANIFEST.md (torch-tb-profiler 0.4.3's reading)."""

from __future__ import annotations

import pytest

from perfdoctor.diagnose.offline import diagnose_path

pytestmark = pytest.mark.integration

NW0 = "tb_plugin/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz"
NW4 = "tb_plugin/resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz"
CUDA_ONLY_FLAGS = {"pageable-copies", "no-tensor-cores"}
CUDA_WORDS = ("CUDA", "cuda", "tensor core", "pin_memory", "AMP")


def assert_no_cuda_advice(doc, allowed=()):
    """Nothing CUDA-specific in the verdict, flags or fixes (ids and texts); `allowed`: words that
    are not CUDA's alone on that device (pinned memory on ROCm: pin_memory is the same API there)."""
    from perfdoctor.rules.loader import load_rules
    cuda_only = {r.id for r in load_rules() if r.devices == ["cuda"]}
    items = doc["flags"] + doc["findings"]
    assert not cuda_only & {f["id"] for f in items}
    text = doc["verdict"]["summary"] + " ".join(f["summary"] + f["title"] + (f.get("fix") or {}).get("text", "") for f in items)
    assert not any(w in text for w in CUDA_WORDS if w not in allowed), text


def report(shared_traces, rel):
    return diagnose_path(str(shared_traces / rel))


def metrics(doc):
    return doc["traces"][0]["metrics"]


def test_every_trace_parses(shared_traces):
    # run directories' own records (child.json, run.json, samples.json) are not traces
    files = sorted(p for p in shared_traces.rglob("*.json*") if p.is_file()
                   and not (p.parent / "child.json").is_file())
    assert len(files) >= 15
    for f in files:
        doc = diagnose_path(str(f))
        m = metrics(doc)
        assert m["trace.events"] > 0 and m["steps.count"] >= 1, f
        assert doc["verdict"]["bound"] in {"input_io", "input_cpu", "input", "host", "device", "communication", "inconclusive"}


def test_resnet50_num_workers_0_is_input_bound(shared_traces):
    doc = report(shared_traces, NW0)
    m = metrics(doc)
    assert doc["verdict"]["bound"].startswith("input")
    assert m["input.data_wait_share"] == pytest.approx(0.229, abs=0.03)
    assert m["steps.time_mean_ms"] == pytest.approx(154.9, rel=0.02)
    assert m["gpu.kernel_busy_share"] == pytest.approx(0.636, abs=0.03)
    assert m["input.num_workers_zero"] is True
    assert "num-workers-zero" in {f["slug"] for f in doc["flags"]}
    # the DataLoader fix is ranked, bounded by removing the data wait entirely, and its expected
    # gain (2 workers assumed: a trace has no core count) is within 25% of what the same job
    # measured with num_workers=4 (tb_plugin's nw4 sample: 154.9 -> 142.8 ms, 1.085x)
    fixes = {f["slug"]: f for f in doc["findings"] if f["ranked"]}
    loader = fixes["loader-workers"]
    assert loader["gain"]["expected"] <= loader["gain"]["ceiling"] <= 1 / (1 - m["input.data_wait_share"]) + 1e-9
    assert loader["gain"]["expected"] == pytest.approx(154.9 / 142.8, rel=0.25)
    # fp32 convolutions on a V100 with no tensor-core kernel: mixed precision is offered first
    assert doc["findings"][0]["slug"] == "mixed-precision"


def test_resnet50_num_workers_4_is_not_input_bound_and_flags_tensor_cores(shared_traces):
    doc = report(shared_traces, NW4)
    m = metrics(doc)
    assert not doc["verdict"]["bound"].startswith("input")
    assert m["input.data_wait_share"] < 0.01
    # the TensorBoard plugin's 69.4% kernel and 10.9% other count the window's edges: the first
    # step's 45.7 ms cudaMemcpyAsync waiting, before any device event is traced, on work launched
    # before the profiler started, and the last step's 80 ms after its last op and kernel, with
    # nothing traced, where every earlier step ends at its last op (the profiler stopping). An
    # independent count over steps 17-20: 83-86% device busy each. Without the edges: 99.0 ms of
    # kernels in a mean step of 121 ms, device-bound
    notes = doc["traces"][0]["notes"]
    assert any("dropped the first step: its host waited" in n and "cudaMemcpyAsync" in n for n in notes), notes
    assert any("cut the last step after its last traced work: its range ran on 80.4 ms" in n for n in notes), notes
    assert m["steps.count"] == 5 and doc["verdict"]["bound"] == "device"
    assert m["breakdown.kernel"] == pytest.approx(0.816, abs=0.02)
    assert m["breakdown.other"] == pytest.approx(0.014, abs=0.01)
    assert m["tensor_core.kernel_share"] == 0 and m["trace.compute_capability"] == 7.0
    assert "no-tensor-cores" in {f["slug"] for f in doc["flags"]}
    # issue 3: mixed precision is offered, a DataLoader fix is not
    slugs = [f["slug"] for f in doc["findings"]]
    assert any("precision" in s or "amp" in s for s in slugs), slugs
    assert "loader-workers" not in slugs


def test_2021_format_traces(shared_traces):
    m0 = metrics(report(shared_traces, "tb_plugin/profiler_api_num_workers_0/worker0.pt.trace.json.gz"))
    m4 = metrics(report(shared_traces, "tb_plugin/profiler_api_num_workers_4/worker0.pt.trace.json.gz"))
    assert m0["input.data_wait_share"] == pytest.approx(0.210, abs=0.03)
    assert m0["gpu.kernel_busy_share"] == pytest.approx(0.678, abs=0.03)
    assert m4["input.data_wait_share"] < 0.01
    assert m4["gpu.kernel_busy_share"] == pytest.approx(0.836, abs=0.03)
    # no deviceProperties in 2021 traces: the capability is the floor its volta_ kernels need, the
    # part unknown; mixed precision is offered on the fp32 SIMT GEMMs with a ceiling and no
    # expected gain (the same ResNet-50 on the V100 that resnet50_num_workers_0 names)
    doc = report(shared_traces, "tb_plugin/profiler_api_num_workers_0/worker0.pt.trace.json.gz")
    assert m0["trace.compute_capability"] == 7.0 and m0["trace.capability_from_kernels"] is True
    assert m0["trace.device_name"] is None and m0["trace.tensor_cores"] is None
    from perfdoctor.report.labels import device_text
    assert device_text(m0) == "device unknown (compute capability 7.0 or later, from its kernels' names)"
    amp = next(f for f in doc["findings"] if f["slug"] == "mixed-precision")
    assert amp["gain"]["expected"] is None and amp["gain"]["ceiling"] > 1.5


def test_df_index_resolver_memory_events(shared_traces):
    doc = report(shared_traces, "hta/df_index_resolver/df_index_resolver.json.gz")
    m = metrics(doc)
    assert m["memory.events"] == 28010
    assert m["memory.peak_reserved_bytes"] > 1e10 and m["memory.peak_allocated_bytes"] > 1e9
    assert 0 < m["memory.peak_reserved_fraction"] < 1
    assert m["steps.count"] == 5 and m["steps.time_mean_ms"] == pytest.approx(347.5, rel=0.01)
    # Reserved memory is flat and there are no cudaMalloc/cudaFree in steady state: no churn.
    assert m["memory.reserved_swing"] == 0 and m["memory.free_per_step"] == 0
    assert "allocator-thrashing" not in {f["slug"] for f in doc["flags"]}
    assert not any(("alloc" in f["slug"] or "expandable" in f["slug"]) for f in doc["findings"])
    # 28k events drawn as at most 200 bins: each keeps its bin's largest values, so the chart
    # reaches the peaks (it had kept each bin's first event: the allocated peak fell between)
    series = doc["traces"][0]["memory_timeline"]
    assert len(series["t_ms"]) <= 200 and series["t_ms"] == sorted(series["t_ms"])
    assert max(series["reserved_bytes"]) == m["memory.peak_reserved_bytes"]
    assert max(series["allocated_bytes"]) == m["memory.peak_allocated_bytes"]


def test_the_memory_series_keeps_each_bins_peak():
    """A spike between two bins' first events is drawn: 1000 events, one of them 5x the rest."""
    import numpy as np

    from perfdoctor.analyze.memory import _downsample
    ts = np.arange(1000, dtype=float) * 10.0
    res = np.full(1000, 100.0)
    alloc = np.full(1000, 50.0)
    res[503], alloc[777] = 500.0, np.nan
    alloc[778] = 250.0
    s = _downsample(ts, res, alloc, points=100)
    assert len(s["t_ms"]) == 100 and s["t_ms"][0] == 0.0
    assert max(s["reserved_bytes"]) == 500.0 and s["reserved_bytes"].count(500.0) == 1
    assert max(s["allocated_bytes"]) == 250.0 and min(s["allocated_bytes"]) == 50.0
    short = _downsample(ts[:10], res[:10], alloc[:10])
    assert short["reserved_bytes"] == [100.0] * 10


def test_two_rank_directory(shared_traces):
    doc = diagnose_path(str(shared_traces / "hta/trace_filter"))
    # one trace per rank, with collectives: merged as a multi-rank run's ranks (diagnose/ranks.py),
    # the pace-setting rank (the most own work: rank 1) first
    assert [t["label"] for t in doc["traces"]] == ["rank 1", "rank 0"]
    sec = doc["ranks"]
    assert sec["count"] == 2 and sec["world_size"] == 128 and sec["pace_rank"] == 1
    # both wait ~25% of the step in NCCL, and rank 0 only ~3% more than rank 1: the transfer itself
    assert sec["wait_cause"] == "network" and doc["verdict"]["rule"] != "PD115"
    assert sec["metrics"]["ranks.network_wait_share"] == pytest.approx(0.242, abs=0.01)
    assert [r["rank"] for r in sec["per_rank"]] == [0, 1] and sec["per_rank"][0]["straggler_wait_ms"] > 0
    for t in doc["traces"]:
        assert t["metrics"]["comm.share"] > 0.2          # NCCL collectives are visible on both ranks


@pytest.mark.parametrize("rel,in_backward,overlap_fix", [
    # all 404 per-parameter all-reduces come after the compiled backward's compute (only
    # AccumulateGrad's copies follow them): the overlap fix is offered, bounded by the compute
    ("hta/df_index_resolver/df_index_resolver.json.gz", 0.0, True),
    # DDP's all-reduces launched from AccumulateGrad hooks during backward: overlap works there, the
    # exposed time is the device waiting for a slow host (host-bound) or the 128-rank network
    ("hta/nccl_parser_config/nccl_data.json.gz", 0.875, False),
    ("hta/trace_filter/sampled_rank-0.json.gz", 0.732, False),
    ("hta/trace_filter/sampled_rank-1.json.gz", 0.723, False)])
def test_collectives_launched_during_backward(shared_traces, rel, in_backward, overlap_fix):
    doc = report(shared_traces, rel)
    m = metrics(doc)
    assert m["comm.launched_in_backward"] == pytest.approx(in_backward, abs=0.005)
    assert m["comm.sync_steps"] == m["steps.count"]            # no accumulation: every step synchronises
    fixes = {f["id"]: f for f in doc["findings"]}
    assert ("PD335" in fixes) is overlap_fix
    if overlap_fix:   # V = 0 here: min(exposed, compute - V) is all the exposed time
        assert fixes["PD335"]["gain"]["ceiling"] == pytest.approx(1 / (1 - m["comm.exposed_share"]), rel=1e-3)


@pytest.mark.parametrize("rel", ["hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
                                 "hta/rank_non_gpu/rank_non_gpu.json.gz"])
def test_cpu_only_traces_get_no_gpu_numbers(shared_traces, rel):
    doc = report(shared_traces, rel)
    m = metrics(doc)
    assert m["trace.platform"] == "cpu" and m["trace.device_name"] is None
    gpu_metrics = [k for k in m if k.startswith(("gpu.", "tensor_core.", "sync.", "memcpy."))]
    assert gpu_metrics and all(m[k] is None for k in gpu_metrics)
    assert all(f["slug"] not in CUDA_ONLY_FLAGS | {"idle-gpu-gaps"} for f in doc["flags"])
    assert "GPU" not in doc["verdict"]["summary"]
    assert_no_cuda_advice(doc)


def test_cpu_only_verdicts(shared_traces):
    # HTA's CPU DLRM step: "## backward ##" lasts 34 ms with 0.1 ms of recorded ops in it (its
    # ops were left out of the file): untraced time, not the ops its label once counted as
    # (compute-bound, ops 96%); the ops themselves cover 35% of the step
    doc = report(shared_traces, "hta/rank_non_gpu/rank_non_gpu.json.gz")
    m = metrics(doc)
    assert doc["verdict"]["bound"] == "host" and doc["verdict"]["confidence"] <= 0.4
    assert m["breakdown.cpu_exec"] == pytest.approx(0.348, abs=0.002) and m["breakdown.other"] == pytest.approx(0.626, abs=0.002)
    assert report(shared_traces, "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")["verdict"]["bound"] == "communication"


def test_amd_trace_gets_no_cuda_advice(shared_traces):
    doc = report(shared_traces, "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    m = metrics(doc)
    assert m["trace.platform"] == "rocm" and m["trace.compute_capability"] is None
    assert m["breakdown.runtime"] == pytest.approx(0.72, abs=0.03)
    assert not {f["slug"] for f in doc["flags"]} & CUDA_ONLY_FLAGS
    assert_no_cuda_advice(doc, allowed=("pin_memory",))
    # its two syncs a step are blocking input copies (hipMemcpyWithStream, HtoD; an independent
    # reading of the raw events found no item() and no device-to-host copy): the syncs are
    # flagged, but "stop reading device values on the host" is not the advice
    assert m["sync.per_step"] == m["sync.h2d_copy_per_step"] == 2.0 and m["sync.scalar_dtoh_per_step"] == 0
    assert "host-device-sync" in {f["slug"] for f in doc["flags"]}
    assert "remove-host-syncs" not in {f["slug"] for f in doc["findings"]}
    assert "async-input-copies" in {f["slug"] for f in doc["findings"]}        # pinned, non_blocking copies


def test_ns_resolution_trace_is_gpu_bound(shared_traces):
    doc = report(shared_traces, "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    assert doc["verdict"]["bound"] == "device"
    assert metrics(doc)["breakdown.kernel"] == pytest.approx(0.968, abs=0.02)


def test_trace_without_profiler_steps_states_its_fallback(shared_traces):
    doc = report(shared_traces, "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")
    m = metrics(doc)
    assert m["steps.source"] == "whole trace" and m["breakdown.runtime"] == pytest.approx(0.97, abs=0.02)
    assert any("pseudo-step" in n for n in doc["traces"][0]["notes"])
    assert doc["verdict"]["confidence"] <= 0.5
