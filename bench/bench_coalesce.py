"""What coalescing small gradient all-reduces saves on gloo (CPU), as ratios within one run.

    python bench/bench_coalesce.py [--world 2] [--rounds 30] [--counts 10 50] [--totals 40000 400000 4000000]

Two (--world) gloo ranks on this machine, spawned with torch.multiprocessing. For each count N of
tensors and total size T bytes (float32, T/N bytes each), interleaved within each round:
- separate: N dist.all_reduce calls, one per tensor, as a loop over model.parameters() does;
- flat: one all_reduce of a flat buffer holding the N tensors (torch.cat, reduce, copy back), what
  DDP's buckets do;
- coalesced: dist.all_reduce_coalesced(tensors) where this torch still has it (gloo flattens them).
Times are per round (all N tensors), medians over --rounds after 3 warm-up rounds, from rank 0,
after a barrier so the ranks start together. Printed: the medians, separate/flat, and the fixed
cost per call that a linear model t(N, T) = N * a + T / B fits from separate vs flat
(a = (separate - flat) / (N - 1)).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _rank(rank: int, world: int, port: int, counts: list[int], totals: list[int], rounds: int, q) -> None:
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    has_coalesced = hasattr(dist, "all_reduce_coalesced")
    rows = []
    for n in counts:
        for total in totals:
            tensors = [torch.randn(max(1, total // 4 // n)) for _ in range(n)]

            def separate():
                for t in tensors:
                    dist.all_reduce(t)

            def flat():
                buf = torch.cat(tensors)
                dist.all_reduce(buf)
                for t, v in zip(tensors, torch._utils._unflatten_dense_tensors(buf, tensors)):
                    t.copy_(v)

            def coalesced():
                import warnings
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    dist.all_reduce_coalesced(tensors)
            ways = {"separate": separate, "flat": flat}
            if has_coalesced:
                ways["coalesced"] = coalesced
            times: dict[str, list[float]] = {k: [] for k in ways}
            for r in range(rounds + 3):
                order = list(ways) if r % 2 == 0 else list(reversed(ways))
                for k in order:
                    dist.barrier()
                    t0 = time.perf_counter()
                    ways[k]()
                    dt = time.perf_counter() - t0
                    if r >= 3:
                        times[k].append(dt)
            rows.append((n, total, {k: statistics.median(v) * 1e3 for k, v in times.items()}))
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--counts", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--totals", type=int, nargs="+", default=[40_000, 400_000, 4_000_000])
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args(argv)
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, a.world, a.port, a.counts, a.totals, a.rounds, q))
             for r in range(a.world)]
    for p in procs:
        p.start()
    rows = q.get(timeout=1800)
    for p in procs:
        p.join()
    print(f"gloo, world {a.world}, medians of {a.rounds} interleaved rounds (ms per round of N tensors)")
    print(f"{'N':>4} {'total':>10} {'each':>9} {'separate':>9} {'flat':>8} {'coalesced':>9} {'sep/flat':>8} {'ms/call':>8}")
    for n, total, t in rows:
        co = t.get("coalesced")
        per_call = (t["separate"] - t["flat"]) / (n - 1) if n > 1 else float("nan")
        print(f"{n:>4} {total:>10,} {total // n:>9,} {t['separate']:>9.3f} {t['flat']:>8.3f} "
              f"{co if co is not None else float('nan'):>9.3f} {t['separate'] / t['flat']:>8.2f} {per_call:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
