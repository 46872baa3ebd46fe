"""torch.nn.DataParallel: one process, several GPUs (analyze/replicas.py, PD364, PD330).

The traces come from tests/dptrace.py, which lays every device interval out by hand, so the
per-device busy and compute times are exact."""

from __future__ import annotations

from dataclasses import replace

import dptrace as dp
import pytest
import tracegen as tg

from perfdoctor.diagnose.offline import diagnose_path
from perfdoctor.report.html import render

SPECS = [dp.DPSpec(),                                                        # GPU 0 busy 84%, the others 46%
         dp.DPSpec(devices=2, fwd=3000, bwd=4000, loss=200, opt=600, tail=900)]   # nearly even


def _diagnose(tmp_path, spec, name="dp.json"):
    truth = dp.write(spec, tmp_path / name)
    doc = diagnose_path(str(tmp_path / name))
    return doc, doc["traces"][0]["metrics"], truth


@pytest.mark.parametrize("spec", SPECS, ids=["4-gpus-uneven", "2-gpus-even"])
def test_per_device_busy_and_compute(tmp_path, spec):
    doc, m, tr = _diagnose(tmp_path, spec)
    step = tr.step_us
    busy = [b / step for b in tr.busy_us]
    own = [c / step for c in tr.compute_us]
    mean = sum(busy) / len(busy)
    assert m["trace.devices_used"] == spec.devices and m["parallel.data_parallel"] is True
    assert m["gpu.device_busy_max"] == pytest.approx(max(busy), abs=1e-6)
    assert m["gpu.device_busy_min"] == pytest.approx(min(busy), abs=1e-6)
    assert m["gpu.device_busy_mean"] == pytest.approx(mean, abs=1e-6)
    assert m["gpu.device_imbalance"] == pytest.approx(1 - mean / max(busy), abs=1e-5)
    assert m["parallel.replica_compute_share_max"] == pytest.approx(max(own), abs=1e-6)
    assert m["parallel.replica_compute_share_mean"] == pytest.approx(sum(own) / len(own), abs=1e-6)
    # the union over devices is still the breakdown; share.device is the mean, the rest is host
    union = m["breakdown.kernel"] + m["breakdown.memcpy"] + m["breakdown.memset"]
    assert union == pytest.approx(tr.union_us / step, abs=1e-5)
    assert m["share.device"] == pytest.approx(mean, abs=1e-6)
    assert m["parallel.replica_idle_share"] == pytest.approx(tr.union_us / step - mean, abs=1e-5)
    assert m["share.communication"] == pytest.approx(tr.comm_exposed_us / step, abs=1e-5)
    shares = [m[f"share.{s}"] for s in ("device", "input", "host", "communication")]
    assert sum(shares) == pytest.approx(1.0, abs=1e-5)


def test_uneven_replicas_are_host_bound_not_device_bound(tmp_path):
    """GPU 0 busy 83.7% reads device-bound as a union; the mean device is busy 55.2% and most of
    the rest is the replicas waiting: PD364, and compile (PD311) does not claim the replicas' wait."""
    doc, m, tr = _diagnose(tmp_path, SPECS[0])
    assert tr.union_us / tr.step_us >= 0.8                         # what the union reported
    assert doc["verdict"]["rule"] == "PD364" and doc["verdict"]["bound"] == "host"
    ids = {f["id"] for f in doc["findings"]}
    assert "PD330" in ids and "PD311" not in ids
    assert "PD210" in {f["id"] for f in doc["flags"]}


def test_same_trace_without_data_parallel_keeps_the_union(tmp_path):
    """Several devices but no DataParallel.forward (a model split over GPUs by hand runs them in
    turn): the per-device metrics are there, the verdict keeps the union: device-bound."""
    doc, m, tr = _diagnose(tmp_path, dp.DPSpec(data_parallel=False))
    assert m["parallel.data_parallel"] is False and m["parallel.replica_idle_share"] is None
    assert m["gpu.device_busy_max"] == pytest.approx(tr.busy_us[0] / tr.step_us, abs=1e-6)
    assert m["share.device"] == pytest.approx(tr.union_us / tr.step_us, abs=1e-5)
    assert doc["verdict"]["bound"] == "device"


@pytest.mark.parametrize("spec", SPECS, ids=["4-gpus-uneven", "2-gpus-even"])
def test_ddp_gain_is_step_over_the_busiest_replicas_compute(tmp_path, spec):
    doc, m, tr = _diagnose(tmp_path, spec)
    g = next(f for f in doc["findings"] if f["id"] == "PD330")["gain"]
    own_max, own_mean = max(tr.compute_us), sum(tr.compute_us) / len(tr.compute_us)
    assert g["expected"] == pytest.approx(tr.step_us / own_max, rel=1e-4)
    assert g["ceiling"] == pytest.approx(tr.step_us / own_mean, rel=1e-4)
    # low end: the busiest device keeps all its busy time (copies it cannot tell from compute)
    assert g["model_range"][0] == pytest.approx(tr.step_us / max(tr.busy_us), rel=1e-4)
    assert g["model_range"][1] == pytest.approx(g["expected"], rel=1e-6)


def test_single_device_results_unchanged(tmp_path):
    """One GPU: no per-device metric, share.device is the union as before (tracegen's exact
    kernel time), and the verdict shares come from the breakdown alone."""
    path = tmp_path / "one.json"
    truth = tg.write(tg.TraceSpec(steps=[tg.StepSpec(kernels=20, kernel_us=50)] * 3), path)
    m = diagnose_path(str(path))["traces"][0]["metrics"]
    for name in ("gpu.device_busy_max", "gpu.device_busy_min", "gpu.device_busy_mean", "gpu.device_imbalance",
                 "parallel.replica_compute_share_max", "parallel.replica_compute_share_mean",
                 "parallel.replica_idle_share"):
        assert m[name] is None, name
    assert m["share.device"] == pytest.approx(m["breakdown.kernel"] + m["breakdown.memcpy"] + m["breakdown.memset"],
                                              abs=1e-9)
    assert m["breakdown.kernel"] > 0 and sum(truth.kernel_busy_us) > 0
    one = _diagnose(tmp_path, dp.DPSpec(devices=1), name="dp1.json")[1]
    assert one["gpu.device_busy_max"] is None and one["share.device"] == pytest.approx(7700 / 9200, abs=1e-5)


def _old_sum_model(tr):
    """What precision used to read on DataParallel: GEMM time summed over the devices, scaled by
    (union of compute kernels) / (their summed time); GPU 0 holds every other device's interval."""
    return sum(tr.gemm_us) * tr.compute_us[0] / sum(tr.compute_us) / tr.step_us


@pytest.mark.parametrize("spec", [dp.DPSpec(), dp.DPSpec(loss_kernel=dp.LOSS, opt_kernel=dp.ADAM)],
                         ids=["all-gemm", "loss-and-adam-on-gpu0"])
def test_precision_measures_the_busiest_replica(tmp_path, spec):
    """The replicas run side by side: mixed precision shortens the step by what it shortens on the
    busiest replica (GPU 0 here, by compute), weighted by that device's busy share; the replicas'
    copies of the same GEMMs add nothing, and GPU 0's fp32 loss and Adam kernels stay fp32."""
    doc, m, tr = _diagnose(tmp_path, spec)
    busiest = max(range(spec.devices), key=lambda d: tr.compute_us[d])
    assert busiest == 0
    gemm = tr.gemm_us[busiest] / tr.step_us
    assert m["precision.gemm_fp32_share"] == pytest.approx(gemm, abs=1e-5)
    assert m["precision.amp_share"] == pytest.approx(gemm * tr.busy_us[busiest] / tr.step_us, abs=1e-5)
    if spec.loss_kernel == dp.LOSS:            # the summed model would have claimed 50% more GEMM time
        assert _old_sum_model(tr) - gemm > 0.2
    g = next(f for f in doc["findings"] if f["id"] == "PD320")["gain"]
    a, r = m["precision.amp_share"], m["precision.amp_speedup"]
    assert g["expected"] == pytest.approx(1 / (1 - a + a / r), rel=1e-4)


def test_precision_keeps_every_device_without_data_parallel(tmp_path):
    """A model split over GPUs by hand runs its devices in turn: every device's kernels are on the
    critical path, weighted by the union (share.device), as before."""
    doc, m, tr = _diagnose(tmp_path, dp.DPSpec(data_parallel=False, loss_kernel=dp.LOSS, opt_kernel=dp.ADAM))
    assert m["precision.gemm_fp32_share"] == pytest.approx(_old_sum_model(tr), abs=1e-5)
    assert m["precision.amp_share"] == pytest.approx(_old_sum_model(tr) * tr.union_us / tr.step_us, abs=1e-5)


@pytest.mark.parametrize("spec", SPECS, ids=["4-gpus-uneven", "2-gpus-even"])
def test_per_step_dominant_share_follows_the_verdict_shares(tmp_path, spec):
    """Each step's dominant share reads the mean device's busy time like share.device does (the
    replicas' idle counts as host); the union stays in the per-step breakdown."""
    doc, m, tr = _diagnose(tmp_path, spec)
    mean = sum(tr.busy_us) / len(tr.busy_us) / tr.step_us
    for s in doc["traces"][0]["steps"]:
        union = sum(s["breakdown_ms"][r] for r in ("kernel", "memcpy", "memset")) / s["duration_ms"]
        assert union == pytest.approx(tr.union_us / tr.step_us, abs=1e-5)
        assert s["dominant"] == {"bound": "device", "share": pytest.approx(mean, abs=1e-5)}
    plain, _, pt = _diagnose(tmp_path, replace(spec, data_parallel=False), name="plain.json")
    for s in plain["traces"][0]["steps"]:           # without DataParallel: the union, as share.device
        assert s["dominant"] == {"bound": "device", "share": pytest.approx(pt.union_us / pt.step_us, abs=1e-5)}
    # the picture's device lane stays the union, and says so
    assert doc["traces"][0]["timeline"]["devices"] == spec.devices
    assert f"device (busy: any of {spec.devices}):" in render(doc)
    one = _diagnose(tmp_path, dp.DPSpec(devices=1), name="one.json")[0]
    assert "devices" not in one["traces"][0]["timeline"] and "device:</b>" in render(one)


def test_communication_fixes_left_to_ddp(tmp_path):
    """DataParallel's broadcast and gradient reduce are exposed NCCL time that DDP (PD330) removes:
    fewer syncs (PD334), overlap (PD335), NCCL tuning (PD336) and a faster interconnect (PD340)
    are not offered; the same collectives without DataParallel get them."""
    doc, m, tr = _diagnose(tmp_path, SPECS[0])
    assert m["comm.exposed_share"] == pytest.approx(tr.comm_exposed_us / tr.step_us, abs=1e-5)
    ids = {f["id"] for f in doc["findings"]}
    assert "PD330" in ids and not ids & {"PD334", "PD335", "PD336", "PD340"}
    plain = {f["id"] for f in _diagnose(tmp_path, dp.DPSpec(data_parallel=False), name="plain.json")[0]["findings"]}
    assert {"PD334", "PD335", "PD336", "PD340"} <= plain
