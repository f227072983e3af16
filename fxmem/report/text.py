"""Plain-text rendering of a :class:`fxmem.Report` (used by ``str(report)``)."""

from __future__ import annotations


def fmt_bytes(n: int) -> str:
    """``1536`` -> ``'1.50 KiB'``."""
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n} B"


def render_text(report, B: int | None = None) -> str:  # noqa: N803
    from ..formula.symbols import B as SYM_B
    from ..memory.liveness import PARTS

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


def render_ranks(report, B: int | None = None) -> str:  # noqa: N803
    """A data-parallel step's memory per rank (:class:`fxmem.report.ranks.ParallelReport`):
    each group of alike ranks' peak formula and figures at ``B``, then rank 0's report."""
    from ..formula.symbols import B as SYM_B
    from ..memory.liveness import PARTS

    first = report.groups[0].report
    b = B or max(first.trace.batch_hint, first.min_batch_size)
    lines = [f"fxmem report per rank: {report.strategy.name} "
             f"({'training' if first.trace.train else 'inference'} step, "
             f"device={report.device}); B is each rank's micro-batch"]
    for g in report.groups:
        r = g.report
        bd = r.breakdown(b)
        lines.append(f"ranks {g.label}: peak bytes = {r.peak}")
        lines.append(f"  at B={b}: {bd.peak_bytes:,} B ({fmt_bytes(bd.peak_bytes)}) after "
                     f"{bd.op} ({bd.phase}, {bd.module or '(root)'})")
        parts = [f"{p} {fmt_bytes(int(r.parts[p].subs(SYM_B, b)))}" for p in PARTS
                 if r.parts[p] != 0]
        lines.append("  parts: " + ", ".join(parts))
    return "\n".join(lines)
