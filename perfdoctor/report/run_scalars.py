"""TensorBoard scalars of a `perfdoctor run`: step time and data wait per step, and the system
samples over time (CPU, IO pressure, memory, the trainer and its loader workers, each NVIDIA GPU).

`tensorboard --logdir RUN_DIR` shows them beside the trace's profile view.
"""

from __future__ import annotations

from pathlib import Path

from perfdoctor.report.tb_events import EventWriter


def write_run_scalars(out_dir: Path, steps: list[dict], samples: list[dict]) -> None:
    with EventWriter(out_dir) as w:
        for s in steps:
            w.scalars(s["step"], {"step/time_ms": s["dur"] * 1e3, "step/data_wait_ms": s["wait"] * 1e3,
                                  "step/data_wait_share": s["wait"] / s["dur"] if s["dur"] > 0 else None},
                      wall_time=s.get("end"))
        for i, smp in enumerate(samples):
            if isinstance(smp, dict):
                w.scalars(i, sample_scalars(smp), wall_time=smp.get("unix"))


def sample_scalars(smp: dict) -> dict:
    """One system sample as TensorBoard scalars (percent of one core for processes)."""
    sysd, trainer, workers = smp.get("system") or {}, smp.get("trainer") or {}, smp.get("workers") or []
    wcpu = [w["cpu_percent"] for w in workers if w.get("cpu_percent") is not None]
    out = {"system/cpu_busy_percent": sysd.get("cpu_usable_percent"),
           "system/iowait_percent": sysd.get("iowait_percent"),
           "system/psi_io_some_avg10": ((sysd.get("psi") or {}).get("io") or {}).get("some_avg10"),
           "trainer/cpu_percent": trainer.get("cpu_percent"),
           "trainer/rss_bytes": trainer.get("rss_bytes") or None,          # 0: read as it exited
           "system/ram_available_bytes": sysd.get("ram_available_bytes"),
           "loader/workers": float(len(workers)),
           "loader/worker_cpu_percent_mean": sum(wcpu) / len(wcpu) if wcpu else None,
           "loader/workers_disk_sleep": float(sum(w.get("state") == "disk-sleep" for w in workers))}
    for g in smp.get("gpu") or []:          # NVML devices (None without an NVIDIA GPU: nothing written)
        i = g.get("index")
        out[f"gpu{i}/util_percent"] = g.get("util_percent")
        out[f"gpu{i}/memory_used_bytes"] = g.get("memory_used_bytes")
        out[f"gpu{i}/sm_clock_mhz"] = g.get("sm_clock_mhz")
    return out
