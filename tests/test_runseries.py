"""The run over time (analyze/runseries.py) and its drawing in the HTML report (report/runcharts.py)."""

from __future__ import annotations

import re

from perfdoctor.analyze.runseries import MAX_POINTS, first_step_s, run_series
from perfdoctor.report.runcharts import run_charts


def _sample(i, dt=0.5, t0=1000.0, workers=0, gpu=False, rss=None):
    s = {"t": i * dt, "unix": t0 + i * dt,
         "trainer": {"pid": 7, "role": "trainer", "cpu_percent": 95.0, "rss_bytes": rss if rss is not None else 2 ** 30 + i * 2 ** 20},
         "workers": [{"pid": 10 + w, "role": "worker", "cpu_percent": 50.0, "rss_bytes": 2 ** 28} for w in range(workers)],
         "helpers": [],
         "system": {"cpu_usable_percent": 75.0, "usable_cpus": 4, "ram_total_bytes": 16 * 2 ** 30,
                    "ram_available_bytes": 10 * 2 ** 30}}
    if gpu:
        s["gpu"] = [{"index": 0, "util_percent": 80, "memory_used_bytes": 3 * 2 ** 30, "pids": [7]},
                    {"index": 1, "util_percent": 0, "memory_used_bytes": 9 * 2 ** 30, "pids": [99]}]
    return s


def test_series_hold_the_samples_values_and_the_step_windows():
    samples = [_sample(i, workers=2, gpu=True) for i in range(20)]
    steps = [{"step": i, "end": 1002.0 + 0.2 * (i + 1), "dur": 0.2, "profiled": 5 <= i < 8} for i in range(30)]
    s = run_series(samples, steps)
    assert s["t_s"][:3] == [0.0, 0.5, 1.0] and len(s["t_s"]) == 20
    assert s["cpu_cores"][0] == 3.0 and s["trainer_cpu_cores"][0] == 0.95 and s["workers_cpu_cores"][0] == 1.0
    assert s["trainer_rss_bytes"][3] == 2 ** 30 + 3 * 2 ** 20 and s["workers_rss_bytes"][0] == 2 ** 29
    assert s["ram_used_bytes"][0] == 6 * 2 ** 30 and s["ram_total_bytes"] == 16 * 2 ** 30 and s["usable_cpus"] == 4
    # only the GPU the trainer uses (the other device's 9 GiB are another job's)
    assert s["gpu_util"][0] == 0.8 and s["gpu_memory_bytes"][0] == 3 * 2 ** 30
    assert s["steps"] == [2.2, 8.0] and s["traced"] == [3.0, 3.6]


def test_the_first_step_is_timed_from_the_launch_by_the_samplers_clock():
    """The sampler's clock starts at the launch (t = 0 at unix 999.9 here, its first sample 0.1 s
    later); the first step starts at its end less its duration; a late sample does not move the
    launch (the median)."""
    samples = [{"t": 0.1 + 0.5 * i, "unix": 1000.0 + 0.5 * i} for i in range(5)]
    samples[3]["unix"] += 0.4                                   # one sample whose clocks disagree
    steps = [{"step": 1, "end": 1005.2, "dur": 0.2}, {"step": 2, "end": 1005.4, "dur": 0.2}]
    assert abs(first_step_s(samples, steps) - 5.1) < 1e-9
    # a first record without its times (a damaged line) is passed over; no sample or no step: unknown
    assert abs(first_step_s(samples, [{"step": 1, "end": "?"}] + steps[1:]) - 5.3) < 1e-9
    assert first_step_s([], steps) is None and first_step_s(samples, []) is None


def test_no_workers_no_gpu_no_lines_for_them_and_a_gap_stays_a_gap():
    samples = [_sample(i) for i in range(10)]
    samples[4]["trainer"]["rss_bytes"] = None                  # a sample that could not read it
    s = run_series(samples, [])
    assert "workers_cpu_cores" not in s and "gpu_util" not in s and "gpu_memory_bytes" not in s
    assert s["trainer_rss_bytes"][4] is None and s["steps"] is None
    legend, pic = run_charts(s)
    assert "loader workers" not in legend and "GPU" not in legend and "trainer RSS" in legend
    rss = re.findall(r'<polyline points="([^"]+)"[^>]*><title>trainer RSS</title>', pic)
    assert [len(p.split()) for p in rss] == [4, 5]              # the line breaks at the unmeasured sample


def test_a_long_run_keeps_samples_as_taken_not_averages():
    samples = [_sample(i, rss=(5 * 2 ** 30 if i == 1001 else 2 ** 30)) for i in range(3000)]
    s = run_series(samples, [])
    assert len(s["t_s"]) <= MAX_POINTS + 1 and s["t_s"][-1] == 1499.5      # the last sample kept
    assert set(s["trainer_rss_bytes"]) <= {2 ** 30, 5 * 2 ** 30}             # values as sampled
    assert run_series(samples[:1], []) is None and run_charts(None) == ("", "")


def test_the_chart_has_a_panel_for_each_kind_measured():
    legend, pic = run_charts(run_series([_sample(i, workers=1, gpu=True) for i in range(6)], []))
    assert pic.startswith('<svg class="chart"') and 'aria-label="the run over time"' in pic
    # the CPU panel's scale follows the data (3 cores busy: top 3); its title says of how many
    # usable cores, so a busy machine reads as one (a 16-core H100 host drew 5 cores as its top)
    assert ">CPU, cores busy (of 4 usable)<" in pic and ">GPU busy<" in pic and ">Memory<" in pic
    assert "100%" in pic and "GiB" in pic
