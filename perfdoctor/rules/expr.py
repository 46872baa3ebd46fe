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
import string
from types import SimpleNamespace
from typing import Any

from simpleeval import EvalWithCompoundTypes

FUNCTIONS = {"min": min, "max": max, "abs": abs}
CONSTANTS = {"inf": math.inf, "true": True, "false": False}
ALLOWED_NODES = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
                 ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Compare, ast.Eq, ast.NotEq, ast.Lt,
                 ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot, ast.Constant, ast.Name,
                 ast.Attribute, ast.Load, ast.Call, ast.Tuple, ast.List, ast.IfExp)


class ExprError(ValueError):
    """The expression is not valid (syntax, forbidden construct, unknown name)."""


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
    try:
        module = ast.parse(normalize(expr))
    except SyntaxError as exc:
        raise ExprError(f"syntax error in {expr!r}: {exc.msg}") from None
    if len(module.body) != 1 or not isinstance(module.body[0], ast.Expr):
        raise ExprError(f"{expr!r} is not a single expression")
    return module.body[0]


def metric_names(expr: str, known: set[str]) -> list[str]:
    """Validate `expr` and return the metric names it uses (raises ExprError)."""
    tree = parse(expr).value
    names: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ALLOWED_NODES):
            raise ExprError(f"{type(node).__name__} is not allowed in {expr!r}")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                raise ExprError(f"unknown function in {expr!r} (allowed: {', '.join(FUNCTIONS)})")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) or isinstance(node, ast.Name):
            name = dotted(node)
            if name is None or name in FUNCTIONS or name in CONSTANTS:
                continue
            if isinstance(node, ast.Name) and any(n.startswith(name + ".") for n in names):
                continue
            if name in known:
                names.append(name)
            elif not any(k.startswith(name + ".") for k in known):
                raise ExprError(f"unknown metric {name!r} in {expr!r}")
    return list(dict.fromkeys(names))


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
        self._se = EvalWithCompoundTypes(names={**CONSTANTS, **_namespace(values)},
                                         functions=dict(FUNCTIONS))  # it adds list/dict/... to the dict it gets

    def set(self, name: str, value: Any) -> None:
        self.values[name] = value
        self._se.names = {**CONSTANTS, **_namespace(self.values)}

    def eval(self, text: str) -> Any:
        return self._se.eval(normalize(text), previously_parsed=parse(text))


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
        if spec == "pct":
            return f"{100 * value:.1f}%"
        if spec == "x":
            return f"{value:.2f}x"
        return format(value, spec)


def render_template(text: str, values: dict[str, Any]) -> str:
    return _Formatter(values).format(text)


def template_names(text: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(text) if f]
