"""Plain-text rendering of a :class:`fxmem.Report` (used by ``str(report)``)."""

from __future__ import annotations

import re


def fmt_bytes(n: int) -> str:
    """``1536`` -> ``'1.50 KiB'``."""
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n} B"


def fmt_share(x: float) -> str:
    """A share of the FLOPs as a percentage; one above 0 that would print as 0.0% is
    ``'<0.1%'`` (a plan that re-runs only pointwise ops still re-runs something).

    >>> fmt_share(0.133), fmt_share(0.0004), fmt_share(0.0)
    ('13.3%', '<0.1%', '0.0%')
    """
    return "<0.1%" if 0 < x < 0.0005 else f"{x:.1%}"


def weight_casts_line(casts: dict) -> str:
    """A summary's ``weight_casts`` (:class:`fxmem.report.points.WeightCasts` as a dict) as
    the sentence under the bytes live at the peak.

    >>> c = {"nbytes": 3 * 2**30, "dtypes": ("bfloat16",), "gathered": False, "autocast": True}
    >>> weight_casts_line(c).split(" (")[0]
    'Of these, 3.00 GiB are bfloat16 casts of the weights that the forward made'
    """
    why = ("autocast's: saved for the backward, and held by autocast's weight cache until "
           "the forward ends" if casts["autocast"] else
           "the model's own, kept while the forward or autograd holds them")
    line = (f"Of these, {fmt_bytes(casts['nbytes'])} are {' and '.join(casts['dtypes'])} "
            f"casts of the weights that the forward made ({why})")
    if casts["gathered"]:
        line += ("; under FSDP2 each is a cast of a whole gathered weight, as many bytes on "
                 "every rank whatever the number of GPUs (FSDP2's param_dtype gathers the "
                 "weights in that dtype, and autocast casts none)")
    return line + "."


def exact_when(s) -> str:
    """Where summary ``s``'s readable peak is exact, as a phrase, with what the exact peak is
    where only its "a multiple of" conditions fail.

    >>> from types import SimpleNamespace as S
    >>> exact_when(S(readable_when=("L a multiple of 128", "B*L >= 467"),
    ...              readable_error=(0, 22548)))
    'exact when L is a multiple of 128 and B*L >= 467 (where only the multiple fails, the exact peak is 0 to 22,548 bytes above it)'
    """
    return exact_when_of(s.readable_when, s.readable_error)


def exact_when_of(when, error) -> str:
    """:func:`exact_when` of a :class:`fxmem.formula.readable.Readable`'s ``exact_when`` and
    ``error``.

    >>> exact_when_of((), (0, 0))
    'exact wherever the trace holds'
    >>> exact_when_of(("L a multiple of 32",), (0, "496*B")).endswith("0 to 496*B bytes above it)")
    True
    >>> exact_when_of(("B = 2", "L = 4096"), (0, 0))  # read at its point alone
    'exact at B = 2 and L = 4096'
    """
    conds = [c.replace(" a multiple of ", " is a multiple of ") for c in when]
    if not conds:
        return "exact wherever the trace holds"
    if all(re.fullmatch(r"\w+ = -?\d+", c) for c in conds):
        return "exact at " + " and ".join(conds)
    text = "exact when " + (", ".join(conds[:-1]) + " and " if len(conds) > 1 else "") + conds[-1]
    lo, hi = error or (0, 0)
    if any(" a multiple of " in c for c in when) and (lo, hi) != (0, 0):
        if not isinstance(lo, int) or not isinstance(hi, int):  # polynomials in B, L
            span = f"{lo} to {hi} bytes above it" if str(lo) == "0" else f"{lo} to {hi} bytes off"
        else:
            span = (f"{lo:,} to {hi:,} bytes above it" if lo >= 0 else
                    f"{lo:+,} to {hi:+,} bytes off")
        text += f" (where only the multiple fails, the exact peak is {span})"
    return text


def read_as(readable: str, when, exact: str, error=(0, 0)) -> tuple:
    """A formula as the reports lead with it: ``(formula, where it is exact)``, the readable
    polynomial with its conditions and, where only its "a multiple of" ones fail, how far
    the exact peak is from it (``error``: :func:`exact_when_of`) where there is one that
    reads otherwise than ``exact``, else ``(exact, "")``.

    >>> read_as("24*B + 4096", ("B >= 2",), "Max(24*B + 4096, ...)")
    ('24*B + 4096', 'exact when B >= 2')
    >>> read_as("", (), "24*B + 4096")
    ('24*B + 4096', '')
    >>> read_as("24*B", ("B a multiple of 64",), "24*B + 512*ceiling(B/64)",
    ...         (0, 512))[1].endswith("the exact peak is 0 to 512 bytes above it)")
    True
    """
    if not readable or readable == exact:
        return exact, ""
    return readable, exact_when_of(tuple(when), tuple(error) or (0, 0))


def readable_in(s, sep: str = ", ") -> str:
    """What summary ``s``'s readable peak is a formula of: ``"B, L"``; ``"L at B = 1"``
    where B is below where the formulas hold (its peak traced at that B: no B in it).

    >>> from types import SimpleNamespace as S
    >>> readable_in(S(peak_readable="8*B*L + 3", readable_point={"B": 16, "L": 1024}))
    'B, L'
    >>> readable_in(S(peak_readable="40*L + 3", readable_point={"B": 1, "L": 4096}), " and ")
    'L at B = 1'
    """
    point = s.readable_point
    if "B" in point and len(point) > 1 and not re.search(r"\bB\b", s.peak_readable):
        return sep.join(k for k in point if k != "B") + f" at B = {point['B']}"
    return sep.join(point)


def exact_in_setup(s, value) -> bool:
    """Whether a setup value of summary ``s`` is the exact peak in B and the named dims
    (the CLI's "peak in B, L") that the renderers keep a click or a flag away: they lead
    with a readable form of it, or with the formula at the dims' values where it has none.

    >>> from types import SimpleNamespace as S
    >>> exact_in_setup(S(peak_exact="Max(8*B*L, 9)", leads_readable=False,
    ...                  at_values={"L": 64}), "Max(8*B*L, 9)")
    True
    >>> exact_in_setup(S(peak_exact="Max(8*B, 9)", leads_readable=False, at_values={}),
    ...                "Max(8*B, 9)")
    False
    """
    return value == s.peak_exact and (s.leads_readable or bool(s.at_values))


def at_dims(s) -> str:
    """``"L = 1024"``: the named dims' values the summary's numbers are at ("" in B alone).

    >>> from types import SimpleNamespace as S
    >>> at_dims(S(at_values={"L": 1024})), at_dims(S(at_values={}))
    ('L = 1024', '')
    """
    return ", ".join(f"{k} = {v}" for k, v in s.at_values.items())


def render_text(report, B: int | None = None) -> str:  # noqa: N803
    from ..formula.symbols import B as SYM_B
    from ..memory.liveness import PARTS

    if report.named is not None:
        return (f"fxmem report in B and {', '.join(report.dims)} (device={report.device})\n"
                f"peak bytes = {report.peak}\n"
                f"valid when: {', '.join(map(str, report.valid_when))}"
                + (f"\n{report.lifted}" if report.lifted else ""))
    b = B or max(report.trace.batch_hint, report.min_batch_size)
    lines = [f"fxmem report ({'training' if report.trace.train else 'inference'} step, "
             f"device={report.device})",
             f"peak bytes = {report.peak}",
             "valid when: " + (", ".join(str(g) for g in report.valid_when) or "B >= 1")]
    if report.lifted:  # how the formula was obtained, beside it
        lines.append(report.lifted)
    # what the formula leaves out belongs beside it, not under the details
    for op, module, what in report.unmodelled:
        lines.append(f"not modelled: {what}, in {op} ({module or '(root)'})")
    if report.grad_accum > 1:
        lines.append(f"gradient accumulation: {report.grad_accum} micro-batches of B per "
                     f"optimizer step (effective batch {report.grad_accum}*B)")
    if report.plan:
        lines.append(f"checkpoint plan: {', '.join(report.plan)}; recompute FLOPs = "
                     f"{report.recompute_flops}")
    for r in report.regimes:
        lines.append(f"  from B={r.B_from}: peak after {r.op} ({r.phase}, "
                     f"{r.module or '(root)'})")
    lines.append("parts:")
    for p in PARTS:
        e = report.parts[p]
        if e != 0:
            lines.append(f"  {p:<16} {str(e):<24} {fmt_bytes(int(e.subs(SYM_B, b)))} at B={b}")
    bd = report.breakdown(b)
    lines.append(f"peak at B={b}: {bd.peak_bytes:,} B ({fmt_bytes(bd.peak_bytes)}) after "
                 f"{bd.op} ({bd.phase}, {bd.module or '(root)'})")
    return "\n".join(lines)


def rank_columns(rows) -> list:
    """The parts any row of a per-rank table has, in :data:`PARTS` order."""
    from ..memory.liveness import PARTS

    return [p for p in PARTS if any(p in r["parts_bytes"] for r in rows)]


def rank_table(rows, budget_bytes: int | None = None) -> list[str]:
    """The per-rank table as aligned text lines, from rows as dicts
    (:meth:`fxmem.report.ranks.RankRow.as_dict`): the ranks (``*`` the tightest), the
    peak and largest B, the parts at B, and the peak formula last."""
    b = rows[0]["B"]
    parts = rank_columns(rows)
    head = ["ranks", f"peak at B={b}",
            *(["largest B"] if budget_bytes is not None else []), *parts, "peak (formula in B)"]
    body = []
    for r in rows:
        most = [("none fits" if r["max_batch_size"] is None else f"{r['max_batch_size']:,}")
                ] if budget_bytes is not None else []
        body.append([r["label"] + (" *" if r["tightest"] else ""), fmt_bytes(r["peak_bytes"]),
                     *most, *(fmt_bytes(r["parts_bytes"].get(p, 0)) for p in parts),
                     r["peak_formula"]])
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head) - 1)]

    def line(cells):
        return "  ".join([cells[0].ljust(widths[0]),
                          *(c.rjust(w) for c, w in zip(cells[1:-1], widths[1:])),
                          cells[-1]]).rstrip()
    return [line(head), *map(line, body)]


def render_ranks(report, B: int | None = None, budget_bytes: int | None = None,  # noqa: N803
                 **options) -> str:
    """A data-parallel step's memory per rank (:class:`fxmem.report.ranks.ParallelReport`):
    one line per group of alike ranks (:meth:`~fxmem.report.ranks.ParallelReport.per_rank`)
    at ``B``, with the largest B for ``budget_bytes`` when given (``options`` as for
    :meth:`fxmem.Report.max_batch_size`); ``*`` marks the ranks with the least room.

    >>> import torch, fxmem
    >>> m = torch.nn.Sequential(*[torch.nn.Linear(30, 30) for _ in range(3)])
    >>> r = fxmem.analyze(m, torch.randn(4, 30), loss=lambda o: o.sum(),
    ...                   optimizer=torch.optim.Adam, device="cpu", parallel=fxmem.FSDP(4))
    >>> print(render_ranks(r, 64, 2**20).splitlines()[2])
    0-2 *     54.98 KiB      2,131  2.91 KiB  7.50 KiB  2.91 KiB         5.84 KiB    15.00 KiB  480*B + 25576
    """
    first = report.groups[0].report
    b = B or max(first.trace.batch_hint, first.min_batch_size)
    rows = [r.as_dict() for r in report.per_rank(b, budget_bytes, **options)]
    budget = "" if budget_bytes is None else f", largest B within {fmt_bytes(budget_bytes)}"
    lines = [f"fxmem report per rank: {report.strategy.name} "
             f"({'training' if first.trace.train else 'inference'} step, "
             f"device={report.device}); B is each rank's micro-batch{budget}",
             *rank_table(rows, budget_bytes),
             "* the ranks with the least room"]
    return "\n".join(lines)


def plan_text(plan) -> str:
    """A plan in a line: its entries, runs of a stack's blocks checkpointed alike as ranges
    (:func:`compact_plan`) when that leaves at most three, else how many, the first and
    the last (the whole plan is ``fxmem.report.ways.WayOut.plan``).

    >>> plan_text(["h.0", "h.1"])
    'h.0-1'
    >>> plan_text([f"layers.{i} (saving 1 op output)" for i in range(32)])
    'layers.0-31 (saving 1 op output each)'
    >>> plan_text([f"layers.{i}" + (" (saving 1 op output)" if i % 2 else "") for i in range(8)])
    '8 modules, layers.0 ... layers.7, some op outputs kept'
    """
    entries = [str(p) for p in plan]
    runs = _runs(entries)
    if len(runs) <= 3:
        return ", ".join(map(_run_text, runs))
    names = [e.split(" (")[0] for e in entries]
    kept = ", some op outputs kept" if any(" (saving" in e for e in entries) else ""
    return f"{len(entries)} modules, {names[0]} ... {names[-1]}{kept}"


def compact_plan(plan) -> str:
    """A plan's every entry, the runs of consecutive blocks of one stack checkpointed alike
    written as one range.

    >>> compact_plan(["h.0", "h.1", "h.2.mlp", "h.3.mlp", "h.5 (saving 2 op outputs)",
    ...               "h.6 (saving 2 op outputs)", "h.7..h.8", "lm_head"])
    'h.0-1, h.2-3.mlp, h.5-6 (saving 2 op outputs each), h.7..h.8, lm_head'
    >>> compact_plan(["0", "1", "2 (saving 1 op output)"])
    '0-1, 2 (saving 1 op output)'
    """
    return ", ".join(map(_run_text, _runs([str(p) for p in plan])))


def _runs(entries: list) -> list:
    """Entries as ``[stack, first, last, tail, note]`` runs (an entry not in a stack, or a
    group of blocks, as itself)."""
    runs: list = []
    for e in entries:
        path, sep, note = e.partition(" (")
        parts = path.split(".")
        k = max((j for j, p in enumerate(parts) if p.isdigit()), default=None)
        if k is None or ".." in path:
            runs.append(e)
            continue
        stack, i, tail = ".".join(parts[:k]), int(parts[k]), ".".join(parts[k + 1:])
        last = runs[-1] if runs else None
        if isinstance(last, list) and last[0] == stack and last[2] + 1 == i \
                and last[3:] == [tail, sep + note]:
            last[2] = i
        else:
            runs.append([stack, i, i, tail, sep + note])
    return runs


def _run_text(run) -> str:
    if isinstance(run, str):
        return run
    stack, a, b, tail, note = run
    at = (f"{stack}." if stack else "") + (f"{a}" if a == b else f"{a}-{b}")
    if a != b and note:
        note = note[:-1] + " each)"
    return at + (f".{tail}" if tail else "") + note


def frontier_plan(plan, compiled=None) -> str:
    """A frontier point's plan in a table cell: its entries (:func:`compact_plan`),
    ``(none)``, or the ``torch.compile`` budget that stands for a plan.

    >>> frontier_plan(("h.0", "h.1")), frontier_plan(()), frontier_plan((), 0.5)
    ('h.0-1', '(none)', 'torch.compile, activation_memory_budget 0.5')
    """
    if compiled is not None:
        return f"torch.compile, activation_memory_budget {compiled:g}"
    return compact_plan(plan) or "(none)"
