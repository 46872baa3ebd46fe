"""Child side of `perfdoctor run`: run the user's script as `python script.py` would, with hooks.

Launched by the parent as `python -m perfdoctor.collect.child` with the run configuration in the
PERFDOCTOR_CHILD environment variable (JSON). Nothing heavy is imported here, and torch is never
imported before the script imports it (scripts set OMP_NUM_THREADS etc. first): an import
finder waits for the script's own `import torch`, then installs the hooks (hooks.py).
The script's stdout/stderr are inherited untouched; its exceptions and exit codes propagate
exactly as under plain Python, after the hooks have written what they measured.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import runpy
import sys

ENV = "PERFDOCTOR_CHILD"


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Calls `on_import(module)` right after the first `import torch` finishes executing."""

    def __init__(self, on_import):
        self.on_import = on_import
        self.done = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self.done:
            return None
        self.done = True
        spec = importlib.util.find_spec(name)   # the real spec, found by the other finders
        if spec is None or spec.loader is None:
            return None
        loader, hook = spec.loader, self.on_import

        class _Loader(importlib.abc.Loader):
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                hook(module)

        spec.loader = _Loader()
        return spec


def main() -> None:
    cfg = json.loads(os.environ.pop(ENV))
    from perfdoctor.collect import hooks   # stdlib-only module; imports torch lazily

    session = hooks.Session(cfg)
    _finish_before_os_exit(session)
    watcher = _TorchWatcher(session.install)
    sys.meta_path.insert(0, watcher)
    if "torch" in sys.modules:                # cannot happen from a clean start, but be safe
        session.install(sys.modules["torch"])
    argv = cfg["argv"]
    script = None
    try:
        if cfg.get("module"):
            sys.argv = [argv[0], *argv[1:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(cfg["module"], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(argv[0])
            sys.argv = [argv[0], *argv[1:]]
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
    except hooks.StopRun:
        session.finish(outcome="stopped")
        sys.exit(0)
    except SystemExit as exc:
        session.finish(outcome="exit", exit_code=_code(exc.code))
        raise
    except KeyboardInterrupt:
        session.finish(outcome="interrupted")
        raise
    except BaseException as exc:
        session.finish(outcome="crashed", error=f"{type(exc).__name__}: {exc}")
        if script is None:
            raise
        # Print the traceback as `python script.py` does: from the script's own frame, without
        # perfdoctor's and runpy's frames above it; an uncaught exception exits with 1.
        tb = _from_script(exc.__traceback__, script)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        sys.exit(1)
    session.finish(outcome="completed", exit_code=0)


def _finish_before_os_exit(session) -> None:
    """os._exit skips `finally`, atexit and the handlers below: the script's own call to it
    first records what the hooks measured (a DDP script may leave that way). A forked process
    (a DataLoader worker ends with os._exit) inherits the wrapper and passes straight through."""
    real, pid = os._exit, os.getpid()

    def _exit(code):
        if os.getpid() == pid:
            try:
                session.finish(outcome="exit", exit_code=_code(code))
                from perfdoctor.collect import inject   # tune's record (an atexit handler)
                inject.write_record()
            except BaseException:      # whatever happens, the script leaves as it asked
                pass
        real(code)
    os._exit = _exit


def _from_script(tb, script: str):
    """The traceback from the script's first frame on (None when the script never ran a line,
    as for a SyntaxError, which Python prints without a traceback)."""
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    return tb


def _code(code) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


if __name__ == "__main__":
    main()
