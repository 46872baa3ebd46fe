"""perfdoctor.analyze.arrays gives numpy's values without importing numpy.ma."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from perfdoctor.analyze import arrays


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 11, 1001])
def test_same_values_as_numpy(n):
    rng = np.random.default_rng(n)
    a = rng.random(n) * 1e3
    ints = rng.integers(0, 7, n)
    assert np.array_equal(arrays.unique(a), np.unique(a))
    assert np.array_equal(arrays.unique(ints), np.unique(ints))
    cand = rng.integers(0, 10, 4).astype(float)
    assert np.array_equal(arrays.isin(np.round(a) % 10, cand), np.isin(np.round(a) % 10, cand))
    assert not arrays.isin(a, np.zeros(0)).any()
    if n:
        assert arrays.median(a) == np.median(a)
        for q in (0, 10, 50, 90, 99, 100):
            assert arrays.percentile(a, q) == np.percentile(a, q)
    else:
        assert np.isnan(arrays.median(a)) and np.isnan(arrays.percentile(a, 90))


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_analysis_does_not_import_numpy_ma(tmp_path, device):
    """numpy.ma costs 20 ms of a cold `perfdoctor report`; np.unique/median/percentile/isin load it."""
    import tracegen as tg
    path = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=500, kernels=8, syncs=1, mallocs=1, frees=1)] * 4,
                          memory_events=True, device=device), path)
    code = ("import sys\nfrom perfdoctor.trace.loader import load_trace\n"
            "from perfdoctor.analyze.pipeline import analyze\n"
            f"a = analyze(load_trace({str(path)!r}))\n"
            "assert a.metrics['steps.count'] >= 3\n"
            "print('numpy.ma' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
