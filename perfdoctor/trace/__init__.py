"""Loading torch.profiler (Kineto) Chrome traces into columnar numpy event tables.

Import from the modules: loader (load_trace, PendingLoad), table (EventTable). Importing the
package itself imports nothing, so the loader can start before numpy is imported."""
