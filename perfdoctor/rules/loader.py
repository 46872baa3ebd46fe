"""Find, parse and validate rule files. Every problem is reported with its file and rule id."""

from __future__ import annotations

import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec

from perfdoctor import inputjson
from perfdoctor.analyze import registry
from perfdoctor.errors import PerfdoctorError
from perfdoctor.rules import cache, expr
from perfdoctor.rules.model import BOUNDS, DEVICES, KINDS, SEVERITIES, TARGETS, Case, Gain, Rule

REQUIRED = ("id", "slug", "kind", "title", "devices", "when", "summary", "source")
NO_DIRECTORY = "rules directory not found"


@dataclass
class RuleProblem:
    path: str
    rule_id: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.rule_id}: {self.message}" if self.rule_id else f"{self.path}: {self.message}"

    def headline(self) -> str:
        """The problem as an error line says it: a missing directory is not an invalid rule."""
        return str(self) if self.message == NO_DIRECTORY else f"invalid rule {self}"


class RulesInvalid(PerfdoctorError):
    def __init__(self, problems: list[RuleProblem]):
        self.problems = problems
        first = problems[0]
        more = f" (and {len(problems) - 1} more problem(s); run `perfdoctor rules check`)" if len(problems) > 1 else ""
        super().__init__(f"{first.headline()}{more}")


def builtin_rules_dir() -> Path:
    """rules/ of a source checkout, else the copy installed with the package."""
    env = os.environ.get("PERFDOCTOR_RULES")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent.parent.parent / "rules"
    if here.is_dir():
        return here
    return Path(sys.prefix) / "share" / "perfdoctor" / "rules"


def load_rules(extra_dirs: list[str | os.PathLike] | None = None, *, builtin: bool = True) -> list[Rule]:
    """Load the built-in rules plus user rule dirs; raises RulesInvalid listing every problem."""
    dirs = ([builtin_rules_dir()] if builtin else []) + [Path(d) for d in (extra_dirs or [])]
    files, problems, read = [], [], set()
    for d in dirs:
        if not d.is_dir():
            problems.append(RuleProblem(str(d), None, NO_DIRECTORY))
            continue
        if d.resolve() in read:   # the built-in folder named again: the same rules, not duplicates
            continue
        read.add(d.resolve())
        files += sorted(d.glob("*.toml"))
    raw = cache.parse_all(files, _read)
    # Names rules may use beyond the registry: the verdict and every flag's outcome.
    known = set(registry.REGISTRY) | {"verdict.bound"} | {
        "flag." + data["slug"].replace("-", "_") for _, (data, _) in raw
        if isinstance(data, dict) and data.get("kind") == "flag" and isinstance(data.get("slug"), str)}
    rules, known = [], frozenset(known)
    for f, (data, prob) in raw:
        if prob is not None:
            problems.append(prob)
            continue
        rule, probs = _validated(f, data, known)
        problems += probs
        if rule is not None:
            rules.append(rule)
    seen: dict[str, str] = {}
    for r in rules:
        for key in (r.id, r.slug):
            if key in seen:
                problems.append(RuleProblem(r.path, r.id, f"duplicate id/slug {key!r} (also in {seen[key]})"))
            seen[key] = r.path
    fixes = {r.slug for r in rules if r.kind == "fix"}
    for r in rules:
        for other in (r.gain.overlaps if r.gain else ()):
            if other not in fixes or other == r.slug:
                problems.append(RuleProblem(r.path, r.id, f"gain.overlaps names {other!r}, which is no other fix's slug"))
    if problems:
        raise RulesInvalid(problems)
    return rules


# parse_rule's results in this process, by file, rule data and the names rules may use: validating
# the 130 rules' expressions is ~0.1 s, nine tenths of an in-process `report` of a small trace (a
# test session or a fuzzer calls it thousands of times; a multi-rank diagnosis once per rank).
# The rules are never changed after loading, so the same objects serve every call.
_VALIDATED: dict[tuple, tuple] = {}
MAX_VALIDATED = 4096


def _validated(path: Path, data: dict, known: frozenset[str]) -> tuple[Rule | None, list[RuleProblem]]:
    try:
        key = (str(path), msgspec.json.encode(data), known)
    except (TypeError, msgspec.EncodeError):      # a value JSON cannot carry: validate it every time
        return parse_rule(path, data, known)
    hit = _VALIDATED.get(key)
    if hit is None:
        if len(_VALIDATED) >= MAX_VALIDATED:
            _VALIDATED.clear()
        hit = _VALIDATED[key] = parse_rule(path, data, known)
    return hit[0], list(hit[1])


def find_rule(rule_id: str, extra_dirs: list[str | os.PathLike] | None = None) -> Rule:
    """The rule whose id (PD301) or slug (loader-workers) is rule_id, among the built-in rules
    and those of extra_dirs."""
    want = rule_id.strip().casefold()             # `rules show pd201` as PD201
    match = [r for r in load_rules(extra_dirs) if want in (r.id.casefold(), r.slug.casefold())]
    if not match:
        raise PerfdoctorError(f"no rule with id or slug {rule_id!r} (see `perfdoctor rules list`)")
    return match[0]


def _read(path: Path) -> tuple[dict | None, RuleProblem | None]:
    if sys.version_info >= (3, 11):  # imported here: with the cache warm, no TOML is parsed
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads(inputjson.read_text(path)), None
    except (OSError, UnicodeDecodeError) as exc:
        return None, RuleProblem(str(path), None, f"cannot read: {exc}")
    except tomllib.TOMLDecodeError as exc:
        return None, RuleProblem(str(path), None, f"TOML syntax error: {exc}")


def parse_rule(path: Path, data: dict, known: set[str] | frozenset[str]) -> tuple[Rule | None, list[RuleProblem]]:
    p = str(path)
    rid = data.get("id") if isinstance(data.get("id"), str) else None
    probs: list[RuleProblem] = []

    def bad(msg: str) -> None:
        probs.append(RuleProblem(p, rid, msg))

    for k in REQUIRED:
        if k not in data:
            bad(f"missing field {k!r}")
    _types(data, bad)
    if probs:
        return None, probs
    kind = data["kind"]
    if kind not in KINDS:
        bad(f"kind must be one of {KINDS}, not {kind!r}")
    devices = data["devices"] if isinstance(data["devices"], list) else [data["devices"]]
    for d in devices:
        if d not in DEVICES:
            bad(f"unknown device {d!r} (allowed: {', '.join(DEVICES)})")
    when_names = _names(data["when"], "when", known, bad)
    try:
        for name in expr.template_names(str(data["summary"])):
            if name not in known:
                bad(f"summary uses unknown metric {name!r}")
    except expr.ExprError as exc:
        bad(str(exc))
    src = data["source"]
    if not isinstance(src, dict) or not src.get("article") or not src.get("section"):
        bad("source needs 'article' (file in shared/articles or a peer tool/doc) and 'section'")
    evidence = list(data.get("evidence", []))
    for name in evidence:
        if name not in known:
            bad(f"evidence lists unknown metric {name!r}")
    gain, no_gain = None, data.get("no_gain_reason")
    if "gain" in data:
        g = data["gain"]
        missing = [k for k in ("share", "speedup", "assumption", "label") if k not in g]
        if missing:
            bad(f"gain needs {', '.join(missing)}")
        else:
            lets = _lets(g.get("let", {}), known, bad)
            names = functools.partial(_names, known=known, bad=bad, lets=lets)
            gain = Gain(str(g["share"]), str(g["speedup"]), g["assumption"], g["label"],
                        names(str(g["share"]), "gain.share"), names(str(g["speedup"]), "gain.speedup"),
                        let={k: text for k, (text, _) in lets.items()})
            _expected(gain, g, names, bad)
            if "expected_with" in g:
                gain.expected_with = _setting(str(g["expected_with"]), gain, known, set(lets), bad)
            gain.work = g.get("work") is True
            overlaps = g.get("overlaps", [])
            if not isinstance(overlaps, list) or not all(isinstance(o, str) and o for o in overlaps):
                bad("gain.overlaps must be a list of fix slugs")
            else:
                gain.overlaps = list(overlaps)
            if "unprofiled_share" in g:
                gain.unprofiled_share = str(g["unprofiled_share"])
                names(gain.unprofiled_share, "gain.unprofiled_share")     # unknown metrics: invalid
            if ("unbounded" in g) != ("unbounded_reason" in g):
                bad("gain.unbounded and gain.unbounded_reason go together")
            elif "unbounded" in g:
                gain.unbounded, gain.unbounded_reason = str(g["unbounded"]), str(g["unbounded_reason"])
                names(gain.unbounded, "gain.unbounded")
    fix = data.get("fix", {})
    if kind == "fix":
        if gain is None and not no_gain:
            bad("a fix needs [gain] (share, speedup, assumption, label) or no_gain_reason")
        if not fix.get("text"):
            bad("a fix needs [fix] text")
    by = fix.get("snippet_by") if isinstance(fix.get("snippet_by"), str) else None
    snippets = fix.get("snippets") if isinstance(fix.get("snippets"), dict) else {}
    if (by is None) != (not snippets):
        bad("[fix] snippet_by and [fix.snippets] go together")
    elif by is not None and by not in evidence:
        bad(f"[fix] snippet_by {by!r} must be one of the rule's evidence metrics")
    if not all(isinstance(v, str) for v in snippets.values()):
        bad("[fix.snippets] values must be strings")
    if data.get("severity", "medium") not in SEVERITIES:
        bad(f"severity must be one of {SEVERITIES}")
    targets = data.get("targets", [])
    if not isinstance(targets, list) or any(t not in TARGETS for t in targets):
        bad(f"targets must be a list drawn from {TARGETS}")
        targets = []
    if kind == "verdict" and data.get("bound") not in BOUNDS:
        bad(f"a verdict rule needs bound in {BOUNDS}")
    cases = _cases(data.get("cases", []), known, bad)
    if not any(c.fires for c in cases) or not any(not c.fires for c in cases):
        bad("needs at least one firing and one non-firing test case")
    if probs:
        return None, probs
    return Rule(id=data["id"], slug=data["slug"], kind=kind, title=data["title"], devices=devices,
                when=str(data["when"]), summary=str(data["summary"]), source=src, cases=cases, path=p,
                priority=int(data.get("priority", 100)), bound=data.get("bound"),
                severity=data.get("severity", "medium"), evidence=evidence, gain=gain,
                no_gain_reason=no_gain, fix_text=fix.get("text"), snippet=fix.get("snippet"),
                snippet_cpu=fix.get("snippet_cpu"),
                snippet_lang=fix.get("snippet_lang", "python"), snippet_by=by, snippets=dict(snippets),
                when_names=when_names, targets=targets), []


EXPECTED_KEYS = ("expected_speedup", "expected_share", "expected_range", "model")
# A rule file is data from anyone: each field's TOML type, checked before anything reads it.
_STR, _NUM = (str,), (str, int, float)
TYPES = {"id": _STR, "slug": _STR, "kind": _STR, "title": _STR, "when": _STR, "summary": _STR, "bound": _STR,
         "severity": _STR, "no_gain_reason": _STR, "priority": (int,), "devices": (list, str), "evidence": (list,),
         "targets": (list,), "source": (dict,), "gain": (dict,), "fix": (dict,), "cases": (list,)}
SUB_TYPES = {"source": {"article": _STR, "section": _STR, "also": (list,)},
             "gain": {"share": _NUM, "speedup": _NUM, "assumption": _STR, "label": _STR, "expected_speedup": _NUM,
                      "expected_share": _NUM, "expected_range": (list,), "model": _STR, "work": (bool,),
                      "unprofiled_share": _NUM, "unbounded": _STR, "unbounded_reason": _STR, "let": (dict,),
                      "expected_with": _STR},
             "fix": {"text": _STR, "snippet": _STR, "snippet_cpu": _STR, "snippet_lang": _STR, "snippet_by": _STR,
                     "snippets": (dict,)}}
CASE_TYPES = {"name": _STR, "metrics": (dict,), "fires": (bool,), "gain": (list,), "expected": (list,)}


def _types(data: dict, bad) -> None:
    def check(value, types, where):
        if isinstance(value, bool) and bool not in types:
            types = ()
        if not isinstance(value, types):
            bad(f"{where} must be {' or '.join(t.__name__ for t in types) or 'something else'}, "
                f"not {type(value).__name__}")
            return False
        return True

    for k, types in TYPES.items():
        if k in data and check(data[k], types, k) and k in SUB_TYPES:
            for sk, st in SUB_TYPES[k].items():
                if sk in data[k]:
                    check(data[k][sk], st, f"{k}.{sk}")
    for k in ("devices", "evidence", "targets"):
        if isinstance(data.get(k), list) and not all(isinstance(x, str) for x in data[k]):
            bad(f"{k} must be a list of strings")
    also = (data.get("source") or {}).get("also") if isinstance(data.get("source"), dict) else None
    if isinstance(also, list) and not all(isinstance(x, str) for x in also):
        bad("source.also must be a list of strings")
    for i, c in enumerate(data.get("cases") if isinstance(data.get("cases"), list) else []):
        if not isinstance(c, dict):
            bad(f"case {i + 1} must be a table ([[cases]])")
            continue
        for ck, ct in CASE_TYPES.items():
            if ck in c:
                check(c[ck], ct, f"case {i + 1} {ck}")
        for ck in ("gain", "expected"):
            if isinstance(c.get(ck), list) and not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                       for x in c[ck]):
                bad(f"case {i + 1} {ck} must be two numbers [low, high]")


def _expected(gain: Gain, g: dict, names, bad) -> None:
    """The optional expected-gain model of a [gain] table (see model.Gain); `names(text, where)`:
    the metrics an expression uses (validated, the [gain.let] names it uses expanded)."""
    unknown = sorted(set(g) - {"share", "speedup", "assumption", "label", "work", "unprofiled_share", "overlaps", "let",
                               "unbounded", "unbounded_reason", "expected_with", *EXPECTED_KEYS})
    if unknown:
        bad(f"gain has unknown keys {unknown} (allowed besides share/speedup/assumption/label/work/unprofiled_share/unbounded/"
            f"overlaps/let/expected_with: {', '.join(EXPECTED_KEYS)})")
    if not any(k in g for k in EXPECTED_KEYS):
        return
    if "expected_speedup" not in g or not g.get("model"):
        bad("an expected-gain model needs expected_speedup and model (its assumption)")
        return
    gain.expected_speedup, gain.model = str(g["expected_speedup"]), str(g["model"])
    used = names(gain.expected_speedup, "gain.expected_speedup")
    if "expected_share" in g:
        gain.expected_share = str(g["expected_share"])
        used += names(gain.expected_share, "gain.expected_share")
    rng = g.get("expected_range")
    if rng is not None:
        if not (isinstance(rng, list) and len(rng) == 2):
            bad("gain.expected_range must be two expressions [low, high] (speed-ups of the share)")
        else:
            gain.expected_range = (str(rng[0]), str(rng[1]))
            for part in rng:
                used += names(str(part), "gain.expected_range")
    gain.expected_names = sorted(set(used))


def _setting(text: str, gain: Gain, known: set[str], lets: set[str], bad) -> str | None:
    """gain.expected_with: a short template over metrics and [gain.let] names, for a gain with an
    expected model (the setting a model assumes says nothing beside a ceiling alone)."""
    if gain.expected_speedup is None:
        bad("gain.expected_with names the setting of an expected-gain model: the gain has none")
        return None
    try:
        unknown = [n for n in expr.template_names(text) if n not in known and n not in lets]
    except expr.ExprError as exc:
        bad(f"gain.expected_with: {exc}")
        return None
    if unknown:
        bad(f"gain.expected_with uses unknown names {unknown} (metrics or [gain.let] names)")
        return None
    return text


def _names(text: str, where: str, known: set[str], bad, lets: dict | None = None) -> list[str]:
    """The metrics `text` uses, those of the [gain.let] names it uses included (`lets`: name ->
    (expression, its metrics)); an invalid expression is reported through `bad`."""
    lets = lets or {}
    try:
        used = expr.metric_names(text, known, frozenset(lets))
        return list(dict.fromkeys(used + [m for n in sorted(expr.local_names(text, frozenset(lets)))
                                          for m in lets[n][1]]))
    except expr.ExprError as exc:
        bad(f"{where}: {exc}")
        return []


LET_NAME = re.compile(r"[a-z_][a-z0-9_]{0,31}")
MAX_LETS = 16


def _lets(raw, known: set[str], bad) -> dict[str, tuple[str, list[str]]]:
    """[gain.let]: name -> (expression, the metrics it uses), in the file's order; each expression
    may use the names before it. A name is a short lower-case identifier that is no metric, metric
    group (`share`, `run`...), function or constant."""
    if not isinstance(raw, dict):
        bad("gain.let must be a table of name = expression")
        return {}
    if len(raw) > MAX_LETS:
        bad(f"gain.let has {len(raw)} names (at most {MAX_LETS})")
        return {}
    out: dict[str, tuple[str, list[str]]] = {}
    for name, text in raw.items():
        if not isinstance(name, str) or not LET_NAME.fullmatch(name) or name in expr.FUNCTIONS \
                or name in expr.CONSTANTS or name in known or any(k.startswith(name + ".") for k in known):
            bad(f"gain.let: {name!r} is no name a rule can define (a short lower-case identifier that is no "
                "metric, metric group, function or constant)")
            continue
        if not isinstance(text, (str, int, float)) or isinstance(text, bool):
            bad(f"gain.let.{name} must be an expression")
            continue
        out[name] = (str(text), _names(str(text), f"gain.let.{name}", known, bad, out))
    return out


def _cases(raw, known: set[str], bad) -> list[Case]:
    out = []
    for i, c in enumerate(raw if isinstance(raw, list) else []):
        name = c.get("name", f"case {i + 1}")
        metrics = c.get("metrics", {})
        unknown = [k for k in metrics if k not in known]
        if unknown:
            bad(f"case {name!r} sets unknown metrics {unknown}")
        if "fires" not in c:
            bad(f"case {name!r} needs fires = true/false")
            continue
        g, e = c.get("gain"), c.get("expected")
        if g is not None and not (isinstance(g, list) and len(g) in (0, 2)):
            bad(f"case {name!r}: gain must be [low, high], or [] for no ceiling")
            g = None
        if e is not None and not (isinstance(e, list) and len(e) in (0, 2)):
            bad(f"case {name!r}: expected must be [low, high], or [] for unknown")
            e = None
        out.append(Case(name, metrics, bool(c["fires"]), tuple(g) if g is not None else None, tuple(e) if e is not None else None))
    return out
