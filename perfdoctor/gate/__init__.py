"""`perfdoctor compare` and `perfdoctor gate`: two runs side by side, and a CI performance gate."""

from perfdoctor.gate.gate import GateOptions, GateResult, gate_paths, gate_runs

__all__ = ["GateOptions", "GateResult", "gate_paths", "gate_runs"]
