"""A decoder that calls its RNN layer once per target token against one call over the target
(PD391), on this CPU, beside the gain `perfdoctor run` expects for it.

pytorch/tutorials' seq2seq_translation_tutorial: an EncoderRNN (embedding, nn.GRU over the source)
and a DecoderRNN that, with teacher forcing, embeds the token before, calls its nn.GRU on that one
step with the hidden state, and applies its output layer, MAX_LENGTH times; against the same
modules called once on the target shifted right. Both train in one process, in alternating
blocks (a noisy machine slows both alike); the speed-up is the ratio of their step times. The
expected gain is PD391's model: the GRU with the embedding and output layer the decoder calls per
token, built again and timed both ways by the probe (collect/rnnprobe.py), that ratio on their
share of the per-token step.

    python bench/bench_rnn_decoder.py [--blocks 4] [--steps 8]
"""

from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F
from rnn_ab import alternate, options, probed

SHAPES = [(128, 10, 32, 2500), (256, 10, 64, 2500), (64, 20, 32, 1000), (512, 15, 32, 4000)]   # hidden, T, batch, vocab


class Seq2Seq(nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.enc_emb, self.enc = nn.Embedding(vocab, hidden), nn.GRU(hidden, hidden, batch_first=True)
        self.dec_emb, self.dec = nn.Embedding(vocab, hidden), nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, src, target, whole: bool):
        _, hidden = self.enc(self.enc_emb(src))
        sos = torch.zeros(target.size(0), 1, dtype=torch.long)
        if whole:
            seq, _ = self.dec(F.relu(self.dec_emb(torch.cat([sos, target[:, :-1]], 1))), hidden)
            return F.log_softmax(self.out(seq), -1)
        x, outs = sos, []
        for i in range(target.size(1)):
            out, hidden = self.dec(F.relu(self.dec_emb(x)), hidden)
            outs.append(self.out(out))
            x = target[:, i].unsqueeze(1)
        return F.log_softmax(torch.cat(outs, 1), -1)


def trainer(hidden: int, T: int, B: int, V: int, whole: bool):
    torch.manual_seed(0)
    model = Seq2Seq(hidden, V)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    src, tgt = torch.randint(1, V, (B, T)), torch.randint(1, V, (B, T))

    def step():
        opt.zero_grad()
        F.nll_loss(model(src, tgt, whole).reshape(-1, V), tgt.reshape(-1)).backward()
        opt.step()
    return step


def main() -> None:
    a = options()
    print("| hidden | T | batch | vocabulary | measured | expected (probe) | ceiling (T) |")
    print("|---|---|---|---|---|---|---|")
    for H, T, B, V in SHAPES:
        per_token, whole = trainer(H, T, B, V, False), trainer(H, T, B, V, True)
        before_s, after_s = alternate(per_token, whole, a.blocks, a.steps)
        expected, share, ratio = probed(
            {"kind": "GRU", "input_size": H, "hidden_size": H, "num_layers": 1, "bias": True, "batch_first": True,
             "bidirectional": False, "proj_size": 0, "nonlinearity": None, "dtype": "float32", "device": "cpu",
             "threads": torch.get_num_threads(), "input_shape": [B, 1, H]}, T,
            [{"kind": "Embedding", "opts": {"num_embeddings": V, "embedding_dim": H, "sparse": False},
              "dtype": "float32", "device": "cpu", "input_shape": [B, 1], "input_dtype": "int64"},
             {"kind": "Linear", "opts": {"in_features": H, "out_features": V, "bias": True}, "dtype": "float32",
              "device": "cpu", "input_shape": [B, 1, H], "input_dtype": "float32"}], before_s)
        print(f"| {H} | {T} | {B} | {V} | {before_s / after_s:.2f}x | {expected:.2f}x ({share:.0%} at {ratio:.2f}x) "
              f"| {T}x |", flush=True)


if __name__ == "__main__":
    main()
