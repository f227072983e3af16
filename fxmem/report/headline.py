"""The report's headline in words, shared by every renderer so each says the same: the largest
B, what it answers and on what, the other answers beside it, and the caveats that qualify the
numbers, each next to the number it qualifies.

Pieces are plain text; a renderer adds its own emphasis (``lead``, ``number``, ``tail``).

>>> from types import SimpleNamespace as S
>>> s = S(budget_bytes=2**30, max_batch_size=7, max_batch_size_by="live", gpu=None,
...       answers={"live": 7}, next_oom="", min_peak_bytes=0, caveats=())
>>> h = largest_b(s)
>>> h.lead + h.number + h.tail
'Largest B within 1.00 GiB (live tensors): 7'
"""

from __future__ import annotations

from dataclasses import dataclass

from .text import compact_plan, fmt_bytes, fmt_share, plan_text

_OTHER = {"allocated": "by max_memory_allocated()", "live": "by live tensors (the formula)",
          "device": "running through the caching allocator"}


@dataclass(frozen=True)
class Headline:
    """``lead`` + ``number`` + ``tail`` is the sentence; ``others``: the other answers for
    the same budget, named; ``fails``: True when no B fits (``number`` is then empty)."""

    lead: str
    number: str
    tail: str
    others: str
    fails: bool = False


def _where(s) -> str:
    if s.gpu:
        g = s.gpu
        return (f"on {g['name']} ({fmt_bytes(g['total_bytes'])}, less "
                f"{fmt_bytes(g['context_bytes'])} estimated for the CUDA context: "
                f"{fmt_bytes(g['usable_bytes'])} for the caching allocator)")
    if s.max_batch_size_by == "live":
        return f"within {fmt_bytes(s.budget_bytes)} (live tensors)"
    return (f"within {fmt_bytes(s.budget_bytes)} of device memory for the caching allocator "
            "(the CUDA context comes on top)")


def largest_b(s) -> Headline:
    """The "largest B" sentence of summary ``s`` (a budget was given)."""
    where = _where(s)
    others = "; ".join(f"{_OTHER[k]}: {'none fits' if v is None else f'{v:,}'}"
                       for k, v in (s.answers or {}).items() if k != s.max_batch_size_by)
    others = f"Other answers for the same bytes: {others}." if others else ""
    if s.max_batch_size is None:
        least = (f"the smallest peak, B = {s.min_peak_b}'s, is {fmt_bytes(s.min_peak_bytes)}"
                 if s.max_batch_size_by == "live" else
                 f"B = {s.min_peak_b} runs out of memory (its live tensors alone peak at "
                 f"{fmt_bytes(s.min_peak_bytes)})")
        return Headline(f"No B fits {where}: {least}", "", "", others, fails=True)
    if s.max_batch_size_by == "device":
        f = s.fit  # the asked B, below the largest, runs out: say so beside it
        asked = f["B"] if f and not f["fits"] and f["B"] < s.max_batch_size else None
        tail = (f" — its {s.setup.get('step', 'training')} steps, replayed through the CUDA "
                "caching allocator (with "
                "its free-and-retry on out-of-memory), run"
                + (f"; B = {s.max_batch_size + 1:,} runs out at {s.next_oom}"
                   if s.next_oom else "")
                + (f"; B = {asked:,}, asked, runs out: the caching allocator's blocks are "
                   "not monotone in B" if asked is not None else ""))
    elif s.max_batch_size_by == "allocated":
        tail = " — by max_memory_allocated()"
    else:
        tail = ""
    return Headline(f"Largest B {where}: ", f"{s.max_batch_size:,}", tail, others)



_NEED = {"device": "max_memory_reserved() replayed with no limit", "live": "live tensors"}


def not_fitting(s) -> Headline | None:
    """The sentence saying that B does not fit and by how much (``s.fit``), or None when it
    fits or no budget was given; ``others``: where the replay runs out."""
    f = s.fit
    if not f or f["fits"]:
        return None
    at = ", ".join(f"{k} = {v}" for k, v in {"B": f["B"], **f["dims"]}.items())
    where = _where(s)
    where = where[len("within "):] if where.startswith("within ") else where
    return Headline(f"{at} does not fit {where}: it needs ", fmt_bytes(f["need_bytes"]),
                    f" ({_NEED[f['by']]}), {fmt_bytes(f['over_bytes'])} over",
                    f"Within the budget the caching allocator runs out {f['oom']}."
                    if f["oom"] else "", fails=True)


def way_rows(s) -> list:
    """The ways out of ``s.fit`` as rows: (the way, what it needs, the share of FLOPs it
    re-runs or "", what one step beyond gives, its whole plan where the way's line gave
    less, else "": :func:`whole_plan`)."""
    return [(w["line"], fmt_bytes(w["need_bytes"]),
             fmt_share(w["recompute_share"]) if w["plan"] else "", w["beyond"],
             whole_plan(w["plan"]))
            for w in (s.fit or {}).get("ways", ())]


def whole_plan(plan) -> str:
    """A way's plan in full, runs of blocks checkpointed alike as ranges
    (:func:`fxmem.report.text.compact_plan`), where its line summarised it
    (:func:`fxmem.report.text.plan_text`); "" where the line gave it whole already.

    >>> whole_plan([f"layers.{i}" for i in range(32)])  # the line says 'layers.0-31'
    ''
    >>> whole_plan([f"layers.{i}" + (" (saving 1 op output)" if i > 5 else "")
    ...             for i in range(8)] + ["norm", "lm_head"])
    'layers.0-5, layers.6-7 (saving 1 op output each), norm, lm_head'
    """
    whole = compact_plan(plan)
    return "" if not plan or whole == plan_text(plan) else whole
