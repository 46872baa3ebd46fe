"""The profiler window's memory budget (collect/tracebudget.py, window.py "Memory"): past it, the
window first returns the free heap to the system and stops only when the process is still over.

The profiler's records, allocated between a step's tensors, fragment glibc's heap: the memory a
step frees stays resident and the next step takes new pages, so the resident size grows with the
script's tensor traffic, not with the events (an LSTMCell loop at batch 256: ~4 KB an event,
against ~0.27 KB an event once the free heap is returned). Counted as the profiler's, that cut an
LSTM's trace after 2 steps.
"""

from __future__ import annotations

import sys

import pytest
from runs import child, prun

from perfdoctor.collect import tracebudget as tb
from perfdoctor.collect import window as win_mod
from perfdoctor.collect.window import Window

MB = 2 ** 20
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc: Linux")


@linux
def test_releasing_the_free_heap_gives_back_what_a_fragmented_heap_kept():
    """Every other 64 KB block freed: the holes lie between live blocks, so free() keeps them
    resident (only the heap's top is trimmed); malloc_trim returns their pages."""
    blocks = [b"x" * (64 << 10) for _ in range(4000)]         # ~250 MB, below the mmap threshold
    del blocks[::2]                                           # ~125 MB of holes
    kept = tb.resident_bytes()
    assert tb.release_free_heap() is True
    freed = kept - tb.resident_bytes()
    assert freed > 80 * MB, freed / MB
    del blocks


def _window(tmp_path, monkeypatch, *, rss_after: int | None, can_release: bool = True) -> Window:
    """A window recording with a budget of 100 MB over 500 MB (limit 600 MB), its process at 650
    MB; returning the free heap leaves it at rss_after."""
    import threading
    w = Window(str(tmp_path), [], skip=1, active=5, memory=False, enabled=True, warmup_s=10, trace_s=10)
    w.state, w.limit, w.t_record, w.thread = "recording", (600 * MB, 100 * MB), 0.0, threading.get_ident()
    rss = {"now": 650 * MB}

    def release():
        if can_release and rss_after is not None:
            rss["now"] = rss_after
        return can_release
    monkeypatch.setattr(win_mod, "resident_bytes", lambda: rss["now"])
    monkeypatch.setattr(win_mod, "release_free_heap", release)
    return w


def test_a_window_past_its_budget_goes_on_when_returning_the_free_heap_brings_it_well_below(tmp_path, monkeypatch):
    w = _window(tmp_path, monkeypatch, rss_after=540 * MB)        # 60 MB below the limit: >= half the budget
    assert w._over_budget(1.0, force=True) is None
    assert [(t["after_s"], t["freed_mb"]) for t in w.trims] == [(1.0, 110)]
    assert w.info()["heap_trims"] == w.trims


def test_a_window_past_its_budget_stops_when_the_growth_is_not_free_heap(tmp_path, monkeypatch):
    # back under the limit but by less than half the budget: a trim at every check would follow
    w = _window(tmp_path, monkeypatch, rss_after=580 * MB)
    assert w._over_budget(1.0, force=True) == 580 * MB
    assert len(w.trims) == 1 and w.trims[0]["freed_mb"] == 70
    # nothing to return (the events themselves): the resident size as it is
    w = _window(tmp_path, monkeypatch, rss_after=650 * MB)
    assert w._over_budget(1.0, force=True) == 650 * MB
    # no glibc: the resident size as read, no trim recorded
    w = _window(tmp_path, monkeypatch, rss_after=None, can_release=False)
    assert w._over_budget(1.0, force=True) == 650 * MB and w.trims == []
    # under the limit: nothing is returned
    w = _window(tmp_path, monkeypatch, rss_after=100 * MB)
    monkeypatch.setattr(win_mod, "resident_bytes", lambda: 590 * MB)
    assert w._over_budget(1.0, force=True) is None and w.trims == []


# An LSTM cell over 40 time steps at batch 256: ~5.5k profiler events a step, and ~20-70 MB of
# tensors a step that the profiler's records keep the heap from reusing.
LSTM_CELL = r"""
import sys
import torch, torch.nn as nn
torch.manual_seed(0); torch.set_num_threads(1)
cell, head = nn.LSTMCell(16, 128), nn.Linear(128, 1)
opt = torch.optim.Adam([*cell.parameters(), *head.parameters()], 1e-3)
x, t = torch.randn(40, 256, 16), torch.randn(256, 1)
for i in range(int(sys.argv[1])):
    opt.zero_grad()
    h = c = torch.zeros(256, 128)
    for xt in x:
        h, c = cell(xt, (h, c))
    nn.functional.mse_loss(head(h), t).backward()
    opt.step()
print("done")
"""


@linux
def test_an_lstm_loop_whose_heap_the_profiler_fragments_gets_all_its_trace_steps(tmp_path):
    """At a 32 MB budget the window recorded 2 of 5 steps (the process grew 51 MB over 12.9k
    events, ~4 KB an event); returning the free heap once (~40 MB) lets it record all 5."""
    pytest.importorskip("torch", reason="perfdoctor run tests need torch (test dependency)")
    script = tmp_path / "lstm_cell.py"
    script.write_text(LSTM_CELL)
    out = tmp_path / "run"
    r = prun("--no-stacks", "--skip-steps", 3, script, 14, out=out, env={"PERFDOCTOR_TRACE_MB": "32"})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "done\n"
    w = child(out)["window"]
    assert w["budget_mb"] == 32 and w["cut"] is None and w["recorded_steps"] == 5, w
    if not w["heap_trims"]:          # a full-suite run once: the heap stayed under half the budget
        pytest.skip("the profiler's events did not fragment the heap this time (no trim was needed; all 5 "
                    "steps recorded): the trim went untested")
    assert w["heap_trims"][0]["freed_mb"] >= 16, w["heap_trims"]
    assert len(w["heap_trims"]) <= 3                    # at most one per half budget of growth


GRU_RSS = r"""
import re, torch, torch.nn as nn
def rss(): return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1)) // 1024
torch.manual_seed(0)
m = nn.GRU(64, 128, batch_first=True); opt = torch.optim.Adam(m.parameters())
for i in range(60):
    out, h = m(torch.randn(16, 200, 64)); out.sum().backward(); opt.step(); opt.zero_grad()
print("rss", rss())
"""


@linux
def test_the_job_gives_back_the_profilers_memory_once_the_window_is_written(tmp_path):
    """A GRU loop (a user's: 348 MB bare) stayed ~200 MB larger for the rest of its run after the
    trace window: torch's profile object kept the events in a reference cycle until a full
    collection, and glibc kept their heap. The window lets go of them and returns the heap."""
    from runs import bare
    script = tmp_path / "gru.py"
    script.write_text(GRU_RSS)
    alone = bare(script)
    assert alone.returncode == 0, alone.stderr
    r = prun(script, out=tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert child(tmp_path / "run")["profiler"] == "done"
    mb_bare, mb_run = int(alone.stdout.split()[-1]), int(r.stdout.split()[-1])
    # 345 MB bare: 536 MB under `run` before, 401 MB after (the hooks, the samplers' reads)
    assert mb_run - mb_bare < 110, (mb_bare, mb_run)
