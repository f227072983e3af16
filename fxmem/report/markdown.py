"""Markdown rendering of a :class:`fxmem.report.summary.Summary` (the gallery in ``docs/``,
``fxmem analyze --format md``).

>>> import torch, fxmem
>>> from fxmem.report.summary import summarize
>>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(),
...                   device="cpu")
>>> print(render_markdown(summarize(r, B=16)).splitlines()[0])
# fxmem report
"""

from __future__ import annotations

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
from .whatif import table as whatif_table


def _module(m: str) -> str:
    """A module path as Markdown code (``<loss>`` would otherwise read as an HTML tag)."""
    return f"`{m or '(root)'}`"


def _rows(header: str, align: str, rows) -> list[str]:
    return [header, align, *rows]


def rank_table(s) -> list[str]:
    """The per-rank table of a data-parallel summary (``s.ranks``) as Markdown lines: the
    ranks (the ones with the least room in bold), peak and largest B, parts at B, formula."""
    from .text import rank_columns

    parts = rank_columns(s.ranks)
    budget = s.budget_bytes is not None
    head = ["ranks", f"peak at B = {s.B}", *(["largest B"] if budget else []), *parts,
            "peak (bytes, formula in B)"]
    out = ["| " + " | ".join(head) + " |",
           "|---|" + "---:|" * (len(head) - 2) + "---|"]
    read = False
    for r in s.ranks:
        most = [("none fits" if r["max_batch_size"] is None else f"{r['max_batch_size']:,}")
                ] if budget else []
        label = f"**{r['label']}** (least room)" if r["tightest"] else r["label"]
        formula, when = read_as(r.get("peak_readable", ""), r.get("readable_when", ()),
                                r["peak_formula"])
        read = read or bool(when)
        out.append("| " + " | ".join([label, fmt_bytes(r["peak_bytes"]), *most,
                                      *(fmt_bytes(r["parts_bytes"].get(p, 0)) for p in parts),
                                      f"`{formula}`" + (f", {when}" if when else "")]) + " |")
    if read:  # the exact expressions a click away
        out += ["", "<details><summary>Exact expressions (in B)</summary>", "",
                *(f"- ranks {r['label']}: `{r['peak_formula']}`" for r in s.ranks), "",
                "</details>"]
    return out


def render_markdown(s) -> str:
    """The report as Markdown: formula, where it holds, numbers at ``s.B``, the largest B for
    the budget, parts, what is live at the peak, checkpointing and what-ifs when present."""
    out = [f"# {s.title}", ""]
    out += _rows("| setup | |", "|---|---|", (f"| {k} | {v} |" for k, v in s.setup.items()
                                              if not exact_in_setup(s, v)))
    if s.ranks:
        out += ["", f"## Per rank ({s.setup.get('parallel', 'data parallel')})", "",
                "B is each rank's micro-batch; one row per group of ranks with alike shards. "
                "The sections below are the report of the ranks with the least room.", "",
                *rank_table(s)]
    out += ["", f"## Peak memory as a formula of {readable_in(s, ' and ') or 'B'}", ""]
    valid = f"valid when {', '.join(s.valid_when) or 'B >= 1'}"
    named = at_dims(s)
    at, when = read_as(s.at_readable, s.at_readable_when, s.peak_formula,
                       s.at_readable_error)
    if s.leads_readable:  # the readable formula first, the exact one a click away
        out += [f"`{s.peak_readable}` bytes, {exact_when(s)}.", ""]
        if named:
            out += [f"At {named}: `{at}` bytes, {when or valid}.", ""]
        what = f"in {readable_in(s)}" if named else valid
        if s.hides_exact:
            out += [f"<details><summary>Exact expression ({what})</summary>", "",
                    f"`{s.peak_exact}`", "",
                    *([f"At {named} (in B): `{s.peak_formula}`, {valid}.", ""] if when
                      else []), "</details>", ""]
    elif named:  # past reading in B and the dims: the formula in B at their values leads
        out += [f"At {named}, in B: `{at}` bytes, {when or valid}.", "",
                f"<details><summary>Exact expression (in {', '.join(['B', *s.at_values])})"
                "</summary>", "", f"`{s.peak_exact}`", "",
                *([f"At {named} (in B): `{s.peak_formula}`, {valid}.", ""] if when else []),
                "</details>", ""]
    else:
        out += [f"`{s.peak_formula}` bytes, {valid}.", ""]
    if s.lifted:
        out += [f"{s.lifted[0].upper()}{s.lifted[1:]}.", ""]
    if s.unmodelled:
        out += [f"Not in this formula: {len(s.unmodelled)} allocation(s) fxmem cannot size "
                "(listed under the numbers below).", ""]
    out += _rows("| from B | the peak is after | phase | module | bytes |",
                 "|---:|---|---|---|---|",
                 (f"| {r.B_from} | `{r.op}` | {r.phase} | {_module(r.module)} | `{r.formula}` |"
                  for r in s.regimes))
    out += ["", f"## At B = {s.B}", "",
            f"Peak: **{fmt_bytes(s.peak_bytes)}** ({s.peak_bytes:,} bytes), after `{s.peak_op}` "
            f"in {_module(s.peak_module)} ({s.peak_phase})."]
    if s.cuda is not None:
        c = s.cuda
        used = " and ".join(f"{what} {fmt_bytes(n)}" for what, n in c["workspaces"]) or "none"
        out += ["", f"On a GPU of compute capability {c['compute_capability']}, "
                f"`torch.cuda.max_memory_allocated()` would read {fmt_bytes(c['max_allocated'])} "
                f"({c['max_allocated']:,} bytes) and `max_memory_reserved()` "
                f"{fmt_bytes(c['max_reserved'])} (the caching allocator's blocks and segments; "
                f"library workspaces: {used}; the CUDA context comes on top)."]
    out += _ways(s)
    if s.budget_bytes is not None:
        h = largest_b(s)
        out += ["", f"**{h.lead}**" if h.fails else f"{h.lead}**{h.number}**{h.tail}."]
        if h.others:
            out += ["", h.others]
    if s.caveats:  # beside the numbers they qualify
        out += ["", "### Caveats", "", *(f"- {c}" for c in s.caveats)]
    out += ["", "## Parts", ""]
    out += _rows(f"| part | bytes (formula in B) | at B = {s.B} |", "|---|---|---:|",
                 (f"| {k} | `{s.parts_formulas[k]}` | {fmt_bytes(v)} |"
                  for k, v in s.parts_bytes.items()))
    out += ["", "## Live at the peak", "", "By category:", ""]
    out += _rows("| category | bytes |", "|---|---:|",
                 (f"| {k} | {fmt_bytes(v)} |" for k, v in s.by_category.items()))
    if s.weight_casts:
        out += ["", weight_casts_line(s.weight_casts)]
    out += ["", "By module (top level):", ""]
    out += _rows("| module | bytes |", "|---|---:|",
                 (f"| {_module(k)} | {fmt_bytes(v)} |" for k, v in s.by_module.items()))
    if s.plan or s.frontier:
        out += ["", "## Activation checkpointing", ""]
        if s.plan:
            out += [f"Plan applied: {compact_plan(s.plan)}; it recomputes "
                    f"{s.recompute_flops:,} FLOPs at B = {s.B}.", ""]
        if s.frontier:
            out += [f"Pareto plans at B = {s.B} (no plan has a lower peak for fewer FLOPs):",
                    ""]
            out += _rows("| peak | recompute FLOPs | plan |", "|---:|---:|---|",
                         (f"| {fmt_bytes(p)} | {f:,} | {frontier_plan(pl, c)} |"
                          for p, f, pl, c in s.frontier))
    if s.whatifs:
        out += ["", "## What-ifs", "", whatif_table(list(s.whatifs))]
    return "\n".join(out) + "\n"


def _ways(s) -> list[str]:
    """B does not fit: by how much, and the ways that make it fit, each checked."""
    h = not_fitting(s)
    if h is None:
        return []
    out = ["", f"**{h.lead}{h.number}{h.tail}.**"]
    if h.others:
        out += ["", h.others]
    rows = way_rows(s)
    if rows:
        out += ["", "Ways it fits, each checked (it fits there, and not one step beyond):", ""]
        out += _rows("| way | needs | recompute | one step beyond |", "|---|---:|---:|---|",
                     (f"| {w} | {n} | {r} | {b} |" for w, n, r, b, _ in rows))
        plans = [(w["kind"], whole) for w, (*_, whole) in zip(s.fit["ways"], rows) if whole]
        if plans:
            out += ["", *(f"- the {k} way's plan, whole: {p}" for k, p in plans)]
    if s.fit["none"]:
        out += ["", "Searched, none found:", "", *(f"- {line}" for line in s.fit["none"])]
    return out
