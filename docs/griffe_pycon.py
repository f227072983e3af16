"""A Griffe extension for the API reference (``mkdocs.yml`` loads it): fxmem's docstrings
are reST-flavoured plain text with doctests, and Markdown would render ``>>>`` lines as
nested block quotes and ``[...]`` outputs as links.

- each run of doctest lines (a ``>>>`` line up to the next blank line) becomes a fenced
  ``pycon`` block;
- Sphinx roles (:class:`Report`, :meth:`a <b.c>`) become code spans;
- a paragraph ending in ``::`` (a reST literal block follows) ends in ``:``.

The docstrings themselves stay as they are: they are doctests (``python -m pytest``).
"""

from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(?:([^`<]*?)\s*<[^`>]*>|([^`]*))`")


def _role(m: re.Match) -> str:
    name = (m.group(1) or m.group(2)).lstrip("~")
    return f"`{name}`"


def markdown_docstring(text: str) -> str:
    """The docstring text with doctests fenced and reST roles as code spans."""
    out, in_doctest, in_fence = [], False, False
    for line in text.split("\n"):
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and not in_doctest and line.startswith(">>>"):
            out.append("```pycon")
            in_doctest = True
        elif in_doctest and not line.strip():
            out.append("```")
            in_doctest = False
        if not in_doctest and not in_fence:
            line = _ROLE.sub(_role, line)
            if line.endswith("::") and not line.lstrip().startswith("::"):
                line = line[:-1]
        out.append(line)
    if in_doctest:
        out.append("```")
    return "\n".join(out)


class PyconBlocks(griffe.Extension):
    """Rewrite every docstring with :func:`markdown_docstring` before it is parsed."""

    def on_object(self, *, obj, **kwargs) -> None:  # noqa: ARG002 - Griffe's hook signature
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
