"""Command-line interface: a thin typer layer. Heavy imports happen inside commands so that
`perfdoctor --help` stays fast."""

from __future__ import annotations

import inspect
import math
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from perfdoctor import __version__
from perfdoctor.errors import exit_with

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Diagnose PyTorch training bottlenecks: input-, host-, device- or communication-bound, "
         "with the evidence behind the verdict.")


class Format(str, Enum):
    terminal = "terminal"
    json = "json"
    html = "html"
    markdown = "markdown"
    md = "md"                      # markdown, as the file suffix names it


class TextFormat(str, Enum):       # compare and tune: no pictures
    terminal = "terminal"
    json = "json"
    markdown = "markdown"
    md = "md"


def _form(fmt: Enum) -> str:
    """The format's name: md is markdown."""
    return "markdown" if fmt.value == "md" else fmt.value


class GateFormat(str, Enum):
    terminal = "terminal"
    json = "json"


DETAILS_HELP = "The full report: evidence, every fix in full with its code, gaps and detail tables."


def _version(value: bool) -> None:
    if value:
        typer.echo(f"perfdoctor {__version__}")
        raise typer.Exit()


def _not_nan(value: float | None) -> float | None:
    """A float option's check for nan, which passes click's range check (every comparison with it
    is false) and then disabled what it set: `gate --min-effect nan` passed any slowdown ("within
    ±nan%"), `tune --budget nan` skipped every trial, `run --duration nan` never stopped the script."""
    if value is not None and math.isnan(value):
        raise typer.BadParameter("nan is not a number")
    return value


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    pass


@app.command()
def report(
    path: Path = typer.Argument(..., help="A torch.profiler trace (.json, .json.gz, *.pt.trace.json[.gz]), "
                                          "a directory of them (one per rank/worker), a `perfdoctor run` "
                                          "directory (re-diagnosed as run did), or a tune directory (its baseline's "
                                          "report with the gains measured)."),
    fmt: Format = typer.Option(Format.terminal, "--format", "-f", metavar="FORMAT",
                               help="terminal (one screen), json, html (one self-contained file) or markdown "
                                    "(md; pull requests, job summaries); on stdout, or in the -o file."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Write the report in --format to this file instead of stdout "
                                               "(with the terminal format: a FILE named .html or .md gets that "
                                               "format, any other the JSON report, beside the screen)."),
    details: bool = typer.Option(False, "--details", help=DETAILS_HELP),
    annotate: Optional[Path] = typer.Option(None, "--annotate", metavar="OUT.json.gz",
                                            help="Also write a copy of the trace with the findings as events of "
                                                 "category perfdoctor (open it in Perfetto UI or TensorBoard)."),
    tune_json: Optional[Path] = typer.Option(None, "--tune", metavar="TUNE.json",
                                             help="tune's JSON: the measured gains under the fixes (found by "
                                                  "itself for a run directory inside a tune directory)."),
    rules_dirs: Optional[list[Path]] = typer.Option(None, "--rules", metavar="DIR",
                                                    help="Extra rule directory (repeatable), added to the built-in rules."),
) -> None:
    """Diagnose a recorded trace: verdict, ranked fixes, breakdown, flags and the numbers behind them."""
    from perfdoctor.diagnose.offline import diagnose_path
    from perfdoctor.report.outputs import check_writable, emit, format_for, report_inputs, tune_baseline, tune_for

    reads = report_inputs(path) + ([tune_json] if tune_json is not None else [])    # a tune's: its tune.json
    tuned_doc = None
    if (tuned := tune_baseline(path)) is not None:       # a tune: its baseline's report, with its JSON
        path, tuned_doc, note = tuned
        print(f"perfdoctor: note: {note}", file=sys.stderr)
        reads += report_inputs(path)
    for dest in (d for d in (output, annotate) if d is not None):     # before the load, never over the input
        check_writable(dest, reads)
    given = tune_for(path, tune_json) if tune_json is not None else tuned_doc  # a bad file: exit 2 before the load
    doc = diagnose_path(str(path), [str(d) for d in rules_dirs or []])
    form = format_for(_form(fmt), output)
    shows_tune = form != "json"
    if given is not None and not shows_tune:
        print("perfdoctor: note: --tune's measured gains are not in the JSON report (they are in tune's JSON)",
              file=sys.stderr)
    tune = (given or tune_for(path, None)) if shows_tune else None
    if annotate is not None:
        from perfdoctor.report.annotate import write_annotated
        write_annotated(doc, annotate)
    emit(doc, form, output, details, tune)


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def run(
    target: Optional[list[str]] = typer.Argument(None, metavar="SCRIPT [ARGS]...",
                                                 help="The training script and its arguments, exactly as for `python`."),
    module: Optional[str] = typer.Option(None, "-m", metavar="MODULE", help="Run a module, as `python -m MODULE`."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1,
                                            help="Stop the script at a step boundary after N measured steps."),
    duration: Optional[float] = typer.Option(None, "--duration", min=1, callback=_not_nan, metavar="SECONDS",
                                             help="Stop the script at a step boundary this long after launch."),
    skip_steps: int = typer.Option(5, "--skip-steps", min=0, help="Warm-up steps before the trace window."),
    trace_steps: int = typer.Option(5, "--trace-steps", min=1, help="Steps recorded by torch.profiler."),
    memory: bool = typer.Option(False, "--memory", help="Also profile memory (allocator events) in the trace."),
    no_trace: bool = typer.Option(False, "--no-trace", help="Do not record a torch.profiler trace."),
    stacks: Optional[bool] = typer.Option(None, "--stacks/--no-stacks", envvar="PERFDOCTOR_STACKS",
                                          show_default="auto",
                                          help="Record Python stacks of the trainer and loader workers with py-spy "
                                               "(py-spy record, 50 Hz, attached to the script: needs ptrace). "
                                               "Default: only when half a CPU core or more is idle at the first step, so "
                                               "py-spy takes no CPU from the job; the env var (1 or 0) sets the default."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default: perfdoctor-runs/<time>-<script>). "
                                                           "A directory that already holds a run is refused."),
    force: bool = typer.Option(False, "--force", help="With --out: replace the run already in that directory "
                                                      "(its files are removed first)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Also write the report here, in --format (with the terminal "
                                               "format: html or markdown for a FILE named .html or .md, else json)."),
    fmt: Format = typer.Option(Format.terminal, "--format", "-f", metavar="FORMAT",
                               help="terminal, json, html or markdown (md): the -o file's; the terminal report goes "
                                    "to stderr (markdown without "
                                    "-o: on stderr instead). The run directory always gets report.json, "
                                    "report.html and an annotated trace."),
    details: bool = typer.Option(False, "--details", help=DETAILS_HELP),
    rules_dirs: Optional[list[Path]] = typer.Option(None, "--rules", metavar="DIR",
                                                    help="Extra rule directory (repeatable)."),
    baselines: Optional[list[Path]] = typer.Option(None, "--baseline", "-b", metavar="RUN",
                                                   help="Gate this run against baseline run(s) (repeatable), "
                                                        "as `perfdoctor gate` with its defaults."),
    strict: bool = typer.Option(False, "--strict", help="With --baseline: inconclusive / not comparable fail too."),
    nproc_per_node: Optional[str] = typer.Option(None, "--nproc-per-node", "--nproc_per_node", metavar="N",
                                                 help="Start N ranks per node through torchrun (torch.distributed.run), "
                                                      "each watched; one merged report."),
    nnodes: Optional[str] = typer.Option(None, "--nnodes", metavar="M", help="torchrun --nnodes (several nodes)."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", "--node_rank", min=0, help="torchrun --node-rank."),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", "--master_addr", help="torchrun --master-addr."),
    master_port: Optional[int] = typer.Option(None, "--master-port", "--master_port", help="torchrun --master-port."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", "--rdzv_endpoint",
                                                help="torchrun --rdzv-endpoint (HOST:PORT)."),
    rdzv_backend: Optional[str] = typer.Option(None, "--rdzv-backend", "--rdzv_backend", help="torchrun --rdzv-backend."),
    rdzv_id: Optional[str] = typer.Option(None, "--rdzv-id", "--rdzv_id", help="torchrun --rdzv-id."),
) -> None:
    """Run a training script unmodified, watch it, and diagnose it (report on stderr).

    Several ranks: --nproc-per-node N starts them through torch.distributed.run; or start
    `perfdoctor run` once per rank with your own launcher (torchrun --no-python, srun): each rank
    writes RUN_DIR/ranks/rank-K/, and the report merges the ranks.

    Exit code: the script's own (128+N if a signal N killed it, and killed by SIGINT as python is
    when SIGINT killed it; with --nproc-per-node, torchrun's);
    when the script succeeded and --baseline is given, the gate's (0 pass, 1 regression, 3
    inconclusive); 2 for usage errors."""
    from perfdoctor.collect.launcher import RunConfig
    from perfdoctor.run_flow import Output, run_script

    from perfdoctor.script_argv import launcher_words, script_argv
    target, module = launcher_words(target, module)
    argv = script_argv("run", run, target, module)
    if output is not None:              # before the script runs, not after its whole training
        from perfdoctor.report.outputs import check_writable
        check_writable(output, [] if module else [Path(argv[0])])
    cfg = RunConfig(argv=argv, module=module, run_dir=out, max_steps=max_steps, duration=duration,
                    skip=skip_steps, active=trace_steps, memory=memory, trace=not no_trace, stacks=stacks,
                    force=force)
    from perfdoctor.report.outputs import format_for
    report_to = Output(output, format_for(_form(fmt), output), details, [str(d) for d in rules_dirs or []])
    dist = [nnodes, node_rank, master_addr, master_port, rdzv_endpoint, rdzv_backend, rdzv_id]
    raise typer.Exit(run_script(cfg, report_to, dist, nproc_per_node, list(baselines or []), strict))


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def tune(
    target: Optional[list[str]] = typer.Argument(None, metavar="SCRIPT [ARGS]...",
                                                 help="The training script and its arguments, exactly as for `python`."),
    module: Optional[str] = typer.Option(None, "-m", metavar="MODULE", help="Tune a module, as `python -m MODULE`."),
    budget: float = typer.Option(300.0, "--budget", min=10, callback=_not_nan, metavar="SECONDS",
                                 help="Wall time for the whole tune; trials that do not fit are skipped (and listed)."),
    duration: Optional[float] = typer.Option(None, "--duration", min=2, callback=_not_nan, metavar="SECONDS",
                                             help="Length of each run's training, from its first step (default: budget/8, "
                                                  "between 8 and 45 s)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=2, help="Also stop each run after N steps."),
    allow_numerics: bool = typer.Option(False, "--allow-numerics",
                                        help="Also try autocast (bf16/fp16) around the model's forward, and "
                                             "float32 for a model in float64."),
    allow_compile: bool = typer.Option(False, "--allow-compile", help="Also try torch.compile of the model."),
    only: Optional[list[str]] = typer.Option(None, "--only", metavar="NAMES",
                                             help="Try only these trial groups (loader, threads, optimizer, ...) or "
                                                  "the trials of these fixes (PD301, ...): comma-separated, "
                                                  "repeatable."),
    out: Optional[Path] = typer.Option(None, "--out", help="Tune directory (default: perfdoctor-runs/<time>-<script>-tune)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Also write the result here, in --format (with the terminal "
                                               "format: markdown for a FILE named .md, else json)."),
    fmt: TextFormat = typer.Option(TextFormat.terminal, "--format", "-f", metavar="FORMAT",
                                   help="terminal, json or markdown (md): the -o file's (markdown without -o: on "
                                        "stdout instead of the table)."),
    rules_dirs: Optional[list[Path]] = typer.Option(None, "--rules", metavar="DIR",
                                                    help="Extra rule directory (repeatable)."),
    stacks: Optional[bool] = typer.Option(None, "--stacks/--no-stacks", envvar="PERFDOCTOR_STACKS",
                                          show_default="auto",
                                          help="Record Python stacks of the baseline run with py-spy, as `run` does "
                                               "(default: only when half a CPU core or more is idle; the env var, 1 or 0, "
                                               "sets it)."),
    show_output: bool = typer.Option(False, "--show-output",
                                     help="Pass every run's output through to this terminal (default: into "
                                          "output.log in each run's directory; a failed run's last lines are shown)."),
    nproc_per_node: Optional[str] = typer.Option(None, "--nproc-per-node", "--nproc_per_node", metavar="N",
                                                 help="Tune a data-parallel job: every run starts N ranks on this "
                                                      "machine through torchrun; its step time is the slowest "
                                                      "rank's."),
) -> None:
    """Measure zero-code changes (DataLoader workers, threads, optimizer, CUDA flags...) on the
    unmodified script, each in a fresh run against the baseline, and print the best as code.
    A torchrun job of one node is tuned whole: --nproc-per-node N, or its torchrun command line.

    Exit code: 0 tuned (whatever the trials found); 1 the baseline run of the script failed;
    2 usage error; 3 the baseline could not be measured (too few steps); 130 interrupted."""
    from perfdoctor.tune.result import emit
    from perfdoctor.tune.plan import only_names
    from perfdoctor.tune.session import TuneFailed, TuneOptions, Tuner

    from perfdoctor.script_argv import launcher_words, script_argv
    from perfdoctor.tune.job import job_command
    target, module = launcher_words(target, module)
    argv, module, dist = job_command(script_argv("tune", tune, target, module), module, nproc_per_node)
    if output is not None:              # before the budget is spent, not after it
        from perfdoctor.report.outputs import check_writable
        check_writable(output, [] if module else [Path(argv[0])])
    tuner = Tuner(TuneOptions(argv=argv, module=module, budget_s=budget, out=out, run_s=duration, max_steps=max_steps,
                              allow_numerics=allow_numerics, allow_compile=allow_compile,
                              rule_dirs=[str(d) for d in rules_dirs or []], stacks=stacks, only=only_names(only),
                              show_output=show_output, dist=dist))
    from perfdoctor.report.outputs import format_for
    form = format_for(_form(fmt), output, ("markdown",))
    try:
        tuner.run()
    except TuneFailed as exc:               # its one line is the error; -o FILE and tune.json say it too
        emit(tuner, output, form, failed=exc)
        raise
    emit(tuner, output, form)


@app.command()
def compare(
    before: Path = typer.Argument(..., metavar="BEFORE", help="Run directory or report JSON file: the reference."),
    after: Path = typer.Argument(..., metavar="AFTER", help="Run directory or report JSON file: the changed run."),
    fmt: TextFormat = typer.Option(TextFormat.terminal, "--format", "-f", metavar="FORMAT",
                                   help="What to print on stdout: terminal, json or markdown (md: for a pull request "
                                        "or job summary)."),
) -> None:
    """Two runs side by side: step time, throughput, breakdown, verdict and fixes, against the noise."""
    from perfdoctor.gate.compare import compare_paths, render_compare
    from perfdoctor.report.outputs import rendered

    doc = compare_paths(before, after)
    if fmt is not TextFormat.terminal:
        sys.stdout.buffer.write(rendered(doc, _form(fmt), kind="compare"))
        return
    render_compare(doc)


@app.command()
def gate(
    current: Path = typer.Argument(..., metavar="CURRENT",
                                   help="The run to judge: run directory (or report JSON file)."),
    baselines: list[Path] = typer.Option(..., "--baseline", "-b", metavar="RUN",
                                         help="Baseline run directory or report (repeatable: several runs "
                                              "measure the run-to-run noise)."),
    min_effect: float = typer.Option(0.10, "--min-effect", min=0.0, callback=_not_nan,
                                     help="Smallest step-time change that counts (0.10 = 10%)."),
    min_share: float = typer.Option(0.10, "--min-share", min=0.0, callback=_not_nan,
                                    help="Smallest change of a share (data wait, idle device) that counts "
                                         "(0.10 = 10 points)."),
    min_steps: int = typer.Option(10, "--min-steps", min=2, help="Steady-state steps needed, else inconclusive."),
    noise_k: float = typer.Option(3.0, "--noise-k", min=0.0, callback=_not_nan,
                                  help="With several baselines: the change must exceed this many spreads."),
    max_other_load: float = typer.Option(0.25, "--max-other-load", min=0.0, callback=_not_nan,
                                         help="Step time is inconclusive when other processes used more than "
                                              "this share of the CPU cores during a run (1 = never)."),
    strict: bool = typer.Option(False, "--strict", help="Fail (exit 1) on inconclusive / not comparable too."),
    junit: Optional[Path] = typer.Option(None, "--junit", metavar="FILE", help="Also write JUnit XML here."),
    fmt: GateFormat = typer.Option(GateFormat.terminal, "--format", "-f", help="What to print on stdout."),
) -> None:
    """Performance gate for CI: is CURRENT slower than the baseline(s)?

    Exit code: 0 pass/improvement, 1 regression or a failed script in CURRENT, 2 usage/input error,
    3 inconclusive/not comparable."""
    from perfdoctor.gate.gate import gate_paths
    from perfdoctor.gate.render import github, junit as write_junit, render_terminal
    from perfdoctor.report.json_out import to_json

    res = gate_paths(current, baselines, min_effect=min_effect, min_share=min_share, min_steps=min_steps,
                     noise_k=noise_k, max_other_load=max_other_load)
    if junit is not None:
        write_junit(res, junit)
    github(res, strict, sys.stderr if fmt is GateFormat.json else sys.stdout)
    if fmt is GateFormat.json:
        sys.stdout.buffer.write(to_json(res.to_dict()))
    else:
        render_terminal(res)
    raise typer.Exit(res.exit_code(strict))


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
    from perfdoctor.rules.loader import find_rule
    render_show(find_rule(rule_id, [str(d) for d in rules_dirs or []]))


@rules_app.command("check")
def rules_check(directory: Optional[Path] = typer.Argument(None, help="A directory of your own rules "
                                                                      "(default: check the built-in rules).")) -> None:
    """Validate rule files and run each rule's test cases. Exit 2 if a file is invalid, 1 if a case fails."""
    from perfdoctor.report.rules_view import render_check
    from perfdoctor.report.sanitize import terminal
    from perfdoctor.rules.check import check_rules
    from perfdoctor.rules.loader import RulesInvalid
    try:
        results, n_rules = check_rules(directory)
    except RulesInvalid as exc:
        for p in exc.problems:
            print(f"perfdoctor: error: {terminal(p.headline())}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    render_check(results, n_rules)
    if any(not x.ok for x in results):
        raise typer.Exit(1)


def _unwrap_help(*apps: typer.Typer) -> None:
    """Docstrings are wrapped at 100 columns for the source; typer keeps their single line breaks,
    so `--help` showed ragged lines ("...; or start" / "`perfdoctor run` once per rank"). Each
    paragraph becomes one line here and the terminal wraps it."""
    for a in apps:
        for c in a.registered_commands:
            doc = inspect.cleandoc(c.callback.__doc__ or "")
            c.callback.__doc__ = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n"))


_unwrap_help(app, rules_app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: maps errors to one line on stderr and a documented exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["run"], ["tune"]):
        from perfdoctor.script_argv import module_args_to_module
        argv = module_args_to_module(argv, typer.main.get_command(app).commands[argv[0]])
    # not standalone: click's usage errors come here, to be said in one line (click and
    # typer print a usage block and a boxed message)
    exit_with(lambda: app(args=argv, prog_name="perfdoctor", standalone_mode=False))


if __name__ == "__main__":  # pragma: no cover
    main()
