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


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def run(
    target: Optional[list[str]] = typer.Argument(None, metavar="SCRIPT [ARGS]...",
                                                 help="The training script and its arguments, exactly as for `python`."),
    module: Optional[str] = typer.Option(None, "-m", metavar="MODULE", help="Run a module, as `python -m MODULE`."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1,
                                            help="Stop the script gracefully after N measured steps."),
    duration: Optional[float] = typer.Option(None, "--duration", min=1, metavar="SECONDS",
                                             help="Stop the script gracefully after this long."),
    skip_steps: int = typer.Option(5, "--skip-steps", min=0, help="Warm-up steps before the trace window."),
    trace_steps: int = typer.Option(5, "--trace-steps", min=1, help="Steps recorded by torch.profiler."),
    memory: bool = typer.Option(False, "--memory", help="Also profile memory (allocator events) in the trace."),
    no_trace: bool = typer.Option(False, "--no-trace", help="Do not record a torch.profiler trace."),
    stacks: bool = typer.Option(False, "--stacks", help="Sample Python stacks of the trainer and loader workers "
                                                         "with py-spy (costs 8-25% on a busy 2-core machine)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default perfdoctor-runs/<time>-<script>)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Also write the JSON report here."),
    rules_dirs: Optional[list[Path]] = typer.Option(None, "--rules", metavar="DIR",
                                                    help="Extra rule directory (repeatable)."),
) -> None:
    """Run a training script unmodified, watch it, and diagnose it (report on stderr).

    Exit code: the script's own (128+N if a signal N killed it); 2 for perfdoctor usage errors."""
    from perfdoctor.collect.launcher import RunConfig, launch

    argv = list(target or [])
    if module:
        argv = [module, *argv]
    elif not argv:
        raise PerfdoctorError("give a script (perfdoctor run train.py ARGS) or a module (perfdoctor run -m pkg.train)")
    elif not Path(argv[0]).is_file():
        raise PerfdoctorError(f"can't open file {argv[0]!r}: no such file")
    cfg = RunConfig(argv=argv, module=module, run_dir=out, max_steps=max_steps, duration=duration,
                    skip=skip_steps, active=trace_steps, memory=memory, trace=not no_trace, stacks=stacks)
    res = launch(cfg)
    try:
        _report_run(res, output, [str(d) for d in rules_dirs or []])
    except PerfdoctorError as exc:
        print(f"perfdoctor: error: {exc}", file=sys.stderr)
    except Exception as exc:  # the script's exit code wins over a diagnosis bug
        if os.environ.get("PERFDOCTOR_DEBUG") == "1":
            raise
        print(f"perfdoctor: internal error while diagnosing: {type(exc).__name__}: {exc} "
              "(set PERFDOCTOR_DEBUG=1 for the traceback)", file=sys.stderr)
    raise typer.Exit(res.exit_code)


def _report_run(res, output: Optional[Path], rule_dirs: list[str]) -> None:
    from rich.console import Console

    from perfdoctor.diagnose.live import diagnose_run, write_run_events
    from perfdoctor.report.json_out import to_json
    from perfdoctor.report.terminal import render

    doc = diagnose_run(res, rule_dirs)
    (res.run_dir / "report.json").write_bytes(to_json(doc))
    write_run_events(res.run_dir)
    if output is not None:
        try:
            output.write_bytes(to_json(doc))
        except OSError as exc:
            raise PerfdoctorError(f"cannot write {output}: {exc.strerror or exc}") from None
    render(doc, Console(stderr=True, highlight=False))


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
