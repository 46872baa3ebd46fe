"""What the user's own source says about a sampled line (stacks.py classifies by it).

py-spy names a file and a line; the line's text and the block around it tell what a stack
alone cannot:
- a device read (`.item()`, `.cpu()`, `.tolist()`, `.numpy()`) or a wait (`sleep(`, `.join(`,
  `synchronize(`...) by the line's text;
- a periodic block: the line lies in the body of an `if` whose test takes a remainder
  (`if step % 100 == 0:`, `if not (i + 1) % log_every:`). Work there is the script's
  every-N-steps work (a metric for a log line): not the batch preparation that DataLoader
  workers could take over. N may be 1 (`--log-every 1`): then it runs every step. A block that
  calls `.backward(` or `.step(` trains every N steps (a GAN's generator, an accumulated step).
A file that cannot be read or parsed says nothing.
"""

from __future__ import annotations

import ast
import linecache
import re
from functools import lru_cache

DEVICE_READ = re.compile(r"\.(?:item|cpu|tolist|numpy)\(\s*\)")
WAITING = re.compile(r"\b(?:sleep|wait|join|synchronize|barrier)\s*\(")
# A copy to a device (`x.to(device)`, `.cuda()`, `.to("cuda", non_blocking=True)`): its time is the
# copy (on a GPU, a pageable one waits for it), whose fix is pinned memory, not a worker.
DEVICE_COPY = re.compile(r"\.(?:to|cuda)\(")
# The garbage collector run by hand (`gc.collect()`): a full collection walks every Python object
# the process holds, milliseconds to seconds with a data set kept as Python objects.
GC_COLLECT = re.compile(r"\bgc\.collect\s*\(")
# A hand-written parameter update: the line reads a gradient (`.grad`, not `autograd.grad(` or
# `.grad_fn`) and changes a tensor in place (`p.data -= lr * p.grad`, `p.add_(p.grad, alpha=-lr)`,
# `p.grad = None`): the optimizer's step written out, not batch preparation.
GRAD_READ = re.compile(r"\.grad\b(?!\s*\()")
IN_PLACE = re.compile(r"(?:[-+*/]=|\.(?:add|sub|mul|div|addcmul|addcdiv|copy|zero|lerp)_\(|\.grad\s*=\s*None)")


def line_says(file: str, line: int, pattern: re.Pattern, source=linecache.getline) -> bool:
    text = source(file, line) if line > 0 else ""
    return bool(text) and bool(pattern.search(text))


def _takes_remainder(test: ast.expr) -> bool:
    """A `%` between numbers in the test; `"%d" % x` (string formatting) is not one."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
               and not isinstance(n.left, (ast.Constant, ast.JoinedStr)) for n in ast.walk(test))


def _trains(body: list[ast.stmt]) -> bool:
    """The block calls `.backward(` or `.step(`: a training update every N steps (a GAN's
    generator every n_critic steps, an accumulated optimizer step), not evaluation or logging."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("backward", "step")
               for s in body for n in ast.walk(s))


@lru_cache(maxsize=64)
def _periodic_lines(file: str, text: str) -> tuple[frozenset[int], frozenset[int]]:
    """(lines in the body of an `if ... % N ...:`, those of them in a body that trains)."""
    try:
        tree = ast.parse(text, filename=file)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset(), frozenset()
    lines: set[int] = set()
    training: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.body and _takes_remainder(node.test):
            end = max(getattr(s, "end_lineno", s.lineno) or s.lineno for s in node.body)
            lines.update(range(node.body[0].lineno, end + 1))
            if _trains(node.body):
                training.update(range(node.body[0].lineno, end + 1))
    return frozenset(lines), frozenset(training)


def source_text(file: str, lines_of=linecache.getlines) -> str:
    """The text of the user's file `file`, joined once per file while linecache keeps it; '' for
    code with no file (`<string>`, `<stdin>`) or one that cannot be read. The key, with the file,
    of each cache of what its parse tells (here and in analyze/recurrence.py)."""
    if not file or file.startswith("<"):
        return ""
    try:
        lines = lines_of(file)
    except (OSError, UnicodeDecodeError, MemoryError):
        return ""
    seen = _joined.get(file)
    if seen is None or seen[0] is not lines:       # linecache hands back the same list while a file is cached
        if len(_joined) >= 64:
            _joined.clear()
        seen = _joined[file] = (lines, "".join(lines))
    return seen[1]


def in_periodic_block(file: str, line: int, lines_of=linecache.getlines, training: bool = False) -> bool:
    """Whether line `line` of `file` runs inside an `if ... % N ...:` body (`training`: one that
    calls .backward( or .step()."""
    if line <= 0:
        return False
    text = source_text(file, lines_of)
    return bool(text) and line in _periodic_lines(file, text)[1 if training else 0]


_joined: dict[str, tuple[list, str]] = {}          # file -> (the line list seen, its text): one join per file
