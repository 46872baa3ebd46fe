"""The lines under `perfdoctor compare`'s table, in plain words, for the terminal and markdown
alike (each output sanitises them its own way): which findings and flags each side raised, and
the notes on what may make the two runs not compare (environment, settings, a failed script,
one run a side, differing commands). The markdown had said less than the terminal: no flags, no
rules left unevaluated, no notes."""

from __future__ import annotations

UNCHECKED = (("before", "unchecked_before"), ("after", "unchecked_after"))
SHARED_ROWS = ("step time", "throughput", "samples/s")       # the rows a shared machine's load is in
SHARED_YES = "yes, on a shared machine (note)"  # their "beyond noise" then (doc["machine_shared"])


def beyond_word(doc: dict, row: dict) -> str | None:
    """The "beyond noise" word of a row where a shared machine qualifies it, else None."""
    if row.get("beyond_noise") and doc.get("machine_shared") and row.get("metric") in SHARED_ROWS:
        return SHARED_YES
    return None


def ids_line(what: str, d: dict) -> str:
    """'findings before: PD301; after: PD358; new: PD358; gone: PD301' from gate/compare._ids's
    dict, with the rules a side could not evaluate (a metric they need is unknown there)."""
    def names(key: str) -> str:
        return ", ".join(str(x) for x in d.get(key) or [])
    return (f"{what} before: {names('before') or 'none'}; after: {names('after') or 'none'}"
            + (f"; new: {names('added')}" if d.get("added") else "")
            + (f"; gone: {names('removed')}" if d.get("removed") else "")
            + "".join(f"; not evaluated {side} (a metric they need is unknown there): {names(key)}"
                      for side, key in UNCHECKED if d.get(key)))


def compare_lines(doc: dict) -> list[tuple[str, str]]:
    """The lines under the table as (kind, text): kind is "ids", "environment" (the
    environments differ: absolute times may not compare), "note" or "warning"."""
    out = [("ids", ids_line("findings", doc["findings"]))]
    g = doc.get("flags") or {}
    if g.get("before") or g.get("after"):
        out.append(("ids", ids_line("flags", g)))
    env = doc["environment"]
    if env["differs"]:
        out.append(("environment", "environment differs (" + "; ".join(env["differs"])
                    + "): absolute times may not compare"))
    if env["unknown"]:
        out.append(("note", "environment not fully known (" + ", ".join(env["unknown"])
                    + "): compared on what is known"))
    if doc.get("settings_differ"):
        out.append(("note", "the runs' settings differ: " + "; ".join(doc["settings_differ"])
                    + " (part of what changed the step time)"))
    out += [("note", f"note: {n}") for n in [*(doc.get("notes") or []),
                                              *([doc["step_noise"]] if doc.get("step_noise") else [])]]
    if warning := (doc.get("commands") or {}).get("warning"):
        out.append(("warning", f"warning: {warning}"))
    return out
