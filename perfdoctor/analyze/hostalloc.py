"""Host memory handed back to the kernel and taken again every step: the trainer's page faults
and kernel CPU time over the steady steps, from `perfdoctor run`'s system samples.

glibc's malloc serves a block above its mmap threshold (128 KiB at first, raised as large blocks
are freed, to at most 32 MiB on a 64-bit machine) with its own mmap, and gives it back to the
kernel with munmap when it is freed. A CPU training step whose tensors are larger than that (a
language model's [tokens, vocabulary] logits, a large batch's activations) then asks the kernel
for fresh pages every step: each first touch of a 4 KiB page is a minor fault that maps and zeroes
it, counted as the process's system CPU time. A user's word-level LSTM (a 33K-word vocabulary,
700 tokens a step: ~92 MB of logits) faulted ~10 million times in 35 s, 27% of its CPU time in the
kernel; with the freed memory kept in the process (glibc's MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_), 250 thousand faults, the kernel's share 2%, and its steps ran 1.10-1.28x
faster (PD393 lists what the fix measured elsewhere). The torch CPU allocator has no cache of its
own.

Metrics, over the steady window (analyze/windows.step_windows), from the trainer's cumulative
counters at its first and last sample there (collect/samplers.py: minflt_life, sys_life_s,
cpu_life_s; None where the samples cannot tell: fewer than MIN_STEPS steps between them, or less
than MIN_CPU_S of CPU time, a few scheduler ticks' rounding):
  host.page_faults_per_step   the trainer's minor page faults per step (4 KiB pages it was given)
  host.kernel_cpu_share       the share of the trainer's CPU time (all its threads) spent in the
                              kernel, system time over user + system
  host.fault_cpu_share        the part of that share the faults can explain: at most FAULT_COST_S
                              of kernel time a fault (the rest is other system calls: a
                              checkpoint's writes spent 32% of a trainer's CPU time in the kernel
                              with 270 faults a step)

FAULT_COST_S is an upper figure for one minor fault: the trap, mapping the page and zeroing its
4 KiB (~10 GB/s), and its share of unmapping the block later; ~1 us on current x86 servers, and
the LSTM above spent 1.5 us of kernel time a fault.
"""

from __future__ import annotations

from perfdoctor.analyze.windows import select, step_windows

MIN_STEPS = 10
MIN_CPU_S = 0.5
FAULT_COST_S = 2e-6

NAMES = ("host.page_faults_per_step", "host.kernel_cpu_share", "host.fault_cpu_share")


def _counters(sample: dict) -> tuple[float, float, float, float] | None:
    """(time, minor faults, system CPU s, CPU s) of the trainer at a sample, or None."""
    tr = sample.get("trainer") or {}
    vals = (sample.get("unix"), tr.get("minflt_life"), tr.get("sys_life_s"), tr.get("cpu_life_s"))
    return vals if all(isinstance(v, (int, float)) for v in vals) else None   # type: ignore[return-value]


def host_alloc(samples: list[dict], steps: list[dict]) -> dict:
    out: dict = dict.fromkeys(NAMES)
    picked = [c for s in select(samples, step_windows(steps).get("steady")) if (c := _counters(s))]
    if len(picked) < 2:
        return out
    (t0, f0, s0, c0), (t1, f1, s1, c1) = picked[0], picked[-1]
    n = sum(1 for s in steps if isinstance(s.get("end"), (int, float)) and t0 < s["end"] <= t1)
    cpu = c1 - c0
    if n < MIN_STEPS or cpu < MIN_CPU_S or f1 < f0 or s1 < s0:      # a trainer restarted between them
        return out
    out["host.page_faults_per_step"] = round((f1 - f0) / n, 1)
    out["host.kernel_cpu_share"] = round(min(1.0, (s1 - s0) / cpu), 4)
    out["host.fault_cpu_share"] = round(min(1.0, min(s1 - s0, (f1 - f0) * FAULT_COST_S) / cpu), 4)
    return out
