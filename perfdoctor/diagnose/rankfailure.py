"""Which rank's failure tells a multi-rank job's: the root cause, not its echoes.

When one rank of a synchronous job fails, the others fail after it and because of it: torchrun
stops them with SIGTERM (exit code 143), and a rank that was waiting in a collective for the
failed one gets its own error first ("Connection closed by peer ... typically caused by a
remote worker crashing" from gloo, a NCCL communicator aborted or timed out). The job's failure
is told by the rank whose failure is not such a consequence, as torchrun's "Root Cause" does:

    1. failed ranks only (exit code not 0);
    2. a rank that was neither stopped by SIGTERM nor failed with a peer's error comes first;
    3. then the first to end (rank.json's end_unix: when its launcher saw the script end; on
       one host one clock, across hosts as close as their clocks agree), then the lowest rank.

The job's run section then takes that rank's outcome and error (named: "rank 1: RuntimeError:
..."), and its exit code and signal together: the job's as torchrun gave it (ranks.json, with
`--nproc-per-node`), else that rank's own (the user's launcher: each rank exits with its own).
Nothing here reads a trace. Used by diagnose/ranks.py.
"""

from __future__ import annotations

import re
import signal

# errors a rank gets because a peer failed or never came: the transport closed under it, the
# communicator aborted, or the collective timed out waiting (gloo, NCCL, the c10d store)
PEER_ERROR = re.compile(
    r"connection closed by peer|connection reset by peer|remote worker crash|broken pipe"
    r"|remote process exited|ncclRemoteError|communicator was aborted|ProcessGroupNCCL is aborted"
    r"|NCCL operations have failed or timed out|Watchdog caught collective operation timeout"
    r"|DistNetworkError|failed to recv, got 0 bytes|timed out waiting|operation timed out", re.I)
STOPPED = signal.SIGTERM                  # how torchrun (and Slurm) stop the ranks left
PEER = "its error says a peer failed"


def consequence(info: dict, doc: dict) -> str | None:
    """Why this failed rank's failure looks like another's consequence ('stopped by SIGTERM',
    PEER), None when it looks like its own."""
    sig, code = info.get("signal"), info.get("exit_code")
    if sig == STOPPED or (sig is None and code == 128 + STOPPED):
        return "stopped by SIGTERM"
    err = (doc.get("run") or {}).get("error")
    if isinstance(err, str) and PEER_ERROR.search(err):
        return PEER
    return None


def first_failure(infos: list[dict], docs: list[dict]) -> int | None:
    """The position of the rank whose failure is the job's (module docstring), None when no rank
    failed (or no rank's exit code is known)."""
    failed = [i for i, info in enumerate(infos) if rank_exit_code(info, docs[i])]
    if not failed:
        return None

    def key(i: int):
        end = infos[i].get("end_unix")
        return (consequence(infos[i], docs[i]) is not None,
                end if isinstance(end, (int, float)) else float("inf"), infos[i]["rank"])
    return min(failed, key=key)


def failure_text(info: dict, doc: dict) -> str:
    """'rank 1: RuntimeError: boom', 'rank 1 was killed by signal 9 (SIGKILL)', or 'rank 1
    exited with code 3': what ended the rank, named."""
    run = doc.get("run") or {}
    err = run.get("error_line") or run.get("error")
    rank = info["rank"]
    if isinstance(err, str) and err:
        return f"rank {rank}: {err}"
    sig = info.get("signal") if info.get("signal") is not None else run.get("signal")
    if isinstance(sig, int) and sig > 0:
        try:
            name = f" ({signal.Signals(sig).name})"
        except ValueError:
            name = ""
        return f"rank {rank} was killed by signal {sig}{name}"
    return f"rank {rank} exited with code {rank_exit_code(info, doc)}"


def job_failure(job: dict, infos: list[dict], docs: list[dict]) -> dict:
    """The run section's fields that tell how the job ended: exit_code, signal, outcome, error,
    error_line, failed_rank (None without a failed rank: the job's exit code, or 0 when every
    rank's is 0, else unknown)."""
    first = first_failure(infos, docs)
    from_job = job.get("exit_code") is not None       # ranks.json: torchrun's own exit
    if first is None:
        codes = [rank_exit_code(i, d) for i, d in zip(infos, docs)]
        return {"exit_code": job["exit_code"] if from_job else (0 if None not in codes else None),
                "signal": job.get("signal") if from_job else None, "failed_rank": None}
    info, doc = infos[first], docs[first]
    run = doc.get("run") or {}
    own_sig = info.get("signal") if info.get("signal") is not None else run.get("signal")
    outcome = run.get("outcome")
    if outcome in (None, "completed", "stopped", "unknown"):   # a failed rank whose summary says otherwise
        outcome = "killed" if own_sig else "crashed"
    return {"exit_code": job["exit_code"] if from_job else rank_exit_code(info, doc),
            "signal": job.get("signal") if from_job else own_sig,
            "outcome": outcome, "error": run.get("error"), "error_line": failure_text(info, doc),
            "failed_rank": info["rank"]}


def before_first_step(run: dict, docs: list[dict]) -> str | None:
    """The job's verdict when it failed before any rank's first step, as a single run's
    (diagnose/ending.py): the failure, named, and nothing measured. None otherwise."""
    if run.get("failed_rank") is None or any((d.get("run") or {}).get("steps") for d in docs):
        return None
    code = "unknown" if run.get("exit_code") is None else run["exit_code"]
    return (f"The job failed before its first step ({run.get('error_line')}; exit code {code}): nothing was "
            "measured to diagnose. Fix the failure and run again.")


def uneven_hint(infos: list[dict], docs: list[dict]) -> str | None:
    """A note when the job's failure is a peer's error and the peer it waited for had ended
    normally (exit code 0): the ranks ran different numbers of steps, the classic uneven-inputs
    hang or crash. None otherwise."""
    first = first_failure(infos, docs)
    if first is None or consequence(infos[first], docs[first]) != PEER:
        return None
    done = [i["rank"] for i, d in zip(infos, docs) if rank_exit_code(i, d) == 0]
    if not done:
        return None
    return (f"rank {infos[first]['rank']} failed in a collective after rank(s) {', '.join(map(str, done))} had ended "
            "normally: the ranks ran different numbers of steps (uneven inputs: give every rank the same number "
            "of batches, e.g. DistributedSampler(drop_last=True), or wrap the loop in "
            "torch.distributed.algorithms.Join)")


def rank_exit_code(info: dict, doc: dict):
    """The rank's exit code: rank.json's, else its run section's (None: unknown)."""
    code = info.get("exit_code")
    return code if code is not None else (doc.get("run") or {}).get("exit_code")
