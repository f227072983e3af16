"""The one-call pipeline: trace -> graph -> liveness -> :class:`fxmem.Report`."""

from __future__ import annotations

from collections import Counter

from .checkpoint.plans import derive
from .memory.graph import build_graph
from .memory.liveness import liveness, parts_of
from .report.result import Report
from .trace.checkpointing import normalize_plan
from .trace.tracer import trace
from .trace.tracking import frozen_gc


@frozen_gc()
def analyze(model, inputs, targets=(), loss=None, optimizer=None, train=True,
            device="cuda", *, checkpoint=None, retrace: bool = False,
            set_to_none: bool = True, grad_accum: int = 1, inference_mode: bool = False,
            amp=None, grad_scaler: bool | None = None,
            batch_hint: int | None = None, dims=None, reuse_blocks: bool = True,
            compute_capability=(9, 0)):
    """Analyse one step of ``model`` and return its memory as formulas in :data:`fxmem.B`.

    ``inputs``: a tensor or tuple of tensors, dim 0 of each is B (only shapes and dtypes are
    used; they may be on the meta device). ``targets``: tensors passed to ``loss`` after the
    model output. ``loss(output, *targets)``; ``None``: the output is the loss or has
    ``.loss``. ``optimizer``: an optimizer class or ``callable(params)``; ``None``: no step.
    ``train=False``: inference under ``torch.no_grad()``. ``device``: ``"cuda"`` counts
    allocator blocks (512-byte rounding) and CUDA's optimizer defaults; ``"cpu"``: live bytes.
    ``checkpoint``: a plan, module paths whose forward is recomputed in backward
    (``torch.utils.checkpoint``, non-reentrant); modules already wrapped with
    ``checkpoint_wrapper`` count too. The plan's schedule is derived from one trace of the
    step without it (:meth:`Report.with_plan`); it is traced with ``torch.utils.checkpoint``
    really running when ``retrace=True``, when a module of the plan runs more than once
    per step, or when the model already has checkpointed modules. ``set_to_none=False``:
    ``zero_grad`` zeroes gradients in place, so they stay allocated between steps (counted
    from the start of the step). ``grad_accum=k``: k forward-backward passes on micro-batches
    of B (loss divided by k) accumulate gradients before one optimizer step; the effective
    batch is k·B (:meth:`Report.effective_batch_size`). ``batch_hint``: the value of B used
    where the trace must decide something (default: the inputs' dim 0, or 8).
    ``inference_mode=True`` (with ``train=False``): under ``torch.inference_mode()``.
    ``amp=torch.bfloat16`` (or float16): forward and loss under ``torch.autocast`` with the
    target device's op lists (CUDA's are emulated: :mod:`fxmem.trace.amp`). ``grad_scaler``: the
    loss is scaled and the optimizer stepped through ``torch.amp.GradScaler`` (default:
    with ``amp=torch.float16`` and an optimizer, as the AMP recipe does). ``dims``: other
    input dims as symbols, e.g. ``{"L": [(0, 1)]}`` (dim 1 of tensor 0; tensors are the
    inputs, then the targets): returns a :class:`fxmem.dims.DimsReport` in B and L (a
    checkpoint plan is then traced for real). ``reuse_blocks=False``: trace every block of a
    stack of identical blocks instead of copying the second one's trace (:mod:`fxmem.trace.reuse`;
    the result is the same, it only takes longer). ``compute_capability``: the GPU whose
    kernels ``device="cuda"`` follows, ``(major, minor)`` (default ``(9, 0)``, an H100):
    which attention kernel ``scaled_dot_product_attention`` runs depends on it
    (:mod:`fxmem.trace.cuda.kernels`).

    >>> import torch, fxmem
    >>> m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    >>> r = fxmem.analyze(m, torch.randn(8, 16), torch.randint(0, 4, (8,)),
    ...                   loss=torch.nn.functional.cross_entropy,
    ...                   optimizer=torch.optim.Adam, device="cpu")
    >>> r.parts["params"]
    2704
    >>> r.peak_bytes(B=64) > r.peak_bytes(B=8)
    True
    """
    if dims:
        from .dims import DimsReport

        t = trace(model, inputs, targets, loss, optimizer, train, device,
                  batch_hint=batch_hint, checkpoint=checkpoint, set_to_none=set_to_none,
                  grad_accum=grad_accum, inference_mode=inference_mode, amp=amp,
                  grad_scaler=grad_scaler, dims=dims, reuse_blocks=reuse_blocks,
                  compute_capability=compute_capability)
        return DimsReport(t, device)
    plan = normalize_plan(model, checkpoint)
    t = trace(model, inputs, targets, loss, optimizer, train, device, batch_hint=batch_hint,
              checkpoint=None if plan and not retrace else plan, set_to_none=set_to_none,
              grad_accum=grad_accum, inference_mode=inference_mode, amp=amp,
              grad_scaler=grad_scaler, reuse_blocks=reuse_blocks,
              compute_capability=compute_capability)
    if plan and not retrace:
        runs = Counter(c.path for c in t.calls)
        if t.plan or any(runs[p] > 1 for p in plan):
            return analyze(model, inputs, targets, loss, optimizer, train, device,
                           checkpoint=plan, retrace=True, set_to_none=set_to_none,
                           grad_accum=grad_accum, inference_mode=inference_mode,
                           amp=amp, grad_scaler=grad_scaler, batch_hint=batch_hint,
                           reuse_blocks=reuse_blocks,
                           compute_capability=compute_capability)
        t = derive(t, plan)
    lv = liveness(build_graph(t))
    return Report(lv, parts_of(lv), t.guards)


def plan_checkpoints(model, inputs, targets=(), loss=None, optimizer=None, train=True,
                     device="cuda", *, budget_bytes: int, B: int, candidates=None,  # noqa: N803
                     batch_hint: int | None = None):
    """The checkpoint plan with the least recompute FLOPs whose peak at batch size ``B``
    fits ``budget_bytes``, with its report: a :class:`fxmem.PlanChoice`. Arguments as for
    :func:`analyze`; ``candidates``: module paths to choose from (default: the blocks of
    the model's stacks, :func:`fxmem.checkpoint.choose.default_candidates`). Apply the plan with
    :func:`fxmem.apply_checkpoints`. Raises :class:`fxmem.InfeasibleBudgetError` stating the
    smallest reachable peak when no plan fits.

    >>> import torch, fxmem
    >>> m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
    ...                                               torch.nn.Linear(64, 16)) for _ in range(3)])
    >>> c = fxmem.plan_checkpoints(m, torch.randn(4, 16), loss=lambda o: o.sum(),
    ...                            device="cpu", budget_bytes=350_000, B=256)
    >>> c.plan, c.peak_bytes <= 350_000, c.recompute_flops > 0
    (('0',), True, True)
    """
    report = analyze(model, inputs, targets, loss, optimizer, train, device,
                     batch_hint=batch_hint)
    return report.plan_for(budget_bytes, B, candidates)
