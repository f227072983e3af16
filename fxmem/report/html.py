"""One self-contained HTML page from a :class:`~fxmem.report.summary.Summary`: inline CSS,
plots as base64 SVG images, formulas as text and MathML; nothing is fetched when it opens.

>>> import torch, fxmem
>>> from fxmem.report.summary import summarize
>>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(),
...                   optimizer=torch.optim.SGD, device="cpu")
>>> page = render_html(summarize(r, B=16, budget_bytes=2**20))
>>> page.startswith("<!DOCTYPE html>"), page.count('src="data:image/svg+xml;base64,')
(True, 3)
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

import sympy
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup
from sympy.printing.mathml import mathml

from . import plots
from .headline import largest_b, not_fitting, way_rows
from .text import (
    at_dims,
    exact_in_setup,
    exact_when,
    fmt_bytes,
    frontier_plan,
    read_as,
    readable_in,
    weight_casts_line,
)


@dataclass(frozen=True)
class Plot:
    """A figure embedded as ``<img src="data:image/svg+xml;base64,...">``."""

    key: str
    alt: str
    src: str


def fmt_flops(n: int) -> str:
    """``9535490`` -> ``'9.54 MFLOP'``."""
    unit, k = plots.unit_for(n, plots.FLOP_UNITS)
    return f"{n / k:.2f} {unit}" if k > 1 else f"{n:,} {unit}"


def fmt_change(n: int) -> str:
    """``-1536`` -> ``'−1.50 KiB'``, ``0`` -> ``'±0'``."""
    if n == 0:
        return "\u00b10"
    return ("+" if n > 0 else "\u2212") + fmt_bytes(abs(n))


def share(n: int, total: int) -> str:
    """``n`` as a percentage of ``total``: ``'12.5%'``."""
    return f"{100 * n / total:.1f}%" if total else ""


def _plot(key: str, fig, alt: str) -> Plot:
    data = base64.b64encode(plots.svg(fig).encode("utf-8")).decode("ascii")
    return Plot(key, alt, "data:image/svg+xml;base64," + data)


def _plots(s) -> list[Plot]:
    out = [_plot("peak-vs-batch", plots.peak_vs_batch(s),
                 f"Peak memory against batch size; {fmt_bytes(s.peak_bytes)} at B = {s.B}"),
           _plot("timeline", plots.timeline(s),
                 f"Live memory after every op at B = {s.B}, coloured by phase"),
           _plot("categories", plots.categories(s),
                 f"Memory at the peak by category and seed-style parts at B = {s.B}")]
    fig = plots.frontier(s)
    if fig is not None:
        out.append(_plot("frontier", fig, "Checkpoint frontier: peak memory against "
                                          "recompute FLOPs"))
    return out


def _math(expr) -> Markup:
    return Markup('<math display="block">{}</math>').format(
        Markup(mathml(expr, printer="presentation")))


LONG_BRANCH = 160  # characters: a longer Max branch (a Piecewise) is too wide to typeset


def _formula(text: str) -> tuple[str, Markup | None]:
    """The peak formula laid out one ``Max`` branch a line, as text and as MathML (``None``
    when sympy cannot parse the text, or a branch is longer than :data:`LONG_BRANCH`). A
    ``Max`` is ``max`` beside a bracketed column of its branches, one ``<math>`` each, so a
    long formula grows down the page, not across it."""
    try:
        expr = sympy.sympify(text)
    except (sympy.SympifyError, SyntaxError, TypeError):
        return text, None
    branches = expr.args if isinstance(expr, sympy.Max) else (expr,)
    if isinstance(expr, sympy.Max):
        text = "max(\n" + ",\n".join(f"    {a}" for a in branches) + "\n)"
    if any(len(str(a)) > LONG_BRANCH for a in branches):
        return text, None  # MathML does not wrap: such a line is shown as wrapping text only
    if not isinstance(expr, sympy.Max):
        return text, _math(expr)
    last = len(expr.args) - 1
    rows = Markup("").join(Markup('<div class="branch">{}{}</div>').format(
        _math(a), Markup('<span class="comma">,</span>') if i < last else "")
        for i, a in enumerate(expr.args))
    math = Markup('<div class="max"><span class="max-op">max</span>'
                  '<div class="branches">{}</div></div>').format(rows)
    return text, math


# a setup value that is a formula in B (e.g. the CLI's "peak in B, L"): arithmetic only, so
# nothing but a formula is ever handed to sympy
_FORMULA = re.compile(r"[\w\s*+\-/().,]*\bB\b[\w\s*+\-/().,]*")
LONG_VALUE = 40  # characters: a longer setup value gets a full-width block of its own
WIDE_VALUE = 16  # characters: a longer one takes two columns of the setup grid


def _setup(setup: dict) -> tuple[list, list]:
    """The setup split for layout: short values for the grid, ``dict(key, text, wide)``, and
    long ones as full-width blocks, ``dict(key, text, math, formula)`` (a formula one ``Max``
    branch a line).

    >>> short, long = _setup({"model": "m", "peak in B, L": "Max(8*B*L + 1, 2*B + 3)"})
    >>> short, [(d["key"], d["text"].splitlines()) for d in long]
    ([{'key': 'model', 'text': 'm', 'wide': False}], [('peak in B, L', ['max(', '    2*B + 3,', '    8*B*L + 1', ')'])])
    """
    short, long = [], []
    for key, value in setup.items():
        text = str(value)
        if isinstance(value, str) and _FORMULA.fullmatch(text) and any(
                c in text for c in "*+"):
            text, math = _formula(text)
            long.append(dict(key=key, text=text, math=math, formula=True))
        elif len(text) > LONG_VALUE:
            long.append(dict(key=key, text=text, math=None, formula=False))
        else:
            short.append(dict(key=key, text=text, wide=len(text) > WIDE_VALUE))
    return short, long


def _budget_line(s) -> Markup:
    if s.budget_bytes is None:
        return Markup("No memory budget given.")
    h = largest_b(s)
    if h.fails:
        return Markup("<strong>{}</strong>.").format(h.lead)
    return Markup("{}<strong>{}</strong>{}.").format(h.lead, h.number, h.tail)


def _context(s) -> dict:
    text, math = _formula(s.peak_formula)
    setup_short, setup_long = _setup({k: v for k, v in s.setup.items()
                                      if not exact_in_setup(s, v)})
    readable, at_exact, in_dims = None, "", None
    at, at_when = read_as(s.at_readable, s.at_readable_when, s.peak_formula,
                          s.at_readable_error)
    if at_when:  # the formula at the named dims read too; its exact one with the other
        at_exact, (text, math) = text, _formula(at)
    if s.leads_readable:  # lead with the readable formula; the exact one behind a click
        exact_text, exact_math = _formula(s.peak_exact)
        readable = dict(text=s.peak_readable, math=_formula(s.peak_readable)[1],
                        when=exact_when(s), at=at_dims(s), dims=readable_in(s),
                        exact_text=exact_text, exact_math=exact_math, hides=s.hides_exact)
    elif at_dims(s):  # past reading in B and the dims: the formula at their values leads
        exact_text, exact_math = _formula(s.peak_exact)
        in_dims = dict(at=at_dims(s), dims=", ".join(["B", *s.at_values]), text=exact_text,
                       math=exact_math)
    from .text import rank_columns

    return dict(s=s, plots=_plots(s), rank_parts=rank_columns(s.ranks),
                budget_ranks=s.budget_bytes is not None, formula_text=text, formula_mathml=math,
                readable=readable,
                setup_short=setup_short, setup_long=setup_long, budget_line=_budget_line(s),
                budget_others=largest_b(s).others if s.budget_bytes is not None else "",
                parts_total=sum(s.parts_bytes.values()), no_fit=not_fitting(s),
                ways=way_rows(s), at_when=at_when, at_exact=at_exact, in_dims=in_dims,
                rank_formulas=[read_as(r.get("peak_readable", ""), r.get("readable_when", ()),
                                       r["peak_formula"]) for r in s.ranks],
                weight_casts=weight_casts_line(s.weight_casts) if s.weight_casts else "",
                frontier=[dict(n=i + 1, peak=p, flops=f, used=set(plan) == set(s.plan),
                               plan=plan if c is None else (frontier_plan(plan, c),))
                          for i, (p, f, plan, c) in enumerate(plots.frontier_points(s))])


def _env() -> Environment:
    env = Environment(loader=PackageLoader("fxmem.report", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      keep_trailing_newline=True)
    env.filters.update(bytes=fmt_bytes, flops=fmt_flops, change=fmt_change, share=share,
                       num="{:,}".format, op=plots.short_op,
                       module=lambda m: m or "(root)")
    return env


def render_html(s) -> str:
    """The report page of summary ``s`` as one HTML document (a string); it references no
    file or URL, so it can be mailed or opened offline."""
    return _env().get_template("report.html.j2").render(**_context(s))
