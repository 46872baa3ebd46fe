"""perfdoctor: diagnose PyTorch training bottlenecks from torch.profiler traces and live runs."""

__version__ = "0.1.0"
