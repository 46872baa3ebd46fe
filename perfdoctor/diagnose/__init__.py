"""From metrics to a verdict (what bounds the step) and flags (what else is wrong)."""
