"""Terminal rendering of a :class:`fxmem.report.summary.Summary` with rich (``fxmem analyze``'s
default ``--format table``). Returns renderables; the caller's console prints them.

>>> import torch, fxmem
>>> from rich.console import Console
>>> from fxmem.report.summary import summarize
>>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), train=False, device="cpu")
>>> console = Console(record=True, width=100, file=open("/dev/null", "w"))
>>> console.print(render_terminal(summarize(r, B=3)))
>>> "Peak memory" in console.export_text()
True
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .headline import largest_b, not_fitting, way_rows
from .text import (
    at_dims,
    compact_plan,
    exact_in_setup,
    exact_when,
    fmt_bytes,
    frontier_plan,
    read_as,
    readable_in,
    weight_casts_line,
)

FRONTIER_ROWS = 16  # the most frontier points a terminal table shows


def _table(title: str, *columns: str, right=()) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold")
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", overflow="fold")
    return t


def _ranks(s, exact: bool = False) -> list:
    """The per-rank table of a data-parallel summary (the ranks with the least room bold,
    ``*``), numbers unbroken, and each group's peak formula under it: the readable one with
    where it is exact (``exact``: the exact expression)."""
    out: list = [_RankTable(s)]
    for r in s.ranks:
        formula, when = (r["peak_formula"], "") if exact else \
            read_as(r.get("peak_readable", ""), r.get("readable_when", ()), r["peak_formula"])
        out.append(Text.assemble(f"ranks {r['label']}: peak bytes = ", (formula, "cyan"),
                                 f"   {when}" if when else ""))
    return out


class _RankTable:
    """The per-rank table, laid out for the width it is printed at (a terminal, or 80
    columns in a pipe): one row per group of ranks when that fits, else one column per
    group (the quantities as rows), as many groups side by side as fit. Numbers are never
    broken nor cut off."""

    def __init__(self, s):
        from .text import rank_columns

        self.s, parts = s, rank_columns(s.ranks)
        budget = s.budget_bytes is not None
        self.heads = ("ranks", f"peak at B = {s.B}", *(["largest B"] if budget else []),
                      *(p.replace("_", " ") for p in parts))
        self.rows = [[r["label"] + (" *" if r["tightest"] else ""), fmt_bytes(r["peak_bytes"]),
                      *([("none fits" if r["max_batch_size"] is None else
                          f"{r['max_batch_size']:,}")] if budget else []),
                      *(fmt_bytes(r["parts_bytes"].get(p, 0)) for p in parts)]
                     for r in s.ranks]
        self.title = (f"Per rank ({s.setup.get('parallel', 'data parallel')}): B is each "
                      "rank's micro-batch; the ranks with the least room are marked *")

    def _table(self, heads, rows, bold) -> Table:
        from rich import box

        t = Table(title=self.title, title_justify="left", title_style="bold",
                  box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False)
        for i, c in enumerate(heads):  # headings wrap at a space; numbers stay whole
            t.add_column(c, justify="right" if i else "left", overflow="fold",
                         min_width=max(len(row[i]) for row in rows))
        for row, b in zip(rows, bold):
            t.add_row(*row, style="bold" if b else None)
        return t

    @staticmethod
    def _width(heads, rows) -> int:
        """Columns the table needs: each column its widest cell or heading word, and a
        space."""
        return sum(max(*(len(r[i]) for r in rows), *map(len, h.split())) + 1
                   for i, h in enumerate(heads))

    def __rich_console__(self, console, options):
        if self._width(self.heads, self.rows) <= options.max_width:
            yield self._table(self.heads, self.rows, [r["tightest"] for r in self.s.ranks])
            return
        # transposed: a column per group of ranks, as many per table as fit the width
        labels = [row[0] for row in self.rows]
        first = max(len(h) for h in self.heads[1:])
        per, used = 0, first + 1
        for row in self.rows:
            used += max(map(len, row)) + 1
            if used > options.max_width and per:
                break
            per += 1
        for i in range(0, len(labels), per):
            cols = self.rows[i:i + per]
            rows = [[h, *(c[j] for c in cols)] for j, h in enumerate(self.heads) if j]
            yield self._table(("", *labels[i:i + per]), rows, [False] * len(rows))


def render_terminal(s, exact: bool = False) -> Group:
    """Setup, formula and regimes, numbers at B, budget, parts, live at the peak, plan and
    frontier, what-ifs: rich tables in one group. The formula is the readable one when the
    summary has it (``s.peak_readable``); ``exact``: the exact expression too."""
    items = []
    setup = _table(s.title, "setup", "")
    for k, v in s.setup.items():
        if exact or not exact_in_setup(s, v):
            setup.add_row(k, str(v))
    items.append(setup)
    if s.ranks:
        items += _ranks(s, exact)
    items += _formula(s, exact)
    if s.lifted:  # how the formula was obtained, beside it
        items.append(Text(s.lifted, style="yellow"))
    if s.unmodelled:  # the caveats themselves sit under the numbers they qualify
        items.append(Text(f"not in this formula: {len(s.unmodelled)} allocation(s) fxmem "
                          "cannot size (under the numbers below)", style="yellow"))
    reg = _table("Where the peak is", "from B", "after op", "phase", "module", "bytes",
                 right=("from B",))
    for r in s.regimes:
        reg.add_row(str(r.B_from), r.op, r.phase, r.module or "(root)", r.formula)
    items.append(reg)
    at = Text.assemble((f"At B = {s.B}: ", "bold"), (fmt_bytes(s.peak_bytes), "bold green"),
                       f" ({s.peak_bytes:,} bytes) after {s.peak_op} in "
                       f"{s.peak_module or '(root)'} ({s.peak_phase})")
    items.append(at)
    if s.cuda is not None:
        c = s.cuda
        items.append(Text(f"On the GPU (compute capability {c['compute_capability']}): "
                          f"max_memory_allocated {fmt_bytes(c['max_allocated'])}, "
                          f"max_memory_reserved {fmt_bytes(c['max_reserved'])} (library "
                          f"workspaces included; the CUDA context comes on top)"))
    items += _ways(s)
    if s.budget_bytes is not None:
        h = largest_b(s)
        items.append(Text(h.lead, style="bold red") if h.fails else
                     Text.assemble((h.lead, "bold"), (h.number, "bold green"), h.tail))
        if h.others:
            items.append(Text(h.others))
    for c in s.caveats:  # beside the numbers they qualify
        items.append(Text(f"caveat: {c}", style="yellow"))
    parts = _table("Parts", "part", "formula in B", f"at B = {s.B}", right=(f"at B = {s.B}",))
    for k, v in s.parts_bytes.items():
        parts.add_row(k, s.parts_formulas[k], fmt_bytes(v))
    items.append(parts)
    live = _table("Live at the peak", "category", "bytes", "module", "bytes ", right=(
        "bytes", "bytes "))
    cats, mods = list(s.by_category.items()), list(s.by_module.items())
    for i in range(max(len(cats), len(mods))):
        c = cats[i] if i < len(cats) else ("", None)
        m = mods[i] if i < len(mods) else ("", None)
        live.add_row(c[0], fmt_bytes(c[1]) if c[1] is not None else "",
                     m[0], fmt_bytes(m[1]) if m[1] is not None else "")
    items.append(live)
    if s.weight_casts:
        items.append(Text(weight_casts_line(s.weight_casts)))
    if s.plan:
        items.append(Text(f"Checkpoint plan: {compact_plan(s.plan)} "
                          f"({s.recompute_flops:,} recompute FLOPs at B = {s.B})"))
    if s.frontier:
        shown = shown_points(len(s.frontier))
        fr = _table(f"Checkpoint frontier at B = {s.B}" + (
            f" ({len(shown)} of its {len(s.frontier)} points, evenly spaced; --format md, "
            "json or html gives every one)" if len(shown) < len(s.frontier) else ""),
            "peak", "recompute FLOPs", "plan", right=("peak", "recompute FLOPs"))
        for i in shown:
            p, f, pl, c = s.frontier[i]
            fr.add_row(fmt_bytes(p), f"{f:,}", frontier_plan(pl, c))
        items.append(fr)
    if s.whatifs:
        most_by = ("largest B that runs" if s.whatifs[0].get("by") == "device"
                   else "largest batch")
        wi = _table("What-ifs", "method", "B", "peak", "change", most_by, "note",
                    right=("B", "peak", "change", most_by))
        for w in s.whatifs:
            most = "none fits" if w["max_batch_size"] is None else f"{w['max_batch_size']:,}"
            wi.add_row(w["method"], str(w["B"]), fmt_bytes(w["peak_bytes"]),
                       "" if w["method"] == "baseline" else fmt_bytes(w["change_bytes"]),
                       most, w["note"])
        items.append(wi)
    return Group(*items)


def shown_points(n: int, most: int = FRONTIER_ROWS) -> list:
    """The indices of the frontier points the terminal shows: every one up to ``most``,
    else ``most`` evenly spaced, the first and the last among them (a frontier over 80
    blocks has 256 points, a long plan each).

    >>> shown_points(4), shown_points(256, 5)
    ([0, 1, 2, 3], [0, 64, 128, 191, 255])
    """
    if n <= most:
        return list(range(n))
    return sorted({round(k * (n - 1) / (most - 1)) for k in range(most)})


def _formula(s, exact: bool) -> list:
    """The peak formula lines: the readable polynomial and where it is exact, the formula in
    B at the named dims' values, and the exact expression (or the flag that shows it)."""
    valid = f"   valid when {', '.join(s.valid_when) or 'B >= 1'}"
    named = at_dims(s)
    formula, when = (s.peak_formula, "") if exact else \
        read_as(s.at_readable, s.at_readable_when, s.peak_formula,
                s.at_readable_error)
    if not s.leads_readable:  # (in named dims: past reading in them; in B at their values)
        out = [Text.assemble((f"Peak memory (bytes, in B at {named}): " if named else
                              "Peak memory (bytes): ", "bold"), (formula, "cyan"),
                             f"   {when}" if when else valid)]
        return out + ([Text("(--exact-formula shows the exact expression)", style="dim")]
                      if named and not exact else [])
    out = [Text.assemble((f"Peak memory (bytes, in {readable_in(s)}): ", "bold"),
                         (s.peak_readable, "cyan"), f"   {exact_when(s)}")]
    if named:
        out.append(Text.assemble((f"At {named}: ", "bold"), (formula, "cyan"),
                                 f"   {when}" if when else valid))
    if exact and s.peak_exact != s.peak_readable:
        out.append(Text.assemble(("Exact expression: ", "bold"), (s.peak_exact, "cyan"),
                                 "" if named else valid))
    elif s.hides_exact and not exact:
        out.append(Text("(--exact-formula shows the exact expression)", style="dim"))
    return out


def _ways(s) -> list:
    """B does not fit: by how much, and the ways that make it fit, each checked."""
    h = not_fitting(s)
    if h is None:
        return []
    out = [Text.assemble((h.lead, "bold red"), (h.number, "bold red"), (h.tail, "bold red"))]
    if h.others:
        out.append(Text(h.others))
    rows = way_rows(s)
    if rows:
        t = _table("Ways it fits (each checked: it fits there, and not one step beyond)",
                   "way", "needs", "recompute", "one step beyond", right=("needs", "recompute"))
        for way, need, share, beyond, _ in rows:
            t.add_row(way, need, share, beyond)
        out.append(t)
        out += [Text(f"the {w['kind']} way's plan, whole: {whole}", style="dim")
                for w, (*_, whole) in zip(s.fit["ways"], rows) if whole]
    out += [Text(f"searched, none found: {line}", style="yellow") for line in s.fit["none"]]
    return out
