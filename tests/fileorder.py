"""The order the two test workers take the test files in: the longest first.

With `--dist loadfile` each worker takes the next whole file when it is nearly out of work, in
the order of the collection. xdist's own order (by number of tests, --loadscope-reorder) put the
files of a few long live runs last, and one worker ran them alone for minutes at the end. Files
are ordered here by the seconds their tests took outside `quiet` holds, as recorded in
`durations.json` (a quiet test stops both workers, wherever it comes, so only the rest balances):
the longest-processing-time-first rule, whose finish is within a third of the best. A file not
recorded counts DEFAULT seconds. Tests keep their order inside a file.

Refresh the record after a change of the suite's shape (it only decides the order):
    python -m pytest -q --junitxml=/tmp/j.xml && python tests/fileorder.py /tmp/j.xml
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RECORD = Path(__file__).with_name("durations.json")
DEFAULT = 10.0      # seconds for a file the record does not hold: a middling file


def recorded() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(RECORD.read_text())["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def longest_first(items: list, root: Path) -> None:
    """Sort pytest items in place: files by decreasing recorded seconds, tests in file order."""
    seconds = recorded()
    first: dict = {}
    for i, item in enumerate(items):
        first.setdefault(item.path, i)

    def key(item):
        try:
            name = item.path.relative_to(root).as_posix()
        except ValueError:
            name = item.path.name
        return -seconds.get(name, DEFAULT), first[item.path]
    items.sort(key=key)


def record(junit: Path, quiet: set[str]) -> dict[str, float]:
    """Seconds per test file outside quiet tests, from a junit XML of a whole-suite run."""
    import xml.etree.ElementTree as ET
    files: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("classname", "").replace(".", "/") + ".py"
        files.setdefault(name, 0.0)
        if f"{name}::{case.get('name')}" not in quiet:
            files[name] += float(case.get("time") or 0)
    return files


def main(argv: list[str]) -> int:
    import subprocess
    if len(argv) != 1:
        print(__doc__)
        return 2
    root = Path(__file__).resolve().parent.parent
    listed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                             "--collect-only", "-m", "quiet", "tests"], cwd=root, capture_output=True, text=True)
    quiet = {line.strip() for line in listed.stdout.splitlines() if "::" in line}
    files = record(Path(argv[0]), quiet)
    RECORD.write_text(json.dumps({"files": {k: round(v, 1) for k, v in sorted(files.items())}}, indent=1) + "\n")
    print(f"{RECORD}: {len(files)} files, {sum(files.values()):.0f} s outside quiet tests ({len(quiet)} quiet tests)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
