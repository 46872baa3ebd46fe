"""A tiny training package, for testing `perfdoctor run -m` (run from the examples directory):

    cd examples && python -m pkg_train.train [--steps N]      # the train module
    cd examples && python -m pkg_train [--steps N]            # the package (__main__.py)

train.py uses a relative import (`from . import make_model`), which works only when it runs
as a module of this package (`-m`), not as a file path: a runner that gets `-m` wrong fails.
"""

import torch.nn as nn


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
