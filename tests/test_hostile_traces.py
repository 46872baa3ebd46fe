"""Trace files no profiler writes, made by hand or by damage: timestamps far outside the
recording (1e308), infinite starts on instant events, step numbers used twice, header fields of
another type or holding lone surrogate escapes. Each is read with what it still tells and a
warning or note saying what was left out; never an internal error (exit 70) or a report of
nonsense at full confidence."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

import tracegen as tg
from perfdoctor.diagnose.offline import diagnose_path
from perfdoctor.trace.loader import load_trace


def _doc(memory: bool = False) -> dict:
    spec = tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=500) for _ in range(6)], memory_events=memory)
    return tg.build(spec)[0]


def _write(tmp_path, doc: dict, name: str = "t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))          # Python's json writes NaN and Infinity as their literals
    return p


def _steps(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]


def test_starts_far_outside_the_recording_are_left_out_with_a_warning(tmp_path):
    """A start of 1e308 us among starts of 1.7e15 made a step of 1e305 ms, numpy overflow
    warnings on stderr and a host-bound verdict; the events are left out and the trace reads as
    the intact one does."""
    good = _write(tmp_path, _doc(), "good.json")
    doc = _doc()
    events = doc["traceEvents"]
    _steps(doc)[0]["ts"] = 1e308
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    ops[3]["ts"], ops[4]["ts"] = 1e308, -1e300
    bad = _write(tmp_path, doc, "bad.json")
    t = load_trace(bad)
    assert len(t.ts) == len(load_trace(good).ts) - 3
    (w,) = [w for w in t.meta.warnings if w.startswith("ignored")]
    assert w.startswith("ignored 3 event(s)") and "start 1e+308 us" in w
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # no overflow in the statistics
        m = diagnose_path(str(bad))["traces"][0]["metrics"]
    m_good = diagnose_path(str(good))["traces"][0]["metrics"]
    assert m["steps.count"] == m_good["steps.count"] - 1           # the step whose span is gone
    assert m["steps.time_median_ms"] == pytest.approx(m_good["steps.time_median_ms"], rel=0.01)
    assert m["breakdown.data_loading"] == pytest.approx(m_good["breakdown.data_loading"], abs=0.03)


def test_an_op_running_far_past_the_steps_is_left_out_with_a_warning(tmp_path):
    """An op of 500 s starting in a step of a few ms, holding the later steps of its thread: under
    the hour that makes a duration impossible by itself, it had moved the verdict (CPU ops 0.55 ->
    1.59 ms a step) without a word. Left out and warned, the trace reads as the intact one; an op
    of the last step that runs on past it is kept (the profiler can stop inside one)."""
    good = _write(tmp_path, _doc(), "good.json")
    doc = _doc()
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    ops[2]["dur"] = 5e8
    late = ops[-1]
    steps = _steps(doc)
    late["dur"] = max(s["ts"] + s["dur"] for s in steps) - late["ts"] + steps[-1]["dur"]    # a step past the end
    bad = _write(tmp_path, doc, "bad.json")
    t = load_trace(bad)
    assert len(t.ts) == len(load_trace(good).ts) - 1
    (w,) = [w for w in t.meta.warnings if w.startswith("ignored")]
    assert w.startswith("ignored 1 event(s)") and "duration 5e+08 us" in w
    m, m_good = (diagnose_path(str(p))["traces"][0]["metrics"] for p in (bad, good))
    assert m["steps.count"] == m_good["steps.count"]
    assert m["breakdown.data_loading"] == pytest.approx(m_good["breakdown.data_loading"], abs=0.05)


def test_a_long_recording_keeps_every_event():
    """The bound is far from any real trace: events spread evenly over 5 days, or a bulk of
    one second with a last event 20 hours later, are all kept; a start in ns among starts in us
    is not."""
    from perfdoctor.trace.assemble import _far
    spread = np.linspace(1.7e15, 1.7e15 + 5 * 86400e6, 1000)
    tail = np.append(np.linspace(1.7e15, 1.7e15 + 1e6, 999), 1.7e15 + 20 * 3600e6)
    for ts in (spread, tail):
        assert not _far(ts, np.ones(len(ts), bool), np.isfinite(ts)).any()
    for odd in (1e308, 1.7e18, -1e300):
        assert _far(np.append(tail, odd), np.ones(1001, bool), np.ones(1001, bool))[-1]


@pytest.mark.parametrize("far", [1e300, -1e300, -1e6])
def test_a_third_of_the_starts_far_outside_are_left_out_too(tmp_path, far):
    """Every third event at a start of 1e300 us (or -1e6 among 1.7e15): over a quarter of the
    starts, so the quartiles' spread was itself 1e300 and nothing was far; a step of 1e300 us
    overflowed the statistics (numpy's RuntimeWarning on stderr), the median step read 0.0 ms and
    the report warned of clocks 1e300 ms apart. Those starts are left out with the warning, and
    the steps left read as the intact trace's."""
    good = _write(tmp_path, _doc(), "good.json")
    doc = _doc()
    for i, e in enumerate(doc["traceEvents"]):
        if i % 3 == 0 and "ts" in e:
            e["ts"] = far
    bad = _write(tmp_path, doc, "bad.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # no overflow in the statistics
        t = diagnose_path(str(bad))["traces"][0]
    assert any(w.startswith("ignored") and f"start {far:g} us" in w for w in t["warnings"]), t["warnings"]
    m_good = diagnose_path(str(good))["traces"][0]["metrics"]
    assert 0 < t["metrics"]["steps.count"] < m_good["steps.count"]
    assert t["metrics"]["steps.time_median_ms"] == pytest.approx(m_good["steps.time_median_ms"], rel=0.01)


def test_an_infinite_start_on_a_memory_event_does_not_break_the_html(tmp_path):
    """[memory] instants starting at Infinity reached the memory chart as null times: the HTML
    report was an internal error (exit 70). They are left out, with the warning."""
    doc = _doc(memory=True)
    mem = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    assert len(mem) > 4
    mem[1]["ts"], mem[2]["ts"] = float("inf"), float("-inf")
    p = _write(tmp_path, doc)
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", "--format", "html", str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "device memory over time" in r.stdout
    rep = diagnose_path(str(p))["traces"][0]
    assert None not in rep["memory_timeline"]["t_ms"]
    assert any(w.startswith("ignored 2 event(s)") for w in rep["warnings"]), rep["warnings"]


def test_a_step_number_used_twice_at_different_times_is_noted(tmp_path):
    """Six ProfilerStep spans all named #5 (two profilers, a step count restarted): one step is
    analysed and a note says the other five were left out; copies of a span on another thread
    (overlapping it) are no other step and get no note."""
    doc = _doc()
    for e in _steps(doc):
        e["name"] = "ProfilerStep#5"
    rep = diagnose_path(str(_write(tmp_path, doc, "same.json")))
    assert rep["traces"][0]["metrics"]["steps.count"] == 1
    assert any(n.startswith("left out 5 ProfilerStep span(s) that repeat another step's number")
               for n in rep["traces"][0]["notes"]), rep["traces"][0]["notes"]
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", "--details", str(tmp_path / "same.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "note: left out 5 ProfilerStep span(s)" in " ".join(r.stdout.split())
    doc = _doc()
    doc["traceEvents"] += [dict(e, tid=e["tid"] + 1, ts=e["ts"] + 1, dur=e["dur"] - 2) for e in _steps(doc)]
    rep = diagnose_path(str(_write(tmp_path, doc, "copies.json")))
    assert rep["traces"][0]["metrics"]["steps.count"] == 6
    assert not any("ProfilerStep span(s)" in n for n in rep["traces"][0]["notes"])


def test_a_step_number_of_thousands_of_digits_is_no_step(tmp_path):
    """ProfilerStep#<4,400 digits> among ordinary steps made int() raise (Python's 4,300-digit
    limit): exit 70. A step number has 1-18 digits (an int64); the odd span is no step and the
    others are analysed; a trace of only such names falls back to another step source."""
    doc = _doc()
    _steps(doc)[1]["name"] = "ProfilerStep#" + "9" * 4400
    rep = diagnose_path(str(_write(tmp_path, doc, "one.json")))["traces"][0]
    assert rep["metrics"]["steps.count"] == 5 and rep["metrics"]["steps.source"] == "ProfilerStep"
    doc = _doc()
    for e in _steps(doc):
        e["name"] = "ProfilerStep#" + "9" * 5000
    r = subprocess.run([sys.executable, "-m", "perfdoctor", "report", str(_write(tmp_path, doc, "all.json"))],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "from DataLoader iterations" in r.stdout, r.stderr


def test_header_fields_of_another_type_or_with_a_lone_surrogate(tmp_path):
    """One odd header field cost the whole header (device unknown, no rank): a lone surrogate
    escape in the device name now reads as U+FFFD, and deviceProperties as an object is left out
    on its own, with a warning naming it, while distributedInfo is kept."""
    doc = _doc()
    doc["deviceProperties"][0]["name"] = "GPU\ud800"
    t = load_trace(_write(tmp_path, doc, "surrogate.json"))
    assert t.meta.device_properties[0]["name"] == "GPU\ufffd"
    assert any("lone UTF-16 surrogate" in w for w in t.meta.warnings)
    doc = _doc()
    doc["deviceProperties"] = {"name": "GPU"}
    doc["distributedInfo"] = {"rank": 3, "world_size": 4, "backend": "nccl"}
    t = load_trace(_write(tmp_path, doc, "odd.json"))
    assert t.meta.device_properties == [] and t.meta.distributed_info["rank"] == 3
    assert "the trace's deviceProperties of an unexpected type: left out" in t.meta.warnings


def test_device_clock_behind_the_host_is_warned_about(tmp_path):
    """Device work that starts before the call that launched it began: clocks out of sync (or
    rewritten timestamps). None of 23 real traces has it; a device clock 5 ms behind puts every
    kernel there, and the report says the host/device shares may be wrong. A few kernels early by
    a glitch are not worth a warning."""
    from perfdoctor.analyze.launches import CLOCK_SHARE
    doc = _doc()
    device = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(device) >= 20
    good = diagnose_path(str(_write(tmp_path, doc, "good.json")))
    assert not [w for w in good["traces"][0]["warnings"] if "clocks disagree" in w]
    few = int(CLOCK_SHARE * len(device)) - 1        # under the share, each 5 ms early
    for e in device[:few]:
        e["ts"] -= 5000
    glitch = diagnose_path(str(_write(tmp_path, doc, "few.json")))
    assert not [w for w in glitch["traces"][0]["warnings"] if "clocks disagree" in w]
    for e in device[few:]:
        e["ts"] -= 5000
    assert glitch["traces"][0]["metrics"]["trace.clock_early_share"] == pytest.approx(few / len(device), abs=0.01)
    assert good["traces"][0]["metrics"]["trace.clock_early_share"] == 0.0
    assert not any("clocks disagree" in n for n in glitch["verdict"]["notes"])
    behind = diagnose_path(str(_write(tmp_path, doc, "behind.json")))
    assert behind["traces"][0]["metrics"]["trace.clock_early_share"] == 1.0
    assert behind["verdict"]["confidence"] <= 0.4 < good["verdict"]["confidence"]
    assert any("clocks disagree" in n for n in behind["verdict"]["notes"])
    (w,) = [w for w in behind["traces"][0]["warnings"] if "clocks disagree" in w]
    assert w.startswith("device work starts before the call that launched it in 100% of the launches")
    assert "by up to 5.0 ms" in w
