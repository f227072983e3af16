"""One trace asked for: the step (:class:`~fxmem.trace.engine.step.Step`) of a model on its
inputs, and how to trace it, in one object.

:func:`fxmem.analyze` traces a step more than once: a checkpoint plan confirmed, a batch
size below where the formulas hold, each group of alike ranks, the ways out of a step
that does not fit (more ranks, another plan). Each of those is the first request with a
few fields changed (:meth:`TraceRequest.but`), so an option added here reaches every one
of them.

>>> import torch
>>> r = TraceRequest(torch.nn.Linear(8, 2), torch.randn(4, 8), step=Step(device="cpu"))
>>> r.but(batch_hint=16).batch_hint, r.batch_hint
(16, None)
>>> r.but(grad_accum=2).step.grad_accum  # a field of the step
2
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from .step import Step


def _equal(a, b) -> bool:
    """``a == b`` where that is a bool (a plan's tuples, a step's options); else False."""
    try:
        return bool(a == b) is True
    except Exception:  # noqa: BLE001 (a tensor's ==: not one value)
        return False


@dataclass(frozen=True)
class TraceRequest:
    """A step of ``model`` on ``inputs`` (and ``targets``), traced as :func:`fxmem.trace.trace`
    says for each field: ``step``, the training step; ``checkpoint``, a plan whose forwards
    run under ``torch.utils.checkpoint``; ``batch_hint``, the value of B where the trace
    must decide; ``dims``, other input dims as symbols; ``batch_dim``, where B is;
    ``reuse_blocks``, copy repeated blocks; ``parallel`` and ``rank``, one rank of a
    parallel step; ``concrete_batch``, B as an int; ``concrete_dims``, named dims as ints
    (``{name: size}``); ``warm_up``, one unrecorded step
    first; ``kernel_semantics``, CUDA's kernels for ``device="cuda"``; ``check_parity``,
    the lifted trace checked at another B."""

    model: Any
    inputs: Any
    targets: Any = ()
    step: Step = field(default_factory=Step)
    checkpoint: Any = None
    batch_hint: int | None = None
    dims: Any = None
    batch_dim: Any = 0
    reuse_blocks: bool = True
    parallel: Any = None
    rank: int = 0
    concrete_batch: int | None = None
    warm_up: bool = False
    kernel_semantics: bool = True
    check_parity: bool = True
    concrete_dims: Any = None

    def but(self, **changes) -> TraceRequest:
        """This request with ``changes`` made: to its own fields, or to its step's
        (``amp=``, ``compile=``: :meth:`Step.of`, which names an unknown option)."""
        own = {f.name for f in fields(self)}
        options = {k: changes.pop(k) for k in list(changes) if k not in own}
        if options:
            changes["step"] = Step.of(changes.get("step", self.step), **options)
        return replace(self, **changes)

    def differs_in_parallel(self, other: TraceRequest) -> bool:
        """Is ``other`` this request but for its ``parallel`` (the model, inputs and
        targets the same objects, every other field equal)?

        >>> import torch
        >>> r = TraceRequest(torch.nn.Linear(8, 2), torch.randn(4, 8))
        >>> r.differs_in_parallel(r.but(parallel=2)), r.differs_in_parallel(r.but(rank=1))
        (True, False)
        """
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name != "parallel" and a is not b and (
                    f.name in ("model", "inputs", "targets") or not _equal(a, b)):
                return False
        return True

    def options(self) -> dict:
        """The keywords :func:`fxmem.trace.trace` takes besides the model, inputs and
        targets."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("model", "inputs", "targets")}
