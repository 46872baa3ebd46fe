"""Sampled means cover the steps, not the process: start-up and teardown samples are left out, and
each phase (warm-up, traced, steady) gets its own means (analyze/windows.py)."""

from __future__ import annotations

import json

import pytest

from perfdoctor.analyze.system import system_metrics
from perfdoctor.analyze.windows import PHASE_METRICS, step_windows, windowed_metrics

T0 = 1_800_000_000.0          # unix seconds of the first sample


def _sample(i: int, gpu: float, trainer_cpu: float, busy: float) -> dict:
    t = i * 0.5
    return {"t": t, "unix": T0 + t, "cost_s": 0.001,
            "trainer": {"pid": 1, "create_time": 1.0, "role": "trainer", "cpu_percent": trainer_cpu,
                        "state": "running", "read_bytes": 0, "runq_wait_s": 0.0, "sched_cpu_s": t * trainer_cpu / 100},
            "workers": [], "helpers": [],
            "gpu": [{"index": 0, "util_percent": gpu, "memory_used_bytes": 10 ** 9, "memory_total_bytes": 8 * 10 ** 9,
                     "pids": [1]}],
            "system": {"cpu_count": 8, "usable_cpus": 8, "cpu_quota_cores": None, "cpu_usable_percent": busy,
                       "cpu_total_percent": busy, "iowait_percent": 0.0, "psi": None, "disk": None,
                       "ram_available_bytes": 10 ** 10}}


def _run(n_before=20, n_steps=40, n_after=6):
    """Samples: 10 s of start-up (GPU idle, one core), 20 s of steps (GPU 90% in warm-up, 60% in the
    traced window, 99% after it), 3 s of teardown; steps of 0.1 s ending at 10.0, 10.1, ... 30.0 s,
    profiled steps 51-60 (14.9-15.9 s)."""
    samples, steps = [], []
    for i in range(n_before + n_steps + n_after):
        t = i * 0.5
        in_steps = n_before * 0.5 <= t <= (n_before + n_steps) * 0.5
        phase_gpu = 90.0 if t < 14.9 else 60.0 if t <= 15.9 else 99.0
        samples.append(_sample(i, phase_gpu if in_steps else 0.0, 100.0, 30.0 if in_steps else 12.5))
    k = 0
    t = n_before * 0.5 - 0.1                  # the first step ends at the first steps sample
    while t < (n_before + n_steps) * 0.5 - 1e-9:
        t += 0.1
        k += 1
        steps.append({"step": k, "end": T0 + round(t, 6), "dur": 0.1, "wait": 0.0, "mode": "optimizer",
                      "profiled": 51 <= k <= 60, "perturbed": False})
    return samples, steps


def test_windows_from_steps():
    _, steps = _run()
    w = step_windows(steps)
    assert w["steps"] == pytest.approx((T0 + 10.0, T0 + 30.0))
    assert w["warmup"] == pytest.approx((T0 + 10.0, T0 + 14.9))
    assert w["traced"] == pytest.approx((T0 + 14.9, T0 + 15.9))
    assert w["steady"] == pytest.approx((T0 + 15.9, T0 + 30.0))
    no_trace = [{**s, "profiled": False} for s in steps]
    assert step_windows(no_trace)["traced"] is None and step_windows(no_trace)["steady"] == w["steps"]
    assert step_windows(steps[:1])["steps"] is None and step_windows([])["steady"] is None


def test_means_cover_the_steps_only_and_each_phase():
    samples, steps = _run()
    whole = system_metrics(samples, [])
    notes: list[str] = []
    m, sampling = windowed_metrics(samples, steps, notes, system_metrics)
    # whole process: 66 samples, 41 in the steps; GPU 0% outside them
    in_steps = [s for s in samples if T0 + 10.0 <= s["unix"] <= T0 + 30.0]
    expected = sum(s["gpu"][0]["util_percent"] for s in in_steps) / len(in_steps) / 100
    assert len(in_steps) == 41 and sampling["samples"] == 41 and sampling["samples_total"] == 66
    assert m["gpu.util_mean"] == pytest.approx(expected) and m["gpu.util_mean"] > 0.9
    assert whole["gpu.util_mean"] == pytest.approx(expected * 41 / 66)
    assert m["system.cpu_busy_share"] == pytest.approx(0.30) and whole["system.cpu_busy_share"] < 0.25
    assert sampling["window"] == "steps" and sampling["seconds"] == pytest.approx(20.0)
    assert sampling["whole_run"]["gpu.util_mean"] == pytest.approx(whole["gpu.util_mean"], abs=1e-4)
    ph = sampling["phases"]
    assert ph["warmup"]["samples"] == 10 and ph["warmup"]["gpu.util_mean"] == pytest.approx(0.90)
    assert ph["traced"]["samples"] == 2 and ph["traced"]["gpu.util_mean"] == pytest.approx(0.60)
    assert ph["steady"]["samples"] == 29 and ph["steady"]["gpu.util_mean"] == pytest.approx(0.99)
    assert set(PHASE_METRICS) <= set(ph["steady"])
    assert any("over the 201 steps" in n and "41 of the 66 samples" in n for n in notes), notes


def test_too_few_samples_in_the_steps_use_the_whole_run_and_say_so():
    samples, steps = _run()
    short = steps[:10]                                     # 1 s of steps: 2 samples
    notes: list[str] = []
    m, sampling = windowed_metrics(samples, short, notes, system_metrics)
    assert sampling["window"] == "whole run" and sampling["samples"] == 66
    assert m["gpu.util_mean"] == pytest.approx(system_metrics(samples, [])["gpu.util_mean"])
    assert any("over the whole run" in n and "2 of 66" in n for n in notes), notes


def test_run_directory_with_samples_outside_the_steps(tmp_path):
    """The live diagnosis of a run directory (no trace) takes the steps window."""
    from perfdoctor.diagnose.live import diagnose_dir

    samples, steps = _run()
    d = tmp_path / "run"
    d.mkdir()
    (d / "samples.json").write_text(json.dumps({"samples": samples, "notes": []}))
    (d / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (d / "child.json").write_text(json.dumps({"outcome": "completed", "exit_code": 0, "torch_imported": True,
                                              "trace_enabled": False, "cuda_available": True, "notes": []}))
    (d / "run.json").write_text(json.dumps({"argv": ["train.py"], "exit_code": 0, "signal": None, "wall_s": 33.0,
                                            "stopped_by": None, "notes": []}))
    doc = diagnose_dir(d)
    m = doc["traces"][0]["metrics"]
    assert m["gpu.util_mean"] == pytest.approx(windowed_metrics(samples, steps, [], system_metrics)[0]["gpu.util_mean"],
                                               rel=1e-5)
    assert m["gpu.util_mean"] > 0.9 and m["system.samples"] == 41
    s = doc["run"]["sampling"]
    assert s["window"] == "steps" and s["phases"]["steady"]["gpu.util_mean"] == pytest.approx(0.99)
    assert s["whole_run"]["gpu.util_mean"] < 0.6
    assert any("between the first and the last step end" in n for n in doc["run"]["notes"])


def test_h100_compute_run_gpu_busy_over_its_steps(shared_traces):
    """The ResNet-50 run whose steps kept the H100 busy: 41% over the process, ~99% over the steps."""
    from perfdoctor.diagnose.live import read_steps

    d = shared_traces / "h100" / "compute"
    if not d.is_dir():
        pytest.skip(f"integration data absent: {d}")
    samples = json.loads((d / "samples.json").read_text())["samples"]
    m, s = windowed_metrics(samples, read_steps(d), [], system_metrics)
    assert s["whole_run"]["gpu.util_mean"] == pytest.approx(0.415, abs=0.01)
    assert m["gpu.util_mean"] >= 0.95 and s["phases"]["steady"]["gpu.util_mean"] >= 0.99
    assert s["samples"] == 17 and s["samples_total"] == 41
