"""CUPTI teardown for `perfdoctor run`'s child, and the CUDA-graph guard. Stdlib only.

Kineto keeps CUPTI subscribed after the profiler's window unless the process asks it to tear
CUPTI down (`TEARDOWN_CUPTI=1`; pytorch/pytorch issue 144455): every later kernel launch then
pays CUPTI's callbacks. On an H100 a launch-bound script ran 1.47x slower per step for the rest
of its run under `perfdoctor run`, and 1.13x with `TEARDOWN_CUPTI=1` (../shared/traces/h100).
So the child gets `TEARDOWN_CUPTI=1`, unless the user set the variable (any value is kept).

The guard: tearing CUPTI down while the process uses CUDA graphs crashed on older CUDA (on the
first lazy CUPTI re-init after a teardown with CUDA 11, on the second re-init with CUDA 12:
pytorch/pytorch PR 112507). torch itself turns teardown off (`TEARDOWN_CUPTI=0`) when
torch.compile or the profiler use CUDA graphs on a CUDA runtime older than 12.6, and on an
H100 with CUDA 13 a torch.compile(mode="reduce-overhead") script ran with teardown without a
crash. perfdoctor decides before the script runs, without a GPU and without importing torch:
  * the CUDA runtime: `torch/version.py` of the torch the child will import (found by the same
    interpreter's import path, read as text);
  * CUDA graphs: the script's own source (or the module's, for -m) mentions a capture
    (torch.cuda.graph / CUDAGraph / make_graphed_callables, torch.compile modes
    "reduce-overhead" and "max-autotune", backend "cudagraphs", triton.cudagraphs = True).
When the script captures CUDA graphs and the CUDA runtime is older than 12.6 (or its version
cannot be read), the variable is left as the user had it (unset: no teardown) and the run's
notes say why. Graph captures hidden in imported modules are not seen; torch's own guard still
covers torch.compile there.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

VAR = "TEARDOWN_CUPTI"
GRAPHS_SAFE_FROM = (12, 6)          # torch's own line for CUPTI teardown with CUDA graphs
UNKNOWN = "unknown"

MARKERS = (
    (re.compile(r"""['"]reduce-overhead['"]"""), "torch.compile mode 'reduce-overhead'"),
    (re.compile(r"""['"]max-autotune['"]"""), "torch.compile mode 'max-autotune'"),
    (re.compile(r"""backend\s*=\s*['"]cudagraphs['"]"""), "torch.compile backend 'cudagraphs'"),
    (re.compile(r"""\bcuda\.graph\s*\("""), "torch.cuda.graph"),
    (re.compile(r"""\bCUDAGraph\s*\("""), "torch.cuda.CUDAGraph"),
    (re.compile(r"""\bmake_graphed_callables\b"""), "torch.cuda.make_graphed_callables"),
    (re.compile(r"""triton\.cudagraphs['"]?\s*[=:]\s*True"""), "inductor triton.cudagraphs"),
)


def cuda_graph_markers(source: str) -> list[str]:
    """What in this source captures CUDA graphs, as 'what (line N)'; comment lines are skipped."""
    found = []
    for n, line in enumerate(source.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        found += [f"{what} (line {n})" for rx, what in MARKERS if rx.search(line)]
    return found


def script_source(argv: list[str], module: str | None, cwd: str | None = None) -> str | None:
    """The text of the script (or of the -m module's file, found without importing anything)."""
    if module:
        parts = module.split(".")
        for base in [cwd or os.getcwd(), *(p for p in sys.path if p)]:
            for cand in (Path(base, *parts).with_suffix(".py"), Path(base, *parts, "__main__.py")):
                if cand.is_file():
                    return _read(cand)
        return None
    return _read(Path(argv[0])) if argv else None


def torch_cuda_version(path: list[str] | None = None) -> str | None:
    """`torch.version.cuda` of the torch this interpreter would import, read from its version.py
    as text (torch is not imported): None without torch or for a build without CUDA, UNKNOWN
    when the file cannot be read."""
    try:
        if path is None:
            spec = importlib.util.find_spec("torch")       # a top-level name: found, not imported
            origin = spec.origin if spec else None
        else:
            origin = next((str(Path(p, "torch", "__init__.py")) for p in path
                           if Path(p, "torch", "__init__.py").is_file()), None)
    except (ImportError, ValueError):
        return None
    if not origin:
        return None
    text = _read(Path(origin).with_name("version.py"))
    if text is None:
        return UNKNOWN
    m = re.search(r"""^cuda\s*(?::[^=\n]*)?=\s*(None|['"]([^'"]*)['"])""", text, re.M)
    if m is None:
        return UNKNOWN
    return m.group(2) if m.group(2) else None


def decide(environ: dict, markers: list[str], cuda: str | None) -> tuple[dict, dict]:
    """(variables to add to the child's environment, the record for run.json and its note)."""
    if VAR in environ:
        return {}, {"value": environ[VAR], "set_by": "user", "cuda": cuda, "cuda_graphs": markers, "note": None}
    if markers and cuda is not None and not _at_least(cuda, GRAPHS_SAFE_FROM):
        why = (f"CUDA {cuda}" if cuda != UNKNOWN else "a CUDA version that could not be read")
        note = (f"CUPTI is not torn down after the trace window: the script captures CUDA graphs "
                f"({', '.join(markers[:3])}) and with {why} (older than "
                f"{GRAPHS_SAFE_FROM[0]}.{GRAPHS_SAFE_FROM[1]}) a CUPTI teardown crashes CUDA graphs; "
                "steps after the window may run slower than without perfdoctor "
                f"(set {VAR}=1 yourself to tear it down anyway)")
        return {}, {"value": None, "set_by": "guard", "cuda": cuda, "cuda_graphs": markers, "note": note}
    return {VAR: "1"}, {"value": "1", "set_by": "perfdoctor", "cuda": cuda, "cuda_graphs": markers, "note": None}


def teardown_env(environ: dict, argv: list[str], module: str | None) -> tuple[dict, dict]:
    """decide() for this run: the script's source and this interpreter's torch."""
    if VAR in environ:                    # the user's choice: nothing to look up
        return decide(environ, [], None)
    source = script_source(argv, module)
    return decide(environ, cuda_graph_markers(source) if source else [], torch_cuda_version())


def _at_least(version: str, floor: tuple[int, int]) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= floor


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
