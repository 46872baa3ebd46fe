"""Safe expressions over metric names, evaluated with simpleeval (never eval/exec).

Metric names are dotted (`input.data_wait_share`): in an expression they read as attribute
access on a namespace. Before anything is evaluated, the expression is parsed and checked:
only comparisons, boolean and arithmetic operators, numbers/strings/booleans, registered metric
names and the functions in FUNCTIONS are allowed. Unknown metrics are None; the engine treats a
comparison that meets None as "unknown" (rules.engine).
"""

from __future__ import annotations

import ast
import functools
import math
import re
import string
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from simpleeval import DEFAULT_OPERATORS, EvalWithCompoundTypes, InvalidExpression

FUNCTIONS = {"min": min, "max": max, "abs": abs}
CONSTANTS = {"inf": math.inf, "true": True, "false": False}
ALLOWED_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
                 ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Compare, ast.Eq, ast.NotEq, ast.Lt,
                 ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot, ast.Constant, ast.Name,
                 ast.Attribute, ast.Load, ast.Call, ast.Tuple, ast.List, ast.IfExp)


# Rules from users are data: bounds that keep a hostile expression from costing time or memory
# at load or evaluation. With no `**`, no subscripts and no sequence arithmetic, evaluation is
# linear in the expression's size, so these bounds are the time bound too.
MAX_EXPR_CHARS = 4000      # the longest built-in expression is ~700
MAX_DEPTH = 40             # nesting of the parsed tree (simpleeval evaluates recursively)
MAX_INT = 10 ** 18         # integer literals; floats are bounded by their type
MAX_STR = 200              # string literals
MAX_RESULT_CHARS = 10_000  # a string a metric of type str grows to (`input.loader * 9999`)
TEMPLATE_SPEC = re.compile(r"(pct|x|bytes|[<>^=]?[+\- ]?\d{0,2}[,_]?(\.\d{1,2})?[eEfFgGd%]?)")


def _not(value: Any) -> Any:
    """`not` in three-valued logic: not unknown is unknown (Python's `not None` is True)."""
    return None if value is None else not value


OPERATORS = {**DEFAULT_OPERATORS, ast.Not: _not}


class ExprError(ValueError):
    """The expression is not valid (syntax, forbidden construct, unknown name)."""


class EvalError(TypeError):
    """Evaluation failed (division by zero, overflow, a string too long, ...): the engine
    treats it as a missing number, like a comparison that met None (a TypeError)."""


def normalize(text: str) -> str:
    """Rule files may wrap long conditions over several lines."""
    return " ".join(str(text).split())


def dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


@functools.lru_cache(maxsize=None)
def parse(expr: str) -> ast.Expr:
    """The parsed expression, in the form simpleeval evaluates (`previously_parsed`); parsed
    once per process: validation and every evaluation share it."""
    text = normalize(expr)
    if len(text) > MAX_EXPR_CHARS:
        raise ExprError(f"expression of {len(text)} characters (at most {MAX_EXPR_CHARS}): {text[:60]!r}...")
    try:
        module = ast.parse(text)
    except SyntaxError as exc:
        raise ExprError(f"syntax error in {_short(expr)}: {exc.msg}") from None
    except (ValueError, MemoryError, RecursionError) as exc:   # 4300+ digit literals, deep nesting
        raise ExprError(f"cannot parse {_short(expr)}: {type(exc).__name__} {exc}") from None
    if len(module.body) != 1 or not isinstance(module.body[0], ast.Expr):
        raise ExprError(f"{expr!r} is not a single expression")
    return module.body[0]


def metric_names(expr: str, known: set[str], local: frozenset[str] = frozenset()) -> list[str]:
    """Validate `expr` and return the metric names it uses (raises ExprError). `local`: names a
    rule defines for its gain's expressions ([gain.let]), allowed and not returned."""
    tree = parse(expr).value
    names: list[str] = []
    _check_depth(tree, expr)
    for node in ast.walk(tree):
        if not isinstance(node, ALLOWED_NODES):
            raise ExprError(f"{type(node).__name__} is not allowed in {_short(expr)}")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                raise ExprError(f"unknown function in {_short(expr)} (allowed: {', '.join(FUNCTIONS)})")
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT:
                raise ExprError(f"integer literal too large in {_short(expr)} (at most 1e18)")
            if isinstance(v, (str, bytes)) and len(v) > MAX_STR:
                raise ExprError(f"string literal of {len(v)} characters in {_short(expr)} (at most {MAX_STR})")
            if isinstance(v, bytes) or v is Ellipsis or isinstance(v, complex):
                raise ExprError(f"{type(v).__name__} literal is not allowed in {_short(expr)}")
        if isinstance(node, ast.BinOp) and any(
                isinstance(o, (ast.Tuple, ast.List)) or (isinstance(o, ast.Constant) and isinstance(o.value, str))
                for o in (node.left, node.right)):
            raise ExprError(f"arithmetic on strings, tuples or lists is not allowed in {_short(expr)}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) or isinstance(node, ast.Name):
            name = dotted(node)
            if name is None or name in FUNCTIONS or name in CONSTANTS or name in local:
                continue
            if isinstance(node, ast.Name) and any(n.startswith(name + ".") for n in names):
                continue
            if name in known:
                names.append(name)
            elif not any(k.startswith(name + ".") for k in known):
                raise ExprError(f"unknown metric {name!r} in {_short(expr)}")
    return list(dict.fromkeys(names))


def local_names(expr: str, local: frozenset[str]) -> set[str]:
    """The `local` names (a rule's [gain.let]) that a valid `expr` uses."""
    return {n.id for n in ast.walk(parse(expr).value) if isinstance(n, ast.Name) and n.id in local}


def _check_depth(tree: ast.AST, expr: str) -> None:
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ExprError(f"expression nested deeper than {MAX_DEPTH} levels: {_short(expr)}")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _short(expr: str) -> str:
    text = normalize(expr)
    return repr(text if len(text) <= 200 else text[:200] + "...")


def _namespace(values: dict[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for name, v in values.items():
        head, _, rest = name.partition(".")
        if not rest:
            root[head] = v
            continue
        ns = root.setdefault(head, SimpleNamespace())
        parts = rest.split(".")
        for p in parts[:-1]:
            if not hasattr(ns, p):
                setattr(ns, p, SimpleNamespace())
            ns = getattr(ns, p)
        setattr(ns, parts[-1], v)
    return root


class Evaluator:
    """Evaluates validated expressions against one set of metric values (None = unknown).
    `values` is that set; change it through `set`, which keeps the namespace in step."""

    def __init__(self, values: dict[str, Any]):
        self.values = values
        self._se = EvalWithCompoundTypes(operators=dict(OPERATORS), names={**CONSTANTS, **_namespace(values)},
                                         functions=dict(FUNCTIONS))  # it adds list/dict/... to the dict it gets

    def set(self, name: str, value: Any) -> None:
        self.values[name] = value
        self._se.names = {**CONSTANTS, **_namespace(self.values)}

    @contextmanager
    def scope(self, lets: dict[str, str], given: dict[str, Any] | None = None):
        """A rule's [gain.let] names for its gain's expressions: each the value of its expression
        over the metrics and the names before it (None where that is unknown or cannot be
        computed), or the value `given` for it (a setting tune tries: the names after it see
        that value); gone afterwards, so no other rule sees them. Yields the names' values."""
        saved = self._se.names
        self._se.names = dict(saved)
        values: dict[str, Any] = {}
        try:
            for name, text in lets.items():
                if given and name in given:
                    value = given[name]
                else:
                    try:
                        value = self.eval(text)
                    except (TypeError, ValueError, ZeroDivisionError):
                        value = None
                self._se.names[name] = values[name] = value
            yield values
        finally:
            self._se.names = saved

    def eval(self, text: str) -> Any:
        """The value (raises TypeError when it meets None or cannot be computed: EvalError)."""
        try:
            v = self._se.eval(normalize(text), previously_parsed=parse(text))
        except TypeError:
            raise
        except (ArithmeticError, ValueError, InvalidExpression, MemoryError, RecursionError) as exc:
            raise EvalError(f"{type(exc).__name__}: {exc}") from None
        if isinstance(v, str) and len(v) > MAX_RESULT_CHARS:
            raise EvalError(f"a string of {len(v)} characters")
        if isinstance(v, int) and v.bit_length() > 1000:      # no float holds it
            raise EvalError(f"an integer of {v.bit_length()} bits")
        return v


class _Formatter(string.Formatter):
    """`{metric.name:pct}` / `{metric.name:.1f}` from the values dict only (no attribute walking)."""

    def __init__(self, values: dict[str, Any]):
        self.values = values

    def get_field(self, field_name, args, kwargs):
        if field_name not in self.values:
            raise KeyError(field_name)
        return self.values[field_name], field_name

    def format_field(self, value, spec):
        if value is None:
            return "unknown"
        try:
            if spec == "pct":
                return f"{100 * value:.1f}%"
            if spec == "x":
                return f"{value:.2f}x"
            if spec == "bytes":
                return human_bytes(value)
            return format(value, spec)
        except (TypeError, ValueError, OverflowError):   # a string where a number was meant
            return str(value)[:MAX_STR]


def human_bytes(n: float) -> str:
    """1,536 -> '1.5 KiB'; binary units, one decimal below 100 of a unit."""
    n, units = float(n), ["B", "KiB", "MiB", "GiB", "TiB"]
    while abs(n) >= 1024 and len(units) > 1:
        n, units = n / 1024, units[1:]
    return f"{n:,.0f} {units[0]}" if units[0] == "B" or abs(n) >= 100 else f"{n:.1f} {units[0]}"


def render_template(text: str, values: dict[str, Any]) -> str:
    return _Formatter(values).format(text)


def template_names(text: str) -> list[str]:
    """The metric names a summary template uses; raises ExprError for a template that is not
    valid or has a format spec other than pct, x, bytes or a short number format (`>1000000000` would
    build a gigabyte)."""
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ExprError(f"summary template: {exc}") from None
    for _, f, spec, conv in fields:
        if f is None:
            continue
        if not f or conv not in (None, "s", "r") or not TEMPLATE_SPEC.fullmatch(spec or ""):
            raise ExprError(f"summary template field {{{f}{'!' + conv if conv else ''}:{spec}}}: "
                            "allowed {metric}, {metric:pct}, {metric:x}, {metric:bytes} or a short number format such as {metric:.1f}")
    return [f for _, f, _, _ in fields if f]
