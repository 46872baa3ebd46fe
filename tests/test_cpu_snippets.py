"""A fix shown on a CPU-only trace carries no CUDA-only code (rules' [fix] snippet_cpu, diagnose/document.py)."""

import re

import pytest

from perfdoctor.diagnose.document import _finding_doc
from perfdoctor.rules.engine import Finding
from perfdoctor.rules.loader import RulesInvalid, load_rules

# Code that only does something on an NVIDIA GPU (a `torch.cuda.is_available()` guard is fine).
CUDA_ONLY = re.compile(r"allow_tf32|pin_memory\s*=\s*True|cudnn\.|\.cuda\(\)|torch\.cuda\.(?!is_available)")


def _shown(rule, platform):
    return _finding_doc(Finding(rule=rule, summary="s", evidence={}), platform)["fix"]["snippet"] or ""


def test_cpu_trace_fixes_carry_no_cuda_code():
    rules = [r for r in load_rules() if r.kind == "fix" and r.snippet and ("any" in r.devices or "cpu" in r.devices)]
    assert len(rules) > 20
    bad = {r.id: CUDA_ONLY.findall(_shown(r, "cpu")) for r in rules}
    assert not {k: v for k, v in bad.items() if v}
    by_id = {r.id: r for r in rules}
    # the GPU trace keeps the CUDA lines: float32 with TF32 matmuls, a loader with pinned batches
    # (PD301's snippet is the workers alone: pinning is PD302's fix)
    assert "allow_tf32" in _shown(by_id["PD357"], "cuda") and "allow_tf32" not in _shown(by_id["PD357"], "cpu")
    assert "pin_memory=True" in _shown(by_id["PD318"], "cuda") and "pin_memory" not in _shown(by_id["PD318"], "cpu")
    assert _shown(by_id["PD301"], "cuda") == _shown(by_id["PD301"], "cpu") and "pin_memory" not in _shown(by_id["PD301"], "cpu")
    assert "prefetch_factor=4" in _shown(by_id["PD301"], "cpu")


def test_snippet_by_shows_the_scripts_own_optimizer_class():
    pd338 = next(r for r in load_rules() if r.id == "PD338")

    def shown(cls):
        doc = _finding_doc(Finding(rule=pd338, summary="s", evidence={"optimizer.class": cls}), "cpu")
        return doc["fix"]["snippet"]

    adam = shown("Adam")
    assert "torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)" in adam and "SGD" not in adam
    assert "torch.optim.AdamW(" in shown("AdamW") and "torch.optim.Adam(" not in shown("AdamW")
    assert "momentum=0.9, fused=True" in shown("SGD") and "Adam" not in shown("SGD")
    assert "foreach=True" in shown("RMSprop") and "fused=True)" not in shown("RMSprop")
    # a class it has no snippet for (a library's optimizer), or none known: the general one
    assert shown("Lion") == shown(None) == pd338.snippet


def test_snippet_by_must_name_an_evidence_metric(tmp_path):
    pd338 = next(r for r in load_rules() if r.id == "PD338")
    text = open(pd338.path).read().replace('id = "PD338"', 'id = "PD991"').replace(
        'slug = "fused-optimizer"', 'slug = "fused-optimizer-copy"')
    (tmp_path / "PD991-copy.toml").write_text(text)
    assert next(r for r in load_rules([tmp_path]) if r.id == "PD991").snippets.keys() == pd338.snippets.keys()
    (tmp_path / "PD991-copy.toml").write_text(text.replace('snippet_by = "optimizer.class"', 'snippet_by = "share.host"'))
    with pytest.raises(RulesInvalid) as exc:
        load_rules([tmp_path])
    assert any("snippet_by 'share.host' must be one of the rule's evidence metrics" in p.message
               for p in exc.value.problems)
