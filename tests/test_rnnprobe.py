"""PD388's probe (collect/rnnprobe.py): the script's RNN layer built again and timed one time step
a call against one call over the sequence, and what analyze/rnnsequence.py makes of its file."""

from __future__ import annotations

import json
import math

import pytest

from perfdoctor.analyze.rnnsequence import probe_metrics
from perfdoctor.collect.rnnprobe import PROBE_FILE, _shape, maybe_probe, wanted


def _cfg(**kw) -> dict:
    cfg = {"kind": "LSTM", "input_size": 16, "hidden_size": 64, "num_layers": 2, "bias": True, "batch_first": True,
           "bidirectional": False, "proj_size": 0, "nonlinearity": None, "dtype": "float32", "device": "cpu",
           "threads": 1, "input_shape": [8, 1, 16]}
    return dict(cfg, **kw)


def _child(calls=12, chained=11, sliced=11, **kw) -> dict:
    return {"root_calls": {"calls": calls, "chained": chained, "sliced": sliced, "rnn_module": "LSTM",
                           "rnn": _cfg(**kw)}}


def test_the_probe_runs_only_on_pd388s_signs():
    assert wanted(_child()) == (_cfg(), 12)
    assert wanted(_child(calls=7, chained=6, sliced=6)) is None          # under the rule's floor of calls
    assert wanted(_child(chained=0)) is None                              # a per-sample loop: no state passed
    assert wanted(_child(sliced=2)) is None                               # a decoder fed its own output
    assert wanted({"root_calls": {"calls": 12, "chained": 11, "sliced": 11, "rnn": "LSTM"}}) is None   # damaged
    assert wanted({}) is None
    # a loop over a cell inside one model call (PD387): the cell's calls in the step
    cell = {"root_calls": {"calls": 1, "chained": 0, "sliced": 0, "rnn_calls": 64, "rnn": _cfg(kind="LSTMCell")}}
    assert wanted(cell) == (_cfg(kind="LSTMCell"), 64)
    cell["root_calls"]["rnn_calls"] = 15                                  # under PD387's 16 time steps
    assert wanted(cell) is None
    cell["root_calls"].update(rnn_calls=64, rnn=_cfg())                   # a module called 64 times in one call
    assert wanted(cell) is None


def test_the_calls_shape_is_read_by_the_layers_layout():
    assert _shape(_cfg(input_shape=[8, 3, 16])) == (8, 3)                           # batch-first, 3 steps a call
    assert _shape(_cfg(batch_first=False, input_shape=[1, 8, 16])) == (8, 1)         # time-first
    assert _shape(_cfg(input_shape=[5, 16])) == (1, 5)                               # unbatched [time, features]
    assert _shape(_cfg(kind="GRUCell", input_shape=[8, 16])) == (8, 1)
    assert _shape(_cfg(input_shape=None)) == (1, 1)                                  # a PackedSequence


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell"])
def test_the_probe_times_each_kind_both_ways(kind):
    pytest.importorskip("torch")
    from perfdoctor.collect.rnnprobe import measure
    shape = [8, 16] if kind.endswith("Cell") else [8, 1, 16]
    r = measure(_cfg(kind=kind, nonlinearity="tanh" if kind.startswith("RNN") else None, input_shape=shape,
                     num_layers=1), 12, budget_s=0.2)
    assert (r["calls"], r["steps"], r["batch"], r["kind"], r["device"]) == (12, 12, 8, kind, "cpu")
    assert 3 <= r["pairs"] <= 20 and r["per_call_ms"] > 0 and r["whole_ms"] > 0
    assert r["ratio"] == pytest.approx(r["per_call_ms"] / r["whole_ms"])
    assert r["ratio_low"] <= r["ratio"] <= r["ratio_high"]


def test_twelve_single_step_calls_of_an_lstm_cost_more_than_one_call_on_all_twelve():
    """Each call pays the layer's fixed cost (dispatch, oneDNN's setup and weight reorder, a graph
    node per call): a 2-layer LSTM of 64 at batch 8 measured 4-6x on a 2-core CPU; far above 1
    on any CPU, however busy (both ways alternate)."""
    pytest.importorskip("torch")
    from perfdoctor.collect.rnnprobe import measure
    r = measure(_cfg(), 12, budget_s=0.5)
    assert r["ratio"] > 1.5, r


def test_a_probe_that_fails_leaves_a_note_not_a_traceback(tmp_path):
    note = maybe_probe(tmp_path, _child(kind="NoSuchRNN"))
    assert note.startswith("the NoSuchRNN layer could not be timed over the whole sequence (") and "\n" not in note
    assert "AttributeError" in note and not (tmp_path / PROBE_FILE).exists()
    assert list(tmp_path.iterdir()) == []                                 # its config file is removed too
    assert maybe_probe(tmp_path, {"root_calls": {"calls": 3}}) is None


def test_the_probe_file_gives_the_layers_share_and_speed_up():
    probe = {"per_call_ms": 30.0, "whole_ms": 10.0, "ratio": 3.0, "ratio_low": 2.8}
    m = probe_metrics(probe, {"run.step_time_ms": 50.0, "run.data_wait_share": 0.1})
    assert m == {"rnn.probe_speedup": 3.0, "rnn.probe_speedup_low": 2.8, "rnn.probe_layer_share": 0.6,
                 "rnn.probe_saved_ms": 20.0}
    # a probe slower than the step it came from (another load then): at most the step outside the wait
    busy = probe_metrics(probe, {"run.step_time_ms": 20.0, "run.data_wait_share": 0.25})
    assert busy["rnn.probe_layer_share"] == 0.75
    assert probe_metrics(probe, {"run.step_time_ms": None})["rnn.probe_layer_share"] is None


@pytest.mark.parametrize("bad", [None, [], {}, {"per_call_ms": "30", "whole_ms": 10.0, "ratio": 3.0, "ratio_low": 2.8},
                                 {"per_call_ms": 30.0, "whole_ms": 0.0, "ratio": 3.0, "ratio_low": 2.8},
                                 {"per_call_ms": math.nan, "whole_ms": 10.0, "ratio": 3.0, "ratio_low": 2.8},
                                 {"per_call_ms": 30.0, "whole_ms": 10.0, "ratio": -3.0, "ratio_low": 2.8}])
def test_a_damaged_probe_file_says_nothing(bad):
    assert all(v is None for v in probe_metrics(bad, {"run.step_time_ms": 50.0}).values())
    json.dumps(probe_metrics(bad, {}))


def test_force_clears_a_probe_left_by_the_run_before(tmp_path):
    """A --force rerun that does not probe (the loop was rewritten) must not read the last run's
    probe, nor its forked workers' totals or forked trainers' steps."""
    from perfdoctor.collect.forked import DIR as FORKED
    from perfdoctor.collect.loaderfetch import FILE as FETCHES
    from perfdoctor.collect.rundir import claim
    for name in ("run.json", PROBE_FILE, FETCHES):
        (tmp_path / name).write_text("{}")
    (tmp_path / FORKED).mkdir()
    (tmp_path / FORKED / "123.json").write_text("{}")
    claim(tmp_path, True)
    assert list(tmp_path.iterdir()) == []
