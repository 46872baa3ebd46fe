"""Loading torch.profiler (Kineto) Chrome traces into columnar numpy event tables."""

from perfdoctor.trace.loader import load_trace, load_traces
from perfdoctor.trace.table import EventTable

__all__ = ["EventTable", "load_trace", "load_traces"]
