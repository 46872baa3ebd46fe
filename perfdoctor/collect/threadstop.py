"""A script that trains in a thread other than the main one: its stop, its end, its profiler.

- Stop. StopRun (--max-steps, --duration) ends the script at a step boundary. In the main
  thread it leaves the script and child.py ends the run (exit 0). In another thread it ends
  that thread: Python would print it as the thread's uncaught exception ("Exception in thread
  trainer: ... StopRun") and the run would read as finished by itself. So threading.excepthook
  swallows our StopRun, and only it (any other exception goes to the hook it replaced), and
  records the stop: child.py reports the run as stopped, exit 0, as for a main-thread script.
- The main thread then has `stop_grace_s` (STOP_GRACE_S; PERFDOCTOR_STOP_GRACE_S) from the
  stopped thread's end to end the script by itself: one that joins the trainer goes on with
  what follows the join (a checkpoint save is not cut short). One still running then (a
  supervisor loop, a wait on a queue the trainer fed) gets StopRun raised in it by STOP_SIGNAL,
  whose handler is the session's (the signal wakes a blocking wait). A script that took
  STOP_SIGNAL for itself is not signalled (nor can --duration ask it to stop): its main thread
  ends as it will.
- STOP_SIGNAL, --duration's request, is a real-time signal no script has a use for: scripts and
  their libraries take SIGUSR1 (`faulthandler.register(signal.SIGUSR1)` dumps every thread's
  stack on it, SLURM's requeue handlers save a checkpoint), and a stop sent there was theirs.
- End. A main thread that returns with a trainer still running: Python waits for its non-daemon
  threads before it exits, and so do the run's records (child.py, live_threads).
- Profiler. torch.profiler stops only in the thread that started it (stopped from another, the
  script died of SIGSEGV): each thread, as it ends, stops the window it started.
"""

from __future__ import annotations

import signal
import threading

from perfdoctor.collect.window import seconds

# SIGRTMIN+0..2 may be taken by the C library's threads; +6 by nothing we know of (SIGUSR1 where
# there are no real-time signals)
STOP_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR1
STOP_GRACE_S = 10.0      # under the launcher's 30 s for --duration: the stop stays a stop, not an interrupt


def attach(session, cfg: dict) -> None:
    """The session's stop state, and our threading.excepthook."""
    session.stopping = False             # StopRun raised at a step boundary
    session.thread_stop = None           # the name of a thread other than the main one that StopRun ended
    session.script_over = threading.Event()   # the script's main code has returned or raised (child.py)
    session.stop_grace_s = seconds(cfg, "stop_grace_s", "PERFDOCTOR_STOP_GRACE_S", STOP_GRACE_S)
    install(session)
    _watch_ends(session)


def _watch_ends(session) -> None:
    """Each thread of the script, as it ends (normally, by StopRun or by an exception, after
    threading.excepthook), stops the profiler window if it started it. Thread._bootstrap_inner
    runs every threading.Thread's run(), whatever class overrides run()."""
    orig = getattr(threading.Thread, "_bootstrap_inner", None)
    if orig is None or getattr(orig, "_perfdoctor", False):
        return

    def _bootstrap_inner(thread):
        try:
            orig(thread)
        finally:
            try:
                session.window.thread_ended()
            except Exception:
                pass
    _bootstrap_inner._perfdoctor = True
    threading.Thread._bootstrap_inner = _bootstrap_inner


def install(session) -> None:
    """Our hook in front of threading.excepthook (again if the script has replaced it since)."""
    current = threading.excepthook
    if getattr(current, "_perfdoctor", None) is session:
        return

    def excepthook(args, _prev=current):
        from perfdoctor.collect.hooks import StopRun
        if isinstance(args.exc_type, type) and issubclass(args.exc_type, StopRun):
            stopped(session, args.thread)
            return
        _prev(args)
    excepthook._perfdoctor = session
    threading.excepthook = excepthook


def stopped(session, thread) -> None:
    """`thread` ended by StopRun: record it; the main thread gets the grace period to end."""
    if session.thread_stop is None:
        session.thread_stop = getattr(thread, "name", None) or "a thread"
    threading.Thread(target=_watch, args=(session, thread), name="perfdoctor-stop", daemon=True).start()


def _watch(session, thread) -> None:
    if thread is not None:
        thread.join()                    # its excepthook returns, then it ends
    if not session.script_over.wait(session.stop_grace_s):
        interrupt_main(session)


def interrupt_main(session) -> None:
    """StopRun in the main thread while it runs the script (never once child.py has it back)."""
    main = threading.main_thread()
    if session.script_over.is_set() or not main.is_alive():
        return
    try:
        if signal.getsignal(STOP_SIGNAL) == session._on_stop_signal:
            signal.pthread_kill(main.ident, STOP_SIGNAL)       # its handler raises StopRun in the main thread
    except (AttributeError, ValueError, OSError):
        pass


def live_threads() -> list:
    """The script's threads that keep the process alive after its main code returns (Python
    joins them before it exits): non-daemon, other than the main thread."""
    me = threading.current_thread()
    return [t for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]
