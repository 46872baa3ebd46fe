"""The script's command line as `run` and `tune` take it: the script (or -m module) and its
arguments, a launcher or interpreter word typed in front of them, and the one-line answers to
an option in the wrong place (perfdoctor's own after the script, an unknown one before it)."""

from __future__ import annotations

import inspect
import re
import shutil
import sys
from pathlib import Path
from typing import Optional

from perfdoctor.errors import PerfdoctorError
from perfdoctor.report.sanitize import terminal

TORCHRUN = "torch.distributed.run"
PYTHON_WORD = re.compile(r"python(\d+(\.\d+)?)?")


def launcher_words(target: Optional[list[str]], module: Optional[str]) -> tuple[Optional[list[str]], Optional[str]]:
    """A command line as the user would type it without perfdoctor: `perfdoctor run python train.py
    ARGS` (or `python -m pkg.train ARGS`) runs the script as
    `perfdoctor run train.py ARGS` does, with perfdoctor's interpreter (a note says so when the named
    one is another); `perfdoctor run torchrun [TORCHRUN OPTIONS] SCRIPT ARGS` (the launcher's console
    script, by name or path) is `-m torch.distributed.run`: the launcher is not a Python script of
    its own to watch."""
    argv = list(target or [])
    name = Path(argv[0]).name if argv else ""
    if module is None and PYTHON_WORD.fullmatch(name):
        named = shutil.which(argv[0])
        if named and _environment(named) != _environment(sys.executable):
            print(f"perfdoctor: note: the script runs with perfdoctor's Python, {terminal(sys.executable)} "
                  f"(not {terminal(named)})", file=sys.stderr)
        argv = argv[1:]
        if argv[:1] == ["-m"] and len(argv) > 1:
            return argv[2:], argv[1]
        if argv and argv[0].startswith("-") and not Path(argv[0]).is_file():
            raise PerfdoctorError(f"python's own option {terminal(argv[0])} is not passed on (the script runs with "
                                  "perfdoctor's interpreter): set it in the environment (PYTHONUNBUFFERED=1, "
                                  "PYTHONOPTIMIZE=1, PYTHONWARNINGS=..., PYTHONDEVMODE=1) and give the script")
        return argv, module
    if module is None and name == "torchrun":
        return argv[1:], TORCHRUN
    return target, module


def module_args_to_module(argv: list[str], command) -> list[str]:
    """`perfdoctor run [OPTIONS] -m MODULE ARGS`: ARGS are the module's, as with `python -m MODULE
    ARGS` and as after a script. -m is an option of ours, so the parser went on reading options
    after its value: `run -m mytrain --max-steps 150 -o out.pt` stopped the script at 150 steps and
    wrote the report over the script's out.pt, and the script got no arguments. A `--` after the
    module ends our options there (click drops it). `command`: the click command of `argv[0]`, whose
    options say which take a value (skipped while looking for -m); the script's path ends the
    search (everything after it is the script's already)."""
    takes_value = {o: not (p.is_flag or p.count) for p in command.params      # typer's click: no isinstance
                   if getattr(p, "param_type_name", "") == "option" for o in (*p.opts, *p.secondary_opts)}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--" or not a.startswith("-"):
            return argv
        if a == "-m" or a.startswith("-m") and not a.startswith("--"):
            end = i + (2 if a == "-m" else 1)
            return argv if end >= len(argv) or argv[end] == "--" else [*argv[:end], "--", *argv[end:]]
        i += 2 if "=" not in a and takes_value.get(a, False) else 1
    return argv


def _environment(interpreter: str) -> Path:
    """The Python environment an interpreter runs: its virtual environment (pyvenv.cfg above its
    bin/: a venv's python links to the base interpreter, which another venv's links to as well),
    else the interpreter file itself."""
    p = Path(interpreter).absolute()
    return p.parent.parent if (p.parent.parent / "pyvenv.cfg").is_file() else p.resolve()


def script_argv(command: str, fn, target: Optional[list[str]], module: Optional[str]) -> list[str]:
    """The script (or -m module) and its arguments, as `run` and `tune` take them (`fn`: the typer
    command, whose options a misplaced one is checked against)."""
    argv = list(target or [])
    if module:
        if module != TORCHRUN:          # its arguments are torchrun's options (--nproc-per-node ...), then the script's
            _own_options_after_script(command, fn, [module, *argv], module=True)
        return [module, *argv]
    if not argv:
        raise PerfdoctorError(f"give a script (perfdoctor {command} train.py ARGS) or a module "
                              f"(perfdoctor {command} -m pkg.train)")
    if argv[0].startswith("-") and not Path(argv[0]).is_file():
        raise PerfdoctorError(_unknown_option(command, fn, argv[0]))
    if Path(argv[0]).is_dir():          # python runs a folder's __main__.py; perfdoctor a file or a module
        main = Path(argv[0]) / "__main__.py"
        raise PerfdoctorError(f"{argv[0]!r} is a directory: give a script file" + (
            f" ({str(main)!r}) or its package as a module (-m {Path(argv[0]).resolve().name}, from its parent folder)"
            if main.is_file() else " in it"))
    if not Path(argv[0]).is_file():
        raise PerfdoctorError(f"can't open file {argv[0]!r}: no such file")
    _own_options_after_script(command, fn, argv)
    return argv


def _own_options_after_script(command: str, fn, argv: list[str], module: bool = False) -> None:
    """A note when the script's arguments hold one of perfdoctor's own options: as with `python`,
    everything after the script is the script's (`perfdoctor tune train.py --budget 120` tuned
    with the default 300 s budget, and a script without argparse ignored the 120 silently). A note,
    not an error: the script may have an option of that name. `module`: argv[0] is run with -m (the
    command line shown keeps it: without it, the module's name read as a missing file)."""
    names = set(_option_names(fn))
    mine = [a for a in argv[1:] if a.split("=", 1)[0] in names]
    if mine:
        print(f"perfdoctor: note: {', '.join(terminal(a) for a in mine)} after {terminal(argv[0])} is passed to the "
              f"script, as with python (everything after the script is its own); if meant for perfdoctor, put "
              f"it before the script: perfdoctor {command} [OPTIONS] {'-m ' if module else ''}{terminal(argv[0])} [ARGS]",
              file=sys.stderr)


def _option_names(fn) -> list[str]:
    """The long options of a typer command (its parameters' defaults hold their declarations)."""
    return [n for p in inspect.signature(fn).parameters.values()
            for n in getattr(p.default, "param_decls", None) or () if n.startswith("--")]


# what other profilers and trainers call perfdoctor's options (spelling alone does not find them)
OTHER_NAMES = {"--run-dir": "--out", "--output-dir": "--out", "--outdir": "--out", "--out-dir": "--out",
               "--logdir": "--out", "--log-dir": "--out", "--warmup": "--skip-steps", "--warmup-steps": "--skip-steps",
               "--wait": "--skip-steps", "--active": "--trace-steps", "--time": "--duration",
               "--timeout": "--duration", "--seconds": "--duration", "--profile-memory": "--memory",
               "--json": "--format", "--html": "--format"}


def _unknown_option(command: str, fn, given: str) -> str:
    """'no such option: --steps (did you mean --max-steps?) ...': an option perfdoctor does not know
    lands where the script goes (typer passes unknown options on, as they may be the script's)."""
    import difflib

    names = _option_names(fn)
    flag = given.split("=", 1)[0]
    near = ([OTHER_NAMES[flag]] if OTHER_NAMES.get(flag) in names else
            # compared without the dashes, which every name shares: '--bogus' is not near '--out'
            ["--" + n for n in difflib.get_close_matches(flag.lstrip("-"), [n[2:] for n in names], n=1, cutoff=0.6)]
            or [n for n in names if flag[2:] and flag[2:] in n][:1])
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"no such option: {flag}{hint}; `perfdoctor {command} --help` lists them"
