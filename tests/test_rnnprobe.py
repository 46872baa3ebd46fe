"""PD388's probe (collect/rnnprobe.py): the script's RNN layer built again and timed one time step
a call against one call over the sequence, and what analyze/rnnsequence.py makes of its file."""

from __future__ import annotations

import json
import math

import pytest

from perfdoctor.analyze.rnnsequence import probe_metrics
from perfdoctor.collect.rebuild import rnn_call_shape as _shape, whole_shape
from perfdoctor.collect.rnnprobe import PROBE_FILE, maybe_probe, wanted


def _cfg(**kw) -> dict:
    cfg = {"kind": "LSTM", "input_size": 16, "hidden_size": 64, "num_layers": 2, "bias": True, "batch_first": True,
           "bidirectional": False, "proj_size": 0, "nonlinearity": None, "dtype": "float32", "device": "cpu",
           "threads": 1, "input_shape": [8, 1, 16]}
    return dict(cfg, **kw)


def _child(calls=12, chained=11, **kw) -> dict:
    return {"root_calls": {"calls": 1, "rnn_module": "LSTM", "rnn_calls": calls, "rnn_chained": chained,
                           "rnn": _cfg(**kw)}}


def test_the_probe_runs_where_the_layer_is_looped_over_time_steps():
    """The step's most-called RNN layer called 8 times or more, most calls taking the state the
    one before returned: outside the model (PD388), inside it (PD391) or a cell (PD387) alike."""
    assert wanted(_child()) == (_cfg(), 12)
    assert wanted(_child(kind="LSTMCell")) == (_cfg(kind="LSTMCell"), 12)
    assert wanted(_child(calls=7, chained=6)) is None                     # under the rule's floor of calls
    assert wanted(_child(chained=5)) is None                              # calls on separate sequences
    assert wanted(_child(calls=8, chained=4)) == (_cfg(), 8)              # half of the 7 after the first
    assert wanted({"root_calls": {"rnn_calls": 12, "rnn_chained": 11, "rnn": "LSTM"}}) is None   # damaged
    assert wanted({"root_calls": {"rnn_calls": "12", "rnn_chained": 11, "rnn": _cfg()}}) is None
    assert wanted({}) is None
    # an attention decoder: the layer's inputs made from its last output, no fix to measure
    fed_back = _child()
    fed_back["root_calls"]["rnn_fed_back"] = 11
    assert wanted(fed_back) is None
    fed_back["root_calls"]["rnn_fed_back"] = 2                             # a few: still the loop
    assert wanted(fed_back) == (_cfg(), 12)


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
    assert maybe_probe(tmp_path, {"root_calls": {"rnn_calls": 3}}) is None


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


def test_one_calls_input_becomes_the_whole_sequences():
    assert whole_shape([32], 13) == [32, 13]                      # token ids of one time step
    assert whole_shape([32, 1], 10) == [32, 10]                   # [batch, 1]: a time dimension of one
    assert whole_shape([32, 1, 64], 10) == [32, 10, 64]
    assert whole_shape([32, 256], 13) == [32, 13, 256]            # a cell's [batch, features]


def test_the_layers_around_the_rnn_are_timed_with_it():
    """An embedding, dropout, a linear layer and layer norm called once a time step, built from
    their descriptions, each timed T calls against one call over the sequence with the RNN."""
    pytest.importorskip("torch")
    from perfdoctor.collect.rnnprobe import measure
    layers = [{"kind": "Embedding", "opts": {"num_embeddings": 30, "embedding_dim": 16, "sparse": False},
               "dtype": "float32", "device": "cpu", "input_shape": [8], "input_dtype": "int64"},
              {"kind": "Dropout", "opts": {"p": 0.5}, "dtype": None, "device": None, "input_shape": [8, 1, 16],
               "input_dtype": "float32"},
              {"kind": "Linear", "opts": {"in_features": 64, "out_features": 30, "bias": True}, "dtype": "float32",
               "device": "cpu", "input_shape": [8, 1, 64], "input_dtype": "float32"},
              {"kind": "LayerNorm", "opts": {"normalized_shape": [64], "elementwise_affine": True},
               "dtype": "float32", "device": "cpu", "input_shape": [8, 64], "input_dtype": "float32"},
              {"kind": "Conv1d", "opts": {}, "input_shape": [8, 3]},                   # not built: refused
              ]
    with pytest.raises(ValueError, match="no layer of kind 'Conv1d'"):
        measure(_cfg(), 12, budget_s=0.1, layers=layers)
    alone = measure(_cfg(), 12, budget_s=0.3)
    both = measure(_cfg(), 12, budget_s=0.3, layers=layers[:4])
    assert alone["layers"] == [] and both["layers"] == ["Embedding", "Dropout", "Linear", "LayerNorm"]
    # each measurement alternates its two ways in pairs: their ratio holds on a loaded machine. Two
    # measurements' times do not (with the layers 14.8 and 15.7 ms a step, without 16.2 and 18.4:
    # two suite runs, one of them with the test alone)
    assert both["ratio"] > 1 and alone["ratio"] > 1 and both["pairs"] >= 1
