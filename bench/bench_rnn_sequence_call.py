"""A model called once per time step against one call over the whole sequence (PD388), on this CPU.

pytorch/examples' char_level_rnn shape: embedding, dropout, nn.LSTM / nn.GRU and an output layer,
called once per character with the hidden state passed from call to call, against the same
modules called once on the whole sequence. For each shape both versions train in one process, in
alternating blocks (a noisy machine slows both alike); the speed-up is the ratio of their step
times. Prints it beside PD388's ceiling, calls-fold (one call per time step: T), and beside its
expected gain as `perfdoctor run` models it: the RNN layer, the embedding, dropout and output
layer called per time step, timed both ways by the probe (collect/rnnprobe.py), that ratio on
their share of the per-time-step step.

    python bench/bench_rnn_sequence_call.py [--blocks 4] [--steps 8]
"""

from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F
from rnn_ab import alternate, options, probed

SHAPES = [("LSTM", 256, 2, 13, 32), ("LSTM", 64, 1, 32, 16), ("GRU", 256, 2, 13, 32), ("LSTM", 512, 2, 64, 64)]
V = 28                                  # module, hidden, layers, time steps, batch; the vocabulary


class CharRNN(nn.Module):
    def __init__(self, kind: str, hidden: int, layers: int):
        super().__init__()
        self.embedding, self.dropout = nn.Embedding(V, 50), nn.Dropout(0.5)
        self.rnn = getattr(nn, kind)(50, hidden, num_layers=layers, batch_first=True)
        self.logits = nn.Linear(hidden, V)

    def forward(self, x, hidden):
        """x: [batch] token ids of one time step, or [batch, time] for the whole sequence."""
        seq = x.dim() == 2
        emb = self.dropout(self.embedding(x if seq else x.unsqueeze(1)))
        out, hidden = self.rnn(emb, hidden)
        return F.log_softmax(self.logits(out if seq else out[:, 0]), dim=-1), hidden


def trainer(kind: str, hidden: int, layers: int, T: int, B: int, whole: bool):
    torch.manual_seed(0)
    model = CharRNN(kind, hidden, layers)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    data = torch.randint(0, V, (B, T + 1))

    def step():
        h = torch.zeros(layers, B, hidden)
        state = (h, h.clone()) if kind == "LSTM" else h
        if whole:
            out, _ = model(data[:, :-1], state)
        else:
            outs = []
            for t in range(T):
                o, state = model(data[:, t], state)
                outs.append(o)
            out = torch.stack(outs, 1)
        loss = F.nll_loss(out.reshape(-1, V), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def main() -> None:
    a = options()
    print("| module | hidden | layers | T | batch | measured | expected (probe) | ceiling (T) |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, H, L, T, B in SHAPES:
        per_step, whole = trainer(kind, H, L, T, B, False), trainer(kind, H, L, T, B, True)
        before_s, after_s = alternate(per_step, whole, a.blocks, a.steps)
        cfg = {"kind": kind, "input_size": 50, "hidden_size": H, "num_layers": L, "bias": True, "batch_first": True,
               "bidirectional": False, "proj_size": 0, "nonlinearity": None, "dtype": "float32", "device": "cpu",
               "threads": torch.get_num_threads(), "input_shape": [B, 1, 50]}
        expected, share, ratio = probed(cfg, T, [
            {"kind": "Embedding", "opts": {"num_embeddings": V, "embedding_dim": 50, "sparse": False},
             "dtype": "float32", "device": "cpu", "input_shape": [B], "input_dtype": "int64"},
            {"kind": "Dropout", "opts": {"p": 0.5}, "dtype": None, "device": None, "input_shape": [B, 1, 50],
             "input_dtype": "float32"},
            {"kind": "Linear", "opts": {"in_features": H, "out_features": V, "bias": True}, "dtype": "float32",
             "device": "cpu", "input_shape": [B, H], "input_dtype": "float32"}], before_s)
        print(f"| {kind} | {H} | {L} | {T} | {B} | {before_s / after_s:.2f}x | {expected:.2f}x "
              f"({share:.0%} at {ratio:.2f}x) | {T}x |", flush=True)


if __name__ == "__main__":
    main()
