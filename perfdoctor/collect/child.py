"""Child side of `perfdoctor run`: run the user's script as `python script.py` would, with hooks.

Launched by the parent as `python -m perfdoctor.collect.child` with the run configuration in the
PERFDOCTOR_CHILD environment variable (JSON). Nothing heavy is imported here, and torch is never
imported before the script imports it (scripts set OMP_NUM_THREADS etc. first): an import
finder waits for the script's own `import torch`, then installs the hooks (hooks.py).
The script's stdout/stderr are inherited untouched; its exceptions and exit codes propagate
exactly as under plain Python, after the hooks have written what they measured.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import runpy
import signal
import sys
import types

ENV = "PERFDOCTOR_CHILD"
NO_MODULE = "no_module"      # child.json's outcome when -m names no module python can run


class _NoModule(Exception):
    """runpy found no module to run (python -m's one-line error)."""


class _ImportWatcher(importlib.abc.MetaPathFinder):
    """Calls each `on_import(module)` registered for a module name right after that module's
    first import finishes executing: torch's (the hooks), and modules whose functions the script
    may bind by name (`from safetensors.torch import save_file`: wrapping the module's attribute
    at a later step boundary would miss that name)."""

    def __init__(self):
        self.hooks: dict[str, list] = {}

    def watch(self, name: str, on_import) -> None:
        mod = sys.modules.get(name)
        if mod is not None and not getattr(getattr(mod, "__spec__", None), "_initializing", False):
            on_import(mod)                       # imported already (not from a clean start)
        else:                                    # to come, or executing now (its import imports torch)
            self.hooks.setdefault(name, []).append(on_import)

    def find_spec(self, name, path=None, target=None):
        hooks = self.hooks.pop(name, None)       # popped first: find_spec below asks this finder too
        if not hooks:
            return None
        spec = importlib.util.find_spec(name)   # the real spec, found by the other finders
        if spec is None or spec.loader is None:
            return None
        loader, watcher = spec.loader, self

        class _Loader(importlib.abc.Loader):
            def create_module(self, s):
                return loader.create_module(s)

            def exec_module(self, module):
                loader.exec_module(module)
                for hook in hooks + watcher.hooks.pop(name, []):   # and those registered meanwhile
                    hook(module)

        spec.loader = _Loader()
        return spec


WATCHER = _ImportWatcher()


def main() -> None:
    cfg = json.loads(os.environ.pop(ENV))
    from perfdoctor.collect import hooks, threadstop   # stdlib-only modules; torch is imported lazily

    session = hooks.Session(cfg, watch=WATCHER.watch)
    _finish_before_os_exit(session)
    _signals_told(cfg.get("signal_fd"))
    sys.meta_path.insert(0, WATCHER)
    WATCHER.watch("torch", session.install)
    for name in session.calls.modules():
        WATCHER.watch(name, session.calls.on_import)
    argv = cfg["argv"]
    script = None
    try:
        if cfg.get("module"):
            sys.argv = [argv[0], *argv[1:]]
            sys.path[0] = os.getcwd()
            _run_module(cfg["module"], session)
        else:
            script = os.path.abspath(argv[0])
            sys.argv = [argv[0], *argv[1:]]
            sys.path[0] = os.path.dirname(script)
            _run_path(script, argv0=argv[0])
        session.script_over.set()           # from here on, no stop is raised in this thread
    except hooks.StopRun:
        _stopped(session)
    except SystemExit as exc:
        session.finish(outcome="exit", exit_code=_code(exc.code))
        raise
    except KeyboardInterrupt as exc:
        session.finish(outcome="interrupted")
        # Python prints an uncaught KeyboardInterrupt through sys.excepthook and then ends by
        # SIGINT: keep both, with the traceback `python script.py` would print (no frames of ours)
        tb = _from_script(exc.__traceback__, script) if script else _as_python_m(exc.__traceback__)
        hook = sys.excepthook

        def as_python(kind, value, trace, exc=exc, tb=tb, hook=hook):
            if value is exc and tb is not None:      # the hook prints the exception's own traceback
                value, trace = value.with_traceback(tb), tb
            hook(kind, value, trace)
        sys.excepthook = as_python
        raise
    except BaseException as exc:
        session.finish(outcome="crashed", error=f"{type(exc).__name__}: {exc}")
        # Print the traceback as `python script.py` or `python -m module` does: without
        # perfdoctor's frames (and runpy's for a script); an uncaught exception exits with 1.
        tb = _from_script(exc.__traceback__, script) if script else _as_python_m(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        sys.exit(1)
    if session.thread_stop is not None:     # the training thread was stopped (threadstop.py)
        _stopped(session)
    elif threadstop.live_threads():
        # Python waits for the script's other threads before it exits (a trainer the main code
        # did not join): their steps are the run's, and the records are written after them
        atexit.register(_finish_at_exit, session)
    else:
        session.finish(outcome="completed", exit_code=0)


def _stopped(session) -> None:
    """Stopped by --max-steps or --duration: exit 0."""
    session.finish(outcome="stopped")
    if _in_process_group():
        _leave_now(0)
    sys.exit(0)


def _finish_at_exit(session) -> None:
    stopped = session.thread_stop is not None
    session.finish(outcome="stopped" if stopped else "completed", exit_code=None if stopped else 0)


def _signals_told(fd) -> None:
    """Python's C signal handler writes the number of each signal this process gets to `fd`, read
    by the launcher (launcher.ChildSignals): a Ctrl-C the script got from the terminal is not sent
    to it again. The script does not see that fd: signal.set_wakeup_fd answers as if none were set
    (a script or library that sets its own, as an asyncio loop does, replaces it: then every
    SIGINT perfdoctor gets is sent on, as before)."""
    if not isinstance(fd, int) or isinstance(fd, bool):
        return
    try:
        os.set_inheritable(fd, False)             # not the script's subprocesses'
        os.set_blocking(fd, False)
        real = signal.set_wakeup_fd
        real(fd, warn_on_full_buffer=False)
    except (OSError, ValueError, TypeError):
        return

    def set_wakeup_fd(new, *a, **kw):
        old = real(new, *a, **kw)
        return -1 if old == fd else old
    set_wakeup_fd.__doc__ = real.__doc__
    signal.set_wakeup_fd = set_wakeup_fd


def _in_process_group() -> bool:
    dist = sys.modules.get("torch.distributed")
    try:
        return dist is not None and dist.is_available() and dist.is_initialized()
    except Exception:
        return False


def _leave_now(code: int) -> None:
    """Stopped inside a process group, the script never reaches its destroy_process_group(): a
    group left to the interpreter's teardown can abort there (gloo: "terminate called without an
    active exception", exit 134). Leave as a DDP script ending with os._exit does: the script's
    output flushed, then os._exit, whose wrapper (_finish_before_os_exit) writes our records."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code)


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


def _run_path(script: str, argv0: str) -> None:
    """`python PATH`: runpy.run_path with the absolute path (the script's __file__ and its
    tracebacks, as Python 3.9+ gives them), but sys.argv[0] as the user typed it (run_path would
    set it to the absolute path; scripts print it in usage lines and pass it on to subprocesses)."""
    modified = getattr(runpy, "_ModifiedArgv0", None)
    if modified is None:                     # a runpy without it: the absolute path, as before
        runpy.run_path(script, run_name="__main__")
        return

    class _AsTyped(modified):
        def __init__(self, value):
            super().__init__(argv0 if value == script else value)

    runpy._ModifiedArgv0 = _AsTyped
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        runpy._ModifiedArgv0 = modified


def _run_module(name: str, session) -> None:
    """`python -m NAME`: runpy.run_module(NAME, run_name="__main__", alter_sys=True) in its two
    halves, so that a module python cannot run (none of that name, a package without __main__)
    ends as under python: `<python>: No module named NAME` on stderr, exit code 1, and the
    outcome NO_MODULE in child.json."""
    try:
        _, spec, code = runpy._get_module_details(name, _NoModule)
    except _NoModule as exc:
        session.finish(outcome=NO_MODULE, exit_code=1, error=str(exc))
        sys.exit(f"{sys.executable}: {exc}")
    runpy._run_module_code(code, None, "__main__", spec)


def _as_python_m(tb):
    """The traceback as `python -m` prints it. Python ran this file through runpy
    (_run_module_as_main, then _run_code); this file ran the module through runpy again
    (run_module's halves: _get_module_details, _run_module_code, _run_code). Kept: the outer
    _run_module_as_main frame (above main(), so not in the traceback yet), then the inner frames
    from _get_module_details or _run_code on: the chain `python -m` shows."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    mine = [i for i, e in enumerate(entries) if e.tb_frame.f_code.co_filename == __file__]
    if not mine:
        return entries[0] if entries else None
    inner = [(e.tb_frame, e.tb_lasti, e.tb_lineno) for e in entries[mine[-1] + 1:]
             if not (_in_runpy(e.tb_frame) and e.tb_frame.f_code.co_name in ("run_module", "_run_module_code"))]
    outer, f = [], entries[0].tb_frame.f_back
    while f is not None:
        if _in_runpy(f) and f.f_code.co_name == "_run_module_as_main":
            outer.insert(0, (f, *_call_site(f, inner[0][0].f_code.co_name if inner else "")))
        f = f.f_back
    return _without_ours(_chain(outer + inner))


def _call_site(frame, callee: str) -> tuple[int, int]:
    """(lasti, line) of `frame`'s call of `callee` (python -m fails in _get_module_details from
    another line of _run_module_as_main than the one that runs the code); where it is now else."""
    if callee == "_get_module_details":
        import dis
        line = None
        for ins in dis.get_instructions(frame.f_code):
            pos = getattr(ins, "positions", None)          # 3.11+; 3.10: starts_line
            line = (pos.lineno if pos else None) or ins.starts_line or line
            if ins.argval == callee and isinstance(line, int) and not isinstance(line, bool):
                return ins.offset, line
    return frame.f_lasti, frame.f_lineno


def _in_runpy(frame) -> bool:
    return frame.f_globals.get("__name__") == "runpy"


def _from_script(tb, script: str):
    """The traceback from the script's first frame on (None when the script never ran a line,
    as for a SyntaxError, which Python prints without a traceback), without perfdoctor's frames."""
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    return _without_ours(tb)


OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep     # the perfdoctor package


def _without_ours(tb):
    """The traceback less the frames of perfdoctor's wrappers inside the script's calls (the
    Module.__call__ that finds the steps, the DataLoader iterator, the timed calls): `python
    script.py` has none of them. Kept whole with PERFDOCTOR_DEBUG=1, or if every frame is ours."""
    entries = []
    while tb is not None:
        entries.append((tb.tb_frame, tb.tb_lasti, tb.tb_lineno))
        tb = tb.tb_next
    keep = [e for e in entries if not e[0].f_code.co_filename.startswith(OURS)]
    return _chain(entries if os.environ.get("PERFDOCTOR_DEBUG") == "1" or not keep else keep)


def _chain(entries):
    out = None
    for frame, lasti, lineno in reversed(entries):
        out = types.TracebackType(out, frame, lasti, lineno)
    return out


def _code(code) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


if __name__ == "__main__":
    main()
