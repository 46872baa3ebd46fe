"""Loops of the user's source that carry a value from one iteration to the next (a recurrence).

A trace shows a loop as the same ops repeated, one row of a tensor at a time (sampleloop.py), and
cannot tell a loop over the samples of a batch, whose iterations are independent and batch into
one, from a loop over time steps, each of which needs the last one's result (a simulation's
integration steps, a hand-written RNN, a rollout): that one cannot be written over the whole
batch. py-spy names the lines the loop ran; the source around them tells the two apart.

A loop is recurrent when a name assigned in its body is read in its body before that assignment
(so it reads the previous iteration's value) by a statement other than a running reduction of it,
and is assigned again from a value that depends on that read: `positions = positions + velocities
* dt` read by `dist = positions[j] - positions[i]` is a recurrence, and so is `h = torch.tanh(x[t]
@ w + h @ u)` (the name inside a call). A running sum, product, max or min (`total = total +
loss_i`, `correct += ...`, `best = max(best, s)`, the name one operand, read nowhere else in the
body) is a reduction: its iterations batch (a sum over the batch). So does a value only handed on
to the next iteration (`d = x - prev; prev = x`: a difference of shifted samples). Names assigned
through a subscript or an attribute (`out[i] = ...`, `self.x = ...`) are not followed as carried,
but a value written into them taints them; the loop's own target is not followed.
A loop that runs backward passes is the training loop (its running loss or EMA
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


def _terms(e: ast.expr, ops: tuple) -> list[ast.expr]:
    """The terms of a chain of one kind of operator: a - b + c -> [a, b, c] for (Add, Sub)."""
    if isinstance(e, ast.BinOp) and isinstance(e.op, ops):
        return _terms(e.left, ops) + _terms(e.right, ops)
    return [e]


CHAINS = ((ast.Add, ast.Sub), (ast.Mult, ast.Div))      # a running sum, a running product
SUMMING_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.BitOr, ast.BitAnd)
EXTREMA = ("max", "min", "maximum", "minimum", "fmax", "fmin", "logaddexp")   # a running max, ...


def _is(e: ast.expr, name: str) -> bool:
    return isinstance(e, ast.Name) and e.id == name


def _reduces(stmt: ast.stmt, name: str) -> bool:
    """stmt folds one more value into `name` and reads it nowhere else: `name += e`,
    `name = name + e - f`, `name = name * e`, `name = max(name, e)`, `torch.maximum(name, e)`."""
    if isinstance(stmt, ast.AugAssign):
        return isinstance(stmt.op, SUMMING_OPS) and not _reads(stmt.value, name)
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _is(stmt.targets[0], name)):
        return False
    if len(_reads(stmt.value, name)) != 1:
        return False
    v = stmt.value
    if isinstance(v, ast.Call):
        f = v.func
        called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        return called in EXTREMA and any(_is(a, name) for a in v.args)
    if any(_is(t, name) for t in _terms(v, CHAINS[0])):
        return True
    product = _terms(v, CHAINS[1])       # `name = e / name` is no running product
    divides = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in ast.walk(v))
    return _is(product[0], name) or (not divides and any(_is(t, name) for t in product))


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


def _carried(loop: ast.For | ast.While) -> set[str] | None:
    """The names of the body read before their first assignment in the body (the last iteration's
    value), beyond a running sum; None where the loop's own test reads one (it runs until a value
    it computes converges: no batch of iterations replaces it)."""
    own = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)} if isinstance(loop, ast.For) else set()
    body = ast.Module(body=loop.body, type_ignores=[])
    order = list(_statements(body))
    index = {id(stmt): i for i, stmt in enumerate(order)}
    stores = [s for s in _stores(body) if s[0] not in own]
    carried = set()
    for name in {s[0] for s in stores}:
        mine = [stmt for n, stmt in stores if n == name]
        first = min(index[id(stmt)] for stmt in mine)
        summing = ({id(n) for stmt in mine for n in _reads(stmt, name)}
                   if all(_reduces(stmt, name) for stmt in mine) else set())
        if isinstance(loop, ast.While) and _reads(loop.test, name):
            return None
        if any(id(n) not in summing for stmt in order[:first + 1] for part in _own_parts(stmt)
               for n in _reads(part, name)):
            carried.add(name)
    return carried


def _root(e: ast.expr) -> str | None:
    """The name a subscript, attribute or method call hangs from: `buf[i].x` -> buf."""
    while isinstance(e, (ast.Subscript, ast.Attribute, ast.Call, ast.Starred)):
        e = e.func if isinstance(e, ast.Call) else e.value
    return e.id if isinstance(e, ast.Name) else None


def _flow(stmts: list[ast.stmt], tainted: set[str], always: bool, control: bool) -> None:
    """Follow the values that depend on the last iteration's (`tainted`) through one pass of the
    statements: an assignment from such a value (or under a test that reads one) taints its names;
    one from other values, on a path every iteration takes (`always`), clears them. A write
    through a subscript or an attribute, or a method call given such a value (`buf[0] = h`,
    `buf.copy_(h)`, `outs.append(h)`), taints the object it writes into, and never clears it."""
    def dirty(e) -> bool:
        return control or any(isinstance(n, ast.Name) and n.id in tainted and isinstance(n.ctx, ast.Load)
                              for n in ast.walk(e))
    for stmt in stmts:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            if stmt.value is None:
                continue
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            d = dirty(stmt.value) or (isinstance(stmt, ast.AugAssign) and _root(stmt.target) in tainted)
            for t in targets:
                for n in ([t] if not isinstance(t, (ast.Tuple, ast.List)) else t.elts):
                    name = n.id if isinstance(n, ast.Name) else _root(n)
                    if name is None:
                        continue
                    if d:
                        tainted.add(name)
                    elif always and isinstance(n, ast.Name):
                        tainted.discard(name)
        elif isinstance(stmt, ast.Expr):
            if isinstance(stmt.value, ast.Call) and (_root(stmt.value) is not None) and \
                    any(dirty(a) for a in [*stmt.value.args, *(k.value for k in stmt.value.keywords)]):
                tainted.add(_root(stmt.value))
        else:
            head = any(dirty(part) for part in _own_parts(stmt))
            loops = isinstance(stmt, (ast.For, ast.AsyncFor, ast.While))
            if isinstance(stmt, (ast.For, ast.AsyncFor)) and head:
                tainted.update(n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name))
            straight = isinstance(stmt, (ast.With, ast.AsyncWith))
            for block in _blocks(stmt):
                for _ in range(2 if loops else 1):      # a value an inner iteration hands to the next
                    _flow(block, tainted, always and straight, control or (head and not straight))


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    out = [getattr(stmt, f) for f in ("body", "orelse", "finalbody") if getattr(stmt, f, None)]
    out += [h.body for h in getattr(stmt, "handlers", [])] + [c.body for c in getattr(stmt, "cases", [])]
    return out


def recurrent(loop: ast.For | ast.While) -> bool:
    """An iteration needs the last one's result: the loop's test reads a value its body computes,
    or some value the body reads before it assigns it (beyond a running sum, max or product) is
    assigned again from a value that depends on it. A value only handed on (`d = x - prev;
    prev = x`, a difference with the last sample) depends on no earlier iteration: it batches."""
    carried = _carried(loop)
    if carried is None:
        return True
    if not carried:
        return False
    tainted = set(carried)
    _flow(loop.body, tainted, True, False)
    return bool(tainted & carried)


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
