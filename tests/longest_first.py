"""The order the test files run in: the longest first (``tests/file_seconds.txt``, written by
this script from CI's timings).

Under pytest-xdist's ``--dist loadfile`` (the README's test commands) each of the two workers
takes the next file as it finishes one. In pytest's order (by name; xdist's own reordering
puts the files with the most tests first) a long file taken last ran on alone: in CI's
precheck at 08f5413, 2.14.1's tier took 396 s where its 644 s of tests fit in two workers'
322 s. Taken longest first, the short files fill the end (``tests/conftest.py`` sorts the
files so and turns xdist's reordering off). A file's seconds are the most any of the runs
given took (each CI tier runs other files); a file not listed runs after the listed ones.
Refresh the list from a precheck's timings (``FXMEM_CI_TIMINGS``, .ci/run)::

    python tests/longest_first.py /tmp/cirun/timings/*.xml
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from tiers import ROOT, cases

LIST = Path(__file__).resolve().parent / "file_seconds.txt"
HEADER = """\
# Seconds each test file took in the slowest of CI's runs that timed it, the longest first:
# the order tests/conftest.py runs the files in. Written by `python tests/longest_first.py
# JUNIT.xml...`. Do not edit by hand.
"""


def file_seconds(junits: list[Path]) -> dict[str, float]:
    """``{file: seconds}``, the most any run in ``junits`` took over the file's tests.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "a.xml").write_text('<testsuite><testcase classname="tests.test_cli" '
    ...     'name="a" time="2"/><testcase classname="tests.test_fit" name="b" time="1"/>'
    ...     '</testsuite>')
    >>> _ = (d / "b.xml").write_text('<testsuite><testcase classname="tests.test_fit" '
    ...     'name="b" time="5"/></testsuite>')
    >>> file_seconds([d / "a.xml", d / "b.xml"])
    {'tests/test_fit.py': 5.0, 'tests/test_cli.py': 2.0}
    """
    most: dict[str, float] = {}
    for junit in junits:
        took: dict[str, float] = collections.defaultdict(float)
        for nid, seconds, _ in cases(junit):
            took[nid.split("::")[0]] += seconds
        for path, s in took.items():
            most[path] = max(most.get(path, 0.0), s)
    return dict(sorted(most.items(), key=lambda kv: (-kv[1], kv[0])))


def read(path: Path = LIST) -> dict[str, float]:
    """The list as written: ``{file: seconds}`` (empty when there is none)."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            s, name = line.split(maxsplit=1)
            out[name] = float(s)
    return out


def order(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """Indices of ``nodeids`` with their files the longest first, each file's tests in
    their order, the files not in ``seconds`` after, in theirs.

    >>> order(["a.py::x", "a.py::y", "b.py::z", "c.py::w"], {"b.py": 9.0, "a.py": 1.0})
    [2, 0, 1, 3]
    """
    return sorted(range(len(nodeids)),
                  key=lambda i: -seconds.get(nodeids[i].split("::")[0], -1.0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", type=Path, nargs="+", help="JUnit XML of CI's tiers")
    args = ap.parse_args(argv)
    seconds = file_seconds(args.junit)
    LIST.write_text(HEADER + "".join(f"{s:.1f} {f}\n" for f, s in seconds.items()),
                    encoding="utf-8")
    print(f"{len(seconds)} files, {sum(seconds.values()):.0f} s -> {LIST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
