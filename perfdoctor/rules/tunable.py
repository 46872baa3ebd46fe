"""The settings `perfdoctor tune` can change, and the fix rules whose gain each one measures.

tune/plan.py plans its trials from this table (which rule predicts a trial: the first of its
rules the report ranked); a run's report ends with the command that measures those of its fixes
a trial can test (`tune_command`, printed under `run`'s fixes), and `rules show` the command
that measures a fix (`knobs_of`).
"""

from __future__ import annotations

import shlex

# Fix rule whose expected gain predicts each knob (first one present in the report wins).
KNOB_RULES = {"num_workers": ("PD301",), "persistent_workers": ("PD356", "PD301"), "prefetch_factor": ("PD301",),
              "pin_memory": ("PD302",), "threads": ("PD341", "PD346", "PD348"), "optimizer": ("PD338",),
              "autocast": ("PD320", "PD375"), "compile": ("PD311", "PD344", "PD312"), "expandable_segments": ("PD324",),
              "cudnn_benchmark": (), "tf32": ("PD320",), "recompute": ("PD345",), "float32": ("PD357", "PD368"),
              "empty_cache": ("PD343",), "save_every": ("PD350",), "channels_last": ("PD342", "PD392"),
              "keep_iterator": ("PD355",), "index_batches": ("PD358",), "store_samples": ("PD306",),
              "anomaly": ("PD374",), "distribution_checks": ("PD379",), "attention_dropout": ("PD381",),
              "batch_scale": ("PD385",), "gather_select": ("PD386",), "keep_host_memory": ("PD393",)}
NO_WORKERS_RULE = "PD347"       # num_workers=0, tried from a script that has workers
WORKERS_RULE = "PD301"          # its model's [gain.let] `workers` (from none) and `added` (to some)
CUDA_ONLY = frozenset({"pin_memory", "cudnn_benchmark", "tf32", "expandable_segments", "empty_cache"})
# Fixes a trial tests whose rule rests on the Python stacks alone (its condition names stacks.*
# metrics only): tune's baseline must record them (--stacks) for the rule to fire and its trial to
# be planned, where the auto mode, as `run`'s, leaves them out on a busy machine (test_tune_only
# checks this against the rules)
STACKS_ONLY = frozenset({"PD379"})
OPT_IN = {"autocast": "--allow-numerics", "float32": "--allow-numerics", "compile": "--allow-compile",
          "attention_dropout": "--allow-numerics", "batch_scale": "--allow-numerics"}


def knob_lets(changes: dict, current_workers: int, modelled: dict) -> dict | None:
    """The [gain.let] values a trial's setting gives WORKERS_RULE's model: the workers it tries,
    at most as many as the model credits (`modelled`: its own lets, from the report's metrics: the
    cores a computing loader's workers would get, or 8 for one that waits), so that 1 and 2 workers
    are not both predicted the gain of 8 (a user trial: "8.67x" beside measured 1.12x and 2.27x).
    None: the trial sets no worker count, or the model has none to replace."""
    n = changes.get("num_workers")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return None
    out = {}
    if isinstance(modelled.get("workers"), (int, float)):
        out["workers"] = min(float(n), modelled["workers"])
    if isinstance(modelled.get("added"), (int, float)) and n > current_workers:
        out["added"] = min(float(n - current_workers), modelled["added"])
    return out or None


def fixes_tested() -> frozenset[str]:
    """Every fix id some trial can test."""
    return frozenset(r for rules in KNOB_RULES.values() for r in rules) | {NO_WORKERS_RULE}


def knobs_of(fix_id: str) -> list[str]:
    """The settings whose trials test `fix_id` (empty: a code change tune cannot make)."""
    return (["num_workers"] if fix_id == NO_WORKERS_RULE else
            [k for k, rules in KNOB_RULES.items() if fix_id in rules])


def tune_command(fix_ids: list[str], command: str | None, cuda: bool, nproc: int | None = None) -> str | None:
    """`perfdoctor tune --only ...` for those of `fix_ids` (the report's fixes, in its order) that
    a trial on this device can measure, with the opt-in flags their trials need, --stacks where
    one rests on the stacks alone (STACKS_ONLY), and --nproc-per-node for a job of `nproc` ranks;
    None when none can, or the script's command line is unknown."""
    if not command:
        return None
    ids, flags = [], []
    for fid in fix_ids:
        knobs = [k for k in knobs_of(fid) if cuda or k not in CUDA_ONLY]
        if knobs and fid not in ids:
            ids.append(fid)
            flags += [OPT_IN[k] for k in knobs if k in OPT_IN and OPT_IN[k] not in flags]
    if not ids:
        return None
    if STACKS_ONLY.intersection(ids):
        flags.append("--stacks")
    ranks = ["--nproc-per-node", str(nproc)] if nproc else []
    return shlex.join(["perfdoctor", "tune", *ranks, "--only", ",".join(ids), *flags]) + " " + command
