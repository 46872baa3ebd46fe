"""tune's attention_dropout trial (PD381): scaled_dot_product_attention runs with dropout_p=0,
called directly (positional or keyword) or through nn.MultiheadAttention."""

from __future__ import annotations

import textwrap

import pytest
from tunecases import facts, injected

from perfdoctor.rules.tunable import tune_command
from perfdoctor.tune import plan
from perfdoctor.tune.apply import apply_text

# Training mode, the same input twice: with attention dropout the two outputs differ, without it
# they match. Then a short training loop through MultiheadAttention (dropout 0.1), its losses.
SCRIPT = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8)
    pos = [torch.equal(F.scaled_dot_product_attention(q, q, q, None, 0.3),
                       F.scaled_dot_product_attention(q, q, q, None, 0.3)) for _ in range(2)]
    kw = [torch.equal(F.scaled_dot_product_attention(q, q, q, dropout_p=0.3),
                      F.scaled_dot_product_attention(q, q, q, dropout_p=0.3)) for _ in range(2)]
    mha = torch.nn.MultiheadAttention(32, 4, dropout=0.5, batch_first=True)
    x = torch.randn(2, 16, 32)
    same = torch.equal(mha(x, x, x, need_weights=False)[0], mha(x, x, x, need_weights=False)[0])
    print("positional", all(pos), "keyword", all(kw), "mha", same)
    opt = torch.optim.SGD(mha.parameters(), lr=0.01)
    for step in range(4):
        loss = mha(x, x, x, need_weights=False)[0].pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
""")


def test_attention_dropout_off_makes_every_attention_call_deterministic(tmp_path, capfd):
    pytest.importorskip("torch")
    out, inj = injected(tmp_path, capfd, {"attention_dropout": "off"}, SCRIPT)
    bare_out, bare = injected(tmp_path, capfd, {}, SCRIPT)
    assert out.strip() == "positional True keyword True mha True"
    assert bare_out.strip() == "positional False keyword False mha False"
    assert "attention_dropout" in inj["applied"] and "attention_dropout" not in bare["applied"]
    assert len(inj["losses"]) == len(bare["losses"]) == 4 and inj["losses"] != bare["losses"]   # numerics change
    assert apply_text({"attention_dropout": "off"}, bare, cuda=False).startswith("attention dropout 0 in training")


def test_a_report_with_pd381_plans_the_trial_behind_allow_numerics():
    trials = [t for t in plan.plan(facts(sdpa_dropout=True, verdict="cpu_compute", data_wait=0.0))
              if "attention_dropout" in t.changes]
    assert len(trials) == 1 and trials[0].skip == "changes numerics: needs --allow-numerics"
    allowed = next(t for t in plan.plan(facts(sdpa_dropout=True, verdict="cpu_compute", data_wait=0.0),
                                        allow_numerics=True) if "attention_dropout" in t.changes)
    assert allowed.skip is None and plan.rule_for(allowed.changes, {"PD381", "PD375"}) == "PD381"
    assert not any("attention_dropout" in t.changes for t in plan.plan(facts()))
    assert tune_command(["PD381"], "train.py", cuda=False) == "perfdoctor tune --only PD381 --allow-numerics train.py"
