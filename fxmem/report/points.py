"""What a :class:`fxmem.Report` answers at one batch size, or over a range of them: the
breakdown at the peak (:class:`Breakdown`), the live bytes after every op
(:class:`TimelinePoint`), and where the peak is by range of B (:class:`PeakRegime`).
Numbers in bytes.

>>> import torch, fxmem
>>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(),
...                   device="cpu")
>>> bd = r.breakdown(16)
>>> isinstance(bd, Breakdown), bd.B, bd.peak_bytes == r.peak_bytes(16)
(True, 16, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy


@dataclass(frozen=True)
class TimelinePoint:
    """Live bytes right after one op allocated its outputs."""

    index: int
    op: str
    phase: str
    module: str
    live_bytes: int


@dataclass(frozen=True)
class WeightCasts:
    """Of the bytes live at the peak, ``nbytes`` are casts of the weights that the forward
    made (``aten._to_copy`` of a parameter: autocast's, which autograd saves for the backward
    and autocast's weight cache holds until the forward's outermost ``autocast`` exits), in
    ``dtypes`` (names, e.g. ``("bfloat16",)``). ``gathered``: some are casts of FSDP2's
    gathered weights, each the whole weight on every rank whatever the number of GPUs
    (FSDP2's ``param_dtype`` gathers the weights in that dtype, and autocast casts none:
    :mod:`fxmem.report.precision`). ``autocast``: the step ran under autocast (else the
    casts are the model's own, ``weight.half()`` in its forward).

    >>> import torch, fxmem
    >>> m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4096))
    >>> r = fxmem.analyze(m, torch.randn(64, 64), loss=lambda o: o.float().pow(2).sum(),
    ...                   device="cpu", amp=torch.bfloat16)
    >>> casts = r.breakdown(64).weight_casts  # the 4096 x 64 weight's bf16 copy, saved
    >>> casts.nbytes == 4096 * 64 * 2, casts.dtypes, casts.autocast
    (True, ('bfloat16',), True)
    """

    nbytes: int
    dtypes: tuple
    gathered: bool = False
    autocast: bool = True


@dataclass(frozen=True)
class Breakdown:
    """What is live at the peak for one batch size, in bytes.

    ``by_category``: param, buffer, input, grad, optimizer_state, activation, temporary.
    ``by_module``: top-level module (or ``(inputs)``, ``<loss>``, ``<optimizer>``).
    ``op``/``phase``/``module``: where the peak happens (``op_index`` -1: before the step).
    A storage counts for the module of the op that made it; in backward that is the module
    whose forward made the autograd node running the op (``fc``'s weight gradient counts for
    ``fc``). ``weight_casts``: what of it are the forward's casts of the weights (a
    :class:`WeightCasts`; None: none is live at the peak).
    """

    B: int
    peak_bytes: int
    op_index: int
    op: str
    phase: str
    module: str
    by_category: dict
    by_module: dict
    weight_casts: WeightCasts | None = None


@dataclass(frozen=True)
class PeakRegime:
    """From batch size ``B_from`` (an int) until the next regime, the peak is right after this
    op. ``crossing``: the exact real B where this op's live bytes overtake the previous
    regime's (a sympy number; ``B_from`` is the first valid integer at or after it)."""

    B_from: int
    op_index: int
    op: str
    phase: str
    module: str
    expr: sympy.Expr
    crossing: object = None


def _top_module(storage) -> str:
    if storage.category == "input":
        return "(inputs)"
    if storage.category in ("param", "buffer", "grad", "optimizer_state") and storage.name:
        parts = storage.name.split(".")
        return parts[0] if len(parts) > 1 else "(root)"
    m = storage.module
    if m.startswith("<"):
        return m
    return m.split(".")[0] if m else "(root)"


def regimes_of(report) -> tuple:
    """:attr:`fxmem.Report.regimes` of a report in B alone."""
    out = []
    for x, c in report.liveness.regimes:
        first = max(report.min_batch_size, int(sympy.ceiling(sympy.Rational(x))))
        while out and out[-1].B_from >= first:  # a regime holding for no integer B
            out.pop()
        op = report.trace.ops[c.op_index] if c.op_index >= 0 else None
        out.append(PeakRegime(first, c.op_index, op.op if op else "(start)",
                              op.phase if op else "start", op.module if op else "",
                              c.expr, sympy.Rational(x)))
    return tuple(out)


def breakdown_of(report, b: int, top: int | None) -> Breakdown:
    """:meth:`fxmem.Report.breakdown` of a report in B alone, at a B where it holds."""
    lv = report.liveness
    cand = lv.peak_candidate(b)
    by_cat, by_mod = {}, {}
    storages, live = lv.graph.storages, lv.live_sids(cand.op_index)
    for sid in live:
        s, v = storages[sid], lv.sizes[sid](b)
        by_cat[s.category] = by_cat.get(s.category, 0) + v
        m = _top_module(s)
        by_mod[m] = by_mod.get(m, 0) + v
    by_mod = dict(sorted(by_mod.items(), key=lambda kv: -kv[1])[:top])
    by_cat = dict(sorted(by_cat.items(), key=lambda kv: -kv[1]))
    op = report.trace.ops[cand.op_index] if cand.op_index >= 0 else None
    return Breakdown(b, cand(b), cand.op_index, op.op if op else "(start)",
                     op.phase if op else "start", op.module if op else "", by_cat, by_mod,
                     weight_casts(lv, live, b, report.trace.amp is not None))


def weight_casts(lv, sids, b: int, autocast: bool = True) -> WeightCasts | None:
    """Of storages ``sids`` (of liveness ``lv``), those a forward ``aten._to_copy`` made
    from a parameter's storage (on one GPU its own; under FSDP2 the gathered one,
    :mod:`fxmem.trace.parallel.fsdp_buffers`' ``unsharded``), as a :class:`WeightCasts`
    at ``b`` (``autocast``: the step's forward ran under it); None when there are none. A
    checkpoint plan's recomputed casts are not the forward's."""
    storages, ops = lv.graph.storages, lv.graph.ops

    def gathered(sid) -> bool:
        buffer = storages[sid].fsdp_buffer
        return buffer is not None and buffer.kind == "unsharded"

    total, dtypes, whole = 0, set(), False
    for sid in sids:
        s = storages[sid]
        op = ops[s.created_by] if s.created_by >= 0 else None
        if op is None or op.op != "aten._to_copy.default" or op.phase != "forward" \
                or op.recompute:
            continue
        sources = [i for i in op.in_sids if storages[i].category == "param" or gathered(i)]
        if not sources:
            continue
        total += lv.sizes[sid](b)
        dtypes.add(str(s.dtype).removeprefix("torch."))
        whole = whole or any(gathered(i) for i in sources)
    return WeightCasts(total, tuple(sorted(dtypes)), whole, autocast) if total else None
