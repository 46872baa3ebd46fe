"""Pure functions from event tables to named metrics (see registry.py for the contract)."""
