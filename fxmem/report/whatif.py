"""Markdown rendering of :func:`fxmem.whatif` rows."""

from __future__ import annotations

from .text import fmt_bytes


def render_markdown(rows) -> str:
    """A Markdown table: method, peak formula, peak at its B, change, largest batch, note."""
    out = ["| method | peak (bytes, formula in B) | B | peak | change | largest batch | note |",
           "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        change = "" if r.method == "baseline" else \
            f"{'+' if r.change_bytes > 0 else ''}{fmt_bytes(r.change_bytes)}"
        most = "none fits" if r.max_batch_size is None else f"{r.max_batch_size:,}"
        out.append(f"| {r.method} | `{r.peak}` | {r.B_used} | {fmt_bytes(r.peak_bytes)} | "
                   f"{change} | {most} | {r.note} |")
    return "\n".join(out)
