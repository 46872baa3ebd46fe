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
    assert probe["layers"] == ["Embedding", "Dropout", "Linear"]              # called once a time step too
    assert m["rnn.probe_speedup"] == pytest.approx(probe["ratio"], rel=1e-3)      # the report rounds
    assert m["rnn.probe_layer_share"] == pytest.approx(min(probe["per_call_ms"] / m["run.step_time_ms"], 1 - wait),
                                                       rel=1e-3)
    # the expected gain is that ratio on that share, under the ceiling
    share, r = m["rnn.probe_layer_share"], m["rnn.probe_speedup"]
    assert fix["gain"]["expected"] == pytest.approx(max(1.0, min(1 / (1 - share + share / r), fix["gain"]["ceiling"])),
                                                    rel=1e-3)
    assert any(n.startswith("timed the script's LSTM layer and the layers called as often around it (Embedding, "
                            "Dropout, Linear) after the run") for n in doc["run"]["notes"])


class Decoder(nn.Module):
    """pytorch/tutorials' seq2seq DecoderRNN (teacher forcing), and its AttnDecoderRNN's step
    (Bahdanau attention queried with the hidden state) with `attention`."""

    def __init__(self, vocab=50, hidden=16, attention=False):
        super().__init__()
        self.embedding, self.gru = nn.Embedding(vocab, hidden), nn.GRU(2 * hidden if attention else hidden, hidden,
                                                                       batch_first=True)
        self.out, self.attention = nn.Linear(hidden, vocab), attention
        self.wq, self.wk, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 1)

    def forward(self, enc_out, hidden, target=None, detach=False):
        x, outs = torch.zeros(enc_out.size(0), 1, dtype=torch.long), []
        for i in range(10):
            emb = torch.relu(self.embedding(x))
            if self.attention:
                q = hidden.permute(1, 0, 2)
                w = torch.softmax(self.v(torch.tanh(self.wq(q) + self.wk(enc_out))).squeeze(2).unsqueeze(1), -1)
                emb = torch.cat((emb, torch.bmm(w, enc_out)), dim=2)
            out, hidden = self.gru(emb, hidden)
            outs.append(self.out(out))
            x = target[:, i].unsqueeze(1) if target is not None else outs[-1].argmax(-1).detach()
        return torch.cat(outs, 1), hidden


def _hooked_census(model, run):
    """One counted step of `run()` (which calls the model once), its inner modules seen as the
    class-wide wrapper sees them: each call with its arguments, an RNN module's output after it."""
    census = Census(torch.Tensor, rnn_types=(nn.RNNBase, nn.RNNCellBase))
    census.boundary("optimizer")
    handles = []
    for m in model.modules():
        if m is not model:
            handles.append(m.register_forward_pre_hook(lambda mod, args, kw: census.inner(mod, args, kw),
                                                       with_kwargs=True))
            if isinstance(m, nn.RNNBase):
                handles.append(m.register_forward_hook(lambda mod, args, out: census.returned(mod, out)))
    try:
        census.count(model, (), {})
        census.returned(model, run())
    finally:
        for h in handles:
            h.remove()
    census.boundary("optimizer")
    return census.result


@pytest.mark.parametrize("attention", [False, True])
def test_a_decoders_gru_called_per_target_token_is_a_loop_over_a_known_sequence(attention):
    """The GRU inside one decoder call, 10 times a step with its state passed on, its embedding
    fed the next slice of the target (8 of 9: the first input is the start token); with attention
    queried by the hidden state, every input after the first is made from the last output."""
    model, enc = Decoder(attention=attention), torch.randn(4, 7, 16)
    target = torch.randint(0, 50, (4, 10))
    r = _hooked_census(model, lambda: model(enc, torch.zeros(1, 4, 16), target))
    assert (r["rnn"]["kind"], r["rnn_calls"], r["rnn_chained"], r["rnn_fed_sliced"]) == ("GRU", 10, 9, 8)
    assert r["rnn_fed_back"] == (9 if attention else 0)
    assert r["rnn"]["input_shape"] == [4, 1, 32 if attention else 16]
    # the layers called as often, in the order first called: what the probe times with the GRU
    assert [c["kind"] for c in r["rnn_layers"]] == ["Embedding"] + ["Linear"] * (4 if attention else 1)


def test_a_decoder_fed_its_own_sampled_tokens_is_fed_no_slices():
    model, enc = Decoder(), torch.randn(4, 7, 16)
    r = _hooked_census(model, lambda: model(enc, torch.zeros(1, 4, 16)))
    assert (r["rnn_calls"], r["rnn_chained"], r["rnn_fed_sliced"], r["rnn_fed_back"]) == (10, 9, 0, 0)


SEQ2SEQ = '''
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

class EncoderRNN(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.embedding, self.gru = nn.Embedding(vocab, hidden), nn.GRU(hidden, hidden, batch_first=True)

    def forward(self, x):
        return self.gru(self.embedding(x))

class DecoderRNN(nn.Module):                             # pytorch/tutorials' seq2seq, teacher forcing
    def __init__(self, hidden, vocab):
        super().__init__()
        self.embedding, self.gru = nn.Embedding(vocab, hidden), nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, enc_out, hidden, target):
        x, outs = torch.zeros(enc_out.size(0), 1, dtype=torch.long), []
        for i in range(10):
            out, hidden = self.gru(F.relu(self.embedding(x)), hidden)
            outs.append(self.out(out))
            x = target[:, i].unsqueeze(1)
        return F.log_softmax(torch.cat(outs, 1), dim=-1)

torch.manual_seed(0)
data = TensorDataset(torch.randint(1, 200, (640, 10)), torch.randint(1, 200, (640, 10)))
enc, dec = EncoderRNN(200, 64), DecoderRNN(64, 200)
eo, do = torch.optim.Adam(enc.parameters(), 1e-3), torch.optim.Adam(dec.parameters(), 1e-3)
for epoch in range(2):
    for inp, tgt in DataLoader(data, batch_size=32, shuffle=True):
        eo.zero_grad(); do.zero_grad()
        enc_out, enc_hidden = enc(inp)
        loss = F.nll_loss(dec(enc_out, enc_hidden, tgt).view(-1, 200), tgt.view(-1))
        loss.backward()
        eo.step(); do.step()
'''


def test_run_offers_one_gru_call_over_the_teacher_forced_target(tmp_path):
    """The seq2seq tutorial's decoder under `perfdoctor run`: one call of the decoder a step, its
    GRU 10 times inside it; PD391, with the probe's expected gain, and not PD388."""
    _, out = prun_script(tmp_path, "seq2seq.py", SEQ2SEQ)
    doc = report(out)
    m = doc["traces"][0]["metrics"]
    assert (m["rnn.layer_kind"], m["rnn.layer_calls_per_step"], m["loop.model_calls_per_step"]) == ("GRU", 10, 1)
    assert m["rnn.layer_chained_share"] == 1.0 and m["rnn.layer_fed_sliced_share"] == pytest.approx(8 / 9, rel=1e-3)
    assert m["rnn.layer_fed_back_share"] == 0.0
    ids = [f["id"] for f in doc["findings"]]
    assert "PD391" in ids and "PD388" not in ids
    probe = json.loads((out / "rnn_probe.json").read_text())
    assert (probe["kind"], probe["calls"], probe["batch"]) == ("GRU", 10, 32)
    # the layers the decoder calls per token were timed with its GRU; the encoder's, called once, not
    layers = json.loads((out / "child.json").read_text())["root_calls"]["rnn_layers"]
    assert [(c["kind"], c["input_shape"]) for c in layers] == [("Embedding", [32, 1]), ("Linear", [32, 1, 64])]
    assert probe["layers"] == ["Embedding", "Linear"]
    fix = next(f for f in doc["findings"] if f["id"] == "PD391")
    share, r = m["rnn.probe_layer_share"], m["rnn.probe_speedup"]
    assert fix["gain"]["expected"] == pytest.approx(max(1.0, min(1 / (1 - share + share / r), fix["gain"]["ceiling"])),
                                                    rel=2e-3)
