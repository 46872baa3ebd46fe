"""tests/fileorder.py: the workers take the longest files first, each file's tests in order."""

from __future__ import annotations

import json
from types import SimpleNamespace

import fileorder


def test_files_go_longest_first_and_keep_their_tests_order(tmp_path, monkeypatch):
    record = tmp_path / "durations.json"
    record.write_text(json.dumps({"files": {"tests/test_b.py": 40.0, "tests/test_c.py": 3.0}}))
    monkeypatch.setattr(fileorder, "RECORD", record)
    root = tmp_path
    items = [SimpleNamespace(path=root / "tests" / f, name=f"{f}:{i}")
             for f, i in [("test_a.py", 0), ("test_a.py", 1), ("test_b.py", 0), ("test_c.py", 0),
                          ("test_b.py", 1), ("test_d.py", 0)]]
    fileorder.longest_first(items, root)
    # b (40 s), then a and d (not recorded: DEFAULT, 10 s, in their collection order), then c (3 s)
    assert [x.name for x in items] == ["test_b.py:0", "test_b.py:1", "test_a.py:0", "test_a.py:1",
                                       "test_d.py:0", "test_c.py:0"]


def test_a_missing_or_damaged_record_keeps_the_collection_order(tmp_path, monkeypatch):
    items = [SimpleNamespace(path=tmp_path / f) for f in ("b.py", "a.py", "b.py")]
    for text in (None, "{", '{"files": [1, 2]}'):
        record = tmp_path / "durations.json"
        if text is None:
            record.unlink(missing_ok=True)
        else:
            record.write_text(text)
        monkeypatch.setattr(fileorder, "RECORD", record)
        got = list(items)
        fileorder.longest_first(got, tmp_path)
        assert [x.path.name for x in got] == ["b.py", "b.py", "a.py"]


def test_the_record_counts_each_files_time_outside_quiet_tests(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite>'
                     '<testcase classname="tests.test_a" name="test_x" time="2.5"/>'
                     '<testcase classname="tests.test_a" name="test_q" time="30"/>'
                     '<testcase classname="tests.test_b" name="test_q2" time="7"/>'
                     '</testsuite></testsuites>')
    files = fileorder.record(junit, {"tests/test_a.py::test_q", "tests/test_b.py::test_q2"})
    assert files == {"tests/test_a.py": 2.5, "tests/test_b.py": 0.0}

