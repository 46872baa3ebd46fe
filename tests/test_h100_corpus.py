"""The H100 corpus (../shared/traces/h100, README there): run directories recorded with
`perfdoctor run` on an H100, each with the speed-up measured when its bottleneck was fixed.

For every case: the verdict, the fix that measured best ranks first, and the expected gain of
the applied fix(es) is within 25% of the measured speed-up (several fixes applied together:
their savings add, rules.gain.combined). Skipped where ../shared is absent (a user's clone)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from perfdoctor.diagnose.offline import diagnose_path
from perfdoctor.rules.gain import combined, stacked

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
from validate_holdout import judge  # noqa: E402  (the held-out check's range, stacked as it stacks them)

sys.path.remove(str(BENCH))

pytestmark = pytest.mark.integration

# name -> (verdict prefix, first fix, fixes applied, measured speed-up), from the corpus README
CASES = {
    "compute": ("device", "mixed-precision", ["mixed-precision", "channels-last"], 70.84 / 34.06),
    "loader": ("input", "loader-workers", ["loader-workers", "pin-memory"], 202.5 / 58.2),
    # channels_last was never measured on the sync script (ResNet-18, fp32, NCHW): it is expected
    # 1.31x there against pinned memory's 1.30x, and measured 1.46-2.31x on three H200 CNNs
    # (bench/holdout/h200-2026-12-01.json), so either may lead until a GPU session measures it
    "sync": ("device", ("pin-memory", "channels-last"), ["pin-memory", "remove-host-syncs"], 41.22 / 29.40),
    "launch": ("host", "fused-optimizer", ["fused-optimizer"], 17.67 / 7.74),
}


@pytest.fixture(scope="module")
def corpus(shared_traces):
    root = shared_traces / "h100"
    if not root.is_dir():
        pytest.skip("../shared/traces/h100 is absent")
    return root


def fixes(doc: dict) -> dict:
    return {f["slug"]: f for f in doc["findings"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_measured_fix_ranks_first_and_is_sized(corpus, name):
    verdict, first, applied, measured = CASES[name]
    doc = diagnose_path(str(corpus / name))
    assert doc["verdict"]["bound"].startswith(verdict), doc["verdict"]["summary"]
    assert doc["findings"][0]["slug"] in ((first,) if isinstance(first, str) else first), \
        [f["slug"] for f in doc["findings"][:3]]
    found = fixes(doc)
    expected = stacked({s: found[s]["gain"] for s in applied}, lambda g: g["expected"])
    assert expected == pytest.approx(measured, rel=0.25), (expected, measured)
    # and the measurement lies inside the range (the loader's low end was the no-overlap model
    # itself, 3.58x with pinning's 1.03x: 3.78x, above the 3.5x measured, before the workers'
    # contention widened it)
    low, high = judge(doc, applied, measured)["range"]
    assert low <= measured <= high, (low, high, measured)
    for s in applied:   # every expected gain lies under its ceiling
        g = found[s]["gain"]
        assert g["ceiling"] is None or g["expected"] <= g["ceiling"] + 1e-9
    # and no measurement beats the ceilings: they bound the share of an un-profiled step (launch's
    # traced steps ran 1.16x longer than its steady ones; on the traced share alone the fused
    # optimizer's ceiling was 2.04x, under the 2.28x measured)
    ceilings = [found[s]["gain"]["ceiling"] for s in applied]
    assert None in ceilings or combined(ceilings) >= measured, (ceilings, measured)


def test_launch_compile_with_fused_optimizer(corpus):
    """compile(mode="reduce-overhead") + fused Adam measured 6.0x; both are offered, and their
    combined expected gain is within 25%; the measurement does not beat the compile ceiling."""
    doc = diagnose_path(str(corpus / "launch"))
    found, m = fixes(doc), doc["traces"][0]["metrics"]
    compile_, fused = found["compile-reduce-overhead"]["gain"], found["fused-optimizer"]["gain"]
    assert combined([compile_["expected"], fused["expected"]]) == pytest.approx(17.67 / 2.93, rel=0.25)
    # host work is 92% of a traced step, and the traced steps ran 1.16x longer than the steady
    # ones: the profiler lengthens the host's ops, so un-profiled the host share is smaller (the
    # device's 8% keeps its milliseconds: 91% of a steady step). The ceiling keeps the traced
    # share, the expected gain the steady one.
    assert m["run.trace_inflation"] == pytest.approx(1.16, abs=0.01)
    assert compile_["ceiling_share"] == compile_["share"] == pytest.approx(m["share.host"], abs=0.01)
    assert compile_["ceiling"] == pytest.approx(1 / (1 - m["share.host"]), rel=0.02)
    assert compile_["ceiling"] > 17.67 / 2.93


def test_alloc_names_empty_cache_and_claims_no_allocator_miracle(corpus):
    """empty_cache every step: removing it measured 1.04x. The calls are named, the expected
    gain matches, and no allocator fix claims more than 1.3x (host API time that overlaps
    device work is not step time). Mixed precision ranks above it on its own evidence: 65%
    of the step is fp32 SIMT GEMMs on an H100 (not measured in the corpus)."""
    doc = diagnose_path(str(corpus / "alloc"))
    found = fixes(doc)
    empty = found["remove-empty-cache"]
    assert empty["ranked"] and empty["evidence"]["memory.empty_cache_per_step"] == pytest.approx(1.0)
    assert empty["gain"]["expected"] == pytest.approx(120.97 / 115.95, rel=0.25)
    for slug in ("remove-empty-cache", "expandable-segments", "fixed-shapes"):
        if slug in found:
            assert found[slug]["gain"]["ceiling"] <= 1.3
    assert doc["findings"][0]["slug"] == "mixed-precision"
    assert "shape-churn" in {f["slug"] for f in doc["flags"]}


def test_busy_device_gets_no_sync_flag(corpus):
    doc = diagnose_path(str(corpus / "compute"))
    assert "host-device-sync" not in {f["slug"] for f in doc["flags"]}
    assert doc["traces"][0]["metrics"]["share.device"] >= 0.95


@pytest.mark.parametrize("name", ["alloc", "compute"])
def test_the_sync_after_the_last_step_is_no_steps(corpus, name):
    """`alloc` and `compute` call no sync in their loops; each trace has one cudaDeviceSynchronize
    after the last step's host range (`perfdoctor run` stopping the profiler), inside the last
    step extended to its device work, and the last Optimizer.step span runs on over it. It read as
    0.2 syncs per step blocking 17% (alloc) / 24% (compute) of the step, PD303 ranked above
    PD343 on an edit of `alloc`, and optimizer.step_share was 21% / 28%."""
    doc = diagnose_path(str(corpus / name))
    m = doc["traces"][0]["metrics"]
    assert m["sync.per_step"] == 0 and m["sync.share"] == 0 and m["sync.exposed_idle_share"] == 0
    assert "host-device-sync" not in {f["slug"] for f in doc["flags"]}
    assert "remove-host-syncs" not in fixes(doc)
    assert m["optimizer.step_share"] < 0.05
    if name == "alloc":     # the allocator's idle is PD343's alone
        assert fixes(doc)["remove-empty-cache"]["ranked"]


def test_sync_gain_rests_on_the_idle_the_syncs_expose(corpus):
    """`sync`: pageable copies and two .item() per step. The host blocks 27% of the step, but
    while it waits the device mostly works: the syncs expose 9% of the step as device idle, which
    is PD303's share (with PD302: expected 1.47x, measured 1.40x)."""
    doc = diagnose_path(str(corpus / "sync"))
    m = doc["traces"][0]["metrics"]
    assert m["sync.share"] > 0.25 and 0.08 < m["sync.exposed_idle_share"] < 0.1
    assert m["sync.exposed_idle_share"] <= m["gpu.idle_share"]
    assert "host-device-sync" in {f["slug"] for f in doc["flags"]}
    syncs = fixes(doc)["remove-host-syncs"]
    assert syncs["ranked"] and syncs["gain"]["share"] == pytest.approx(m["sync.exposed_idle_share"])


def test_framework_runs_diagnose(corpus):
    """Lightning and HF Trainer traces (no measured fix): a verdict and ranked fixes, and the
    bf16 HF run is not told to use mixed precision. `launch_compiled` has its verdict, and no
    ranked fix: it replays CUDA graphs already (tests/test_graph_replay.py)."""
    for name in ("hf", "lightning", "launch_compiled"):
        doc = diagnose_path(str(corpus / name))
        assert doc["verdict"]["bound"] != "inconclusive", name
        assert any(f["ranked"] for f in doc["findings"]) is (name != "launch_compiled"), name
    assert "mixed-precision" not in fixes(diagnose_path(str(corpus / "hf")))
    # its host time inside the fused optimizer's step (21%) is offered to compilation, bounded by
    # that share; the model compiled already, no compile fix is
    compiled = fixes(diagnose_path(str(corpus / "launch_compiled")))
    opt = compiled["compile-optimizer-step"]
    assert not opt["ranked"] and 1.25 < opt["gain"]["ceiling"] < 1.5, opt["gain"]
    assert not {"compile-reduce-overhead", "compile-fuse", "fused-optimizer"} & set(compiled)


def test_host_bound_runs_without_a_memory_profile_are_offered_a_larger_batch(corpus):
    """The corpus runs were recorded without --memory: the trace has no reserved memory, and the
    larger-batch fix (PD313) and the headroom flag (PD208) had stayed unknown on four host-bound
    runs. NVML's peak used (all processes, the CUDA context too: at least the reserved) stands in
    as an upper bound, here 2-4% of the device."""
    for name in ("hf", "lightning", "launch", "launch_compiled"):
        doc = diagnose_path(str(corpus / name))
        m = doc["traces"][0]["metrics"]
        assert m["memory.peak_reserved_fraction"] is None, name
        assert m["memory.used_fraction_peak"] == m["gpu.memory_used_fraction_peak"] < 0.05, name
        assert "memory-headroom" in {f["slug"] for f in doc["flags"]}, name
        if doc["verdict"]["bound"] == "host":
            batch = fixes(doc)["larger-batch"]
            assert batch["summary"].startswith(f"At most {100 * m['memory.used_fraction_peak']:.1f}% of device memory"), name


def test_docs_quote_the_calibration_table_the_bench_prints(corpus, capsys):
    """docs/rules.md quotes bench/calibrate_corpus.py's table: the code is the source (it had
    gone stale by a point on two rows and a ceiling)."""
    sys.path.insert(0, str(BENCH))
    try:
        import calibrate_corpus
        assert calibrate_corpus.main(["--corpus", str(corpus)]) == 0
    finally:
        sys.path.remove(str(BENCH))
    table = capsys.readouterr().out.strip()
    assert table.count("\n") >= 6
    docs = (BENCH.parent / "docs" / "rules.md").read_text()
    assert table in docs, "docs/rules.md's calibration table differs: paste bench/calibrate_corpus.py's output"
