"""A model called once per time step with the state the call before returned (collect/chainedcalls.py,
loop.model_call_chained_share / sliced_share / rnn_module, PD388): a recurrence, not a loop over
samples (PD353), told by the census and by a live run."""

from __future__ import annotations

import json

import pytest
from runs import prun_script, report

torch = pytest.importorskip("torch", reason="the census counts torch modules' calls")

from perfdoctor.collect.modules import Census  # noqa: E402

nn = torch.nn


class CharRNN(nn.Module):
    """pytorch/examples' char_level_rnn model: one character per call, its hidden state passed on."""

    def __init__(self, tokens=28, emb=8, hidden=16):
        super().__init__()
        self.embedding, self.rnn = nn.Embedding(tokens, emb), nn.LSTM(emb, hidden, batch_first=True)
        self.logits = nn.Linear(hidden, tokens)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.embedding(x).view(x.size(0), 1, -1), hidden)
        return self.logits(out.view(x.size(0), -1)), hidden


def _census(model, calls):
    """Count one step of `calls` (a function that calls the model through `call`) the way the
    class-wide wrapper does: count, the inner modules, the call, what it returned."""
    census = Census(torch.Tensor, rnn_types=(nn.RNNBase, nn.RNNCellBase))
    census.boundary("optimizer")

    def call(*args):
        census.count(model, args, {})
        for m in model.modules():
            if m is not model:
                census.inner(m, (), {})
        out = model(*args)
        census.returned(model, out)
        return out
    calls(call)
    census.boundary("optimizer")
    return census.result


def test_time_steps_on_slices_of_one_input_with_the_state_passed_on_are_a_recurrence():
    model, tokens = CharRNN(), torch.randint(0, 28, (4, 13))

    def loop(call):
        hidden = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
        for t in range(13):
            _, hidden = call(tokens[:, t], hidden)
    r = _census(model, loop)
    # every call after the first took the state the one before returned, on the next slice of tokens
    assert (r["calls"], r["batch"], r["chained"], r["sliced"], r["rnn_module"]) == (13, 1, 12, 12, "LSTM")


def test_the_rnn_layer_is_described_as_it_was_called():
    """rnn_config: what the probe builds again, with the shape of the layer's first call."""
    census = Census(torch.Tensor, rnn_types=(nn.RNNBase, nn.RNNCellBase))
    class Encoder(nn.GRU):                     # a subclass: built again as the torch class it is
        pass
    gru = Encoder(8, 24, num_layers=3, bidirectional=True).double()
    census.boundary("optimizer")
    census.count(gru, (torch.zeros(5, 7, 8, dtype=torch.float64),), {})     # the loop calls it itself
    census.boundary("optimizer")
    cfg = census.result["rnn"]
    assert census.result["rnn_module"] == "Encoder"
    assert cfg == {"kind": "GRU", "input_size": 8, "hidden_size": 24, "num_layers": 3, "bias": True,
                   "batch_first": False, "bidirectional": True, "proj_size": 0, "nonlinearity": None,
                   "dtype": "float64", "device": "cpu", "threads": torch.get_num_threads(), "input_shape": [5, 7, 8]}


def test_a_decoder_fed_its_own_output_passes_state_on_but_slices_nothing():
    model = CharRNN()

    def loop(call):
        x, hidden = torch.zeros(4, dtype=torch.long), (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
        for _ in range(10):
            logits, hidden = call(x, hidden)
            x = logits.argmax(-1)                     # the next input is the last output, sampled
    r = _census(model, loop)
    assert (r["chained"], r["sliced"]) == (9, 0)


def test_a_per_sample_loop_slices_one_batch_and_passes_nothing_on():
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)), torch.randn(16, 8)

    def loop(call):
        for i in range(16):
            call(x[i:i + 1])
    r = _census(model, loop)
    assert (r["calls"], r["batch"], r["chained"], r["sliced"], r["rnn_module"]) == (16, 1, 0, 15, None)


SCRIPT = '''
import torch, torch.nn as nn, torch.nn.functional as F

class CharRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding, self.dropout = nn.Embedding(28, 16), nn.Dropout(0.2)
        self.rnn = nn.LSTM(16, 64, num_layers=2, batch_first=True)
        self.logits = nn.Linear(64, 28)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.dropout(self.embedding(x)).view(x.size(0), 1, -1), hidden)
        return F.log_softmax(self.logits(out.view(x.size(0), -1)), dim=1), hidden

torch.manual_seed(0)
model, data = CharRNN(), torch.randint(0, 28, (320, 13))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(60):
    batch = data[(step * 32) % 288:][:32]
    hidden = (torch.zeros(2, 32, 64), torch.zeros(2, 32, 64))
    outs = []
    for t in range(12):                                  # one character per call
        out, hidden = model(batch[:, t], hidden)
        outs.append(out)
    loss = F.nll_loss(torch.stack(outs, 1).reshape(-1, 28), batch[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def test_run_offers_the_whole_sequence_call_not_batching_the_samples(tmp_path):
    """The char-level loop under `perfdoctor run`: its 1-D slices of token ids read as a batch of
    one, which made PD353 ("batch the samples") its fix; the state passed from call to call makes
    it PD388's, with PD353's ceiling argument (calls-fold)."""
    _, out = prun_script(tmp_path, "charrnn.py", SCRIPT)
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert (m["loop.model_name"], m["loop.model_calls_per_step"], m["loop.model_rnn_module"]) == ("CharRNN", 12, "LSTM")
    assert m["loop.model_call_chained_share"] == 1.0 and m["loop.model_call_sliced_share"] == 1.0
    ids = [f["id"] for f in doc["findings"]]
    assert "PD388" in ids and "PD353" not in ids
    fix = next(f for f in doc["findings"] if f["id"] == "PD388")
    wait = m["run.data_wait_share"] or 0
    assert fix["gain"]["ceiling"] == pytest.approx(1 / (wait + (1 - wait) / 12), rel=0.02)
    # the layer as the census saw it, built again after the run and timed both ways (rnnprobe.py)
    child = json.loads((out / "child.json").read_text())["root_calls"]["rnn"]
    assert {k: child[k] for k in ("kind", "input_size", "hidden_size", "num_layers", "batch_first", "input_shape")} \
        == {"kind": "LSTM", "input_size": 16, "hidden_size": 64, "num_layers": 2, "batch_first": True,
            "input_shape": [32, 1, 16]}
    probe = json.loads((out / "rnn_probe.json").read_text())
    assert (probe["calls"], probe["steps"], probe["batch"]) == (12, 12, 32)
    assert m["rnn.probe_speedup"] == pytest.approx(probe["ratio"], rel=1e-3)      # the report rounds
    assert m["rnn.probe_layer_share"] == pytest.approx(min(probe["per_call_ms"] / m["run.step_time_ms"], 1 - wait),
                                                       rel=1e-3)
    # the expected gain is that ratio on that share, under the ceiling
    share, r = m["rnn.probe_layer_share"], m["rnn.probe_speedup"]
    assert fix["gain"]["expected"] == pytest.approx(max(1.0, min(1 / (1 - share + share / r), fix["gain"]["ceiling"])),
                                                    rel=1e-3)
    assert any(n.startswith("timed the script's LSTM layer after the run") for n in doc["run"]["notes"])
