"""A drop-in for ``accelerate.utils.find_executable_batch_size`` that starts at fxmem's answer.

accelerate's decorator runs the training function at ``starting_batch_size`` and, after
each out-of-memory error, again at a smaller batch size (``reduce_batch_size_fn``; by
default 90 % of the last one in accelerate 1.x, half in earlier releases). Every failed try
is real work on the GPU. :func:`find_executable_batch_size` has the same call shape; given
``prediction`` (a :class:`fxmem.Report` of the step with a budget, a
:class:`fxmem.integrations.hf.TrainerFit`, or a batch size) it starts at the largest batch
size fxmem predicts to fit, so the first try does not run out of memory, and hands the
function to accelerate's own decorator, whose fallback still catches a real out-of-memory
(something the prediction does not model: another process on the card, fragmentation of a
longer run).

>>> import torch, fxmem
>>> from fxmem.integrations.accelerate import find_executable_batch_size
>>> m = torch.nn.Linear(256, 256)
>>> r = fxmem.analyze(m, torch.randn(4, 256), loss=lambda o: o.sum(), device="cpu",
...                   optimizer=torch.optim.SGD)
>>> @find_executable_batch_size(prediction=r, budget_bytes=r.peak_bytes(100))
... def train(batch_size):
...     return batch_size
>>> train()
100
"""

from __future__ import annotations

from ..errors import InputError


def _accelerate():
    try:
        import accelerate.utils
    except ImportError:
        raise InputError("fxmem.integrations.accelerate needs accelerate: pip install "
                         "'fxmem[hf]'") from None
    return accelerate.utils


def start_from(prediction, budget_bytes: int | None = None, **options) -> int:
    """The batch size to start at: ``prediction``'s ``per_device_train_batch_size`` (a
    :class:`fxmem.integrations.hf.TrainerFit`), a report's ``max_batch_size(budget_bytes,
    **options)`` (``options``: ``by``, ``gpu``, ``context_bytes``, ...; without a budget on a
    machine with CUDA, the current device's total memory less ``context_bytes``, default
    512 MiB), or a positive int as it is."""
    if isinstance(prediction, int) and not isinstance(prediction, bool):
        if prediction < 1:
            raise InputError(f"prediction must be a positive batch size, got {prediction}")
        return prediction
    fit = getattr(prediction, "per_device_train_batch_size", None)
    if fit is not None:
        return int(fit)
    if not hasattr(prediction, "max_batch_size"):
        raise InputError("prediction must be a fxmem.Report, a TrainerFit or a batch size, got "
                         f"{type(prediction).__name__}")
    if budget_bytes is None and options.get("gpu") is None:
        from .common import device_budget

        budget_bytes = device_budget(options.pop("context_bytes", None))
    return int(prediction.max_batch_size(budget_bytes, **options))


def find_executable_batch_size(function=None, starting_batch_size: int | None = None,
                               reduce_batch_size_fn=None, *, prediction=None,
                               budget_bytes: int | None = None, **options):
    """``accelerate.utils.find_executable_batch_size``, starting at fxmem's answer.

    Used as accelerate's: ``@find_executable_batch_size(starting_batch_size=...)`` over a
    function whose first argument is the batch size. With ``prediction`` (see
    :func:`start_from`, which ``budget_bytes`` and ``options`` go to) the first try
    is at fxmem's answer, capped at ``starting_batch_size`` when that is given too; without
    one, at ``starting_batch_size`` (accelerate's default 128). The decorated function is
    accelerate's, its ``starting_batch_size`` attribute the batch size it starts at;
    ``reduce_batch_size_fn`` is accelerate's too (where the installed accelerate has it)."""
    if function is None:
        return lambda f: find_executable_batch_size(
            f, starting_batch_size, reduce_batch_size_fn, prediction=prediction,
            budget_bytes=budget_bytes, **options)
    utils = _accelerate()
    start = 128 if starting_batch_size is None else starting_batch_size
    if prediction is not None:
        start = start_from(prediction, budget_bytes, **options)
        if starting_batch_size is not None:
            start = min(start, starting_batch_size)
    elif budget_bytes is not None or options:
        raise InputError("budget_bytes and the budget's options need a prediction= (a "
                         "fxmem.Report)")
    kw = {} if reduce_batch_size_fn is None else {"reduce_batch_size_fn": reduce_batch_size_fn}
    decorated = utils.find_executable_batch_size(function, starting_batch_size=start, **kw)
    decorated.starting_batch_size = start
    return decorated
