"""`python -m pkg_train`: the same training run as `python -m pkg_train.train`."""

from .train import main

main()
