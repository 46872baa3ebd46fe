"""Command-line interface: a thin typer layer. Heavy imports happen inside commands so that
`perfdoctor --help` stays fast."""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from perfdoctor import __version__
from perfdoctor.errors import EXIT_INTERNAL, PerfdoctorError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Diagnose PyTorch training bottlenecks: input-, host-, device- or communication-bound, "
         "with the evidence behind the verdict.")


class Format(str, Enum):
    terminal = "terminal"
    json = "json"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"perfdoctor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    pass


@app.command()
def report(
    path: Path = typer.Argument(..., help="A torch.profiler trace (.json, .json.gz, *.pt.trace.json[.gz]) "
                                          "or a directory of them (one per rank/worker)."),
    fmt: Format = typer.Option(Format.terminal, "--format", "-f", help="What to print on stdout."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Also write the JSON report to this file "
                                               "(with --format json, only there)."),
    rules_dirs: Optional[list[Path]] = typer.Option(None, "--rules", metavar="DIR",
                                                    help="Extra rule directory (repeatable), added to the built-in rules."),
) -> None:
    """Diagnose a recorded trace: verdict, ranked fixes, breakdown, flags and the numbers behind them."""
    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.report.json_out import to_json

    doc = diagnose_path(str(path), [str(d) for d in rules_dirs or []])
    if output is not None:
        try:
            output.write_bytes(to_json(doc))
        except OSError as exc:
            raise PerfdoctorError(f"cannot write {output}: {exc.strerror or exc}") from None
    if fmt is Format.json:
        if output is None:
            sys.stdout.buffer.write(to_json(doc))
        return
    from perfdoctor.report.terminal import render
    render(doc)


rules_app = typer.Typer(no_args_is_help=True, help="List, show and check the diagnosis rules (rules/*.toml).")
app.add_typer(rules_app, name="rules")


@rules_app.command("list")
def rules_list(rules_dirs: Optional[list[Path]] = typer.Option(None, "--rules", metavar="DIR",
                                                                help="Extra rule directory (repeatable).")) -> None:
    """List every rule: id, kind, devices, title, source."""
    from perfdoctor.report.rules_view import render_list
    from perfdoctor.rules.loader import load_rules
    render_list(load_rules([str(d) for d in rules_dirs or []]))


@rules_app.command("show")
def rules_show(rule_id: str = typer.Argument(..., help="Rule id (PD301) or slug (loader-workers)."),
               rules_dirs: Optional[list[Path]] = typer.Option(None, "--rules", metavar="DIR",
                                                               help="Extra rule directory (repeatable).")) -> None:
    """Show one rule in full: condition, gain model, fix text and snippet, source."""
    from perfdoctor.report.rules_view import render_show
    from perfdoctor.rules.loader import load_rules
    rules = load_rules([str(d) for d in rules_dirs or []])
    match = [r for r in rules if rule_id in (r.id, r.slug)]
    if not match:
        raise PerfdoctorError(f"no rule with id or slug {rule_id!r} (see `perfdoctor rules list`)")
    render_show(match[0])


@rules_app.command("check")
def rules_check(directory: Optional[Path] = typer.Argument(None, help="A directory of your own rules "
                                                                      "(default: check the built-in rules).")) -> None:
    """Validate rule files and run each rule's test cases. Exit 2 if a file is invalid, 1 if a case fails."""
    from perfdoctor.report.rules_view import render_check
    from perfdoctor.rules.check import run_cases
    from perfdoctor.rules.loader import RulesInvalid, load_rules
    try:
        rules = load_rules([str(directory)] if directory else [])
    except RulesInvalid as exc:
        for p in exc.problems:
            print(f"perfdoctor: error: invalid rule {p}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    if directory is not None:
        root = str(directory.resolve())
        rules = [r for r in rules if str(Path(r.path).resolve()).startswith(root)]
    results = [res for r in rules for res in run_cases(r)]
    render_check(results, len(rules))
    if any(not x.ok for x in results):
        raise typer.Exit(1)


def main(argv: list[str] | None = None) -> None:
    """Entry point: maps errors to one line on stderr and a documented exit code."""
    debug = os.environ.get("PERFDOCTOR_DEBUG") == "1"
    try:
        app(args=argv, prog_name="perfdoctor", standalone_mode=True)
    except PerfdoctorError as exc:
        if debug:
            raise
        print(f"perfdoctor: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # a bug: one line, and how to get the traceback
        if debug:
            raise
        print(f"perfdoctor: internal error: {type(exc).__name__}: {exc} "
              "(set PERFDOCTOR_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":  # pragma: no cover
    main()
