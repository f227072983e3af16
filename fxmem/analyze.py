"""The one-call pipeline: trace -> graph -> liveness -> :class:`fxmem.Report`."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import replace

import torch

from .checkpoint.plans import derive
from .memory.graph import build_graph
from .memory.liveness import liveness, parts_of
from .report.forked import foreground
from .report.ranks import ParallelReport, RankGroup
from .report.result import Report
from .trace.compiled import check_lowerable, check_parts, compiled_parts
from .trace.engine import UNSET, Step, TraceRequest, trace
from .trace.ledger import freeze_more, frozen_gc
from .trace.parallel import (
    FSDP,
    as_wrapped,
    at_world_size,
    check_parallel,
    other_rank,
    refuse_wrapped,
)
from .trace.plans import drops_a_cache, normalize_plan


@frozen_gc()
def analyze(model, inputs, targets=(), loss=UNSET, optimizer=UNSET, train=UNSET, device=UNSET,
            *, step: Step | None = None, checkpoint=None, retrace: bool = False,
            batch_hint: int | None = None, dims=None, reuse_blocks: bool = True, batch_dim=0,
            parallel=None, **options):
    """Analyse one step of ``model`` and return its memory as formulas in :data:`fxmem.B`.

    ``inputs``: a tensor or tuple of tensors, B at dim 0 of each unless ``batch_dim`` says
    otherwise (only shapes and dtypes are used; they may be on the meta device).
    ``targets``: tensors passed to ``loss`` after the model output. ``batch_dim``: where B is,
    an int for every input and target (``batch_dim=1`` for a sequence-first model's
    ``(L, B, F)`` input and ``(L, B)`` target), or a tuple with one entry per input then
    target, each a dim or None for a tensor with no batch dim (an LSTM's ``(x, (h0, c0))``
    flattened as inputs ``x, h0, c0`` shaped ``(L, B, F)``, ``(layers, B, H)``: ``1``; a
    lookup table the model takes: ``(1, None)``). The step is ``step`` (a
    :class:`fxmem.Step`, default ``Step()``) with the
    options given here: ``loss(output, *targets)`` (``None``: the output is the loss or has
    ``.loss``); ``optimizer``: an optimizer class or ``callable(params)`` (``None``: no
    step); ``train=False``: inference under ``torch.no_grad()``; ``device``: ``"cuda"``
    (the default) counts allocator blocks (512-byte rounding) and follows CUDA's kernels and
    optimizer defaults, ``"cpu"`` live bytes; and as keywords every other field of
    :class:`fxmem.Step`: ``set_to_none=False`` (``zero_grad`` zeroes gradients in place,
    so they stay allocated between steps), ``grad_accum=k`` (k forward-backward passes on
    micro-batches of B before one optimizer step; the effective batch is k·B,
    :meth:`Report.effective_batch_size`), ``inference_mode=True`` (with ``train=False``),
    ``amp=torch.bfloat16`` or float16 (forward and loss under ``torch.autocast`` with the
    target device's op lists; CUDA's are emulated: :mod:`fxmem.trace.kernels.amp`), ``grad_scaler``
    (default: with ``amp=torch.float16`` and an optimizer, as the AMP recipe does),
    ``compute_capability`` (the GPU whose kernels ``device="cuda"`` follows, default
    ``(9, 0)``, an H100: which attention kernel ``scaled_dot_product_attention`` runs
    depends on it, :mod:`fxmem.trace.kernels.cuda.kernels`).

    ``checkpoint``: a plan, module paths whose forward is recomputed in backward
    (``torch.utils.checkpoint``, non-reentrant); modules already wrapped with
    ``checkpoint_wrapper`` count too. The plan's schedule is derived from one trace of the
    step without it (:meth:`Report.with_plan`); it is traced with ``torch.utils.checkpoint``
    really running when ``retrace=True``, when a module of the plan runs more than once
    per step, when the model already has checkpointed modules, or when it has parts
    compiled on their own (each ``torch.compile(block)`` of the plan lowered as
    ``torch.compile(checkpoint_wrapper(block))``: :mod:`fxmem.trace.compiled.parts`).
    ``batch_hint``: the value
    of B used where the trace must decide something (default: the inputs' batch size, or 8).
    ``dims``: other input dims as symbols, e.g. ``{"L": [(0, 1)]}`` (dim 1 of tensor 0;
    tensors are the inputs, then the targets): the report's formulas are then in B and L
    (:attr:`Report.dims`; a checkpoint plan is then traced for real). ``reuse_blocks=False``:
    trace every block of a stack of identical blocks instead of copying the second one's trace
    (:mod:`fxmem.trace.blocks.reuse`; the result is the same, it only takes longer).

    ``parallel``: a parallel step (:class:`fxmem.FSDP`, :class:`fxmem.DDP`, :class:`fxmem.TP`,
    :class:`fxmem.Parallel` for FSDP2 x TP), each rank's memory with B its micro-batch: the
    model wrapped by PyTorch's own code as that rank runs it, over a fake process group
    (:mod:`fxmem.trace.parallel.fsdp`). Returns a
    :class:`fxmem.report.ranks.ParallelReport`, one report per group of alike ranks; a
    checkpoint plan is then traced for real. A model you wrapped yourself (FSDP2's
    ``fully_shard``, ``parallelize_module``, both, or ``DistributedDataParallel``) over a
    fake process group is analysed as it is, without ``parallel=``: the report of your
    rank (every rank under DDP), its wrapping re-applied to a copy
    (:mod:`fxmem.trace.parallel.wrapped`).

    >>> import torch, fxmem
    >>> m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    >>> r = fxmem.analyze(m, torch.randn(8, 16), torch.randint(0, 4, (8,)),
    ...                   loss=torch.nn.functional.cross_entropy,
    ...                   optimizer=torch.optim.Adam, device="cpu")
    >>> r.parts["params"]
    2704
    >>> r.peak_bytes(B=64) > r.peak_bytes(B=8)
    True
    >>> step = fxmem.Step(loss=torch.nn.functional.cross_entropy, device="cpu")
    >>> fxmem.analyze(m, torch.randn(8, 16), torch.randint(0, 4, (8,)), step=step,
    ...               grad_accum=2).grad_accum
    2
    """
    step = Step.of(step, loss=loss, optimizer=optimizer, train=train, device=device, **options)
    request = TraceRequest(model, inputs, targets, step=step, checkpoint=checkpoint,
                           batch_hint=batch_hint, dims=dims, batch_dim=batch_dim,
                           reuse_blocks=reuse_blocks, parallel=parallel)
    return analyze_request(request, retrace)


def analyzer(model, inputs, targets=(), *, step: Step, dims=None, batch_dim=0, parallel=None):
    """The step :func:`analyze` would take from these arguments, not traced: a function of
    :class:`~fxmem.trace.engine.request.TraceRequest` field changes (``parallel=``,
    ``concrete_batch=``, ...) to the report of the step so changed (:func:`analyze_request`),
    as a report's own ``reanalyze`` gives it (``defer=True`` too: the CLI's ways started
    before the first trace, :func:`fxmem.report.ahead.param_dtype_early` and
    :func:`fxmem.report.ranks_ahead.fewest_early`).

    >>> import torch
    >>> from fxmem.trace.engine import Step
    >>> again = analyzer(torch.nn.Linear(8, 2), torch.randn(4, 8),
    ...                  step=Step(loss=lambda o: o.sum(), device="cpu"))
    >>> again(concrete_batch=3).parts["grads"]
    72
    """
    request = TraceRequest(model, inputs, targets, step=step, dims=dims, batch_dim=batch_dim,
                           parallel=parallel)
    return lambda defer=False, **changes: analyze_request(request.but(**changes), defer=defer)


def analyze_request(request: TraceRequest, retrace: bool = False, defer: bool = False,
                    like: tuple | None = None):
    """:func:`analyze` of one :class:`~fxmem.trace.engine.request.TraceRequest` (its
    ``parallel`` as the user gave it; ``retrace``: its checkpoint plan traced for real;
    ``defer``: a parallel step's groups of ranks after the first traced when first read;
    ``like``: ``(strategy, rank 0's trace)`` of this request over another world size of
    FSDP2, which this one's rank 0 is derived from where it can be, :func:`_per_rank`):
    what :func:`analyze`, :func:`min_world_size`, :func:`fxmem.whatif` and every trace a
    report makes again (a plan confirmed, the ways out) call, each with the request it
    was given, some fields changed.

    >>> import torch
    >>> from fxmem.trace.engine import Step
    >>> r = TraceRequest(torch.nn.Linear(8, 2), torch.randn(4, 8),
    ...                  step=Step(loss=lambda o: o.sum(), device="cpu"))
    >>> analyze_request(r).parts["grads"]
    72
    >>> analyze_request(r.but(step=Step(device="cpu", train=False))).parts["grads"]
    0
    """
    given, model = request.parallel, request.model
    if given is None:
        model, parallel = as_wrapped(model)  # a model the user wrapped: as it is
    else:
        parallel = given
        refuse_wrapped(model, parallel)
    request = request.but(model=model)
    as_here = _modes(model)

    made: dict = {}  # the last parallel step made here of each kind: (request, report)

    def reanalyze(*, defer: bool = False, **changes):  # the ways out (fxmem.report.fit):
        again = request.but(**changes)  # FSDP2 over more ranks, ... (defer: as _per_rank's)
        with as_here():
            return _made(made, again, analyze_request(again, defer=defer,
                                                      like=_like(made, again)))
    again_as = {} if given is None and parallel is not None else {"reanalyze": reanalyze}
    if parallel is not None:  # (what is not modelled of compiled parts: before any rank)
        check_parts(model, request.checkpoint, parallel, request.step)
        normalize_plan(model, request.checkpoint, parallel,  # (over blocks compiled in
                       request.step.compile)  # place, by the user or by compile=)
        check_lowerable(model, request.step)
        return _made(made, request, _per_rank(request.but(parallel=parallel), again_as,
                                              defer, like))
    check_parts(model, request.checkpoint, None, None)
    plan = normalize_plan(model, request.checkpoint)
    # the plan is derived from the step traced without it, but over parts compiled on their
    # own: traced, each part lowered with its checkpoint (the partitioner's re-run); and
    # over Hugging Face layers that write a key/value cache, which run without it
    # checkpointed (the derivation would keep the cache the step without the plan writes)
    retrace = retrace or bool(plan and (compiled_parts(model) or drops_a_cache(model, plan)))
    below = _below(as_here, request.but(checkpoint=plan))
    step = request.step

    def again(plan, point=None):  # the planner's confirmation: this step traced with
        with as_here():  # ``plan`` (``point``: (B, {dim: size}), there alone)
            return analyze_request(request.but(checkpoint=plan, **_at_point(point)),
                                   retrace=True)
    if request.dims:
        t = _trace(request)
        return replace(Report.in_dims(t, step.device), below=below,
                       **({} if plan else {"retrace": again}), **again_as)
    t = _trace(request.but(checkpoint=None if plan and not retrace else plan))
    if plan and not retrace:
        runs = Counter(c.path for c in t.calls)
        if t.plan or any(runs[p] > 1 for p in plan.modules):
            return analyze_request(request.but(checkpoint=plan), retrace=True)
        t = derive(t, plan)
    lv = liveness(build_graph(t))
    if plan:
        return Report(lv, parts_of(lv), t.guards, below=below, **again_as)
    return Report(lv, parts_of(lv), t.guards, retrace=again, below=below, **again_as)


def _at_point(point) -> dict:
    """The :class:`~fxmem.trace.engine.request.TraceRequest` fields of a step traced at
    ``point`` = (B, {dim: size}) alone (B and those dims plain ints), or none."""
    if point is None:
        return {}
    return {"concrete_batch": point[0], "concrete_dims": dict(point[1]) or None}


def _kind(parallel):
    """FSDP2's ``parallel`` but for its world size (a key), or None (not FSDP2's, or
    with an option that is no key: ``blocks=[...]``)."""
    if type(parallel) is not FSDP:
        return None
    kind = tuple((f, getattr(parallel, f)) for f in parallel.__dataclass_fields__
                 if f != "world_size")
    try:
        hash(kind)
    except TypeError:
        return None
    return kind


def _made(made: dict, request: TraceRequest, report):
    """``report`` (of ``request``), kept in ``made`` as the last of its parallel kind, and
    returned: another world size's rank 0 may be derived from its (:func:`_like`)."""
    kind = _kind(request.parallel)
    if kind is not None and isinstance(report, ParallelReport):
        made[kind] = request, report
    return report


def _like(made: dict, request: TraceRequest) -> tuple | None:
    """``(strategy, rank 0's trace)`` of ``request``'s step over another world size, from
    the last report of its kind in ``made`` (at ``request``'s B when that is an int: the
    report's rank 0 traced there already), or None."""
    got = made.get(_kind(request.parallel))
    if not got:
        return None
    was, report = got
    lead, b = report.groups[0].report, request.concrete_batch
    if was.differs_in_parallel(request):
        return _lead(report)
    small = b is not None and was.but(concrete_batch=b).differs_in_parallel(request) and \
        lead._traced_at(b, make=False)
    return (report.strategy, small.trace) if small else None


def _lead(report: ParallelReport) -> tuple:
    """``(strategy, rank 0's trace)`` of ``report``."""
    return report.strategy, report.groups[0].report.trace


def _trace(request: TraceRequest):
    """``request`` traced (by this module's :func:`trace`, which tests and the benchmarks'
    logging count), its objects then exempt from the collector's passes while fxmem's
    outermost block lasts (:func:`fxmem.trace.ledger.freeze_more`). Under a checkpoint
    plan (a plan chosen, confirmed: the answer waits on it) in the foreground, a way
    searched ahead in a child stopped meanwhile (:func:`fxmem.report.forked.foreground`)."""
    with foreground() if request.checkpoint else contextlib.nullcontext():
        t = trace(request.model, request.inputs, request.targets, **request.options())
    freeze_more()
    return t


def _below(as_here, request: TraceRequest, guards=()):
    """``(b, values=None) -> Report``: ``request`` traced with B the int ``b``, for a B below
    where the formulas hold, the modules in the modes ``as_here`` restores; ``values``
    (``{dim: size}``, every named dim): traced there alone, a report in B only (a point's
    trace costs less than one in symbols: :meth:`fxmem.Report.at`'s reports ask so)."""
    def below(b, values=None):
        _own_world_free(request.parallel, b, guards)
        point = {"concrete_dims": dict(values)} if values else {}
        with as_here():
            t = _trace(request.but(concrete_batch=b, **point))
        return _report(t, None if values else request.dims, request.step.device)
    return below


def _own_world_free(parallel, b: int, guards) -> None:
    """A rank traced at B=``b`` (below where the formulas hold) runs over fxmem's own fake
    process group, which cannot be made while the caller's is initialised (a model the
    caller wrapped is traced over the caller's: no such limit)."""
    import torch.distributed as dist

    from .errors import InputError
    from .trace.parallel import AsWrapped

    if parallel is None or isinstance(parallel, AsWrapped) or not (
            dist.is_available() and dist.is_initialized()):
        return
    held = ", ".join(map(str, guards))
    raise InputError(f"B={b} is below where this report's formulas hold ({held}), so fxmem "
                     f"traces the step at B={b} over its own fake process group, and a "
                     "process group is initialised already: ask for it before "
                     "init_process_group, or after destroy_process_group")


def _report(t, dims, device: str) -> Report:
    """The report of trace ``t`` (in the named ``dims`` when there are any)."""
    if dims:
        return Report.in_dims(t, device)
    lv = liveness(build_graph(t))
    return Report(lv, parts_of(lv), t.guards)


def _modes(model):
    """A context manager that puts ``model``'s modules back in the train/eval modes they
    have now while it runs, and in the ones they had before it afterwards: a trace made
    later (a plan confirmed, a small B traced) sees the step as :func:`analyze` saw it."""
    modes = [(m, m.training) for m in model.modules()] \
        if isinstance(model, torch.nn.Module) else []  # (not a model: the trace says so)

    @contextlib.contextmanager
    def as_here():
        now = [(m, m.training) for m, _ in modes]
        try:
            for m, mode in modes:
                m.training = mode
            yield
        finally:
            for m, mode in now:
                m.training = mode
    return as_here


def _per_rank(request: TraceRequest, again_as=None, defer: bool = False,
              like: tuple | None = None) -> ParallelReport:
    """One trace per group of alike ranks (the strategy's ``rank_groups``) of ``request``'s
    parallel step; ``defer``: the groups after the first traced when first read (in the
    modules' modes of now), for a search that reads them only where the first fits. The
    groups after the first are derived from its trace where they can be, and the first
    from ``like`` (``(strategy, trace)``: rank 0 of the same step over another world size
    of FSDP2) where it can be
    (:mod:`fxmem.trace.parallel.other_ranks`); else traced."""
    parallel, model = request.parallel, request.model
    check_parallel(parallel)
    plan = normalize_plan(model, request.checkpoint)
    as_here = _modes(model)

    def group(ranks, lead=None, derived_only=False):  # lead: the first group's trace, to
        rank = request.but(checkpoint=plan, rank=ranks[0])  # derive this one from
        t = lead and other_rank(lead, parallel, model, ranks[0], first[0])
        if not t and ranks == first and like is not None:
            t = at_world_size(like[1], like[0], parallel, model)
        if not t and derived_only:
            return None
        if not t:
            with as_here():
                t = _trace(rank)
        below = _below(as_here, rank, t.guards)
        return replace(_report(t, rank.dims, rank.step.device), below=below,
                       **(again_as or {}))
    first, *rest = parallel.rank_groups(model)
    groups = [RankGroup(first, group(first))]
    lead = groups[0].report.trace
    groups += [RankGroup(ranks, make=lambda r=ranks: group(r, lead),
                         derive=lambda r=ranks: group(r, lead, True)) if defer else
               RankGroup(ranks, group(ranks, lead)) for ranks in rest]

    def retrace(plan, defer: bool = False, point=None):  # the planner's confirmation: this
        # step traced with ``plan``; ``point``: (B, {dim: size}), traced there alone
        return _per_rank(request.but(checkpoint=plan, **_at_point(point)), again_as, defer)
    return ParallelReport(parallel, tuple(groups), None if plan else retrace)


def min_world_size(model, inputs, targets=(), loss=UNSET, optimizer=UNSET, train=UNSET,
                   device=UNSET, *, parallel, budget_bytes: int, B: int,  # noqa: N803
                   max_world_size: int = 1024, step: Step | None = None, batch_dim=0,
                   by: str | None = None, **options) -> int:
    """The fewest ranks of ``parallel``'s kind (its other options kept, e.g.
    ``fxmem.FSDP(8, param_dtype=torch.bfloat16)``) on which every rank's step at micro-batch
    ``B`` fits ``budget_bytes``, answered as :meth:`fxmem.Report.max_batch_size` answers
    (``by``; for a CUDA step, the replayed caching allocator). Searched by doubling then
    bisection, each world size analysed as :func:`analyze` does, and checked: the answer
    fits and one rank fewer does not. Raises :class:`fxmem.InfeasibleBudgetError` when even
    ``max_world_size`` ranks do not fit.

    >>> import torch, fxmem
    >>> m = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    >>> fxmem.min_world_size(m, torch.randn(2, 256), loss=lambda o: o.sum(), device="cpu",
    ...                      optimizer=torch.optim.Adam, parallel=fxmem.FSDP(1),
    ...                      budget_bytes=2_500_000, B=16)
    3
    """
    from dataclasses import fields, replace

    from .errors import InfeasibleBudgetError, InputError

    check_parallel(parallel)
    if isinstance(B, bool) or not isinstance(B, int) or B < 1:
        raise InputError(f"B must be a positive int, got {B!r}")
    if "world_size" not in {f.name for f in fields(parallel)}:
        raise InputError(f"min_world_size varies the world size of fxmem.FSDP, fxmem.DDP or "
                         f"fxmem.TP; for {parallel.name}, vary one of its parts")
    step = Step.of(step, loss=loss, optimizer=optimizer, train=train, device=device, **options)
    request = TraceRequest(model, inputs, targets, step=step, batch_dim=batch_dim)
    memo: dict = {}

    def fits(w: int) -> bool:  # (rank 0 derived from the last world size's where it can be)
        if w not in memo:
            last = next(reversed(memo.values()))[1] if memo else None
            r = analyze_request(request.but(parallel=replace(parallel, world_size=w)),
                                like=last and _lead(last))
            try:
                memo[w] = r.max_batch_size(budget_bytes, by=by) >= B, r
            except InfeasibleBudgetError:
                memo[w] = False, r
        return memo[w][0]

    hi = 1
    while not fits(hi):
        if hi >= max_world_size:
            least = memo[hi][1].peak_bytes(B)
            raise InfeasibleBudgetError(
                f"B={B} per rank does not fit {budget_bytes:,} B on {max_world_size} ranks of "
                f"{parallel.name.split(' over ')[0]} (peak {least:,} B there): more ranks, a "
                "smaller B, or a lighter step (mixed precision, checkpointing)",
                minimum_bytes=least)
        hi = min(2 * hi, max_world_size)
    lo = hi // 2  # does not fit (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def plan_checkpoints(model, inputs, targets=(), loss=UNSET, optimizer=UNSET, train=UNSET,
                     device=UNSET, *, budget_bytes: int, B: int, candidates=None,  # noqa: N803
                     kinds=None, step: Step | None = None, batch_hint: int | None = None,
                     batch_dim=0,
                     **options):
    """The checkpoint plan with the least recompute FLOPs whose peak at batch size ``B``
    fits ``budget_bytes``, with its report: a :class:`fxmem.PlanChoice`. The step and the
    other arguments (``batch_dim`` too) as for :func:`analyze`; ``candidates``: module paths
    to choose from (default: the blocks of the model's stacks,
    :func:`fxmem.checkpoint.choose.default_candidates`); ``kinds``: whole modules, groups of
    blocks, selective checkpointing (default: all, :meth:`fxmem.Report.plan_for`). Apply the
    plan with :func:`fxmem.apply_checkpoints`. Raises :class:`fxmem.InfeasibleBudgetError`
    stating the smallest reachable peak when no plan fits.

    >>> import torch, fxmem
    >>> m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
    ...                                               torch.nn.Linear(64, 16)) for _ in range(3)])
    >>> c = fxmem.plan_checkpoints(m, torch.randn(4, 16), loss=lambda o: o.sum(),
    ...                            device="cpu", budget_bytes=350_000, B=256)
    >>> str(c.plan), c.peak_bytes <= 350_000, c.recompute_flops > 0
    ('0', True, True)
    """
    report = analyze(model, inputs, targets, loss, optimizer, train, device, step=step,
                     batch_hint=batch_hint, batch_dim=batch_dim, **options)
    return report.plan_for(budget_bytes, B, candidates, kinds=kinds)
