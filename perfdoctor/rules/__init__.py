"""The rule engine: loads rules/ (TOML data files), evaluates them over registered metrics with
a safe expression evaluator, computes Amdahl-bounded gains and ranks the fixes."""
