"""Markdown rendering of :func:`fxmem.whatif` rows."""

from __future__ import annotations

from .text import fmt_bytes


def as_dict(row) -> dict:
    """A :class:`fxmem.WhatIf` as the plain dict reports carry (formula as text)."""
    return dict(method=row.method, peak_formula=str(row.peak), B=row.B_used,
                peak_bytes=row.peak_bytes, max_batch_size=row.max_batch_size,
                change_bytes=row.change_bytes, note=row.note, by=row.by)


_BY = {"device": "largest batch that runs (allocator replay)",
       "allocated": "largest batch (max_memory_allocated)",
       "live": "largest batch (live tensors)"}


def table(rows: list[dict]) -> str:
    """A Markdown table of what-if rows given as dicts (see :func:`as_dict`)."""
    kinds = {r.get("by", "live") for r in rows}
    most_by = _BY[kinds.pop()] if len(kinds) == 1 else "largest batch"
    out = [f"| method | peak (bytes, formula in B) | B | peak | change | {most_by} | note |",
           "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        change = "" if r["method"] == "baseline" else \
            f"{'+' if r['change_bytes'] > 0 else ''}{fmt_bytes(r['change_bytes'])}"
        most = "none fits" if r["max_batch_size"] is None else f"{r['max_batch_size']:,}"
        out.append(f"| {r['method']} | `{r['peak_formula']}` | {r['B']} | "
                   f"{fmt_bytes(r['peak_bytes'])} | {change} | {most} | {r['note']} |")
    return "\n".join(out)


def render_markdown(rows) -> str:
    """A Markdown table: method, peak formula, peak at its B, change, largest batch, note."""
    return table([as_dict(r) for r in rows])
