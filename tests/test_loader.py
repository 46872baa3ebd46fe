"""Reading every supported trace shape, and refusing bad input cleanly."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import tracegen as tg
from perfdoctor.errors import TraceFormatError
from perfdoctor.trace import reader, surrogates
from perfdoctor.trace.loader import find_trace_files, load_trace

STEPS = [tg.StepSpec(data_wait_us=500, kernels=8, syncs=1)] * 3


def _names(t):
    return [t.names[c] for c in t.name]


@pytest.mark.parametrize("kw", [
    dict(name="a.json"), dict(name="a.json.gz"), dict(name="w.pt.trace.json.gz"),
    dict(name="a.json", indent=False), dict(name="a.json", bare_list=True),
    dict(name="a.json.gz", bare_list=True, indent=False),
])
def test_every_container_gives_the_same_events(tmp_path, kw):
    spec = tg.TraceSpec(steps=STEPS, memory_events=True)
    name = kw.pop("name")
    truth = tg.write(spec, tmp_path / name, **kw)
    t = load_trace(tmp_path / name)
    obj, _ = tg.build(spec)
    events = obj["traceEvents"]
    non_flow = [e for e in events if e.get("ph") not in ("s", "f", "t")]
    assert len(t) == len(non_flow) == truth.num_events - (len(events) - len(non_flow))
    assert t.meta.n_flow_events == len(events) - len(non_flow)
    assert _names(t) == [e.get("name", "") for e in non_flow]
    assert np.allclose(t.ts, [e["ts"] for e in non_flow])
    if not kw.get("bare_list"):
        assert t.meta.device_properties[0]["computeMajor"] == 7
    assert not t.meta.truncated and t.meta.warnings == []


def test_small_chunks_cut_only_between_events(tmp_path, monkeypatch):
    """Force many cuts (including attempts inside nested args) and compare with one decode."""
    spec = tg.TraceSpec(steps=STEPS * 4, memory_events=True)
    tg.write(spec, tmp_path / "a.json")
    whole = load_trace(tmp_path / "a.json")
    monkeypatch.setattr(reader, "CHUNK_BYTES", 700)
    monkeypatch.setattr(reader, "READ_BYTES", 512)
    cut = load_trace(tmp_path / "a.json")
    assert _names(cut) == _names(whole)
    for k in whole.args:
        assert np.array_equal(cut.args[k], whole.args[k], equal_nan=True)


def test_nested_list_of_objects_in_args_survives_cutting(tmp_path, monkeypatch):
    ev = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i * 10, "dur": 5,
           "args": {"nested": [{"a": 1}, {"b": 2}] * 20}} for i in range(200)]
    (tmp_path / "n.json").write_text(json.dumps({"traceEvents": ev}))
    monkeypatch.setattr(reader, "CHUNK_BYTES", 300)
    monkeypatch.setattr(reader, "READ_BYTES", 256)
    t = load_trace(tmp_path / "n.json")
    assert _names(t) == [e["name"] for e in ev]


def _load_200(path, monkeypatch, chunked: bool):
    """The trace at `path` (200 X events), read whole or in small chunks: (trace, names), all kept."""
    if chunked:
        monkeypatch.setattr(reader, "CHUNK_BYTES", 700)
        monkeypatch.setattr(reader, "READ_BYTES", 512)
    t = load_trace(path)
    names = _names(t)
    assert len(names) == 200 and not t.meta.truncated
    return t, names


@pytest.mark.parametrize("chunked", [False, True])
def test_lone_surrogate_escapes_read_as_replacement_characters(tmp_path, monkeypatch, chunked):
    """Python's json writes "\\ud800" for a str holding an undecodable byte: valid JSON that msgspec
    calls truncated. Every event is kept, the name reads U+FFFD, and one warning says so."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i * 10, "dur": 5}
          for i in range(200)]
    ev[3]["name"] = "op3\udc80x"                  # a lone low surrogate (os.fsdecode of byte 0x80)
    ev[150]["name"] = "op150\ud800"               # a lone high one
    ev[7]["name"] = "op7\U0001F600"                # a real pair stays as it is
    ev[9]["name"] = "C:\\udc80dir"                  # a backslash, then text: no escape at all
    (tmp_path / "s.json").write_text(json.dumps({"traceEvents": ev}))
    t, names = _load_200(tmp_path / "s.json", monkeypatch, chunked)
    assert names[3] == "op3\ufffdx" and names[150] == "op150\ufffd" and names[7] == "op7\U0001F600"
    assert names[9] == "C:\\udc80dir"
    assert [w for w in t.meta.warnings if "surrogate" in w] == [surrogates.SURROGATE_WARNING]


@pytest.mark.parametrize("chunked", [False, True])
def test_bytes_that_are_not_utf8_read_as_replacement_characters(tmp_path, monkeypatch, chunked):
    """A name holding a raw byte that is not UTF-8 (a Latin-1 writer, one damaged byte) made
    msgspec refuse its whole chunk: a trace of one such name had "no timed events". Every event
    is kept, the bad bytes read U+FFFD (the header's too), and one warning says so."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i * 10, "dur": 5}
          for i in range(200)]
    doc = {"deviceProperties": [{"id": 0, "name": "GPU-@"}], "traceEvents": ev}
    raw = json.dumps(doc).encode()
    raw = raw.replace(b'"op3"', b'"op3\xff"').replace(b'"op150"', b'"op150\xe9x"').replace(b"GPU-@", b"GPU-\xc3")
    (tmp_path / "u.json").write_bytes(raw)
    t, names = _load_200(tmp_path / "u.json", monkeypatch, chunked)
    assert names[3] == "op3\ufffd" and names[150] == "op150\ufffdx" and names[4] == "op4"
    assert t.meta.device_properties == [{"id": 0, "name": "GPU-\ufffd"}]
    assert [w for w in t.meta.warnings if "UTF-8" in w] == [surrogates.NOT_UTF8_WARNING]


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("token", ["NaN", "-Infinity", "Infinity", "nan", "-inf", "1e999", "9" * 401])
def test_odd_number_tokens_lose_one_event_not_the_rest(tmp_path, monkeypatch, chunked, token):
    """Python's json writes NaN/Infinity, C++ writers nan/inf, and damage makes numbers beyond a
    float's range: msgspec refuses all of them. Only the event holding one in its duration is left
    out (with a warning); one in its args leaves the arg absent; every other event is read."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": i * 10, "dur": 5,
           "args": {"External id": i}} for i in range(200)]
    text = json.dumps({"traceEvents": ev})
    text = text.replace('"dur": 5, "args": {"External id": 150}', f'"dur": {token}, "args": {{"External id": 150}}')
    text = text.replace('"External id": 20}', f'"External id": {token}}}')
    (tmp_path / "odd.json").write_text(text)
    if chunked:
        monkeypatch.setattr(reader, "CHUNK_BYTES", 700)
        monkeypatch.setattr(reader, "READ_BYTES", 512)
    t = load_trace(tmp_path / "odd.json")
    assert _names(t) == [f"op{i}" for i in range(200) if i != 150]
    assert not t.meta.truncated
    assert sum("ignored 1 event(s)" in w and "'op150'" in w for w in t.meta.warnings) == 1
    ext = t.args["external_id"]
    assert ext[19] == 19 and ext[21] == 21 and not np.isfinite(ext[20])


def test_legacy_2021_format(tmp_path):
    spec = tg.TraceSpec(steps=STEPS, fmt="legacy2021")
    tg.write(spec, tmp_path / "old.json.gz")
    t = load_trace(tmp_path / "old.json.gz")
    assert {"Operator", "Runtime", "Kernel"} <= set(t.cats)
    assert any(isinstance(x, str) for x in t.tids)   # 2021 traces use string thread ids
    assert t.meta.device_properties == []


def test_nanosecond_resolution_keeps_fractions(tmp_path):
    spec = tg.TraceSpec(steps=STEPS, ns_resolution=True)
    tg.write(spec, tmp_path / "ns.json")
    t = load_trace(tmp_path / "ns.json")
    assert t.meta.display_time_unit == "ns"
    assert (t.dur % 1 != 0).any()                      # sub-microsecond durations survive


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_file_uses_parsed_events_and_warns(tmp_path, gz):
    spec = tg.TraceSpec(steps=STEPS * 3)
    name = "cut.json.gz" if gz else "cut.json"
    tg.write(spec, tmp_path / name, truncate_at=0.6)
    t = load_trace(tmp_path / name)
    full, _ = tg.build(spec)
    n_full = sum(e.get("ph") not in ("s", "f") for e in full["traceEvents"])
    assert t.meta.truncated
    assert any("truncated" in w for w in t.meta.warnings)
    assert 0.3 * n_full < len(t) < 0.75 * n_full
    assert _names(t) == [e["name"] for e in full["traceEvents"] if e.get("ph") not in ("s", "f")][: len(t)]


@pytest.mark.parametrize("size", ["small", "large"])
def test_truncated_gzip_stream(tmp_path, size):
    steps = STEPS * (2 if size == "small" else 60)
    tg.write(tg.TraceSpec(steps=steps), tmp_path / "cut.json.gz", truncate_gz_stream=True, truncate_at=0.6)
    t = load_trace(tmp_path / "cut.json.gz")
    assert t.meta.truncated and len(t) > 0


@pytest.mark.parametrize("content,message", [
    (b"", "empty file"),
    (b"   \n", "empty file"),
    (b"hello world", "not a JSON trace"),
    (b"\x00\x01\x02binary", "not a JSON trace"),
    # a clone without git-lfs holds the pointer (a public repo's kineto_trace.json of 564 MB)
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 564000000\n", "a Git LFS pointer.*git lfs pull"),
    (b'{"foo": 1, "bar": [1, 2]}', "no 'traceEvents'"),
    (b'{"traceEvents": []}', "no events"),
    (b"[]", "no events"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": "x"', "no events could be parsed"),
])
def test_bad_input_is_one_clear_error(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message):
        load_trace(p)


def test_corrupt_gzip(tmp_path):
    p = tmp_path / "bad.json.gz"
    p.write_bytes(b"\x1f\x8b" + b"\x00garbage" * 10)
    with pytest.raises(TraceFormatError, match="decompress"):
        load_trace(p)


def test_events_of_unexpected_types_use_the_slow_path(tmp_path):
    ev = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "args": {"External id": None}},
          {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1.5, "tid": [1], "ts": 3, "dur": 1},
          "not an event", 7]
    (tmp_path / "odd.json").write_text(json.dumps({"traceEvents": ev}))
    t = load_trace(tmp_path / "odd.json")
    assert _names(t) == ["a", "b"]
    assert any("skipped 2 malformed" in w for w in t.meta.warnings)


def test_directory_discovery(tmp_path):
    with pytest.raises(TraceFormatError, match="no such file"):
        find_trace_files(tmp_path / "missing")
    with pytest.raises(TraceFormatError, match="no trace files"):
        find_trace_files(tmp_path)
    # perfdoctor-runs/: a folder of run directories, not of traces: say so, and give one
    for name in ("a-run", "b-run"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "run.json").write_text("{}")
    with pytest.raises(TraceFormatError, match=r"holds 2 perfdoctor run directories \(a-run, b-run\), not traces: give one"):
        find_trace_files(tmp_path / "runs")
    shutil.rmtree(tmp_path / "runs")
    for r in (1, 0):
        tg.write(tg.TraceSpec(steps=STEPS, rank=r, world_size=2), tmp_path / f"rank{r}.pt.trace.json.gz")
    (tmp_path / "notes.txt").write_text("x")
    files = find_trace_files(tmp_path)
    assert [f.name for f in files] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    assert [load_trace(f).meta.rank for f in files] == [0, 1]


@pytest.mark.parametrize("isal_state", ["changed", "missing"])
def test_gzip_falls_back_when_isal_changes_or_is_missing(tmp_path, monkeypatch, isal_state):
    """isal's raw gzip reader is a private API: a changed signature, or no isal at all, must
    fall back to the standard library, not break .gz input."""
    import sys

    if isal_state == "missing":
        monkeypatch.setitem(sys.modules, "isal", None)        # import isal -> ImportError
    else:
        from isal import isal_zlib

        def changed(*a, **kw):
            raise TypeError("signature changed")
        monkeypatch.setattr(isal_zlib, "_GzipReader", changed)
    tg.write(tg.TraceSpec(steps=STEPS), tmp_path / "a.json.gz")
    tg.write(tg.TraceSpec(steps=STEPS), tmp_path / "a.json")
    assert _names(load_trace(tmp_path / "a.json.gz")) == _names(load_trace(tmp_path / "a.json"))


def test_impossible_events_are_dropped_with_a_warning(tmp_path):
    """A ProfilerStep of 1e30 us (every share read 0% at full confidence) and ops with negative
    durations: the table leaves them out and says so; the other steps and their shares stand."""
    from perfdoctor.diagnose.offline import diagnose_path

    good = tmp_path / "good.json"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=500)] * 4), good)
    doc = json.loads(good.read_text())
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    steps[1]["dur"] = 1e30
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    ops[0]["dur"] = -5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    t = load_trace(bad)
    assert len(t.ts) == len(load_trace(good).ts) - 2
    assert np.isfinite(t.ts[t.ph == ord("X")]).all() and (t.dur[t.ph == ord("X")] >= 0).all()
    (w,) = [w for w in t.meta.warnings if w.startswith("ignored")]
    assert w.startswith("ignored 2 event(s) with a missing, negative, non-finite or impossible start or duration")
    m_good = diagnose_path(str(good))["traces"][0]["metrics"]
    rep = diagnose_path(str(bad))
    m = rep["traces"][0]["metrics"]
    assert m["steps.count"] == 3 and m["breakdown.data_loading"] == pytest.approx(m_good["breakdown.data_loading"], abs=0.02)
    assert any(x.startswith("ignored 2 event(s)") for x in rep["traces"][0]["warnings"])


@pytest.mark.parametrize("untyped", [False, True])
def test_events_without_a_start_or_duration_are_dropped_with_a_warning(tmp_path, untyped):
    """ProfilerSteps without "ts" all read as starting at 0: a nonsense report at full confidence,
    with no warning. X events without a start or a duration (or with null) are left out with the
    warning and the steps come from elsewhere; events of other phases keep 0, as before."""
    from perfdoctor.diagnose.offline import diagnose_path

    good = tmp_path / "good.json"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec(data_wait_us=500)] * 4), good)
    doc = json.loads(good.read_text())
    events = doc["traceEvents"]
    for e in events:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e.pop("ts") if not untyped else e.update(ts=None)
    op = next(e for e in events if e.get("cat") == "cpu_op")
    op.pop("dur")
    meta = {"ph": "M", "name": "no_start_meta", "pid": op["pid"], "tid": op["tid"], "args": {"name": "main"}}
    instant = {"ph": "i", "name": "mark", "pid": op["pid"], "tid": op["tid"], "ts": op["ts"]}
    events += [meta, instant]
    if untyped:
        events.append({"ph": "X", "name": "odd", "pid": [1], "tid": 1, "ts": op["ts"], "dur": 1})  # forces the untyped path
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    t, t_good = load_trace(bad), load_trace(good)
    x = t.ph == ord("X")
    assert int(x.sum()) == int((t_good.ph == ord("X")).sum()) - 5 + untyped
    assert np.isfinite(t.ts).all() and np.isfinite(t.dur).all() and (t.dur >= 0).all()
    names = _names(t)
    assert not any(n.startswith("ProfilerStep#") for n in names)
    assert t.ts[names.index("no_start_meta")] == 0 and t.dur[names.index("mark")] == 0
    (w,) = [w for w in t.meta.warnings if w.startswith("ignored")]
    assert w.startswith("ignored 5 event(s) with a missing") and "start nan us" in w
    tr = diagnose_path(str(bad))["traces"][0]
    assert tr["metrics"]["steps.source"] == "DataLoader iterations" and tr["metrics"]["steps.count"] >= 3
    assert any(x.startswith("ignored 5 event(s)") for x in tr["warnings"])


def test_a_byte_order_mark_is_read_and_a_null_event_list_is_named(tmp_path):
    """A trace saved by an editor with a UTF-8 byte order mark loads as without it; a
    'traceEvents' that is null says so (it read 'no traceEvents array; keys: traceEvents')."""
    plain = tmp_path / "plain.json"
    tg.write(tg.TraceSpec(steps=[tg.StepSpec()] * 3), plain)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    a, b = load_trace(plain), load_trace(bom)
    assert len(a.ts) == len(b.ts) and (a.dur == b.dur).all() and b.meta.device_properties == a.meta.device_properties
    null = tmp_path / "null.json"
    null.write_text('{"schemaVersion": 1, "traceEvents": null}')
    with pytest.raises(TraceFormatError, match=r"^'traceEvents' is null, not an array of events$"):
        load_trace(null)
