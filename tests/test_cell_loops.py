"""A Python loop over an RNN cell's time steps (analyze/cellloops.py, PD387), recorded by
torch.profiler on the CPU: an nn.LSTMCell / nn.GRUCell unrolled by hand, its nn.LSTM twin, and a
loop over a batch's samples beside a cell loop."""

from __future__ import annotations

import pytest

T, B, H = 24, 8, 16


def _trainer(kind: str):
    torch = pytest.importorskip("torch", reason="torch records the trace")
    nn = torch.nn
    torch.manual_seed(0)
    emb, out = nn.Embedding(32, H), nn.Linear(H, 32)
    cell = {"lstm": nn.LSTMCell, "gru": nn.GRUCell, "fused": nn.LSTM}[kind](H, H)
    params = [*emb.parameters(), *out.parameters(), *cell.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    x = torch.randint(0, 32, (B, T + 1))

    def forward(seq):
        if kind == "fused":
            return out(cell(emb(seq).transpose(0, 1))[0]).transpose(0, 1)
        h = torch.zeros(B, H)
        c = torch.zeros(B, H)
        outs = []
        for t in range(seq.size(1)):                 # one time step at a time: a recurrence
            if kind == "lstm":
                h, c = cell(emb(seq[:, t]), (h, c))
            else:
                h = cell(emb(seq[:, t]), h)
            outs.append(out(h))
        return torch.stack(outs, 1)

    def step():
        loss = nn.functional.cross_entropy(forward(x[:, :-1]).reshape(-1, 32), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _report(tmp_path, kind: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from perfdoctor.diagnose.offline import diagnose_path
    step = _trainer(kind)
    step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(3):
            step()
            p.step()
    path = tmp_path / f"{kind}.json"
    p.export_chrome_trace(str(path))
    return diagnose_path(str(path))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_loop_over_a_cell_is_a_recurrence_with_its_own_fix(tmp_path, kind):
    doc = _report(tmp_path, kind)
    m = doc["traces"][0]["metrics"]
    # the forward loop (a cell, an embedding and a slice a time step) and its backward: most of
    # the step, none of it a loop over samples
    assert m["rnn.cell_loop_iterations"] == pytest.approx(T, abs=1)
    # what stays is the ops outside the loop and its backward (the optimizer's, the loss's): less
    # than the rest of the step, whose untraced time between ops goes with the loop
    assert 0.5 < m["rnn.cell_loop_share"] <= 1 and 0 < m["rnn.cell_loop_kept_share"] < 1 - m["rnn.cell_loop_share"]
    assert not m["cpu.loop_share"]
    ids = [f["id"] for f in doc["findings"]]
    assert "PD387" in ids and "PD365" not in ids
    fix = next(f for f in doc["findings"] if f["id"] == "PD387")
    assert fix["gain"]["ceiling"] == pytest.approx(1 / m["rnn.cell_loop_kept_share"], rel=1e-3)
    assert fix["gain"]["expected"] is None


def test_the_fused_module_has_no_cell_loop(tmp_path):
    doc = _report(tmp_path, "fused")
    m = doc["traces"][0]["metrics"]
    assert m["rnn.cell_loop_share"] is None and not m["cpu.loop_share"]
    assert "PD387" not in [f["id"] for f in doc["findings"]]
