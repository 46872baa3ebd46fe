"""The training thread waiting for the GIL while the loop's own Python threads run.

A thread the script starts in the trainer's process (a producer filling a queue, a log writer,
a prefetcher) runs its Python under the same interpreter lock as the training step: while it
holds the lock, the training thread, ready to dispatch its next op, sleeps in the lock's wait.
Two records see it, neither alone:

- the Python stacks (py-spy --idle samples every thread, blocked or not): the share of the
  steady steps' sampled time in which one of the trainer process's other threads is in a stack
  that runs (not blocked in a lock, queue, pipe, selector or sleep; analyze/stackcause.py's
  causes `waiting` and `producer_wait` left out), leaving out perfdoctor's own threads and
  torch's pin-memory thread (it copies without the GIL):

      stacks.own_threads_busy_share

- the step records: the training thread's time neither on a CPU nor queued for one
  (dur - cpu - runq, collect/steprecord.py), over the steady steps' wall time, less the waits
  already named: the DataLoader's data wait (`wait`), and the stacks' producer_wait, waiting,
  checkpoint and logging_sync shares. What is left the thread slept for a reason not named.

      stacks.gil_wait_share = min(stacks.own_threads_busy_share, unnamed sleep share)

The lock's handoffs cost more than the sleep: a thread woken for the lock queues for a core
(runq) on a busy machine, and the step's own work slows beside a thread taking turns with it.
Measured on the 2-core VM, a thread spinning in Python beside the step: the training thread
asleep 10.0 ms of a 15.2 ms step (the share 0.67: at most 3.1x), queued 2.4 ms (0.9 ms with the
spinner in a process), and the step 3.8x faster with the spinner in a process. So the ceiling of
moving the threads' work out counts the queueing too:

      stacks.gil_bound_share = min(stacks.own_threads_busy_share, unnamed sleep + runq share)

(0.82 there: at most 5.7x; a producer thread filling a queue: 1.48x measured, 0.46: at most 1.9x).

Either bound alone overstates: a busy thread that releases the GIL (a C call, IO) does not stop
the step, and the thread can sleep for reasons the stacks do not name. Measured (2-core VM, an
MLP step on 1 torch thread, the step timed with the producer as a thread and as a process): a pure-Python producer in a thread, 50k loop iterations a batch,
the unnamed sleep 0.15-0.17 of the step, the step 1.17-1.27x slower than with the same producer
in a process; a spinning thread, 0.42 predicted 1.7x, measured 2.2-5x (the lock's switch
interval, 5 ms, also delays the training thread's next op); no producer: sleep 0, with 2
intra-op threads too. py-spy's own --gil sampling overstates (the lock held 14-31% of the time
with no step lost) and is not used.

On a device the training thread also sleeps in backward while the autograd device thread works,
and in synchronizations: its sleep is no GIL wait there. So the share is None off the CPU
platform, without the thread's CPU clock (run.thread_awake_share), or without stacks.
"""

from __future__ import annotations

import linecache

from perfdoctor.analyze.stackcause import blocked, classify, code_frames
from perfdoctor.analyze.stepwait import sleep_sums

IDLE_CAUSES = ("waiting", "producer_wait")
PIN_MEMORY = "torch.utils.data._utils.pin_memory"
THREAD_WRAPPER = "collect/threadstop.py"
NAMED_WAITS = ("stacks.producer_wait_share", "stacks.waiting_share", "stacks.checkpoint_share",
               "stacks.logging_sync_share")


def own_thread(stack: tuple) -> bool:
    """A thread of the user's or a library's (not perfdoctor's, not torch's pin-memory thread):
    the thread's target, the first frame past the standard library's thread start and our
    wrapper of it (collect/threadstop.py wraps every thread's bootstrap), is not ours, and no
    frame is the pin-memory loop."""
    frames = code_frames(stack)
    if any(f.kind == "lib" and f.module.startswith(PIN_MEMORY) for f in frames):
        return False
    first = next((f for f in frames if not (f.kind == "lib" and f.stdlib or f.file.endswith(THREAD_WRAPPER))), None)
    return first is None or first.kind != "tool"


def busy(stack: tuple, source=linecache.getline) -> bool:
    """The stack runs (it holds or wants the GIL): not blocked, not waiting by its cause."""
    frames = code_frames(stack)
    if not frames or blocked(frames[-1]):
        return False
    return classify(stack, source)[0] not in IDLE_CAUSES


def unnamed_sleep_share(steps: list[dict], m: dict) -> float | None:
    """The steady steps' share the training thread slept, less the waits already named (the
    DataLoader's data wait and the stacks' waits, NAMED_WAITS); at least 0. None without the
    steps' cpu and runq."""
    dur, sleep, wait, _ = sleep_sums(steps)
    if dur <= 0:
        return None
    named = sum(float(m.get(k) or 0.0) for k in NAMED_WAITS)
    return max(0.0, sleep / dur - wait / dur - named)


def gil_wait(steps: list[dict], m: dict) -> dict:
    """stacks.gil_wait_share and stacks.gil_bound_share from the steady steps and the metrics (see
    the module docstring)."""
    busy_share = m.get("stacks.own_threads_busy_share")
    out = {"stacks.gil_wait_share": None, "stacks.gil_bound_share": None}
    if (not isinstance(busy_share, (int, float)) or m.get("trace.platform") != "cpu"
            or not isinstance(m.get("run.thread_awake_share"), (int, float))):
        return out
    sleep = unnamed_sleep_share(steps, m)
    if sleep is not None:
        dur, _, _, runq = sleep_sums(steps)
        out["stacks.gil_wait_share"] = float(min(busy_share, sleep))
        out["stacks.gil_bound_share"] = float(min(busy_share, sleep + runq / dur))
    return out
