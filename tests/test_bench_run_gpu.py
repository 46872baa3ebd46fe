"""bench/bench_run_gpu.py: skips without a GPU, and its mechanics (pairs, STEADY_MS, wall fallback,
ratios, interval) checked on tiny CPU scripts with --cpu."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "bench_run_gpu.py"


def _bench(*args):
    return subprocess.run([sys.executable, str(BENCH), *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_skips_with_a_clear_message_without_cuda(tmp_path):
    sys.path.insert(0, str(BENCH.parent))
    try:
        import bench_run_gpu
    finally:
        sys.path.pop(0)
    ok, what = bench_run_gpu.cuda_available()
    assert bench_run_gpu.steady_ms("loss 1.0\nSTEADY_MS 17.67\n") == 17.67
    assert bench_run_gpu.steady_ms("no line") is None
    lo, hi = bench_run_gpu.bootstrap_median([1.0, 1.1, 0.9, 1.05, 0.98])
    assert 0.9 <= lo <= 1.0 <= hi <= 1.1
    if ok:
        return                                            # a GPU machine: the bench runs for real
    r = _bench("--scripts-dir", tmp_path)
    assert r.returncode == 0 and "skipped: no CUDA GPU here" in r.stdout, r.stdout + r.stderr


def test_pairs_ratios_and_wall_fallback_on_cpu(tmp_path):
    (tmp_path / "steady.py").write_text("import time\ntime.sleep(0.2)\nprint('STEADY_MS 10.00')\n")
    (tmp_path / "nosteady.py").write_text("import sys, time\ntime.sleep(0.2)\nprint(sys.argv[1:])\n")
    out = tmp_path / "res.json"
    r = _bench("--cpu", "--pairs", "2", "--scripts-dir", tmp_path, "--args", "nosteady.py=--x 1",
               "--run-args=--no-trace", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    res = {x["script"]: x for x in json.loads(out.read_text())["results"]}
    s, w = res["steady.py"], res["nosteady.py"]
    assert s["measure"] == "steady_ms" and s["ratios"] == [1.0, 1.0] and s["target_met"]
    assert w["measure"] == "wall_s" and w["args"] == ["--x", "1"] and len(w["ratios"]) == 2
    assert all(x > 0.2 for x in w["bare"] + w["run"])
    assert "per-pair ratios: 1.000 1.000" in r.stdout and "steady.py pair 2" in r.stdout


def test_the_recorded_gpu_overhead_is_what_the_docs_say():
    """bench/overhead/ holds bench_run_gpu's JSON from GPU sessions; docs/project.md and
    bench/README.md quote the H200 record's per-pair step times and ratios: they must be its."""
    rec = json.loads((REPO / "bench" / "overhead" / "h200-2026-12-01.json").read_text())
    (res,) = rec["results"]
    assert res["script"] == "g_launch.py" and res["measure"] == "steady_ms" and len(res["ratios"]) == rec["pairs"]
    assert res["ratios"] == pytest.approx([r / b for b, r in zip(res["bare"], res["run"])])   # run over bare
    project = " ".join((REPO / "docs" / "project.md").read_text().split())
    for b, r in zip(res["bare"], res["run"]):
        assert f"{b:.2f}" in project and f"{r:.2f}" in project, (b, r)
    bench = " ".join((REPO / "bench" / "README.md").read_text().split())
    ratios = " and ".join(f"{x:.3f}" for x in res["ratios"])
    assert f"ratios {ratios}" in bench and f"median {res['median_ratio']:.3f}" in bench
