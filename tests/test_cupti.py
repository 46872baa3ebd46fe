"""CUPTI teardown for the child (TEARDOWN_CUPTI=1 unless the user set it) and the CUDA-graph guard
(collect/cupti.py): the decision, its inputs read without a GPU or torch import, and the environment
the child really gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap


from perfdoctor.collect.cupti import (UNKNOWN, VAR, cuda_graph_markers, decide, script_source,
                                      torch_cuda_version)

COMPILED = textwrap.dedent("""
    import torch
    # torch.compile(model, mode="reduce-overhead") in a comment is no capture
    model = torch.compile(torch.nn.Linear(4, 4), mode="reduce-overhead")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pass
    fast = torch.compile(model, mode="max-autotune-no-cudagraphs")
""")


def test_markers_name_the_capture_and_its_line():
    assert cuda_graph_markers(COMPILED) == ["torch.compile mode 'reduce-overhead' (line 4)",
                                            "torch.cuda.CUDAGraph (line 5)", "torch.cuda.graph (line 6)"]
    assert cuda_graph_markers("opt = torch.compile(m, backend='cudagraphs')\n") == [
        "torch.compile backend 'cudagraphs' (line 1)"]
    assert cuda_graph_markers("cfg = {'triton.cudagraphs': True}\ninductor.config.triton.cudagraphs = True\n") == [
        "inductor triton.cudagraphs (line 1)", "inductor triton.cudagraphs (line 2)"]
    assert cuda_graph_markers("m = torch.compile(m)\nx = m(x)\n") == []
    assert cuda_graph_markers("m = torch.compile(m, mode='max-autotune')") == ["torch.compile mode 'max-autotune' (line 1)"]


def test_decision():
    graphs = ["torch.cuda.graph (line 6)"]
    # the user's value is kept, whatever it is, and nothing is added
    for value in ("0", "1", ""):
        env, rec = decide({VAR: value}, graphs, "11.8")
        assert env == {} and rec["value"] == value and rec["set_by"] == "user" and rec["note"] is None
    # no graphs, or a CUDA runtime that survives re-init with graphs, or no CUDA at all: teardown
    for markers, cuda in (([], "11.8"), (graphs, "12.6"), (graphs, "13.0"), (graphs, None), ([], UNKNOWN)):
        env, rec = decide({}, markers, cuda)
        assert env == {VAR: "1"} and rec["set_by"] == "perfdoctor" and rec["note"] is None, (markers, cuda)
    # graphs on an older (or unreadable) CUDA: no teardown, and the note says why
    for cuda in ("12.4", "11.8", UNKNOWN):
        env, rec = decide({}, graphs, cuda)
        assert env == {} and rec["set_by"] == "guard" and rec["value"] is None
        assert "not torn down" in rec["note"] and "torch.cuda.graph (line 6)" in rec["note"]
        assert ("CUDA " + cuda if cuda != UNKNOWN else "could not be read") in rec["note"]


def _fake_torch(root, cuda_line):
    pkg = root / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('a fake torch must never be imported')\n")
    if cuda_line is not None:
        (pkg / "version.py").write_text(f"from typing import Optional\n__version__ = '2.4.0'\n{cuda_line}\n")
    return root


def test_cuda_version_is_read_without_importing_torch(tmp_path):
    assert torch_cuda_version([str(_fake_torch(tmp_path / "a", "cuda: Optional[str] = '12.4'"))]) == "12.4"
    assert torch_cuda_version([str(_fake_torch(tmp_path / "b", "cuda = '11.8'"))]) == "11.8"
    assert torch_cuda_version([str(_fake_torch(tmp_path / "c", "cuda: Optional[str] = None"))]) is None
    assert torch_cuda_version([str(_fake_torch(tmp_path / "d", None))]) == UNKNOWN      # no version.py
    assert torch_cuda_version([str(tmp_path / "nowhere")]) is None                     # no torch
    # this environment's torch (CPU build in the test venv): its own torch.version.cuda
    try:
        import torch
    except ImportError:
        return
    assert torch_cuda_version() == torch.version.cuda


def test_module_source_is_found_without_importing(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('must not run')\n")
    (pkg / "train.py").write_text(COMPILED)
    assert script_source([], "pkg.train", cwd=str(tmp_path)) == COMPILED
    assert script_source([str(pkg / "train.py")], None) == COMPILED
    assert script_source([], "no.such.module", cwd=str(tmp_path)) is None


PRINT_ENV = textwrap.dedent("""
    import os
    MODE = "reduce-overhead"          # the script would compile with CUDA graphs
    print(repr(os.environ.get("TEARDOWN_CUPTI")))
""")


def _run(tmp_path, name, env_extra):
    script = tmp_path / "show_env.py"
    script.write_text(PRINT_ENV)
    env = {k: v for k, v in os.environ.items() if k != VAR}
    env.update(env_extra)
    out = tmp_path / name
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "run", "--no-trace", "--out", str(out), str(script)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), json.loads((out / "run.json").read_text()), json.loads((out / "report.json").read_text())


def test_the_environment_the_child_gets(tmp_path):
    # this machine's torch has no CUDA (or there is none): teardown on, as for any run without the guard
    cuda = torch_cuda_version()
    if cuda is None:
        out, launched, _ = _run(tmp_path, "plain", {})
        assert out == "'1'"
        rec = launched["config"]["teardown_cupti"]
        assert rec["set_by"] == "perfdoctor" and rec["cuda_graphs"] == ["torch.compile mode 'reduce-overhead' (line 3)"]
    # the user's value, even empty, reaches the script untouched
    assert _run(tmp_path, "user0", {VAR: "0"})[0] == "'0'"
    assert _run(tmp_path, "user_empty", {VAR: ""})[0] == "''"
    # a torch built for CUDA 12.4 (a stand-in found first on the path; the script never imports it):
    # the script captures CUDA graphs, so no teardown, and the run's notes say why
    fake = _fake_torch(tmp_path / "fake", "cuda: Optional[str] = '12.4'")
    out, launched, doc = _run(tmp_path, "guarded", {"PYTHONPATH": str(fake)})
    assert out == "None"
    assert launched["config"]["teardown_cupti"]["set_by"] == "guard"
    assert any("CUPTI is not torn down" in n and "CUDA 12.4" in n for n in doc["run"]["notes"]), doc["run"]["notes"]
    # the same stand-in at CUDA 13.0: teardown
    fake13 = _fake_torch(tmp_path / "fake13", "cuda: Optional[str] = '13.0'")
    assert _run(tmp_path, "cuda13", {"PYTHONPATH": str(fake13)})[0] == "'1'"
