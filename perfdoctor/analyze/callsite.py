"""The user's line a sampled stack was called from, where py-spy read it after the call returned.

`perfdoctor run` samples the trainer with py-spy --nonblocking: the process is never paused, and
py-spy walks its frames from the innermost out while it runs on. A call that returns between the
read of its own frame and the read of its caller's leaves a stack whose user line has moved on:
a user's REINFORCE loop showed `Categorical.sample at rl.py:26` beside line 26's text,
`s, r, done = env.step(a.item())`, where sample() is called on line 21 (and `log_prob` one line
late, at the next line). The stacks table then names a line whose text contradicts the function.

`settle_all(segments)` moves such a stack's user line back to where the thread's other samples
read that call: the line most often read calling the same function from the same function of the
same file, at most WINDOW lines before the line read, among the stacks whose line names it (the
nearest call by its text alone can be another branch's). A dunder or private callee (a module's
`__call__`: called as `model(x)`) is left as read, and so is a stack no other sample places.
"""

from __future__ import annotations

import linecache
import re

from perfdoctor.analyze.stackcause import code_frames

WINDOW = 12             # lines looked back from the line read


def _read(stack: tuple, lines_of) -> tuple | None:
    """(user frame, callee name, whether the user line's text names the callee) of a stack whose
    innermost user frame calls a public function; None otherwise."""
    frames = code_frames(stack)
    user = max((i for i, f in enumerate(frames) if f.kind == "user"), default=None)
    if user is None or user + 1 >= len(frames):
        return None
    callee = next((f for f in frames[user + 1:] if f.kind != "tool"), None)
    name = callee.func.rsplit(".", 1)[-1] if callee is not None else ""
    if not name.isidentifier() or name.startswith("_"):
        return None
    u = frames[user]
    try:
        lines = lines_of(u.file)
    except (OSError, ValueError, TypeError):
        return None
    if not lines or not 1 <= u.line <= len(lines):
        return None
    return u, name, re.search(rf"(^|[^\w]){re.escape(name)}\s*\(", lines[u.line - 1]) is not None


def _moved(stack: tuple, u, line: int) -> tuple:
    """`stack` with the raw frame of user frame `u` (its innermost match) at `line`."""
    i = max(k for k, f in enumerate(stack) if f[0] == u.func and f[1] == u.file and f[2] == u.line)
    return (*stack[:i], (stack[i][0], stack[i][1], line), *stack[i + 1:])


def settle_all(segs: list, lines_of=linecache.getlines) -> list:
    """A thread's segments [(start, end, stack), ...] with each stack whose user line does not
    call the function below it moved to the line that does, as the thread's other samples read
    it: the call site read most often among the stacks whose line names that callee, in the same
    file and function, at most WINDOW lines before the line read (the nearest call by text alone
    may be another branch's: `if batched: ...sample()` read late at the next line, where the else
    branch's `d.sample()` stood between). Left as read where no sample shows such a site."""
    reads = {stack: _read(stack, lines_of) for stack in dict.fromkeys(seg[2] for seg in segs)}   # once a stack
    sites: dict = {}                        # (file, func, callee) -> {line: segments read there}
    for seg in segs:
        r = reads[seg[2]]
        if r is not None and r[2]:
            key = (r[0].file, r[0].func, r[1])
            sites.setdefault(key, {})
            sites[key][r[0].line] = sites[key].get(r[0].line, 0) + 1
    moved: dict = {}
    for stack, r in reads.items():
        if r is None or r[2]:
            continue
        u, name, _ = r
        near = {ln: n for ln, n in sites.get((u.file, u.func, name), {}).items() if u.line - WINDOW <= ln < u.line}
        if near:
            moved[stack] = _moved(stack, u, max(near, key=lambda ln: (near[ln], ln)))
    return [(*seg[:2], moved.get(seg[2], seg[2]), *seg[3:]) for seg in segs] if moved else segs
