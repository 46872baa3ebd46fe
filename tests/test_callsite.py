"""Stacks py-spy read after a call returned (analyze/callsite.py): the user's line moved back to
where the thread's other samples read that call."""

from __future__ import annotations

from perfdoctor.analyze.callsite import settle_all

SCRIPT = """\
import torch
for ep in range(10):
    done = False
    while not done:
        if B:
            with torch.no_grad():
                a = Categorical(logits=policy(s)).sample()
        else:
            d = Categorical(logits=policy(s))
            a = d.sample(); logps.append(d.log_prob(a))
        s, r, done = env.step(a.item())
"""
LIB = "/venv/lib/python3.11/site-packages/torch/distributions/categorical.py"


def _seg(line: int, callee: str, file: str) -> tuple:
    stack = (("<module>", file, line), (callee, LIB, 70))
    return (0.0, 1.0, stack)


def test_a_late_read_joins_the_call_site_the_other_samples_read(tmp_path):
    """A user's REINFORCE loop read `Categorical.sample at rl.py:11` (env.step's line) where the
    batched branch calls sample() on line 7: the nearest call by its text, line 10, is the other
    branch's, which never ran; the consistent samples say line 7."""
    f = str(tmp_path / "rl.py")
    (tmp_path / "rl.py").write_text(SCRIPT + "# more of the loop\n" * 30 + "s, r, done = env.step(a.item())\n")
    segs = [_seg(7, "Categorical.sample", f)] * 5 + [_seg(11, "Categorical.sample", f)] * 3
    out = settle_all(segs)
    assert [s[2][0][2] for s in out] == [7] * 8
    # log_prob read one line late (line 11) beside samples that read it on line 10
    segs = [_seg(10, "Categorical.log_prob", f)] * 2 + [_seg(11, "Categorical.log_prob", f)]
    assert [s[2][0][2] for s in settle_all(segs)] == [10, 10, 10]
    # no sample places the call: left as read; a private or dunder callee (model(x)) too
    alone = [_seg(11, "Categorical.sample", f)]
    assert settle_all(alone) == alone
    calls = [_seg(7, "Module._call_impl", f), _seg(11, "Module._call_impl", f)]
    assert settle_all(calls) == calls
    # a call site more than WINDOW lines back is another loop's
    far = [_seg(7, "Categorical.sample", f), _seg(42, "Categorical.sample", f)]
    assert [s[2][0][2] for s in settle_all(far)] == [7, 42]
