"""Held-out check of perfdoctor's advice on GPU scripts that are not in the H100 corpus.

    python bench/validate_holdout.py [--pairs 3] [--set h3] [--only h_attention.py ...] [--json FILE]
                                     [--keep DIR] [--cpu] [--steps N]

Each script in bench/holdout/ has a known bottleneck and a textbook fix behind `--fixed`
(hand-written attention -> SDPA, fp32 -> bf16 autocast, a checkpoint every step -> every 100,
unfused elementwise kernels -> torch.compile, every block checkpointed -> none). The h2_* scripts
are a second set of the same fixes on other models, written after the gain models were fitted to
the first set's H200 measurements; the h3_* scripts a third, written once the models were revised
on the second; h4_* the corpus's other bottlenecks; h5_* and h6_* (2026-12-04) a loader, a
checkpoint, attention, precision and layout on other models; h7_* fixes not measured before
(float64, anomaly detection, evaluation and logging in the loop, workers restarted each epoch)
and bf16 on an LSTM. Each set was committed before its first run, and the outcome of that run is
kept (bench/holdout/*.json). Not yet run: h6_ckpt_every25.py (run it first, as it comes), then
the h7 set. For each one this runs, on this machine:

1. the script bare and with `--fixed`, in interleaved pairs (order alternating), each printing
   its own steady step time (`STEADY_MS`); measured speed-up = mean bare / mean fixed;
2. `perfdoctor run --stacks` on the bare script, and reads its report.json;
3. prints, per script, where perfdoctor ranks the fix that was applied, its expected gain, range
   and ceiling, the measured speed-up, the error, and whether the issue's bar is met (the applied
   fix ranks first; expected within 25% of measured; the measurement never beats the ceiling).

GPU only: without CUDA it says so and exits 0. `--cpu` runs it anyway with `--small` sizes, to
check the harness itself (the numbers then say nothing about GPUs); `--steps N` runs each script
N steps instead of its own default (a quicker check). Add a row to
../shared/traces/h100/README.md and the run directory to the corpus when a script's result is
worth keeping (`--keep DIR` keeps the run directories).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run_gpu import cuda_available, steady_ms  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HOLDOUT = REPO / "bench" / "holdout"
# script -> the fix rules (slugs) that make the change its --fixed applies
APPLIED = {
    "h_attention.py": ["flash-attention"],
    "h_precision.py": ["mixed-precision"],
    "h_checkpoint.py": ["checkpoint-off-the-step"],
    "h_fusion.py": ["compile-fuse"],
    "h_recompute.py": ["recompute-less"],
    # a second set, written after the models were fitted to the first (2026-11-26)
    "h2_tf32_mixer.py": ["mixed-precision"],
    "h2_padded_attention.py": ["flash-attention"],
    "h2_checkpoint_every5.py": ["checkpoint-off-the-step"],
    "h2_fusion_gelu.py": ["compile-fuse"],
    "h2_recompute_cnn.py": ["recompute-less"],
    # a third set, written when the models were final (2026-11-26) and not yet run on a GPU: run
    # it before changing any model, so that it stays held out
    "h3_vit_fp32.py": ["mixed-precision"],
    "h3_cross_attention.py": ["flash-attention"],
    "h3_safetensors_every2.py": ["checkpoint-off-the-step"],
    "h3_llama_mlp.py": ["compile-fuse"],
    "h3_recompute_gpt_devicebound.py": ["recompute-less"],
    # a fourth set (2026-11-30): the corpus's other bottlenecks (input, syncs, launches, the
    # allocator), which no held-out script had yet, on other models; run once as written
    "h4_loader_spectrogram.py": ["loader-workers", "pin-memory"],
    "h4_sync_metrics.py": ["pin-memory", "remove-host-syncs"],
    "h4_foreach_off_moe.py": ["fused-optimizer"],
    "h4_empty_cache_cnn.py": ["remove-empty-cache"],
    # a fifth set (2026-12-04), written and committed before its only run: Python tokenisation in
    # the trainer, a checkpoint every 10th step, SDPA forced onto its math path, a TF32 temporal
    # CNN, a UNet in NCHW
    "h5_loader_tokenize.py": ["loader-workers", "pin-memory"],
    "h5_ckpt_every10.py": ["checkpoint-off-the-step"],
    "h5_math_sdpa.py": ["flash-attention"],
    "h5_tcn_fp32.py": ["mixed-precision"],
    "h5_channels_first_unet.py": ["channels-last"],
    # a sixth set (2026-12-04), written after the h5 revisions to test them out of sample: an
    # attention upcast to fp32 by hand, a loader augmenting images on the CPU for a ViT, and
    # a checkpoint every 25th step
    "h6_upcast_attention.py": ["flash-attention"],
    "h6_loader_augment_vit.py": ["loader-workers", "pin-memory"],
    "h6_ckpt_every25.py": ["checkpoint-off-the-step"],
    # a seventh set (2026-12-04, third session), written with no GPU lent and committed before any
    # run: fixes no held-out script had measured yet (float64, anomaly detection, evaluation and
    # logging inside the loop, workers restarted every epoch) and precision on recurrent kernels
    "h7_lstm_fp32.py": ["mixed-precision"],
    "h7_float64_pinn.py": ["float32-not-float64"],
    "h7_anomaly_gpt.py": ["anomaly-detection-off"],
    "h7_eval_every4.py": ["evaluate-less-often"],
    "h7_short_epochs.py": ["persistent-workers"],
    "h7_log_grad_norms.py": ["log-less-often"],
}
TOLERANCE = 0.25
NOISE = 1.05        # what a measurement may lie past a ceiling or a range's end by: its own noise


def timed(script: Path, extra: list[str]) -> float:
    r = subprocess.run([sys.executable, str(script), *extra], capture_output=True, text=True)
    ms = steady_ms(r.stdout)
    if r.returncode != 0 or ms is None:
        raise SystemExit(f"{script.name} {' '.join(extra)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return ms


def measure(script: Path, pairs: int, small: list[str]) -> tuple[list[float], list[float]]:
    bare, fixed = [], []
    for i in range(pairs):
        for arm in (("bare", "fixed") if i % 2 == 0 else ("fixed", "bare")):
            (bare if arm == "bare" else fixed).append(timed(script, small + (["--fixed"] if arm == "fixed" else [])))
    return bare, fixed


def diagnose(script: Path, out: Path, small: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--stacks", "--out", str(out), str(script), *small],
                       capture_output=True, text=True)
    if r.returncode != 0 or not (out / "report.json").is_file():
        raise SystemExit(f"perfdoctor run {script.name} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads((out / "report.json").read_text())


def judge(doc: dict, slugs: list[str], measured: float) -> dict:
    from perfdoctor.rules.gain import combined, stacked

    ranked = [f["slug"] for f in doc["findings"]]
    gains = {f["slug"]: f["gain"] for f in doc["findings"]}
    got = {s: gains.get(s) or {} for s in slugs}
    exp = stacked(got, lambda g: g.get("expected"))
    cap = combined([g["ceiling"] for g in got.values()]) if all(g.get("ceiling") for g in got.values()) else None
    ranks = [ranked.index(s) + 1 if s in ranked else None for s in slugs]
    rng = [stacked(got, lambda g, k=k: (g.get("range") or [g.get("expected")] * 2)[k]) for k in (0, 1)] if exp else None
    return {"fixes": slugs, "ranks": ranks, "first": ranked[:1], "expected": exp, "ceiling": cap, "range": rng,
            "measured": measured, "error": exp / measured - 1 if exp else None,
            "ranked_first": 1 in ranks, "within": exp is not None and abs(exp / measured - 1) <= TOLERANCE,
            "ceiling_holds": cap is None or measured <= cap * NOISE,
            "in_range": rng is not None and rng[0] <= measured * NOISE and measured <= rng[1] * NOISE}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--only", nargs="*", choices=sorted(APPLIED))
    ap.add_argument("--set", choices=["h", "h2", "h3", "h4", "h5", "h6", "h7"], help="only the scripts of one set (h_*, h2_*, ..., h7_*)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--keep", type=Path, help="keep the perfdoctor run directories here")
    ap.add_argument("--cpu", action="store_true", help="run without CUDA (--small sizes): checks the harness only")
    ap.add_argument("--steps", type=int, help="steps each script runs (default: its own)")
    a = ap.parse_args(argv)
    ok, what = cuda_available()
    print(f"# {what}")
    if not ok and not a.cpu:
        print("no CUDA device: nothing measured (--cpu checks the harness on the CPU)")
        return 0
    small = ([] if ok else ["--small"]) + ([] if a.steps is None else ["--steps", str(a.steps)])
    rows = {}
    tmp = Path(tempfile.mkdtemp(prefix="perfdoctor-holdout-"))
    try:
        print("| script | fix applied (rank) | perfdoctor's first fix | expected | range | ceiling | measured | error | bar |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name in [n for n in a.only or APPLIED if a.set is None or n.startswith(a.set + "_")]:
            script = HOLDOUT / name
            bare = fixed = None
            try:                  # one script that fails must not cost the others their turn
                bare, fixed = measure(script, a.pairs, small)
                measured = statistics.mean(bare) / statistics.mean(fixed)
                out = (a.keep or tmp) / name.removesuffix(".py")
                doc = diagnose(script, out, small)
            except SystemExit as e:
                print(f"| {name} | failed: {str(e)[-300:]!r} |", flush=True)
                if a.json and bare is not None:   # the measurement stands without its diagnosis
                    rows[name] = {"bare_ms": bare, "fixed_ms": fixed, "error": str(e)[-2000:]}
                    a.json.write_text(json.dumps({"device": what, "rows": rows}, indent=1))
                continue
            # the run's metrics travel in the results: record_holdout.py can keep them without the run directory
            row = judge(doc, APPLIED[name], measured) | {"bare_ms": bare, "fixed_ms": fixed,
                                                         "metrics": doc["traces"][0]["metrics"]}
            rows[name] = row
            fmt = lambda v: "-" if v is None else ("unbounded" if v == float("inf") else f"{v:.2f}x")  # noqa: E731
            fixes = ", ".join(f"{s} (#{r})" if r else f"{s} (absent)" for s, r in zip(row["fixes"], row["ranks"]))
            bar = "met" if row["ranked_first"] and row["within"] and row["ceiling_holds"] and row["in_range"] else "NOT met"
            rng = f"{fmt(row['range'][0])}-{fmt(row['range'][1])}" if row["range"] else "-"
            err = f"{100 * row['error']:+.0f}%" if row["error"] is not None else "-"
            print(f"| {name} | {fixes} | {(row['first'] or ['-'])[0]} | {fmt(row['expected'])} | {rng} | "
                  f"{fmt(row['ceiling'])} | {measured:.2f}x | {err} | {bar} |", flush=True)
            if a.json:  # after every row: a run stopped at its time limit keeps what it measured
                a.json.write_text(json.dumps({"device": what, "rows": rows}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
