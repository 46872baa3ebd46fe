"""Memory that grows every step (analyze/memgrowth.py, PD216/PD217): fitted on sampled series,
and found by `perfdoctor run` in a loop that keeps each step's output."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from perfdoctor.analyze.memgrowth import MIN_GROWTH_BYTES, growth_rate, growth_slowdown, memory_growth
from perfdoctor.rules.expr import human_bytes

MIB = 2 ** 20


def series(f, n=40, dt=0.5, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return [(i * dt, f(i * dt) + noise * rng.standard_normal()) for i in range(n)]


def test_linear_growth_is_measured_at_its_rate():
    pts = series(lambda t: 500 * MIB + 10 * MIB * t, noise=2 * MIB)        # 200 MiB over 20 s
    assert growth_rate(pts) == pytest.approx(10 * MIB, rel=0.03)


def test_a_warm_up_that_levels_off_is_no_growth():
    # the caching allocator or the profiler's buffers: a rise in the first seconds, then flat
    pts = series(lambda t: 400 * MIB + 300 * MIB * min(1.0, t / 4), noise=1 * MIB)
    assert growth_rate(pts) == 0.0
    # one jump in the middle (a buffer allocated once): only one half grows
    jump = series(lambda t: 400 * MIB + (200 * MIB if t > 10 else 0), noise=1 * MIB)
    assert growth_rate(jump) == 0.0


def test_a_leak_keeps_its_pace_and_a_filling_cache_slows_down():
    """A user's detection loop (new padded shapes each step) grew 2.2 then 0.9 MiB a step and
    levelled off later: PD216 had told it to look for outputs kept alive (PD225 now)."""
    leak = series(lambda t: 500 * MIB + 10 * MIB * t, noise=2 * MIB)
    assert growth_slowdown(leak) == pytest.approx(1.0, abs=0.1)
    filling = series(lambda t: 400 * MIB + 600 * MIB * (1 - np.exp(-t / 12)), noise=1 * MIB)   # toward a size
    assert growth_rate(filling) > 0 and growth_slowdown(filling) < 0.5
    assert growth_slowdown(series(lambda t: 400 * MIB, noise=1 * MIB)) is None                # no growth
    assert growth_slowdown(series(lambda t: 400 * MIB, n=5)) is None
    m = memory_growth(_samples(lambda t: 300 * MIB + 20 * MIB * t), _steps())
    assert m["host.rss_growth_slowdown"] == pytest.approx(1.0, abs=0.05)


def test_growth_below_one_malloc_arena_is_not_told_from_noise():
    small = series(lambda t: 400 * MIB + 0.5 * (MIN_GROWTH_BYTES / 20) * t, noise=0.2 * MIB)   # 32 MiB in 20 s
    assert growth_rate(small) == 0.0
    assert growth_rate(series(lambda t: 400 * MIB, noise=8 * MIB)) == 0.0     # noisy but flat
    assert growth_rate(series(lambda t: 400 * MIB, n=5)) is None               # too few samples


def _samples(rss_of_t, n=60, dt=0.5, t0=1000.0, gpu=None):
    out = []
    for i in range(n):
        t = t0 + i * dt
        s = {"t": i * dt, "unix": t, "trainer": {"pid": 7, "role": "trainer", "rss_bytes": rss_of_t(i * dt)},
             "workers": [], "helpers": [], "system": {"ram_available_bytes": 8 * 2 ** 30}}
        if gpu:
            s["gpu"] = [{"index": 0, "memory_used_bytes": gpu(i * dt), "memory_total_bytes": 80 * 2 ** 30, "pids": [7]},
                        {"index": 1, "memory_used_bytes": 5 * 2 ** 30, "memory_total_bytes": 80 * 2 ** 30, "pids": [99]}]
        out.append(s)
    return out


def _steps(n=300, dt=0.1, t0=1000.0, profiled=range(0)):
    return [{"step": i, "end": t0 + (i + 1) * dt, "dur": dt, "profiled": i in profiled} for i in range(n)]


def test_per_step_growth_runway_and_the_gpu_the_trainer_uses():
    # 2 MiB a step at 0.1 s a step on the host; 40 MiB a step on GPU 0 (GPU 1 is another job's)
    m = memory_growth(_samples(lambda t: 300 * MIB + 20 * MIB * t, gpu=lambda t: 2 * 2 ** 30 + 400 * MIB * t),
                      _steps())
    assert m["host.rss_growth_per_step_bytes"] == pytest.approx(2 * MIB, rel=0.02)
    assert m["host.rss_peak_bytes"] == pytest.approx(300 * MIB + 20 * MIB * 29.5, rel=1e-6)
    assert m["host.ram_runway_steps"] == pytest.approx(8 * 2 ** 30 / (2 * MIB), rel=0.02)
    assert m["gpu.memory_growth_per_step_bytes"] == pytest.approx(40 * MIB, rel=0.02)
    free = 80 * 2 ** 30 - (2 * 2 ** 30 + 400 * MIB * 29.5)
    assert m["gpu.memory_runway_steps"] == pytest.approx(free / (40 * MIB), rel=0.05)


def test_workers_that_cache_what_they_read_are_judged_each_on_its_own():
    """A user trial's Dataset kept every sample it read: each of its 2 workers grew 300 -> 740 MB
    while the trainer stayed flat, and no flag was raised."""
    samples = _samples(lambda t: 300 * MIB)
    for s in samples:
        t = s["t"]
        s["workers"] = [{"pid": 20 + w, "role": "worker", "create_time": 5.0, "rss_bytes": 300 * MIB + 10 * MIB * t}
                        for w in range(2)]
    m = memory_growth(samples, _steps())
    assert m["host.rss_growth_per_step_bytes"] == 0.0
    assert m["loader.workers_rss_growth_per_step_bytes"] == pytest.approx(2 * MIB, rel=0.02)      # 1 MiB each
    assert m["host.ram_runway_steps"] == pytest.approx(8 * 2 ** 30 / (2 * MIB), rel=0.02)
    # workers restarted every few seconds (non-persistent, short epochs): too short-lived to judge
    for s in samples:
        s["workers"] = [{**w, "create_time": float(int(s["t"] // 2))} for w in s["workers"]]
    assert memory_growth(samples, _steps())["loader.workers_rss_growth_per_step_bytes"] is None


def test_only_the_steps_after_the_profiled_ones_count():
    # the profiler holds its events in the trainer while it records (steps 20-29): memory rises
    # during those steps and stays; after them it is flat
    def rss(t):
        return 300 * MIB + (0 if t < 2 else 400 * MIB * min(1.0, (t - 2) / 1.0))
    m = memory_growth(_samples(rss), _steps(profiled=range(20, 30)))
    assert m["host.rss_growth_per_step_bytes"] == 0.0 and m["host.ram_runway_steps"] is None
    assert m["gpu.memory_growth_per_step_bytes"] is None          # no GPU samples: unknown, not 0


def test_too_few_steps_or_samples_is_unknown():
    m = memory_growth(_samples(lambda t: 300 * MIB + 20 * MIB * t), _steps(n=10, dt=3.0))
    assert m["host.rss_growth_per_step_bytes"] is None and m["host.rss_peak_bytes"] > 0
    assert memory_growth([], [])["host.rss_peak_bytes"] is None


def test_bytes_render_in_binary_units():
    assert [human_bytes(x) for x in (512, 1536, 2 * MIB + 0.2 * MIB, 150 * MIB, 3 * 2 ** 30)] == \
        ["512 B", "1.5 KiB", "2.2 MiB", "150 MiB", "3.0 GiB"]


LEAK = r"""
import sys, time
import torch
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(1)
keep = sys.argv[1] == "leak"
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1024))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 64)
outputs, n, t0 = [], 0, time.perf_counter()
while time.perf_counter() - t0 < float(sys.argv[2]):
    opt.zero_grad()
    out = model(x)                      # 512 x 1024 floats: 2 MiB
    out.pow(2).mean().backward()
    opt.step()
    outputs.append(out if keep else out[:1].detach().clone())    # kept "for an epoch-end metric"
    n += 1
print(f"{n} steps")
"""


@pytest.mark.quiet          # the slope maps sampled RSS to steps by time: one CI run under the other worker's load read 1.77 MiB
def test_run_finds_a_loop_that_keeps_each_steps_output(tmp_path):
    script = tmp_path / "keeps_outputs.py"
    script.write_text(LEAK)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--out", str(out), str(script), "leak", "9"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "report.json").read_text())
    m = doc["traces"][0]["metrics"]
    # each step keeps 2 MiB (plus the kept tensor's small header): the slope finds it within 15%
    assert m["host.rss_growth_per_step_bytes"] == pytest.approx(2 * MIB, rel=0.15), m
    assert m["host.ram_runway_steps"] > 0
    flag = next(f for f in doc["flags"] if f["id"] == "PD216")
    assert "grows every step over the steady steps" in flag["summary"] and "MiB a step" in flag["summary"]
    assert m["loader.workers_rss_growth_per_step_bytes"] == 0.0           # no loader workers
    assert "its DataLoader workers' by 0 B a step together" in flag["summary"]
    assert "PD216" in r.stderr and "memory grows every step" in r.stderr
    # the picture of it: the trainer's RSS over time, rising through the steps
    series = doc["run"]["series"]
    rss = [v for v in series["trainer_rss_bytes"] if v is not None]
    assert rss[-1] - rss[len(rss) // 2] > 64 * MIB and "workers_rss_bytes" not in series
    html = (out / "report.html").read_text()            # the run directory's picture, as `report --format html`
    assert "<h2>The run over time</h2>" in html and "<title>trainer RSS</title>" in html


@pytest.mark.integration
def test_no_growth_on_the_h100_runs(shared_traces):
    """The H100 corpus's scripts keep nothing from step to step, `alloc`'s empty_cache every step
    included: where the GPU samples cover enough steady steps, they measure no growth."""
    from perfdoctor.diagnose.live import read_steps
    runs = [d for d in sorted((shared_traces / "h100").glob("*")) if (d / "samples.json").exists()]
    if not runs:
        pytest.skip("no H100 run directories in ../shared/traces/h100")
    measured = {}
    for d in runs:
        samples = json.loads((d / "samples.json").read_text())["samples"]
        measured[d.name] = memory_growth(samples, read_steps(d))["gpu.memory_growth_per_step_bytes"]
    assert all(v in (0.0, None) for v in measured.values()), measured
    assert sum(v == 0.0 for v in measured.values()) >= 4, measured        # measured, not just unknown
