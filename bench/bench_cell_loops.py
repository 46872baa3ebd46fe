"""A Python loop over an RNN cell against the fused module (PD387), on this CPU.

For each shape: the loop version and the nn.LSTM / nn.GRU version of the same model train in
one process, in alternating blocks (a noisy machine slows both alike), and the speed-up is the
ratio of their step times; a trace of the loop version gives the report's shares. Prints, per
shape, the measured speed-up beside the ceiling (PD387) and two candidate models of the
expected gain: the loop's matrix products kept (cpu.gemm_conv_share), or its large ops kept
(cpu.compute_share); and the model PD387 uses under `perfdoctor run`: the cell, the embedding and
the output layer called per time step, timed T calls against the fused module (and one call of
each layer) over T steps by the probe (collect/rnnprobe.py), that ratio on their share of the
loop version's step, under the ceiling.

    python bench/bench_cell_loops.py [--blocks 4] [--steps 10]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.nn as nn
from rnn_ab import alternate, options, probed

SHAPES = [("lstm", 64, 32, 16), ("lstm", 256, 64, 32), ("lstm", 512, 32, 64), ("lstm", 128, 100, 8),
          ("gru", 256, 64, 32), ("lstm", 32, 128, 4)]       # cell, hidden, time steps, batch
V = 64


def trainer(cell: str, H: int, T: int, B: int, fused: bool):
    torch.manual_seed(0)
    emb, out = nn.Embedding(V, H), nn.Linear(H, V)
    if fused:
        rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(H, H, batch_first=True)
    else:
        rnn = (nn.LSTMCell if cell == "lstm" else nn.GRUCell)(H, H)
    opt = torch.optim.Adam([*emb.parameters(), *out.parameters(), *rnn.parameters()], 1e-3)
    data = torch.randint(0, V, (B, T + 1))

    def forward(x):
        if fused:
            return out(rnn(emb(x))[0])
        h = torch.zeros(B, H)
        c = torch.zeros(B, H)
        outs = []
        for t in range(x.size(1)):
            if cell == "lstm":
                h, c = rnn(emb(x[:, t]), (h, c))
            else:
                h = rnn(emb(x[:, t]), h)
            outs.append(out(h))
        return torch.stack(outs, 1)

    def step():
        loss = nn.functional.cross_entropy(forward(data[:, :-1]).reshape(-1, V), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def diagnosed(step, path: Path) -> dict:
    """The report (diagnose_path's document) of a trace of three steps after one of warm-up."""
    from torch.profiler import ProfilerActivity, profile

    from perfdoctor.diagnose.offline import diagnose_path
    step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(3):
            step()
            p.step()
    p.export_chrome_trace(str(path))
    return diagnose_path(str(path))


def main() -> None:
    a = options(steps=10)
    print("| cell | H | T | B | loop share | gemm share | compute share | measured | gemms kept | large ops kept "
          "| probe | ceiling |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for cell, H, T, B in SHAPES:
            loop, fused = trainer(cell, H, T, B, False), trainer(cell, H, T, B, True)
            m = diagnosed(loop, Path(d) / f"{cell}{H}.json")["traces"][0]["metrics"]
            loop_s, fused_s = alternate(loop, fused, a.blocks, a.steps)
            share = m["rnn.cell_loop_share"] or 0.0
            gemm = min(share, m["cpu.gemm_conv_share"] or 0.0)
            large = max(0.0, min(share, 1 - (m["cpu.compute_share"] or 0.0)))
            kept = m["rnn.cell_loop_kept_share"] or 1.0
            expected, part, ratio = probed(
                {"kind": "LSTMCell" if cell == "lstm" else "GRUCell", "input_size": H, "hidden_size": H,
                 "num_layers": 1, "bias": True, "batch_first": False, "bidirectional": False, "proj_size": 0,
                 "nonlinearity": None, "dtype": "float32", "device": "cpu", "threads": torch.get_num_threads(),
                 "input_shape": [B, H]}, T,
                [{"kind": "Embedding", "opts": {"num_embeddings": V, "embedding_dim": H, "sparse": False},
                  "dtype": "float32", "device": "cpu", "input_shape": [B], "input_dtype": "int64"},
                 {"kind": "Linear", "opts": {"in_features": H, "out_features": V, "bias": True}, "dtype": "float32",
                  "device": "cpu", "input_shape": [B, H], "input_dtype": "float32"}],
                loop_s, span=1 - kept)                      # PD387's model: within the loop's span
            print(f"| {cell} | {H} | {T} | {B} | {share:.2f} | {m['cpu.gemm_conv_share'] or 0:.2f} | "
                  f"{m['cpu.compute_share'] or 0:.2f} | {loop_s / fused_s:.2f}x | "
                  f"{1 / (1 - (share - gemm)):.2f}x | {1 / (1 - large):.2f}x | "
                  f"{min(expected, 1 / kept):.2f}x ({part:.0%} at {ratio:.2f}x) | {1 / kept:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
