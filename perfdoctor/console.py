"""The console script (`perfdoctor`, `python -m perfdoctor`).

Before the CLI is imported, a `report` starts loading its trace (perfdoctor.trace.prefetch):
a helper process decodes while typer, numpy, the analysis and the rules are imported. After
the command, the process leaves without interpreter teardown: freeing a big trace's objects
and modules costs ~70 ms that nobody waits for usefully. Output is flushed first and every
file perfdoctor writes is closed by then, so nothing is lost. In-process callers (tests) use
perfdoctor.cli.main(), which raises SystemExit as usual.
"""

from __future__ import annotations

import os
import sys


def entry() -> None:
    prefetch = None
    if sys.argv[1:2] == ["report"]:  # other commands do not pay for importing the loader
        from perfdoctor.trace import prefetch

        prefetch.start_from_argv(sys.argv[1:])
    try:
        from perfdoctor.cli import main

        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # sys.exit("message"): what Python would print, and status 1
            print(exc.code, file=sys.stderr)
            code = 1
    finally:
        if prefetch is not None:
            prefetch.abandon()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): its reader has gone
            pass
    os._exit(code)
