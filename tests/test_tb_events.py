"""perfdoctor writes TensorBoard event files by hand; TensorBoard must read them back."""

from __future__ import annotations

import pytest

from perfdoctor.report.tb_events import EventWriter, _crc32c


def test_crc32c_check_value():
    assert _crc32c(b"123456789") == 0xE3069283     # the standard CRC-32C check value


def test_tensorboard_reads_our_scalars(tmp_path):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                 reason="tensorboard is a test dependency")
    with EventWriter(tmp_path) as w:
        for i in range(20):
            w.scalars(i, {"step/time_ms": 10.0 + i, "step/data_wait_share": i / 20, "skip": None},
                      wall_time=1_700_000_000.0 + i)
    ea = ea_mod.EventAccumulator(str(tmp_path))
    ea.Reload()
    assert sorted(ea.Tags()["scalars"]) == ["step/data_wait_share", "step/time_ms"]
    vals = ea.Scalars("step/time_ms")
    assert [v.step for v in vals] == list(range(20))
    assert [v.value for v in vals] == pytest.approx([10.0 + i for i in range(20)])
    assert vals[3].wall_time == pytest.approx(1_700_000_003.0)


def test_sample_scalars_from_a_real_sample_shape():
    from perfdoctor.report.run_scalars import sample_scalars
    smp = {"system": {"cpu_usable_percent": 75.0, "iowait_percent": 5.0, "psi": {"io": {"some_avg10": 1.5}}},
           "trainer": {"cpu_percent": 98.0, "rss_bytes": 3 << 30},
           "workers": [{"cpu_percent": 90.0, "state": "running"}, {"cpu_percent": 10.0, "state": "disk-sleep"}],
           "gpu": [{"index": 0, "util_percent": 55, "memory_used_bytes": 1e9, "sm_clock_mhz": 1400}]}
    s = sample_scalars(smp)
    assert s["loader/worker_cpu_percent_mean"] == 50.0 and s["loader/workers_disk_sleep"] == 1.0
    assert s["gpu0/util_percent"] == 55 and s["system/iowait_percent"] == 5.0
    assert s["trainer/rss_bytes"] == 3 << 30 and s["system/ram_available_bytes"] is None
    assert not any(k.startswith("gpu") for k in sample_scalars({**smp, "gpu": None}))   # no GPU, no numbers
