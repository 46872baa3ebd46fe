"""Loops of the user's source that carry a value from one iteration to the next (a recurrence).

A trace shows a loop as the same ops repeated, one row of a tensor at a time (sampleloop.py), and
cannot tell a loop over the samples of a batch, whose iterations are independent and batch into
one, from a loop over time steps, each of which needs the last one's result (a simulation's
integration steps, a hand-written RNN, a rollout): that one cannot be written over the whole
batch. py-spy names the lines the loop ran; the source around them tells the two apart.

A loop is recurrent when a name assigned in its body is read in its body before that assignment
(so it reads the previous iteration's value) by a statement other than a running sum of it:
`positions = positions + velocities * dt` read by `dist = positions[j] - positions[i]` is a
recurrence, and so is `h = torch.tanh(x[t] @ w + h @ u)` (the name inside a call). A running sum
(`total = total + loss_i`, `correct += ...`, the name one term of a chain of + and -, read nowhere
else in the body) is a reduction: its iterations batch (a sum over the batch). Names assigned
through a subscript or an attribute (`out[i] = ...`, `self.x = ...`) and the loop's own target
are not followed. A loop that runs backward passes is the training loop (its running loss or EMA
carries, its inner loops may still be over samples): left out. A file that cannot be read or
parsed has no recurrent lines. stacks.recurrent_loop_share is the forward pass's and the loop's
own sampled time on such lines (analyze/stacks.py).
"""

from __future__ import annotations

import ast
import linecache
from functools import lru_cache

from perfdoctor.analyze.sourcelines import source_text


def _stores(node: ast.AST) -> list[tuple[str, ast.stmt]]:
    """(name, statement) of each plain-name assignment inside node, nested blocks included,
    function and class bodies left out."""
    out: list[tuple[str, ast.stmt]] = []
    for stmt in _statements(node):
        targets = (stmt.targets if isinstance(stmt, ast.Assign) else
                   [stmt.target] if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and stmt.value is not None else [])
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    out.append((n.id, stmt))
    return out


def _statements(node: ast.AST):
    """The statements under node in source order, into nested blocks, not into defs or classes."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(child, ast.stmt):
            yield child
        yield from _statements(child)


def _reads(node: ast.AST, name: str) -> list[ast.Name]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]


def _terms(e: ast.expr) -> list[ast.expr]:
    """The terms of a chain of + and -: a - b + c -> [a, b, c]."""
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
        return _terms(e.left) + _terms(e.right)
    return [e]


def _sums(stmt: ast.stmt, name: str) -> bool:
    """stmt adds to `name` and reads it nowhere else: `name += e`, `name = name + e - f`."""
    if isinstance(stmt, ast.AugAssign):
        return isinstance(stmt.op, (ast.Add, ast.Sub)) and not _reads(stmt.value, name)
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        terms = _terms(stmt.value)
        own = [t for t in terms if isinstance(t, ast.Name) and t.id == name]
        return len(own) == 1 and len(_reads(stmt.value, name)) == 1
    return False


def _own_parts(stmt: ast.stmt) -> list[ast.AST]:
    """What a statement evaluates itself: a simple statement whole, a compound one its header."""
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.iter]
    if isinstance(stmt, (ast.While, ast.If)):
        return [stmt.test]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [i.context_expr for i in stmt.items]
    if isinstance(stmt, ast.Match):
        return [stmt.subject]
    if isinstance(stmt, ast.Try):
        return []
    return [stmt]


def recurrent(loop: ast.For | ast.While) -> bool:
    """Some name of the body is read before its first assignment in the body, beyond a running sum."""
    own = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)} if isinstance(loop, ast.For) else set()
    body = ast.Module(body=loop.body, type_ignores=[])
    order = list(_statements(body))
    index = {id(stmt): i for i, stmt in enumerate(order)}
    stores = [s for s in _stores(body) if s[0] not in own]
    for name in {s[0] for s in stores}:
        mine = [stmt for n, stmt in stores if n == name]
        first = min(index[id(stmt)] for stmt in mine)
        summing = ({id(n) for stmt in mine for n in _reads(stmt, name)}
                   if all(_sums(stmt, name) for stmt in mine) else set())
        if isinstance(loop, ast.While) and _reads(loop.test, name):
            return True             # the loop's test reads the last iteration's value
        for stmt in order[:first + 1]:
            if any(id(n) not in summing for part in _own_parts(stmt) for n in _reads(part, name)):
                return True
    return False


TRAINING_CALLS = ("backward", "zero_grad")


def trains(loop: ast.For | ast.While) -> bool:
    """The loop runs backward passes (a closure defined in it counts): the training loop, whose
    carried values (a running loss, an EMA, a step counter) say nothing of the loops inside it.
    Not sourcelines._trains, which counts `.step(` too: a rollout's `env.step(action)` would make
    its time loop a training loop."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in TRAINING_CALLS
               for n in ast.walk(loop))


def recurrent_lines(file: str, lines_of=linecache.getlines) -> frozenset[int]:
    """The lines of `file` inside the body of a recurrent for or while loop that is no training
    loop."""
    text = source_text(file, lines_of)
    return _recurrent_lines(file, text) if text else frozenset()


@lru_cache(maxsize=64)
def _recurrent_lines(file: str, text: str) -> frozenset[int]:
    try:
        tree = ast.parse(text, filename=file)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return frozenset()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While)) and node.body and recurrent(node) and not trains(node):
            end = getattr(node, "end_lineno", None) or node.body[-1].lineno
            lines.update(range(node.body[0].lineno, end + 1))
    return frozenset(lines)
