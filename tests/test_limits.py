"""Resource limits on hostile input (issue 12): a gzip bomb, a file of one huge string and a
header that never ends are refused within a memory cap (the reader's 128 MiB span, far below
1 GiB RSS) with one line and exit 2; 100k-deep nesting is a decode error, not a recursion
crash; a trace directory's FIFOs, devices, dangling links, link loops, sub-directories and
unrelated files are skipped with a note each (never opened: a FIFO would block)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tracegen as tg
from perfdoctor.trace.reader import MAX_SPAN_BYTES

RSS_CAP_MB = 1024


def measured(args: list[str], timeout: int = 120) -> tuple[subprocess.CompletedProcess, float, float]:
    """`perfdoctor ARGS` in a fresh process; (result, peak RSS in MB of that process, seconds)."""
    probe = textwrap.dedent(f"""
        import resource, subprocess, sys, time
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "perfdoctor", *{args!r}], capture_output=True, text=True,
                           timeout={timeout})
        dt = time.monotonic() - t0
        sys.stdout.write(f"{{r.returncode}}\\n{{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}}\\n"
                         f"{{dt}}\\n{{r.stderr}}")
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout + 30)
    code, rss, dt, err = out.stdout.split("\n", 3)
    return subprocess.CompletedProcess(args, int(code), "", err), float(rss), float(dt)


def _bomb(path: Path, head: bytes, gib: int = 2) -> Path:
    block = gzip.compress(b"a" * (8 << 20), 9)          # gzip members concatenate: 8 MiB each
    with open(path, "wb") as f:
        f.write(gzip.compress(head))
        for _ in range(gib * 128):
            f.write(block)
        f.write(gzip.compress(b'", "ph": "X"}]}'))
    return path


@pytest.mark.parametrize("head", [b'{"traceEvents": [{"name": "', b'{"metadata": "'], ids=["event", "header"])
def test_gzip_bomb_is_refused_within_the_memory_cap(tmp_path, head):
    bomb = _bomb(tmp_path / "bomb.json.gz", head)
    assert bomb.stat().st_size < 4 << 20                 # 2 GiB of JSON in a few MB: ratio ~1000
    r, rss, dt = measured(["report", str(bomb)])
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "128 MiB cap" in r.stderr and "decompression bomb" in r.stderr
    assert rss < RSS_CAP_MB and dt < 60, (rss, dt)
    print(f"gzip bomb ({head[:12]!r}): refused at {MAX_SPAN_BYTES >> 20} MiB, peak RSS {rss:.0f} MB, {dt:.1f} s")


def test_a_file_of_one_long_string_is_refused_within_the_cap(tmp_path):
    p = tmp_path / "long.json"
    with open(p, "wb") as f:
        f.write(b'{"traceEvents": [{"ph": "X", "name": "')
        chunk = b"x" * (16 << 20)
        for _ in range((MAX_SPAN_BYTES >> 24) + 2):     # just over the cap: 160 MB on disk
            f.write(chunk)
        f.write(b'"}]}')
    r, rss, dt = measured(["report", str(p)])
    assert r.returncode == 2 and "without an event boundary" in r.stderr, r.stderr
    assert rss < RSS_CAP_MB, rss


@pytest.mark.parametrize("closed", [True, False])
def test_deep_nesting_is_a_decode_error(tmp_path, closed):
    p = tmp_path / "nest.json"
    p.write_bytes(b'{"traceEvents": [' + b"[" * 100_000 + (b"]" * 100_000 if closed else b"") + b"]}")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(p)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("perfdoctor: error:") and r.stderr.count("\n") == 1
    assert "Recursion" not in r.stderr and time.monotonic() - t0 < 30


DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000


@pytest.mark.parametrize("text", [b'{"traceEvents": [' + DEEP_OBJECT + b"]}",
                                  b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "args": '
                                  + DEEP_OBJECT + b"}]}",
                                  b'{"traceEvents": [], "x": ' + DEEP_OBJECT + b"}",
                                  b"[" + DEEP_OBJECT + b"]",
                                  b'{"traceEvents": [' + b"}" * 500_000 + b"]}"],
                         ids=["event", "args", "trailer", "bare", "closers"])
def test_deep_objects_and_a_flood_of_braces_are_refused_quickly(tmp_path, text):
    """The salvage of a damaged end tried the first event alone at every '}', each decode from
    the start: quadratic, 100k closing braces ran for hours. It tries the first 64."""
    p = tmp_path / "nest.json"
    p.write_bytes(text)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(p)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and r.stderr.startswith("perfdoctor: error:") and r.stderr.count("\n") == 1, r.stderr
    assert "no events could be parsed" in r.stderr and time.monotonic() - t0 < 20


def test_a_deep_trailer_after_real_events_keeps_the_events(tmp_path):
    p = tmp_path / "t.json"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec() for _ in range(3)]), p)
    text = p.read_bytes().rstrip()
    p.write_bytes(text[:-1] + b', "x": ' + DEEP_OBJECT + b"}")
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(p)], capture_output=True, text=True,
                       timeout=30, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "3 step(s)" in r.stdout and "trace is truncated or damaged near its end" in r.stdout


def test_a_directory_of_odd_entries(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    tg.write(tg.TraceSpec(steps=[tg.StepSpec() for _ in range(3)]), d / "good.json")
    os.mkfifo(d / "fifo.json")
    (d / "loop.json").symlink_to(d / "loop.json")
    (d / "dangling.json").symlink_to(d / "nothere.json")
    (d / "dev.json").symlink_to("/dev/zero")            # would never end if it were read
    (d / "sub.json").mkdir()
    for i in range(3000):                                # unrelated files are not even looked at
        (d / f"note{i}.txt").write_text("x")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(d)], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 30
    for name, why in (("fifo.json", "not a regular file"), ("loop.json", "cannot stat it (Too many levels of symbolic links)"),
                      ("dangling.json", "a dangling symbolic link"), ("dev.json", "not a regular file"),
                      ("sub.json", "a directory")):
        assert f"warning: skipped {name}: {why}" in r.stdout, r.stdout


@pytest.mark.parametrize("entry", ["fifo", "device", "loop"])
def test_an_odd_path_given_alone_is_refused(tmp_path, entry):
    p = tmp_path / "t.json"
    if entry == "fifo":
        os.mkfifo(p)
    elif entry == "device":
        p = Path("/dev/zero")
    else:
        p.symlink_to(p)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(p)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "FIFO" in r.stderr or "link" in r.stderr


def test_an_unreadable_file_in_a_directory(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("running as root: permissions do not stop root (FIFOs and dangling links cover the case)")
    d = tmp_path / "traces"
    d.mkdir()
    tg.write(tg.TraceSpec(steps=[tg.StepSpec() for _ in range(3)]), d / "good.json")
    (d / "secret.json").write_text("{}")
    (d / "secret.json").chmod(0)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(d)], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0 and "skipped secret.json: not readable" in r.stdout


def _run_dir(d: Path) -> Path:
    """A small run directory by hand: run.json, child.json, 30 steps of 10 ms, samples.json."""
    import json
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"argv": ["train.py"], "exit_code": 0, "wall_s": 1.0}))
    (d / "child.json").write_text(json.dumps({"outcome": "completed", "steps": 30, "mode": "optimizer"}))
    (d / "steps.jsonl").write_text("".join(json.dumps({"step": i + 1, "end": 1.7e9 + 0.01 * (i + 1), "dur": 0.01,
                                                       "wait": 0.001, "batches": 1, "mode": "optimizer"}) + "\n"
                                           for i in range(30)))
    (d / "samples.json").write_text(json.dumps({"samples": [], "notes": []}))
    return d


@pytest.mark.parametrize("name", ["run.json", "child.json", "steps.jsonl", "samples.json", "stacks/pyspy.meta.json"])
@pytest.mark.parametrize("entry", ["fifo", "device"])
def test_a_run_directory_file_that_is_a_fifo_or_a_device(tmp_path, name, entry):
    """A run directory's files were read with read_text/read_bytes: a FIFO (no writer) blocked
    `report RUN_DIR` forever, a link to /dev/zero read until the memory ran out. They are read
    only when regular files (inputjson.read_bytes); child.json says why it is unknown."""
    run = _run_dir(tmp_path / "run")
    p = run / name
    p.parent.mkdir(exist_ok=True)
    p.unlink(missing_ok=True)
    os.mkfifo(p) if entry == "fifo" else p.symlink_to("/dev/zero")
    r, rss, dt = measured(["report", str(run)], timeout=30)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert rss < RSS_CAP_MB and dt < 20, (rss, dt)
    if name in ("child.json", "steps.jsonl"):     # said, not silently unknown
        r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(run)], capture_output=True, text=True,
                           timeout=30, env={**os.environ, "COLUMNS": "300"})
        said = {"child.json": "child.json could not be read (not a regular file",
                "steps.jsonl": "steps.jsonl cannot be read (not a regular file"}[name]
        assert said in " ".join(r.stdout.split()), r.stdout


def test_a_rule_file_that_is_a_fifo_is_an_invalid_rule(tmp_path):
    os.mkfifo(tmp_path / "PD990-fifo.toml")
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "rules", "check", str(tmp_path)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a regular file" in r.stderr, r.stderr
