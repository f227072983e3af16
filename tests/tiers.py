"""Which tests are slow: ``tests/slow.txt``, written from a measured run of the whole suite.

CI runs the fast tier (``-m "not slow"``) so that it stays under fifteen minutes on a
two-core machine; the slow tier (``-m slow``) holds the same kinds of checks on bigger
models, over more ranks, through the command line in a subprocess. A test is slow when it
took ``--threshold`` seconds or more in the measured run, except that every file keeps its
cheapest test in the fast tier, so that every file is exercised by CI. Refresh the list
after a full run (or after fast-tier runs alone: a listed test they did not time
stays slow)::

    python -m pytest -q -n 2 --dist loadfile --junitxml=/tmp/junit.xml
    python -m pytest -q -n 2 --dist loadfile -m "not slow" --junitxml=/tmp/fast.xml
    python tests/tiers.py /tmp/junit.xml /tmp/fast.xml

``tests/conftest.py`` marks the listed tests ``slow`` as it collects them; a listed test
that no longer exists is reported at the end of a whole-suite run.
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = Path(__file__).resolve().parent / "slow.txt"
HEADER = """\
# Tests marked `slow` (tests/conftest.py): CI runs the others, `-m slow` runs these.
# Written by `python tests/tiers.py JUNIT.xml... --threshold {threshold:g}` from a whole-suite run
# and fast-tier runs ({total:.0f} s of tests; these {n} took {slow:.0f} s). Do not edit by hand.
"""

# Tests CI must run whatever they take: what no other fast test checks (the docs site's
# strict build, which a renamed heading breaks; issue 40).
ALWAYS_FAST = frozenset({"tests/test_docs.py::test_site_builds_strict"})


def node_id(classname: str, name: str, root: Path = ROOT) -> str:
    """pytest's node id of a JUnit test case: ``tests.test_x.TestY`` + ``test_z[p]`` ->
    ``tests/test_x.py::TestY::test_z[p]``; a doctest's ``fxmem.analyze`` +
    ``fxmem.analyze.analyze`` -> ``fxmem/analyze.py::fxmem.analyze.analyze``.

    >>> node_id("tests.test_cli", "test_help_and_version")
    'tests/test_cli.py::test_help_and_version'
    """
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[i:], name])
    raise ValueError(f"no file for the test case {classname}::{name}")


def cases(junit: Path):
    """``(node id, seconds, skipped)`` of each test case of the JUnit XML ``junit``; a
    module skipped or failed as it was collected has its dotted path as its name and no
    class: its node id is its file's, ``path::``.

    >>> import tempfile
    >>> x = Path(tempfile.mkdtemp()) / "run.xml"
    >>> _ = x.write_text('<testsuite><testcase classname="tests.test_cli" name="a" time="2"/>'
    ...                  '<testcase classname="" name="tests.test_fit" time="0">'
    ...                  '<skipped/></testcase></testsuite>')
    >>> list(cases(x))
    [('tests/test_cli.py::a', 2.0, False), ('tests/test_fit.py::', 0.0, True)]
    """
    for case in ET.parse(junit).getroot().iter("testcase"):
        cls, name = case.get("classname"), case.get("name")
        if not cls:
            cls, name = name, ""
        yield node_id(cls, name), float(case.get("time") or 0), case.find("skipped") is not None


def slow_tests(junits: list[Path], threshold: float,
               listed: frozenset = frozenset()) -> tuple[list[str], float, float]:
    """(node ids of the slow tests, seconds of all tests, seconds of the slow ones), a test's
    seconds those of the last of the runs ``junits`` that ran it (a module's fixtures are
    timed with the first test that asks for them: a later run of the fast tier alone finds
    the fixtures of the tests it no longer runs first; a later run of a few files, what a
    change made faster or slower). A test in ``listed`` (the slow tests as they are) that
    no run timed stays slow: a fast-tier run alone moves tests to the slow tier, never out.

    >>> import tempfile
    >>> x = Path(tempfile.mkdtemp()) / "fast.xml"
    >>> _ = x.write_text('<testsuite><testcase classname="tests.test_cli" name="a" time="9"/>'
    ...                  '<testcase classname="tests.test_cli" name="b" time="1"/></testsuite>')
    >>> slow_tests([x], 3.0, frozenset({"tests/test_fit.py::c"}))[0]
    ['tests/test_cli.py::a', 'tests/test_fit.py::c']
    """
    took: dict[str, float] = {}
    for junit in junits:
        for nid, seconds, skipped in cases(junit):
            if not skipped:
                took[nid] = seconds
    per_file = collections.defaultdict(list)
    for nid, s in took.items():
        per_file[nid.split("::")[0]].append((s, nid))
    slow, total, slow_s = [], 0.0, 0.0
    for timed in per_file.values():
        timed.sort()
        total += sum(s for s, _ in timed)
        for s, nid in timed[1:]:  # the cheapest of each file stays fast
            if s >= threshold and nid not in ALWAYS_FAST:
                slow.append(nid)
                slow_s += s
    slow += [nid for nid in listed if nid not in took]
    return sorted(slow), total, slow_s


def _exists(nid: str, root: Path = ROOT) -> bool:
    r"""Whether the test ``nid`` names is still defined: its file, and a ``def`` of its
    function there (a doctest: its file); an id without parameters (no ``[...]``) names no
    test of a function its own ``parametrize`` decorator splits into cases.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); (d / "tests").mkdir()
    >>> _ = (d / "tests" / "test_a.py").write_text(
    ...     "import pytest\n@pytest.mark.parametrize('x', [1])\ndef test_p(x): pass\n"
    ...     "def test_q(): pass\n")
    >>> [_exists(f"tests/test_a.py::{n}", d) for n in ("test_p", "test_p[1]", "test_q",
    ...                                                  "test_r")]
    [False, True, True, False]
    """
    path, _, rest = nid.partition("::")
    if not (root / path).is_file():
        return False
    if not path.startswith("tests/"):
        return True
    name, bracket, _ = rest.split("::")[-1].partition("[")
    return any(bracket or not split for split in _defs(root / path).get(name, ()))


@functools.lru_cache(maxsize=None)
def _defs(path: Path) -> dict:
    """Each function name defined in the file ``path`` -> whether a ``parametrize``
    decorator splits it into cases, for each of its definitions there."""
    out: dict = {}
    for f in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(f.name, []).append(
                any("parametrize" in ast.unparse(d) for d in f.decorator_list))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", type=Path, nargs="+",
                    help="JUnit XML of a whole-suite run (and of fast-tier runs)")
    ap.add_argument("--threshold", type=float, default=3.0, help="seconds (default 3)")
    args = ap.parse_args(argv)
    listed = LIST.read_text(encoding="utf-8").splitlines() if LIST.exists() else []
    listed = frozenset(n.strip() for n in listed if n.strip() and not n.startswith("#")
                       and _exists(n.strip()))
    slow, total, slow_s = slow_tests(args.junit, args.threshold, listed)
    LIST.write_text(HEADER.format(threshold=args.threshold, total=total, n=len(slow),
                                  slow=slow_s) + "".join(f"{n}\n" for n in slow),
                    encoding="utf-8")
    print(f"{len(slow)} slow tests ({slow_s:.0f} s of {total:.0f} s) -> {LIST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
