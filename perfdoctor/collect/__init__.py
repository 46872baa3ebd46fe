"""The live run: launching the child, in-process hooks, system samplers. Writes a run directory;
knows nothing about reporting."""
