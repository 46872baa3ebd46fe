"""Statistics shared by run, compare, gate and tune (numpy only, never torch)."""

from perfdoctor.stats.speedups import speedup, wait_share_change
from perfdoctor.stats.steptime import StepEstimate, estimate, estimate_durations

__all__ = ["StepEstimate", "estimate", "estimate_durations", "speedup", "wait_share_change"]
