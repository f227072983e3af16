"""Exceptions raised by fxmem.

Every error fxmem raises on bad input is a :class:`FxmemError`, with a one-line message.
Errors that happen while tracing name the aten op, the module path and the user's source
line, so the user knows where to look.
"""

from __future__ import annotations

import re


def one_line(text: str, limit: int = 400) -> str:
    r"""``text`` (another library's message, perhaps of several lines) as one line of at
    most ``limit`` characters.

    >>> one_line("Validation error for field 'n_layer':\n  TypeError: expected int")
    "Validation error for field 'n_layer': TypeError: expected int"
    """
    text = re.sub(r"\s*\n\s*", " ", str(text).strip())
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


class FxmemError(Exception):
    """Base class of every error fxmem raises on purpose."""


class InputError(FxmemError, ValueError):
    """The arguments given to :func:`fxmem.analyze` or :func:`fxmem.measure` are unusable."""


class TraceError(FxmemError):
    """The step could not be traced on fake tensors.

    Attributes name where it happened: ``op`` (aten op or ``None``), ``module`` (module path,
    ``""`` for the root) and ``source`` (``"file.py:LINE in function"`` of the user's code).
    """

    def __init__(self, reason: str, *, op: str | None = None, module: str | None = None,
                 source: str | None = None, phase: str | None = None):
        self.reason, self.op, self.module = reason, op, module
        self.source, self.phase = source, phase
        where = []
        if op:
            where.append(f"op {op}")
        if module is not None:
            where.append(f"module {module or '(root)'}")
        if phase:
            where.append(f"during {phase}")
        if source:
            where.append(f"at {source}")
        super().__init__(f"{reason} ({', '.join(where)})" if where else reason)


class ModelError(TraceError):
    """The model itself fails at an op on these shapes or dtypes, as eager PyTorch would:
    not a limit of tracing (checked by running the op on meta tensors of the example's
    concrete sizes, with no fake tensor nor symbol involved)."""


class SpecializationError(TraceError):
    """The batch size was fixed to a number while tracing, so no formula in B exists."""


class DataDependentError(TraceError):
    """The step depends on a tensor's value, which fake tensors do not have: Python control
    flow on a value read from a tensor (``if x.sum() > 0``, ``bool(t)``, a LayerDrop draw),
    or a storage whose size such a value sets with no bound fxmem knows. The message names
    the line and what to do (for a Hugging Face model, the config flag responsible)."""


class InfeasibleBudgetError(FxmemError):
    """No batch size fits the budget. ``minimum_bytes`` is the smallest peak reachable."""

    def __init__(self, message: str, *, minimum_bytes: int):
        self.minimum_bytes = minimum_bytes
        super().__init__(message)
