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
) -> None:
    """Diagnose a recorded trace: verdict, step breakdown, flags and the numbers behind them."""
    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.report.json_out import to_json

    doc = diagnose_path(str(path))
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
