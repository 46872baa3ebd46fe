"""Python frames that a switch removes from the step: the share of the steady steps' sampled time
inside them (stacks.* metrics, from analyze/stacks.py's walk of the training thread).

    stacks.anomaly_stack_share       traceback.format_stack / extract_stack (torch.fx.traceback's
                                     too): autograd anomaly mode storing, inside each forward op
                                     that records a backward node, the Python stack that made it
                                     (off with the mode: PD374)

    stacks.distribution_check_share  torch.distributions checking its arguments: a frame of
                                     Distribution.__init__ or Distribution._validate_sample
                                     (torch/distributions/distribution.py), or of a constraint's
                                     check (torch/distributions/constraints.py). On by default
                                     (validate_args follows __debug__): each Categorical(probs)
                                     checks that probs lie on the simplex and each log_prob(a)
                                     that a is in its support, a few small ops and a host read
                                     each. Off with validate_args=False (PD379). With the checks
                                     off, Distribution.__init__ sets two attributes and returns:
                                     a sample there is the checks'.

A stack counts whole where any of its frames matches: the frame's callees are its work.
"""

from __future__ import annotations

DIST_FILE = "torch/distributions/distribution.py"
CONSTRAINTS_FILE = "torch/distributions/constraints.py"
DIST_CHECKS = ("__init__", "_validate_sample")


def stores_stack(stack: tuple) -> bool:
    """Autograd anomaly mode at work: each forward op that records a backward node stores the
    Python stack that made it (torch calls traceback.format_stack, or torch.fx.traceback's, from
    inside the op): a sample inside one of those calls."""
    return any(f[0] in ("format_stack", "extract_stack") and f[1].endswith("traceback.py") for f in stack)


def checks_distribution(stack: tuple) -> bool:
    """torch.distributions validating its arguments (see the module docstring). Frames are
    (function, file, line); py-spy names a method Class.method, or the bare function."""
    for func, file, _ in stack:
        path = file.replace("\\", "/")
        if path.endswith(CONSTRAINTS_FILE):
            return True
        if path.endswith(DIST_FILE) and func.rsplit(".", 1)[-1] in DIST_CHECKS:
            return True
    return False


MARKS = {"stacks.anomaly_stack_share": stores_stack,
         "stacks.distribution_check_share": checks_distribution}


class Marks:
    """Sampled time per mark over a walk of the trainer's segments (each stack tested once)."""

    def __init__(self):
        self.time = dict.fromkeys(MARKS, 0.0)
        self._memo: dict[tuple, tuple[str, ...]] = {}

    def add(self, stack: tuple, seconds: float) -> None:
        hit = self._memo.get(stack)
        if hit is None:
            hit = self._memo[stack] = tuple(k for k, f in MARKS.items() if f(stack))
        for k in hit:
            self.time[k] += seconds

    def shares(self, sampled: float) -> dict:
        return {k: v / sampled for k, v in self.time.items()}
