"""What a rendered report shows, computed once from a :class:`fxmem.Report`: every renderer
(terminal, Markdown, HTML, JSON) and every plot reads a :class:`Summary`, never the trace.

``Summary.to_dict()`` is the JSON document, versioned by :data:`SCHEMA` (documented in
``docs/json-schema.md``; a change to a field's meaning bumps the version).

>>> import torch, fxmem
>>> from fxmem.report.summary import summarize
>>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(),
...                   optimizer=torch.optim.SGD, device="cpu")
>>> s = summarize(r, B=16, budget_bytes=2**20)
>>> s.peak_bytes == r.peak_bytes(16), s.max_batch_size == r.max_batch_size(2**20)
(True, True)
>>> s.to_dict()["schema"]
'fxmem.report/2'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import sympy

from ..errors import InfeasibleBudgetError
from ..formula.symbols import B as SYM_B
from .inductor import graph_estimates, summary_line
from .ways import rank_reports
from .whatif import as_dict

SCHEMA = "fxmem.report/2"
CURVE_POINTS = 64  # batch sizes sampled for the peak-vs-B plot


@dataclass(frozen=True)
class Regime:
    """From batch size ``B_from`` on, the peak is right after ``op`` in ``module``."""

    B_from: int
    op: str
    phase: str
    module: str
    formula: str  # bytes, in B


@dataclass(frozen=True)
class Summary:
    """A report's contents, numbers in bytes.

    ``peak_formula``: the peak as a formula in B (sympy's text), valid where ``valid_when``
    holds; ``regimes``: which op is the peak for which range of B. ``B``/``peak_bytes``: the
    chosen batch size and its peak; ``parts_bytes``: the seed-style parts at ``B`` (and
    ``parts_formulas`` in B). ``budget_bytes``/``max_batch_size``: the largest B within the
    budget (``None`` when no budget was given or none fits; ``min_peak_bytes`` is then the
    peak at ``min_peak_b``: B = 1 where none fits and a search traced it, else the least B
    the formulas hold for), answered as ``max_batch_size_by`` says
    (:meth:`fxmem.Report.max_batch_size`: ``"device"`` for a CUDA step, the steps replayed
    through the caching allocator within ``budget_bytes``, the bytes it can get;
    ``"live"`` on the CPU); ``answers``: every answer for the same budget (``device``,
    ``allocated``, ``live``); ``next_oom``: where ``max_batch_size + 1`` runs out (device
    answers); ``gpu``: the card the budget came from (name, ``total_bytes``,
    ``context_bytes``, ``usable_bytes``, ``source``) or None. ``caveats``: what the figures
    leave out, shown beside them. ``by_category``/``by_module``: what is live at
    the peak at ``B``; ``weight_casts``: what of it are the forward's casts of the weights
    (``nbytes``, ``dtypes``, ``gathered``: :class:`fxmem.report.points.WeightCasts`), or
    None. ``curve``: (B, peak bytes) samples; ``cuda_curve`` (a CUDA step):
    (B, max_allocated, max_reserved) at the same B's, the replayed allocator's figures that
    the ``"device"`` and ``"allocated"`` answers are read from; ``timeline``: live bytes after
    every op at ``B`` (index, op, phase, module, bytes). ``plan``/``frontier``: the
    checkpoint plan applied, and Pareto points (peak bytes, recompute FLOPs, plan, the
    ``torch.compile`` budget that stands for a plan or None) at ``B``.
    ``whatifs``: rows of :func:`fxmem.whatif` (dicts), when given. ``cuda`` (``device="cuda"``
    only): what ``torch.cuda`` would report at ``B``, from :meth:`fxmem.Report.cuda_memory`:
    ``max_allocated``, ``max_reserved``, the library ``workspaces`` ([what, bytes]) and
    ``max_batch_size``: the largest B whose ``max_allocated`` fits the budget.
    ``ranks`` (a data-parallel step only): the per-rank table, one dict per group of alike
    ranks (:meth:`fxmem.report.ranks.RankRow.as_dict`); the rest of the summary is then the
    report of the group marked ``tightest``.
    ``peak_readable``: the peak as one polynomial around ``B`` (in B and the named dims of
    ``readable_point``, the point it was read at), equal to ``peak_exact`` (the exact
    expression it reads: ``peak_formula``, or the formula in B and the dims) wherever every
    ``readable_when`` holds; where only its "a multiple of" conditions fail, the exact peak
    is ``peak_readable`` plus ``readable_error[0]`` to ``readable_error[1]`` bytes (ints,
    or formulas as text where a rounding is scaled by B or L: ``"496*B"``)
    (:meth:`fxmem.Report.readable_peak`); ``""`` when the peak is past reading.
    ``at_readable``/``at_readable_when``: ``peak_formula`` (in B at the named dims' values)
    as one polynomial around ``B`` (or the least B it holds for) and where it is exact, when
    that reads otherwise than ``peak_formula``; ``""`` and ``()`` when not;
    ``at_readable_error``: as ``readable_error``, of ``at_readable``. ``at_values``:
    the named dims' values the numbers (and ``peak_formula``) are at, e.g. ``{"L": 8192}``
    (``{}`` for a report in B alone).
    """

    title: str
    setup: dict
    peak_formula: str
    peak_latex: str
    valid_when: tuple
    regimes: tuple
    B: int
    peak_bytes: int
    peak_op: str
    peak_phase: str
    peak_module: str
    parts_formulas: dict
    parts_bytes: dict
    budget_bytes: int | None
    max_batch_size: int | None
    min_peak_bytes: int
    by_category: dict
    by_module: dict
    curve: tuple
    timeline: tuple = field(repr=False)
    plan: tuple = ()
    recompute_flops: int = 0
    frontier: tuple = ()
    whatifs: tuple = ()
    unmodelled: tuple = ()
    cuda: dict | None = None
    lifted: str = ""  # B fixed by the step: how the formula was fitted (Report.lifted)
    max_batch_size_by: str = ""
    answers: dict = field(default_factory=dict)
    next_oom: str = ""
    gpu: dict | None = None
    caveats: tuple = ()
    ranks: tuple = ()
    cuda_curve: tuple = ()
    peak_readable: str = ""
    readable_when: tuple = ()
    readable_error: tuple = ()
    readable_point: dict = field(default_factory=dict)
    peak_exact: str = ""
    fit: dict | None = None
    weight_casts: dict | None = None
    min_peak_b: int = 1
    at_readable: str = ""
    at_readable_when: tuple = ()
    at_readable_error: tuple = ()
    at_values: dict = field(default_factory=dict)

    @property
    def leads_readable(self) -> bool:
        """Whether the renderers lead with ``peak_readable`` (and keep ``peak_exact`` a click
        or a flag away): when it differs from the exact expression, or when it is in B and
        named dims (``peak_formula`` is then the formula at their values alone, not the one
        asked for).

        >>> from types import SimpleNamespace as S
        >>> lead = Summary.leads_readable.fget
        >>> lead(S(peak_readable="768*B*L + 3", peak_exact="768*B*L + 3", at_values={"L": 8}))
        True
        >>> lead(S(peak_readable="24*B + 3", peak_exact="24*B + 3", at_values={}))
        False
        """
        return bool(self.peak_readable) and (self.peak_readable != self.peak_exact
                                             or bool(self.at_values))

    @property
    def hides_exact(self) -> bool:
        """Whether a formula the renderers lead with stands for an exact expression they
        keep a click or a flag away (``peak_readable`` for ``peak_exact``, ``at_readable``
        for ``peak_formula``): else there is nothing more to show."""
        return (self.leads_readable and self.peak_readable != self.peak_exact) or \
            bool(self.at_readable)

    def to_dict(self, timeline: bool = False) -> dict:
        """The JSON document (see ``docs/json-schema.md``); ``timeline=True`` adds the
        per-op live bytes, which can be long."""
        # (the per-op timeline, one row an op, left to the lines below: asdict's copy of it
        # was most of the JSON's rendering, 0.33 s of Llama-3.1-8B's over 8 GPUs)
        d = {"schema": SCHEMA, **asdict(replace(self, timeline=()))}
        d["regimes"] = [asdict(r) for r in self.regimes]
        d["curve"] = [list(p) for p in self.curve]
        d["cuda_curve"] = [list(p) for p in self.cuda_curve]
        d["frontier"] = [dict(peak_bytes=p, recompute_flops=f, plan=list(pl), compiled=c)
                         for p, f, pl, c in self.frontier]
        d["plan"] = list(self.plan)
        d["valid_when"] = list(self.valid_when)
        d["whatifs"] = [dict(w) for w in self.whatifs]
        d["unmodelled"] = list(self.unmodelled)
        d["caveats"] = list(self.caveats)
        d["ranks"] = [dict(r) for r in self.ranks]
        d["readable_when"] = list(self.readable_when)
        d["readable_error"] = list(self.readable_error)
        if timeline:
            d["timeline"] = [list(t) for t in self.timeline]
        else:
            del d["timeline"]
        return d


def _at(expr, b: int) -> int:
    return int(sympy.sympify(expr).subs(SYM_B, b))


def summarize(report, *, B: int, budget_bytes: int | None = None, top: int = 10,  # noqa: N803
              title: str = "fxmem report", setup: dict | None = None, frontier=None,
              whatifs=None, cudnn_workspace: int = 0, gpu=None,
              context_bytes: int | None = None, named=None, dims=None, fit=None) -> Summary:
    """The :class:`Summary` of ``report`` at batch size ``B``. ``setup``: what the step is
    (model, optimizer, ...; shown as given); ``frontier``: checkpoint Pareto points at ``B``
    (:meth:`fxmem.Report.frontier`); ``whatifs``: :class:`fxmem.WhatIf` rows;
    ``cudnn_workspace``: bytes each convolution holds on CUDA (:meth:`fxmem.Report.cuda_memory`).
    ``gpu``: a card's name (:mod:`fxmem.device.gpus`): the budget is what its allocator can
    get, its capacity less ``context_bytes`` for the CUDA context (then ``budget_bytes`` is
    left None). ``named``: the report in named dims that ``report`` is at ``dims`` (their
    values, ``named.at(**dims)``): the readable peak is then read in B and the dims.
    ``fit``: a :class:`fxmem.report.fit.Fit` at ``B`` within the budget (``Fit.as_dict()``
    becomes ``Summary.fit``): whether B fits and, when not, the ways out.

    ``report`` may be a :class:`fxmem.ParallelReport` (in B alone: see its ``at``): the
    summary is then the report of the ranks with the least room, with the per-rank table
    (:meth:`~fxmem.report.ranks.ParallelReport.per_rank`) in ``ranks``, its largest B
    answered as the summary's own."""
    from ..memory.liveness import PARTS
    from .ranks import ParallelReport

    card = None
    if gpu is not None:
        from ..device.gpus import DEFAULT_CONTEXT_BYTES
        from ..device.gpus import gpu as lookup

        g = lookup(gpu)
        ctx = DEFAULT_CONTEXT_BYTES if context_bytes is None else context_bytes
        budget_bytes = g.usable_bytes(ctx)
        card = dict(name=g.name, total_bytes=g.total_bytes, context_bytes=ctx,
                    usable_bytes=budget_bytes, source=g.source)
    ranks, shown = (), {}
    if isinstance(report, ParallelReport):
        opts = dict(by=_by(report.device), cudnn_workspace=cudnn_workspace) \
            if budget_bytes is not None else {}
        rows = report.per_rank(B, budget_bytes, **opts)
        ranks = tuple(r.as_dict() for r in rows)
        chosen = next(r for r in rows if r.tightest)
        shown = {"parallel": report.strategy.name,
                 "ranks shown": f"{chosen.label} (the least room)"}
        report = report.rank(chosen.ranks[0])
    bd = report.breakdown(B, top=top)
    by, answers = _answers(report, budget_bytes, cudnn_workspace)
    most, next_oom = answers.get(by), ""
    if most is not None and by == "device":
        run = report.runs_on_device(most + 1, budget_bytes, cudnn_workspace=cudnn_workspace)
        if not run.fits:
            _, _, op, phase, module = run.oom
            next_oom = f"{op} in {module or '(root)'} ({phase})"
    b_min = report.min_batch_size
    # where no B fits, B = 1's peak when a search traced it (none is traced for this alone)
    least = 1 if most is None and budget_bytes is not None and b_min > 1 and \
        report._traced_at(1, make=False) is not None else b_min
    hi = max(2 * B, 2 * most if most else 0, b_min + 1)
    step = max(1, (hi - b_min) // (CURVE_POINTS - 1))
    bs = sorted({*range(b_min, hi + 1, step), B, *((most, most + 1) if most else ())})
    curve = tuple((b, report.peak_bytes(b)) for b in bs)
    cuda_curve = () if report.device != "cuda" else tuple(
        (b, d.max_allocated, d.max_reserved)
        for b, d in ((b, report.cuda_memory(b, cudnn_workspace=cudnn_workspace)) for b in bs))
    kernels = "; ".join(what for _, what in report.trace.kernel_choices)
    estimates = graph_estimates(report.trace)
    info = {"device": report.device, "step": "training" if report.trace.train else "inference",
            **({"CUDA kernels": kernels} if kernels else {}),
            **({"inductor's estimate": summary_line(estimates)} if estimates else {}),
            **({"grad_accum": report.grad_accum} if report.grad_accum > 1 else {}),
            **(setup or {}), **shown}
    parts = {p: report.parts[p] for p in PARTS if report.parts[p] != 0}
    rows = tuple(as_dict(w) for w in (whatifs or ()))
    unmodelled = _unmodelled(report.unmodelled)
    caveats = tuple(f"not counted: {u}" for u in unmodelled)
    if card is not None:
        caveats += (f"the CUDA context is an estimate ({card['context_bytes'] // 2**20} MiB; "
                    "measure yours and pass --cuda-context)",)
    if by == "device":
        caveats += ("the caching allocator's replay follows PyTorch's source; it is checked "
                    "against PyTorch's CUDA build on a fake GPU (docs/validation.md), not yet "
                    "on a real one",)
    read = _readable(named if named is not None else report, B, dims or {})
    return Summary(
        title=title, setup=info, peak_formula=str(report.peak),
        peak_latex=sympy.latex(report.peak), valid_when=tuple(str(g) for g in report.valid_when),
        regimes=tuple(Regime(r.B_from, r.op, r.phase, r.module, str(r.expr))
                      for r in report.regimes),
        B=B, peak_bytes=bd.peak_bytes, peak_op=bd.op, peak_phase=bd.phase,
        peak_module=bd.module, parts_formulas={k: str(v) for k, v in parts.items()},
        parts_bytes={k: _at(v, B) for k, v in parts.items()}, budget_bytes=budget_bytes,
        max_batch_size=most, min_peak_bytes=report.peak_bytes(least),
        min_peak_b=least,
        by_category=dict(bd.by_category), by_module=dict(bd.by_module), curve=curve,
        timeline=tuple((t.index, t.op, t.phase, t.module, t.live_bytes)
                       for t in report.timeline(B)),
        plan=tuple(map(str, report.plan)),  # entries as printed: "h.0", "h.1..h.3", ...
        recompute_flops=_at(report.recompute_flops, B) if report.plan else 0,
        frontier=tuple((p.peak_bytes, p.recompute_flops, tuple(map(str, p.plan)),
                        getattr(p, "compiled", None)) for p in (frontier or ())),
        whatifs=rows, unmodelled=unmodelled, lifted=report.lifted,
        cuda=_cuda(report, B, answers.get("allocated"), cudnn_workspace),
        max_batch_size_by=by, answers=answers, next_oom=next_oom, gpu=card, caveats=caveats,
        ranks=ranks, cuda_curve=cuda_curve, fit=fit.as_dict() if fit is not None else None,
        weight_casts=None if bd.weight_casts is None else asdict(bd.weight_casts),
        **(_in_b(report, B) if dims else {}), at_values=dict(dims or {}), **read)


def _readable(report, b: int, dims: dict) -> dict:
    """The summary's ``peak_readable`` fields (:meth:`fxmem.Report.readable_peak`)."""
    exact, r = str(report.peak), report.readable_peak(b, **dims)
    if r is None:
        return dict(peak_exact=exact)
    return dict(peak_readable=str(r.formula), readable_when=r.exact_when,
                readable_error=_error(r),
                readable_point={"B": b, **dims}, peak_exact=exact)


def _in_b(report, b: int) -> dict:
    """The summary's ``at_readable`` fields: ``report`` (in B alone, at the named dims'
    values) read around ``b``, or the least B its formulas hold for."""
    least = max(r.min_batch_size for r in rank_reports(report))
    r = report.readable_peak(max(b, least))
    if r is None or str(r.formula) == str(report.peak):
        return {}
    return dict(at_readable=str(r.formula), at_readable_when=r.exact_when,
                at_readable_error=_error(r))


def _error(r) -> tuple:
    """A :class:`fxmem.formula.readable.Readable`'s ``error`` as the summary keeps it: ints,
    or formulas as text."""
    return tuple(e if isinstance(e, int) else str(e) for e in r.error)


def _by(device: str) -> str:
    """The headline's kind of answer on ``device``."""
    return "device" if device == "cuda" else "live"


def _answers(report, budget: int | None, cudnn_workspace: int) -> tuple:
    """(the headline's kind, {kind: largest B or None}) for a budget."""
    if budget is None:
        return "", {}
    cuda = report.device == "cuda"
    answers = {}
    for by in (("device", "allocated", "live") if cuda else ("live",)):
        try:
            answers[by] = int(report.max_batch_size(budget, by=by,
                                                    cudnn_workspace=cudnn_workspace))
        except InfeasibleBudgetError:
            answers[by] = None
    return _by(report.device), answers


def _unmodelled(entries, shown: int = 3) -> tuple:
    """One line per (op, what), naming the first ``shown`` modules it happens in."""
    where: dict = {}
    for op, module, what in entries:
        where.setdefault((op, what), []).append(module or "(root)")
    out = []
    for (op, what), mods in where.items():
        more = f" and {len(mods) - shown} more" if len(mods) > shown else ""
        out.append(f"{what}, in {op} ({', '.join(mods[:shown])}{more})")
    return tuple(out)


def _cuda(report, b: int, most: int | None, cudnn_workspace: int) -> dict | None:
    if report.device != "cuda":
        return None
    d = report.cuda_memory(b, cudnn_workspace=cudnn_workspace)
    return {"max_allocated": d.max_allocated, "max_reserved": d.max_reserved,
            "workspaces": [[what, n] for what, n in d.workspaces],
            "compute_capability": "{}.{}".format(*report.trace.compute_capability),
            "kernels": [what for _, what in report.trace.kernel_choices],
            "max_batch_size": most}
