"""The seed article's six ways to save memory, each answered as a formula in B.

:func:`whatif` analyses the user's step once as it is (the baseline) and once per method,
with the same API a user would call for each, and returns one :class:`WhatIf` row per method:
its peak formula, its peak at the user's batch size, the largest batch size for a budget,
and the change against the baseline. :func:`fxmem.report.whatif.render_markdown` prints them.

>>> import torch, fxmem
>>> m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
>>> rows = fxmem.whatif(m, torch.randn(8, 16), torch.randint(0, 4, (8,)),
...                     loss=torch.nn.functional.cross_entropy, optimizer=torch.optim.Adam,
...                     B=64, budget_bytes=2**20, device="cpu")
>>> [r.method for r in rows]
['baseline', 'smaller batch', 'mixed precision', 'gradient accumulation', 'no_grad evaluation', 'checkpointing']
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from .analyze import analyze_request
from .errors import InfeasibleBudgetError, InputError
from .trace.engine import UNSET, Step, TraceRequest, make_spec
from .trace.parallel import refuse_wrapped


@dataclass(frozen=True)
class WhatIf:
    """One way to save memory, at the user's batch size ``B``.

    ``peak``: peak bytes as a formula in B (the micro-batch for gradient accumulation);
    ``peak_bytes``: at the batch size the row evaluates (``B_used``); ``max_batch_size``: the
    largest batch (samples per optimizer step) within the budget, ``None`` when no batch
    size fits, answered as :meth:`fxmem.Report.max_batch_size` answers (``by``: ``"device"``,
    the steps run through the CUDA caching allocator, for a CUDA step; ``"live"``, live
    tensors, on the CPU); ``change_bytes``: ``peak_bytes`` minus the baseline's at ``B``;
    ``note``: what the row assumes.
    """

    method: str
    peak: sympy.Expr
    B_used: int
    peak_bytes: int
    max_batch_size: int | None
    change_bytes: int
    note: str
    by: str = "live"


def whatif(model, inputs, targets=(), loss=UNSET, optimizer=UNSET, *, B: int,  # noqa: N803
           budget_bytes: int, device=UNSET, step: Step | None = None, smaller_model=None,
           amp=torch.bfloat16, grad_accum: int = 4, checkpoint=None, batch_dim=0,
           parallel=None, **options) -> tuple:
    """The seed's six methods for the user's step, as :class:`WhatIf` rows.

    The step is ``step`` with the options given here, as for :func:`fxmem.analyze` (a
    training step; ``amp`` and ``grad_accum`` below are the alternatives tried, not options
    of the step). ``smaller_model``: a smaller version of ``model`` to compare (row left out
    if None). ``amp``: the autocast dtype, with the device's op lists (float16 training
    steps through a GradScaler). ``grad_accum``: k micro-batches of ``B // k`` keep the
    effective batch ``B``. ``checkpoint``: a plan; default: the plan with the smallest peak
    at ``B`` among the candidates (:meth:`fxmem.Report.frontier`). ``batch_dim``: where B
    is in the inputs and targets, as for :func:`fxmem.analyze`. ``parallel``: a sharding to
    compare (:class:`fxmem.FSDP`): one more row, the step on each of its ranks with B per
    rank (its peak the largest rank's, its largest B the one every rank fits).
    """
    if isinstance(B, bool) or not isinstance(B, int) or B < 1:
        raise InputError(f"B must be a positive int, got {B!r}")
    refuse_wrapped(model, parallel, "whatif")  # its rows are the unwrapped model's
    step = Step.of(step, loss=loss, optimizer=optimizer, device=device, **options)
    spec = make_spec(model, inputs, targets, step, batch_dim)

    request = TraceRequest(model, inputs, targets, step=step, batch_dim=spec.batch_dims)
    base = analyze_request(request)
    b0 = base.peak_bytes(B)
    rows = []

    def row(method, report, b, note, scale=1):
        try:
            most = report.max_batch_size(budget_bytes)
            by, most = most.by, scale * int(most)
        except InfeasibleBudgetError:
            most, by = None, "device" if report.device == "cuda" else "live"
        rows.append(WhatIf(method, report.peak, b, report.peak_bytes(b), most,
                           report.peak_bytes(b) - b0, note, by))

    row("baseline", base, B, "the step as given" if parallel is None else
        f"the step on one device, without {parallel.name}")
    half = max(base.min_batch_size, B // 2)
    row("smaller batch", base, half, f"B = {half} instead of {B}: the same formula")
    if smaller_model is not None:
        row("smaller model", analyze_request(request.but(model=smaller_model)), B,
            "the model passed as smaller_model")
    if amp is not None:
        mixed = Step.of(step, amp=amp)
        scaler = " with a GradScaler" if mixed.scaled else ""
        row("mixed precision", analyze_request(request.but(step=mixed)), B,
            f"forward and loss under torch.autocast('{step.device}', {amp}){scaler}")
    k = grad_accum
    micro = max(1, B // k)
    row("gradient accumulation",
        analyze_request(request.but(grad_accum=k)), micro,
        f"{k} micro-batches of {micro}; largest batch = {k} x the largest micro-batch", k)
    evaluation = Step.of(step, loss=None, optimizer=None, train=False, grad_accum=1,
                         grad_scaler=None, set_to_none=True)
    evaluated = request.but(targets=(), batch_dim=spec.batch_dims[:len(spec.inputs)],
                            step=evaluation)  # no targets
    row("no_grad evaluation", analyze_request(evaluated), B,
        "inference under torch.no_grad(): no backward, no optimizer")
    plan = checkpoint
    if plan is None:
        front = base.frontier(B)
        plan = front[-1].plan if front else ()
    planned = base.with_plan(plan)
    row("checkpointing", planned, B,
        f"plan {', '.join(map(str, plan))}" if plan else "no checkpoint plan lowers the peak")
    if parallel is not None:
        sharded = analyze_request(request.but(parallel=parallel))
        row("sharding", sharded, B, f"{parallel.name}: B per rank, the rank with the "
            "largest peak")
    return tuple(rows)
