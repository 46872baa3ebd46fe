"""Communication metrics and the fixes that read them (analyze/comm.py; PD334, PD335), on DDP-like
traces whose collectives, backward and optimizer steps are placed by construction (tracegen)."""

from __future__ import annotations

import pytest

import tracegen as tg
from perfdoctor.rules.engine import evaluate
from perfdoctor.rules.gain import amdahl
from perfdoctor.rules.loader import load_rules

S = tg.StepSpec
RULES = load_rules()
# 16 ops of 200 us kernels (the last 8 backward), 4 all-reduces of 3 ms: a slow link
DDP = dict(cpu_ops_us=2000, kernels=16, kernel_us=200, nccl_kernels=4, nccl_us=3000, backward=True)


def ddp(sync_every=1, in_backward=True, optimizer=True, others=0, **kw):
    """8 micro-batch steps; the last of every `sync_every` all-reduces (no_sync() on the others, which
    launch `others` collectives) and steps the optimizer."""
    steps = [S(**{**DDP, **kw, "nccl_kernels": DDP["nccl_kernels"] if (i + 1) % sync_every == 0 else others},
               nccl_in_backward=in_backward, optimizer=optimizer and (i + 1) % sync_every == 0) for i in range(8)]
    return tg.TraceSpec(steps=steps, rank=0, world_size=8)


def diagnose(analyze_spec, spec):
    a, _ = analyze_spec(spec)
    d = evaluate(RULES, a.metrics)
    return a, {f.rule.id: f for f in d.fixes}


def test_buckets_all_reduced_during_backward_are_not_sent_to_overlap(analyze_spec):
    a, fixes = diagnose(analyze_spec, ddp())
    m = a.metrics
    # the all-reduces follow backward ops 2, 4, 6 and 8 of 8: three of four are launched with
    # 3/4, 1/2 and 1/4 of the backward's compute still to come; the last as backward ends
    assert m["comm.launched_in_backward"] == pytest.approx(0.75)
    assert m["comm.exposed_share"] >= 0.05 and m["comm.overlap"] < 0.5      # PD335's old condition held
    assert "PD335" not in fixes
    # what is left: fewer synchronisations, the transport, the interconnect
    assert {"PD334", "PD336", "PD340"} <= set(fixes)
    assert m["comm.sync_steps"] == 8 and m["steps.count"] == 8
    assert "synchronised in 8 of the 8 steps analysed" in fixes["PD334"].summary
    assert fixes["PD334"].ceiling == pytest.approx(amdahl(m["comm.exposed_share"], 4))


def test_the_host_ran_ahead_so_launches_are_placed_by_the_steps_host_ranges(analyze_spec):
    a, _ = analyze_spec(ddp())
    st = a.steps
    # the device (12 ms of collectives a step) lags the host (2 ms a step) further every step:
    # by the last step, its device window begins after several steps' host ranges have ended
    assert st.start[-1] > st.host_end[-3]
    launches = (st.host_start + st.host_end) / 2
    assert st.host_range_of(launches).tolist() == list(range(8))
    assert st.index_of(launches).tolist() != list(range(8))


def test_all_reduce_after_backward_is_sent_to_overlap_within_its_ceiling(analyze_spec):
    a, fixes = diagnose(analyze_spec, ddp(in_backward=False))
    m = a.metrics
    assert m["comm.launched_in_backward"] == 0.0
    f = fixes["PD335"]
    exposed, total, compute = m["comm.exposed_share"], m["comm.share"], m["share.device"]
    # perfectly overlapped the step is max(compute, all collective time) + the rest
    assert f.ceiling == pytest.approx(1 / (1 - min(exposed, compute - (total - exposed))))
    # no overlap brings the step below its collectives' own time; hiding the exposed part behind
    # all of the compute (min(exposed, compute)) would have claimed more than that
    assert f.ceiling <= 1 / total + 1e-9 < 1 / (1 - min(exposed, compute))


def test_without_backward_ops_the_launch_order_is_unknown_and_overlap_is_still_offered(analyze_spec):
    a, fixes = diagnose(analyze_spec, ddp(backward=False))
    assert a.metrics["comm.launched_in_backward"] is None
    assert "PD335" in fixes


def test_accumulation_already_at_four_micro_batches_gets_no_accumulation_fix(analyze_spec):
    a, fixes = diagnose(analyze_spec, ddp(sync_every=4))
    m = a.metrics
    assert m["comm.sync_steps"] == 2 and m["steps.count"] == 8
    assert m["optimizer.kernels_per_step"] == 0.25
    assert m["comm.exposed_share"] >= 0.10              # PD334's old condition held
    assert "PD334" not in fixes and "PD335" not in fixes


def test_accumulation_over_two_micro_batches_is_offered_what_four_would_add(analyze_spec):
    a, fixes = diagnose(analyze_spec, ddp(sync_every=2))
    m = a.metrics
    assert m["comm.sync_steps"] == 4
    f = fixes["PD334"]
    assert "synchronised in 4 of the 8 steps analysed" in f.summary
    assert "every step" not in f.summary
    assert f.ceiling == pytest.approx(amdahl(m["comm.exposed_share"], 2))     # 2 -> 4 micro-batches


def test_collectives_on_every_micro_batch_do_not_hide_the_accumulation(analyze_spec):
    # a collective on each no_sync() micro-batch too (DDP's forward broadcast of buffers): the
    # optimizer steps tell which steps synchronise
    a, fixes = diagnose(analyze_spec, ddp(sync_every=4, others=1))
    assert a.metrics["comm.sync_steps"] == 2
    assert "PD334" not in fixes
    # without optimizer annotations, the steps that launch collectives
    a, _ = diagnose(analyze_spec, ddp(sync_every=4, optimizer=False))
    assert a.metrics["comm.sync_steps"] == 2 and a.metrics["optimizer.kernels_per_step"] is None


def test_no_collectives_no_comm_metrics(analyze_spec):
    a, _ = analyze_spec(tg.TraceSpec(steps=[S(**{**DDP, "nccl_kernels": 0}, optimizer=True)] * 4))
    m = a.metrics
    assert m["comm.share"] == 0.0 and m["comm.launched_in_backward"] is None and m["comm.sync_steps"] is None


def _analyze_doc(tmp_path, doc):
    import json

    from perfdoctor.analyze.pipeline import analyze
    from perfdoctor.trace.loader import load_trace
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    a = analyze(load_trace(path))
    return a, {f.rule.id: f for f in evaluate(RULES, a.metrics).fixes}


def _gathers(doc, every):
    """Rename every `every`-th all-reduce kernel (and its nccl: annotation's launch) to an all-gather."""
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"] == tg.NCCL_KERNEL]
    for e in kernels[::every]:
        e["name"] = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    return len(kernels[::every]), len(kernels)


def test_only_the_reducing_collectives_are_what_fewer_syncs_remove(tmp_path):
    # the same DDP-like trace with none, half and all of its collective kernels turned into all-gathers
    # (FSDP's parameter gathers, which come back on every micro-batch): the exposed share stays, the
    # share PD334 attacks (comm.exposed_reduce_share) is what the all-reduces leave exposed
    base, _ = tg.build(ddp())
    a, fixes = _analyze_doc(tmp_path, base)
    m = a.metrics
    assert m["comm.exposed_reduce_share"] == pytest.approx(m["comm.exposed_share"])
    assert fixes["PD334"].ceiling == pytest.approx(amdahl(m["comm.exposed_share"], 4))
    assert m["parallel.wrapper"] is None
    half, _ = tg.build(ddp())
    n, total = _gathers(half, 2)
    assert n == total // 2
    a, fixes = _analyze_doc(tmp_path, half)
    h = a.metrics
    assert h["comm.exposed_share"] == pytest.approx(m["comm.exposed_share"])
    assert 0.3 * m["comm.exposed_share"] < h["comm.exposed_reduce_share"] < 0.7 * m["comm.exposed_share"]
    assert fixes["PD334"].ceiling == pytest.approx(amdahl(h["comm.exposed_reduce_share"], 4))
    assert fixes["PD334"].ceiling < amdahl(h["comm.exposed_share"], 4)
    gathers, _ = tg.build(ddp())
    _gathers(gathers, 1)
    a, fixes = _analyze_doc(tmp_path, gathers)
    assert a.metrics["comm.exposed_reduce_share"] == 0.0 and a.metrics["comm.exposed_share"] > 0.10
    assert "PD334" not in fixes


@pytest.mark.parametrize("label, wrapper", [("FSDP::pre_forward (0)", "fully_shard"),
                                            ("FullyShardedDataParallel._pre_forward", "FullyShardedDataParallel"),
                                            ("DistributedDataParallel.forward", "DistributedDataParallel")])
def test_the_wrapper_is_named_from_its_annotations(tmp_path, label, wrapper):
    doc, _ = tg.build(ddp())
    step = next(e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": label, "pid": step["pid"],
                               "tid": step["tid"], "ts": step["ts"] + 1, "dur": 5})
    a, fixes = _analyze_doc(tmp_path, doc)
    assert a.metrics["parallel.wrapper"] == wrapper
    assert f"(data-parallel wrapper in the trace: {wrapper})" in fixes["PD334"].summary


def test_reductions_by_hand_one_per_tensor_are_offered_one_flat_buffer(tmp_path):
    # 4 all-reduces of 3 ms a step and no DDP/FSDP annotation: gradients reduced by hand (PD372),
    # at best 4-fold faster as one call; with DDP's annotation (it buckets already) not offered
    doc, _ = tg.build(ddp())
    a, fixes = _analyze_doc(tmp_path, doc)
    m = a.metrics
    assert m["comm.reduce_calls_per_step"] == 4.0
    assert m["comm.reduce_call_mean_us"] == pytest.approx(3000, rel=0.01)
    assert m["comm.reduce_call_mean_bytes"] is None                  # tracegen records no sizes
    assert fixes["PD372"].ceiling == pytest.approx(amdahl(m["comm.exposed_reduce_share"], 4))
    assert "4 reducing collectives a step" in fixes["PD372"].summary
    step = next(e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    doc["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "DistributedDataParallel.forward",
                               "pid": step["pid"], "tid": step["tid"], "ts": step["ts"] + 1, "dur": 5})
    _, fixes = _analyze_doc(tmp_path, doc)
    assert "PD372" not in fixes and "PD334" in fixes
    # half the calls all-gathers: two reductions a step, under PD372's four
    doc, _ = tg.build(ddp())
    _gathers(doc, 2)
    a, fixes = _analyze_doc(tmp_path, doc)
    assert a.metrics["comm.reduce_calls_per_step"] == 2.0 and "PD372" not in fixes
