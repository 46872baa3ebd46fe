"""input.split: does the loader wait on storage ('io'), on the CPU ('cpu'), or on neither
('other')? From the loader's numbers that analyze/system.py computes from the samples, decided in
this order; every threshold is a principle, not a fit to one machine:

The loader's time is judged against a single thread's ceiling: a DataLoader worker does its
work on one thread (torch gives each worker one intra-op thread), so one core is all it can use,
and its runnable share is (on-CPU time + run-queue wait) per wall second, capped at 1, or the
share of samples that caught it running (state R), whichever is larger (a throttled process is
runnable without being on a CPU or in the run queue). A worker at 0.8 core spent 80% of its time
computing: it is CPU-bound on its one thread, not waiting on something else. With num_workers=0
the trainer's CPU also holds its other threads (intra-op pool, CUDA), and its loading is only
part of its time: the step hooks time the process's CPU inside DataLoader __next__ (`wcpu`, its
intra-op threads included) and its runnable share there is that CPU plus the step's run-queue
wait pro rata, over the waits (a loader sleeping 30 ms a batch beside a busy step read 'cpu' from
the main thread's state over the whole run, 56% running, while it ran 9% of its waits); without
those records (an older run), the main thread's sampled state (the CPU numbers when no state was
sampled).

'io' first when the loader was caught in disk sleep (state D) in >= 20% of the samples and at
least as often as it was runnable: a process blocked on storage a fifth of the time is
IO-limited for that share, and storage is the larger part of its time.

'cpu' when the loader was runnable at least half of its time: computing (or queued for a core)
is then the larger part of its time, so more parallel loaders on free cores, or less work per
sample, is the fix. This also covers saturated cores: a loader that waits for a CPU is in the
run queue (or throttled by a cgroup quota, running in state R), and that time counts as
runnable; a loader that sleeps on a busy machine does not.

'io' (only when not 'cpu': the loader is off-CPU more than half of its time) when any of
  * loader disk-sleep share >= 0.2: the loader processes themselves were caught in state D
    (uninterruptible sleep: waiting for block-device or network-filesystem IO) in at least a
    fifth of the samples. Page-cache hits and CPU work never show D, so a sampler catches D
    only when storage latency is a first-order part of the loader's time; at 20% removing it
    alone would make the loader 1.25x faster.
  * the loader reads from storage (read_bytes >= 1 MB/s: more than metadata and lazily
    imported modules) AND the system shows an IO stall: PSI io 'some' >= 0.2 of wall time (a
    task stalled on IO a fifth of the time; background logging and writeback stay at a few
    percent), or iowait >= 0.5 core (on average half a CPU idles waiting for IO: iowait is
    per-core time, so it is scaled by the core count rather than compared as a percent), or a
    disk busy >= 0.8 of wall time (iostat %util: the device had IO in flight nearly all the
    time). System-wide signals count only together with the loader's own reads, so another
    job's IO on the same host cannot make our loader look IO-bound.

'other' otherwise: the loader is off-CPU without evidence of storage waits - sockets or
remote object storage (S3/HTTP reads sleep in S, not D), locks, queues, sleeps, or the loader
is simply idle because the run is not input-bound (the rules only read the split for
input-bound runs).
"""

from __future__ import annotations

MIN_COVERED_S = 0.5          # seconds of loader time the IO/CPU split needs (analyze/system.py docstring)
# ... unless the trainer's own waits were timed (num_workers=0): its process CPU inside
# DataLoader __next__ comes from an exact clock (CLOCK_PROCESS_CPUTIME_ID, not 10 ms ticks), so
# a tenth of a second of waits, dozens of batches, gives the share (a 313-step run that waited
# 0.49 s on per-sample tensor conversions got no split, and no preprocessing fix)
MIN_TIMED_WAIT_S = 0.1
THREAD_CEILING = 1.0         # cores one thread can use: a worker's ceiling
RUNNABLE_SHARE = 0.5         # runnable share of that ceiling from which CPU is the larger part of the time
DISK_SLEEP_SHARE = 0.2       # loader samples in state D
READ_MB_S = 1.0              # loader storage reads that count as "reading from storage"
PSI_IO_SHARE = 0.2           # PSI io some: share of wall time with a task stalled on IO
IOWAIT_CORES = 0.5           # iowait expressed in cores
DISK_BUSY = 0.8              # busiest disk's share of wall time with IO in flight


def runnable_share(ld: dict, is_trainer: bool) -> float | None:
    """Share of its one thread's time the loader was runnable (the docstring above)."""
    if ld["cpu"] is None:
        return None
    by_cpu = min(1.0, (ld["cpu"] + (ld["runq"] or 0.0)) / THREAD_CEILING)
    if ld["running"] is None:
        return by_cpu
    return ld["running"] if is_trainer else max(by_cpu, ld["running"])


def split(m: dict, ld: dict, is_trainer: bool, notes) -> str | None:
    """'io', 'cpu', 'other', or None (too little loader time observed: a note says so)."""
    if ld["cpu"] is None or ld["covered_s"] < MIN_COVERED_S and not ld.get("timed"):
        where = "in the trainer's thread (no loader workers)" if is_trainer else "in the loader workers"
        seen = int(ld["covered_s"] * 100) / 100              # cut, not rounded: 0.498 s is not "0.50 s"
        notes.append(f"input split (IO or CPU) unknown: data loading {where} was observed for {seen:.2f} s in all, "
                     f"under the {MIN_COVERED_S} s the split needs (the run was too short to tell)")
        return None
    runnable = runnable_share(ld, is_trainer)
    d_share = ld["d"] or 0.0
    if d_share >= DISK_SLEEP_SHARE and d_share >= runnable:
        return "io"
    if runnable >= RUNNABLE_SHARE:
        return "cpu"
    if d_share >= DISK_SLEEP_SHARE:
        return "io"
    reading = ld["read"] is not None and ld["read"] >= READ_MB_S
    psi = m["system.psi_io_some_share"]
    iow = m["system.iowait_share"]
    ncpu = m["system.cpu_count"]
    disk = m["system.disk_busy_share"]
    stalled = ((psi is not None and psi >= PSI_IO_SHARE)
               or (iow is not None and ncpu and iow * ncpu >= IOWAIT_CORES)
               or (disk is not None and disk >= DISK_BUSY))
    if reading and stalled:
        return "io"
    return "other"
