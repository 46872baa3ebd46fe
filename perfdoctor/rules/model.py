"""A rule as loaded from one TOML file (format documented in docs/rules.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS = ("verdict", "flag", "fix")
DEVICES = ("cuda", "rocm", "mtia", "cpu", "any")
BOUNDS = ("input_io", "input_cpu", "input", "host", "device", "communication", "inconclusive")
TARGETS = ("input", "host", "device", "communication")
SEVERITIES = ("high", "medium", "low")


def target_of(bound: str | None) -> str | None:
    """input_io / input_cpu / input all address the input pipeline."""
    if bound is None:
        return None
    return "input" if bound.startswith("input") else bound


@dataclass
class Gain:
    """Two numbers per fix. The ceiling: the Amdahl bound of `speedup` on `share` (share, speedup,
    assumption). The expected gain: a model of what the change does, `expected_speedup` on
    `expected_share` (default: share), optionally with a low/high range, and its assumption
    (`model`). Without an expected model a fix only has its ceiling and ranks after the modelled."""

    share: str                 # expression: the measured share of step time the fix attacks
    speedup: str               # expression: assumed speed-up of that share for the ceiling ("inf" = removed)
    assumption: str            # why that ceiling
    label: str                 # what the share is, in words ("data wait")
    share_names: list[str] = field(default_factory=list)
    speedup_names: list[str] = field(default_factory=list)
    expected_speedup: str | None = None     # expression: the speed-up of expected_share the model expects
    expected_share: str | None = None       # expression; None = share
    expected_range: tuple[str, str] | None = None   # expressions: low and high speed-up of that share
    model: str | None = None                # the expected model's assumption, in words
    expected_names: list[str] = field(default_factory=list)
    work: bool = False         # the share is time spent working (ops, kernels, copies, Python), which
    #                            the profiler can only lengthen: its ceiling allows for run.trace_inflation
    unprofiled_share: str | None = None     # expression: the same share timed on un-profiled steps
    #                            (None where not measured); when known it is the ceiling's and the
    #                            expected model's share, with no inflation to allow for
    overlaps: list[str] = field(default_factory=list)   # slugs of fixes whose shares overlap this
    #                            one's (gain.stacked composes them multiplicatively when applied together)
    unbounded: str | None = None           # expression: where true, the share bounds nothing (the rest
    #                            of the step changes with the fix too): no ceiling, `unbounded_reason` says why
    unbounded_reason: str | None = None
    let: dict[str, str] = field(default_factory=dict)   # [gain.let]: names for sub-expressions the
    #                            gain's expressions share, evaluated in order (expr.Evaluator.scope)
    expected_with: str | None = None       # template over metrics and [gain.let] names: the setting the
    #                            expected gain assumes ("with {count:.0f} workers"), said beside it


@dataclass
class Case:
    name: str
    metrics: dict[str, Any]
    fires: bool
    gain: tuple[float, float] | None = None      # [low, high] the ceiling must lie in
    expected: tuple[float, float] | None = None  # [low, high] the expected gain must lie in


@dataclass
class Rule:
    id: str
    slug: str
    kind: str
    title: str
    devices: list[str]
    when: str
    summary: str                              # template over metric values
    source: dict[str, Any]
    cases: list[Case]
    path: str
    priority: int = 100                       # verdict rules: first firing (lowest) wins
    bound: str | None = None                  # verdict rules: the verdict they give
    severity: str = "medium"                  # flags
    evidence: list[str] = field(default_factory=list)
    gain: Gain | None = None                  # fixes; None = no speed claim
    no_gain_reason: str | None = None         # fixes without a speed claim say why
    fix_text: str | None = None
    snippet: str | None = None
    snippet_cpu: str | None = None            # shown instead of snippet on CPU-only traces (no CUDA lines)
    snippet_lang: str = "python"
    snippet_by: str | None = None             # an evidence metric whose value picks a snippet from `snippets`
    snippets: dict[str, str] = field(default_factory=dict)
    when_names: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)   # fixes: the verdict classes they address

    @property
    def flag_name(self) -> str:
        """How other rules refer to this flag's outcome: flag.<slug with underscores>."""
        return "flag." + self.slug.replace("-", "_")

    def applies_to(self, platform: str) -> bool:
        return "any" in self.devices or platform in self.devices
