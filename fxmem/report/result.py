"""The result object users hold: :class:`Report`.

A report only reads the analysis results (trace, graph, liveness); it never re-traces.
Every number is in bytes; formulas are sympy expressions in :data:`fxmem.B`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import sympy

from ..checkpoint.flops import FlopCount, count_flops, op_flops
from ..errors import FxmemError, InfeasibleBudgetError, InputError
from ..formula.readable import readable_around
from ..formula.symbols import B
from ..memory.dims import DimsFormula, specialize
from ..memory.graph import build_graph
from ..memory.liveness import PARTS, Liveness, liveness, parts_of
from .points import Breakdown, TimelinePoint, breakdown_of, regimes_of
from .recent import Recent
from .retrace import retrace_at
from .text import render_text


@dataclass(frozen=True)
class Report:
    """Memory of one step as formulas in B, and in the named dims when the step was analysed
    with some (``analyze(..., dims={"L": ...})``: :attr:`dims`). Build it with
    :func:`fxmem.analyze`.

    Every figure at a point takes the batch size and, for a report in named dims, their
    values: ``peak_bytes(B, L=512)``, ``max_batch_size(budget, L=512)``,
    ``breakdown(B, L=512)``, ``timeline``, ``cuda_memory``, ``plan_for``, ``frontier``;
    ``max_length(budget, B)`` solves for a named dim; ``at(L=512)`` is the report in B alone
    at that length (its ``regimes``, ``segments`` and ``with_plan``).

    >>> import torch, fxmem
    >>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8),
    ...                   loss=lambda o: o.sum(), device="cpu")
    >>> r.peak_bytes(B=64) == int(r.peak.subs(fxmem.B, 64)), r.dims
    (True, ())
    """

    liveness: Liveness | None  # None for a report in named dims (see ``named``)
    parts: dict = field(default_factory=dict)
    valid_when: tuple = ()
    named: DimsFormula | None = field(default=None, repr=False)  # formulas in B and the dims
    _at: dict = field(default_factory=dict, repr=False, compare=False)
    retrace: object = field(default=None, repr=False, compare=False)  # plan -> traced Report
    # (and ``point=(B, {dim: size})``: traced there alone, fxmem.report.ways.cheapest_plan)
    # b -> this step traced with B the int b (fxmem.analyze sets it), for a B below where
    # the formulas hold (B = 1 takes other paths in some kernels: ``valid_when``'s B >= 2)
    below: object = field(default=None, repr=False, compare=False)
    # **options -> this step analysed again with other fxmem.analyze options (it sets it)
    reanalyze: object = field(default=None, repr=False, compare=False)

    @classmethod
    def in_dims(cls, trace, device: str) -> "Report":
        """The report of a trace whose named dims are symbols too (``trace.dims``)."""
        formula = DimsFormula(trace, device)
        return cls(None, formula.parts, trace.guards, formula)

    @property
    def dims(self) -> tuple:
        """Names of the input dims beyond B that the formulas are in (``()``: B alone)."""
        return self.named.dims if self.named is not None else ()

    def at(self, **values) -> "Report":
        """The report in B alone with the named dims fixed, e.g. ``at(L=512)``, derived from
        the same trace (cached; ``reanalyze`` gives it too); a report in B alone is its own."""
        if self.named is None:
            self._no_dims(values)
            return self
        key = tuple(sorted(values.items()))
        if key not in self._at:
            t = specialize(self.named.trace, **values)
            lv = liveness(build_graph(t), self.device)
            below = self.below and functools.partial(self._small_at, values)
            again = self.reanalyze and (lambda f=self.reanalyze, **kw: f(**kw).at(**values))
            self._at[key] = Report(lv, parts_of(lv), t.guards, below=below, reanalyze=again,
                                   retrace=retrace_at(self.retrace, values))
        return self._at[key]

    def _small_at(self, values: dict, b: int) -> "Report":
        """The step at ``b`` below the formulas with the dims at ``values`` (:meth:`at`'s):
        read from the trace at ``b`` in the dims where made or :meth:`_in_dims_at`, else
        traced at that point alone (Llama-3.1-8B over 8 GPUs, L=8192: 2.45 s, 2.03 s)."""
        made = self._traced_at(b, make=False)
        if made is None and set(values) == set(self.dims) and \
                b not in self.__dict__.get("_in_dims", ()):
            return self.below(b, values)
        return (made or self._traced_at(b)).at(**values)

    def _in_dims_at(self, b: int) -> None:  # (fxmem.report.fit.in_dims_at; nothing traced)
        """The step at ``b`` is read in the dims by this report's at fixed values."""
        self.__dict__.setdefault("_in_dims", set()).add(b)

    def _small(self, B) -> "Report | None":  # noqa: N803
        """The step traced at B (cached) below min_batch_size (no formula there), else None."""
        b = _check_b(B)
        return None if self.below is None or b >= self.min_batch_size else self._traced_at(b)

    def _traced_at(self, b: int, make: bool = True) -> "Report | None":
        """This step traced with B the int ``b``, once (reports derived from it ask it);
        ``make=False``: only where that was made already (else None: nothing traced)."""
        if b not in (cache := self.__dict__.setdefault("_below_at", {})) and make:
            cache[b] = self.below(b)
        return cache.get(b)

    def _no_dims(self, values: dict) -> None:
        if values:
            raise InputError(f"this report is in B alone, so {', '.join(values)} cannot be "
                             "given: analyze(..., dims={name: [(tensor, dim), ...]}) makes "
                             "an input dim a symbol too")

    def _b_only(self, what: str) -> None:
        if self.named is not None:
            example = ", ".join(f"{n}=..." for n in self.dims)
            raise InputError(f"{what} of a report in B and {', '.join(self.dims)}: ask "
                             f"report.at({example}).{what}")

    def max_length(self, budget_bytes: int, B: int, name: str | None = None,  # noqa: N803
                   limit: int | None = None, **values) -> int:
        """The largest value of the named dim ``name`` (the only one by default) whose peak
        at batch size ``B`` fits in ``budget_bytes``; other named dims in ``values``.
        ``limit``: the model's own maximum, which no shape shows (e.g. GPT-2's
        ``config.n_positions``): never above it, nor past the trace's end (``.beyond``)."""
        if self.named is None:
            raise InputError("max_length needs a report in named dims: analyze(..., "
                             "dims={'L': [(tensor, dim), ...]})")
        if small := self._small(B):
            return small.max_length(budget_bytes, B, name, limit, **values)
        return self.named.max_length(budget_bytes, B, name, limit, **values)

    @functools.cached_property
    def flop_count(self) -> FlopCount:
        """FLOPs of the step (:class:`fxmem.checkpoint.flops.FlopCount`), counted on first use."""
        return count_flops(self.trace, self._op_flops)

    @functools.cached_property
    def _op_flops(self) -> dict:
        """FLOPs per op (:func:`fxmem.checkpoint.flops.op_flops`), shared with the planner."""
        return op_flops(self.trace)

    @property
    def plan(self) -> tuple:
        """The checkpoint plan of the step, a :class:`fxmem.Plan` (empty: none): the modules
        and groups whose forward is recomputed in backward, with the op outputs each keeps."""
        return self.trace.plan

    @functools.cached_property
    def segments(self) -> tuple:
        """Checkpoint candidates: every submodule as a
        :class:`fxmem.checkpoint.segments.Segment`, with whether it is a valid segment and,
        if not, why (a :class:`~fxmem.checkpoint.segments.Segments` tuple, which prints a
        line per module)."""
        from ..checkpoint.segments import segments

        self._b_only("segments")
        return segments(self.liveness.graph)

    def with_plan(self, plan) -> "Report":
        """This step under checkpoint ``plan`` (module paths), derived from this report's
        trace without tracing again (:mod:`fxmem.checkpoint.plans`). The report must have no plan.

        >>> import torch, fxmem
        >>> block = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.GELU(),
        ...                             torch.nn.Linear(64, 8))
        >>> m = torch.nn.Sequential(block, torch.nn.Linear(8, 2))
        >>> r = fxmem.analyze(m, torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu")
        >>> r.with_plan(["0"]).peak_bytes(256) < r.peak_bytes(256)
        True
        """
        from ..checkpoint.plans import derive
        from ..trace.plans import check_plan

        self._b_only("with_plan(plan)")
        plan = check_plan({c.path for c in self.trace.calls}, plan)
        kept = self.__dict__.setdefault("_with_plans", Recent())  # a planner's choice, then
        if plan not in kept:  # its replay, ask for the same plan
            lv = liveness(build_graph(derive(self.trace, plan)), self.device)
            # its replays kept as long as this step (a walk over every rank group asks again)
            lv.__dict__["_replays"] = self.__dict__.setdefault("_plan_replays", {}).setdefault(
                plan, {})
            below = self.below and (lambda b: self._traced_at(b).with_plan(plan))
            kept[plan] = Report(lv, parts_of(lv), self.valid_when, below=below)
        return kept[plan]

    def plan_for(self, budget_bytes: int, B: int, candidates=None, *,  # noqa: N803
                 kinds=None, confirm: bool = True, by: str | None = None,
                 cudnn_workspace: int = 0, **dims):
        """The checkpoint plan with the least recompute FLOPs whose step at batch size ``B``
        fits ``budget_bytes``, as a :class:`fxmem.PlanChoice` (see :mod:`fxmem.checkpoint.options`).
        ``kinds``: what a plan may use, among ``"module"`` (whole blocks), ``"group"``
        (consecutive blocks as one segment), ``"selective"`` (op outputs kept); default
        those three; and ``"compiled"``: ``torch.compile``'s partitioner budgets
        (:mod:`fxmem.checkpoint.compiled`). ``by``: how it fits, as :meth:`max_batch_size`
        answers: ``"device"`` (the default for a CUDA step) the plan's steps run within the
        budget in the caching allocator's replay (:mod:`fxmem.checkpoint.on_device`;
        ``cudnn_workspace`` as for :meth:`runs_on_device`), ``"live"`` its peak fits. For a
        report made by :func:`fxmem.analyze`, the plan is traced (unless ``confirm=False``):
        ``peak_bytes`` and ``report`` are the traced ones (:mod:`fxmem.checkpoint.confirm`).
        Raises :class:`fxmem.InfeasibleBudgetError` (with the least need) when none fits."""
        from ..checkpoint.compiled import plan_for
        from .capacity import plan_by

        kw = dict(kinds=kinds, confirm=confirm, by=by, cudnn_workspace=cudnn_workspace)
        if self.named is not None:
            return self.at(**dims).plan_for(budget_bytes, B, candidates, **kw)
        self._no_dims(dims)
        if small := self._small(B):
            return small.plan_for(budget_bytes, B, candidates, **kw)
        if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool):
            raise InputError(f"budget_bytes must be an int, got {budget_bytes!r}")
        return plan_for(self, budget_bytes, _check_b(B), candidates, kinds, confirm=confirm,
                        by=plan_by(by, self.device), cudnn_workspace=cudnn_workspace)

    def frontier(self, B: int, candidates=None, *, kinds=None, **dims) -> tuple:  # noqa: N803
        """Pareto-optimal checkpoint plans at batch size ``B``: a tuple of
        :class:`fxmem.FrontierPoint` (peak bytes, recompute FLOPs, plan), from no plan
        (largest peak, no recompute) to the smallest peak, each derived exactly
        (``kinds``: see :meth:`plan_for`)."""
        if self.named is not None:
            return self.at(**dims).frontier(B, candidates, kinds=kinds)
        self._no_dims(dims)
        if small := self._small(B):
            return small.frontier(B, candidates, kinds=kinds)
        from ..checkpoint.compiled import frontier
        return frontier(self, _check_b(B), candidates, kinds)

    def _chooser(self, candidates=None, kinds=None):
        """The planner for ``kinds`` over ``candidates`` (:func:`fxmem.checkpoint.options.
        chooser`), made once per question."""
        from ..checkpoint.options import chooser

        return chooser(self, candidates, kinds)

    @property
    def recompute_flops(self) -> sympy.Expr:
        """FLOPs spent re-running checkpointed forwards, a sympy expression in B."""
        return self.flop_count.recompute

    @property
    def device(self) -> str:
        return self.named.device if self.named is not None else self.liveness.device

    @property
    def trace(self):
        return self.named.trace if self.named is not None else self.liveness.graph.trace

    @property
    def unmodelled(self) -> tuple:
        """``(op, module, what)`` for allocations fxmem cannot size (e.g. cuDNN's RNN
        reserve space, oneDNN's RNN scratchpad): the peak leaves them out, and says so here.
        Then the storages whose size is a count the data sets (``grad[mask]``: the number
        of True values of a mask), which the peak takes at their largest: each says whether
        it is live at a point that can be the peak (the peak is then an upper bound) or
        never (the peak is exact whatever the count)."""
        from .unmodelled import unmodelled

        return unmodelled(self)

    @property
    def lifted(self) -> str:
        """How the formulas were obtained when the step fixes B as a Python int (``len(x)``,
        ``int(x.shape[0])``): where, and the batch sizes they were fitted from and checked at
        (:mod:`fxmem.trace.engine.lift`); ``""`` when the trace kept B a symbol."""
        return str(self.trace.lifted) if self.trace.lifted is not None else ""

    @property
    def peak(self) -> sympy.Expr:
        """Peak bytes of the step, a sympy expression in :data:`fxmem.B` (and the named
        dims)."""
        return self.named.peak if self.named is not None else self.liveness.peak

    def readable_peak(self, B: int, **dims):  # noqa: N803
        """The peak around batch size ``B`` (and the named dims' values) as one polynomial
        and where it equals :attr:`peak`: a :class:`fxmem.formula.readable.Readable`.

        >>> import torch, fxmem
        >>> r = fxmem.analyze(torch.nn.Linear(1000, 8), torch.randn(4, 1000), loss=torch.sum)
        >>> p = r.readable_peak(64); p.formula, p.exact_when, p.error  # CUDA's 512-byte blocks
        (4000*B + 66560, ('B a multiple of 16', 'B <= 1010'), (0, 480))
        """
        if (small := self._small(B)) or self.peak_bytes(B, **dims) is None:  # a valid point
            return small.readable_peak(B, **dims)
        return readable_around(self.peak, self.valid_when, B, **dims)

    def peak_bytes(self, B: int, **dims) -> int:  # noqa: N803 - the batch size is B everywhere
        """Peak bytes at batch size ``B`` (and the named dims' values), exact."""
        if small := self._small(B):
            return small.peak_bytes(B, **dims)
        if self.named is not None:
            return self.named.peak_bytes(B, **dims)
        self._no_dims(dims)
        return self.liveness.peak_bytes(_check_b(B))

    def cuda_memory(self, B: int, config=None, compute_capability=None,  # noqa: N803
                    cublas_workspace: int | None = None, cudnn_workspace: int = 0, **dims):
        """What ``torch.cuda.max_memory_allocated()`` and ``max_memory_reserved()`` would
        report for the step at batch size ``B``: the step replayed through the CUDA caching
        allocator (``config``: a :class:`fxmem.device.caching_allocator.AllocatorConfig`, e.g.
        ``AllocatorConfig.from_string("expandable_segments:True")``) with the cuBLAS
        workspaces PyTorch keeps (32 MiB per thread on compute capability 9.x). A
        :class:`fxmem.device.allocator.DeviceMemory`; see
        :func:`fxmem.device.allocator.cuda_memory`. ``cudnn_workspace``: bytes each cuDNN
        convolution holds while it runs (a bound under ``CUDNN_CONV_WSCAP_DBG``); 0 leaves them out.
        ``compute_capability``: the GPU's, for the workspace sizes (default: the one the step
        was traced for, ``analyze(..., compute_capability=)``).

        >>> import torch, fxmem
        >>> r = fxmem.analyze(torch.nn.Linear(1024, 1024), torch.randn(4, 1024),
        ...                   loss=lambda o: o.sum(), optimizer=torch.optim.SGD)
        >>> d = r.cuda_memory(64)
        >>> d.max_allocated > r.peak_bytes(64)   # + cuBLAS's workspaces (32 MiB on sm90)
        True
        >>> d.max_reserved >= d.max_allocated
        True
        """
        from ..device.allocator import cuda_memory

        if self.named is not None:
            return self.at(**dims).cuda_memory(B, config, compute_capability,
                                               cublas_workspace, cudnn_workspace)
        self._no_dims(dims)
        if small := self._small(B):
            return small.cuda_memory(B, config, compute_capability, cublas_workspace,
                                     cudnn_workspace)
        if compute_capability is None:
            compute_capability = self.liveness.graph.trace.compute_capability
        return cuda_memory(self.liveness, _check_b(B), config, compute_capability,
                           cublas_workspace, cudnn_workspace)

    @property
    def regimes(self) -> tuple:
        """Where the peak is, by range of B: a tuple of :class:`PeakRegime`."""
        self._b_only("regimes")
        return regimes_of(self)

    def breakdown(self, B: int, top: int | None = None, **dims) -> Breakdown:  # noqa: N803
        """What is live at the peak at batch size ``B`` (and the named dims' values), by
        category and by module."""
        if self.named is not None:
            return self.at(**dims).breakdown(B, top)
        self._no_dims(dims)
        if small := self._small(B):
            return small.breakdown(B, top)
        return breakdown_of(self, _check_b(B), top)

    def timeline(self, B: int, **dims) -> tuple:  # noqa: N803
        """Live bytes after every op at batch size ``B`` (and the named dims' values): a
        tuple of :class:`TimelinePoint`."""
        if self.named is not None:
            return self.at(**dims).timeline(B)
        self._no_dims(dims)
        if small := self._small(B):
            return small.timeline(B)
        live = self.liveness.timeline(_check_b(B))
        return tuple(TimelinePoint(o.index, o.op, o.phase, o.module, v)
                     for o, v in zip(self.trace.ops, live))

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step (``analyze(..., grad_accum=k)``); B is one of them."""
        return self.trace.grad_accum

    def effective_batch_size(self, B: int) -> int:  # noqa: N803
        """Samples per optimizer step at micro-batch ``B``: ``grad_accum * B``.

        >>> import torch, fxmem
        >>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(),
        ...                   optimizer=torch.optim.SGD, device="cpu", grad_accum=4)
        >>> r.grad_accum, r.effective_batch_size(16)
        (4, 64)
        """
        return self.grad_accum * _check_b(B)

    @property
    def min_batch_size(self) -> int:
        """The smallest B the formula is valid for (from ``valid_when``)."""
        for g in self.valid_when:
            if isinstance(g, sympy.GreaterThan) and g.lhs == B:
                return int(g.rhs)
        return 1

    @property
    def least_batch_size(self) -> int:
        """The smallest B this report answers at: 1 when it can trace the step at a B below
        :attr:`min_batch_size` (``below``, set by :func:`fxmem.analyze`), else
        :attr:`min_batch_size`."""
        return 1 if self.below is not None else self.min_batch_size

    def start_batch_size(self, fits) -> int | None:
        """Where a search for the largest B with ``fits(B)`` starts: :attr:`min_batch_size`
        when it fits, else the largest smaller B that fits (the step traced at it), else
        None. A smaller B is traced only when :attr:`min_batch_size` does not fit."""
        lo = self.min_batch_size
        if fits(lo):
            return lo
        return next((b for b in range(lo - 1, self.least_batch_size - 1, -1) if fits(b)), None)

    @property
    def max_valid_batch_size(self) -> int | None:
        """The largest B the formula is valid for (a ``B <= n`` in ``valid_when``, e.g. a
        step that slices a fixed table by B), or None when it has no upper limit."""
        for g in self.valid_when:
            if isinstance(g, sympy.LessThan) and g.lhs == B:
                return int(g.rhs)
        return None

    def max_batch_size(self, budget_bytes: int | None = None,
                       max_recompute: float | None = None, candidates=None, *,
                       kinds=None, by: str | None = None, gpu=None, context_bytes=None,
                       config=None, cudnn_workspace: int = 0, confirm: bool = True, **dims):
        """The largest integer B that fits, as a :class:`fxmem.report.capacity.MaxBatchSize`
        (an ``int`` whose ``.by`` and ``.explain`` say what it answers):

        * ``by="device"`` (the default for a CUDA step): the largest B whose steps
          **run**, replayed through the CUDA caching allocator with its free-and-retry on
          out-of-memory (:meth:`runs_on_device`), within ``budget_bytes`` of device memory:
          what the allocator can get, i.e. the card's capacity minus the CUDA context.
          ``gpu="H100-80GB"`` takes that from a known card instead
          (:mod:`fxmem.device.gpus`; ``context_bytes``: the CUDA context, default 512 MiB).
          ``B + 1`` runs out of memory in the same replay.
        * ``by="allocated"``: the largest B whose predicted ``max_memory_allocated()`` fits.
        * ``by="live"`` (the default on the CPU): the peak formula, solved.

        With ``max_recompute`` (a fraction, e.g. ``0.25``): the largest B that fits, as ``by``
        answers (``"device"`` or ``"live"``), with a checkpoint plan re-running at most that
        share of the step's FLOPs (on CUDA the plan's steps run in the allocator's replay:
        :mod:`fxmem.checkpoint.on_device`), the same
        :class:`~fxmem.report.capacity.MaxBatchSize` carrying its plan (``.plan``,
        ``.peak_bytes``, ``.recompute_flops``, ``.report``; ``.choice``, the
        :class:`fxmem.PlanChoice`), traced as :meth:`plan_for`'s (``confirm``);
        ``candidates``: module paths (default: :func:`fxmem.checkpoint.choose.default_candidates`).
        Without it, ``.plan`` is empty: ``fxmem.apply_checkpoints(model, b.plan)`` does for
        either.

        Raises :class:`fxmem.InfeasibleBudgetError` if even the smallest valid B does not fit.
        A report in named dims takes their values too (``max_batch_size(budget, L=512)``).

        >>> import torch, fxmem
        >>> r = fxmem.analyze(torch.nn.Linear(1024, 1024), torch.randn(4, 1024),
        ...                   loss=lambda o: o.sum(), optimizer=torch.optim.SGD)
        >>> card, live = r.max_batch_size(2**30), r.max_batch_size(2**30, by="live")
        >>> card.by, live.by, card < live          # the allocator's blocks and workspaces
        ('device', 'live', True)
        >>> r.max_batch_size(gpu="A100-40GB").explain[:43]
        'the largest B whose steps, replayed through'
        """
        from ..device.gpus import gpu as lookup_gpu
        from .capacity import MaxBatchSize, _start, check_by, device_max_batch_size, search

        if self.named is not None:
            return self.at(**dims).max_batch_size(
                budget_bytes, max_recompute, candidates, kinds=kinds, by=by, gpu=gpu,
                context_bytes=context_bytes, config=config, cudnn_workspace=cudnn_workspace,
                confirm=confirm)
        self._no_dims(dims)
        card = ""
        if gpu is not None:
            if budget_bytes is not None:
                raise InputError("give either budget_bytes or gpu, not both")
            g = lookup_gpu(gpu)
            card, budget_bytes = g.name, g.usable_bytes(context_bytes)
            by = "device" if by is None else by
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int):
            hint = (f": write {int(budget_bytes)} or e.g. 8 * 2**30" if isinstance(
                budget_bytes, float) and budget_bytes.is_integer() else
                    " (bytes), e.g. 8 * 2**30 for 8 GiB")
            raise InputError(f"budget_bytes must be an int{hint}, got {budget_bytes!r}")
        if budget_bytes <= 0:
            raise InputError(f"budget_bytes must be positive, got {budget_bytes:,}")
        by = check_by(by, self.device)
        if max_recompute is not None:
            from ..checkpoint.compiled import max_batch_size
            from .capacity import plan_by

            by = plan_by(by, self.device)
            return MaxBatchSize.with_plan(max_batch_size(
                self, budget_bytes, max_recompute, candidates, kinds, by=by, confirm=confirm,
                cudnn_workspace=cudnn_workspace), budget_bytes, by=by, gpu=card)
        if by == "device":
            return device_max_batch_size(self, budget_bytes, config=config,
                                         cudnn_workspace=cudnn_workspace, gpu=card)
        if by == "allocated":
            most = self.cuda_max_batch_size(budget_bytes, config,
                                            cudnn_workspace=cudnn_workspace)
            return MaxBatchSize(most, by=by, budget_bytes=budget_bytes, gpu=card,
                                limit=most == self.max_valid_batch_size)
        lo = _start(self, lambda b: self.peak_bytes(b) <= budget_bytes, budget_bytes, live=True)
        if lo is None:
            least = self.peak_bytes(self.least_batch_size)
            raise InfeasibleBudgetError(
                f"budget {budget_bytes:,} B is below the smallest peak {least:,} B "
                f"(at B={self.least_batch_size}); memory that does not depend on B alone is "
                f"{self.fixed_bytes:,} B", minimum_bytes=least)
        if lo < self.min_batch_size:  # traced at lo; lo + 1 does not fit
            return MaxBatchSize(lo, by="live", budget_bytes=budget_bytes, gpu=card)
        if self.peak_bytes(lo) == self.peak_bytes(2 * lo + 1) == self.peak_bytes(10**9):
            raise FxmemError("the peak does not grow with B, so every batch size fits")
        most, limit = search(lambda b: self.peak_bytes(b) <= budget_bytes, lo, None,
                             self.max_valid_batch_size)
        return MaxBatchSize(most, by="live", budget_bytes=budget_bytes, gpu=card, limit=limit)

    def runs_on_device(self, B: int, capacity_bytes: int, config=None,  # noqa: N803
                       compute_capability=None, cudnn_workspace: int = 0, **dims):
        """Whether training at batch size ``B`` runs on a CUDA device whose caching allocator
        can get ``capacity_bytes`` (the card's capacity minus the CUDA context): steps
        replayed through the allocator, with its free-cache-and-retry on out-of-memory, until
        they need no new device memory. A :class:`fxmem.device.allocator.DeviceRun`
        (``.fits``, ``.oom``: where it ran out); see
        :func:`fxmem.device.allocator.run_on_device`."""
        from ..device.allocator import run_at_dims, run_on_device

        if self.named is not None:  # at the dims' values (a run, or None: the report there)
            return run_at_dims(self.named, B, dims, capacity_bytes, config, compute_capability,
                               cudnn_workspace) or self.at(**dims).runs_on_device(
                B, capacity_bytes, config, compute_capability, cudnn_workspace)
        self._no_dims(dims)
        if self.device != "cuda":
            raise InputError("runs_on_device replays the CUDA caching allocator: analyse the "
                             "step with device='cuda'")
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int) \
                or capacity_bytes <= 0:
            raise InputError(f"capacity_bytes must be a positive int, got {capacity_bytes!r}")
        if small := self._small(B):
            return small.runs_on_device(B, capacity_bytes, config, compute_capability,
                                        cudnn_workspace)
        if compute_capability is None:
            compute_capability = self.liveness.graph.trace.compute_capability
        return run_on_device(self.liveness, _check_b(B), capacity_bytes, config,
                             compute_capability, cudnn_workspace=cudnn_workspace)

    def fits(self, B: int, budget_bytes: int | None = None, *, gpu=None,  # noqa: N803
             context_bytes: int | None = None, ways: bool = True, limit: int | None = None,
             **options):
        """Whether the step at batch size ``B`` fits ``budget_bytes`` (or a card, ``gpu``,
        less ``context_bytes``) as the headline answers it (a CUDA step: the allocator's
        replay runs), by how much it is over, and the ways that make it fit, each checked:
        a :class:`fxmem.report.fit.Fit` (``bool(fit)``: it fits). A report in named dims
        takes their values (``fits(2, budget, L=8192)``; ``limit``: the model's longest);
        ``options``: ``by``, ``cudnn_workspace``; see :func:`fxmem.report.fit.fit`."""
        from ..device.gpus import gpu as lookup_gpu
        from .fit import fit

        if gpu is not None:
            if budget_bytes is not None:
                raise InputError("give either budget_bytes or gpu, not both")
            budget_bytes = lookup_gpu(gpu).usable_bytes(context_bytes)
        dims = {n: options.pop(n) for n in self.dims if n in options}
        whole = options.pop("report", self)  # a ParallelReport's, through its first rank's
        named = whole if whole.dims else None
        return fit(whole.at(**dims) if named else whole, B, budget_bytes, named=named,
                   dims=dims, limit=limit, ways=ways, reanalyze=self.reanalyze, **options)

    def cuda_max_batch_size(self, budget_bytes: int, config=None, compute_capability=None,
                            cudnn_workspace: int = 0, **dims) -> int:
        """The largest B whose predicted ``torch.cuda.max_memory_allocated()``
        (:meth:`cuda_memory`: allocator blocks, their slack, the cuBLAS workspaces, and
        ``cudnn_workspace`` bytes held by each convolution) fits in ``budget_bytes``. Raises
        :class:`fxmem.InfeasibleBudgetError` when none does. ``max_batch_size(budget,
        by="allocated")`` is the same number, saying so.

        >>> import torch, fxmem
        >>> r = fxmem.analyze(torch.nn.Linear(1024, 1024), torch.randn(4, 1024),
        ...                   loss=lambda o: o.sum(), optimizer=torch.optim.SGD)
        >>> r.cuda_max_batch_size(2**30) < r.max_batch_size(2**30, by="live")  # workspaces
        True
        """
        from .capacity import allocated_max_batch_size

        if self.named is not None:
            return self.at(**dims).cuda_max_batch_size(budget_bytes, config,
                                                       compute_capability, cudnn_workspace)
        self._no_dims(dims)
        return allocated_max_batch_size(self, budget_bytes, config, compute_capability,
                                        cudnn_workspace)

    @property
    def fixed_bytes(self) -> int:
        """Bytes that do not depend on B: params, buffers, grads, optimizer state."""
        return sum(int(self.parts[p].subs(B, 0)) for p in PARTS[:5] if p != "inputs")

    def __repr__(self) -> str:
        dims = "".join(f", {n}" for n in self.dims)
        plan = f", checkpoint plan {self.plan}" if self.plan else ""
        return (f"<fxmem.Report in B{dims} on {self.device}{plan}: peak {self.peak} bytes, "
                f"valid when {', '.join(map(str, self.valid_when)) or 'B >= 1'}>")

    def __str__(self) -> str:
        return render_text(self)


def _check_b(b) -> int:
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise InputError(f"B must be a positive int, got {b!r}")
    return b
