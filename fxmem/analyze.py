"""The one-call pipeline: trace -> graph -> liveness -> :class:`fxmem.Report`."""

from __future__ import annotations

from .graph import build_graph
from .liveness import liveness
from .result import Report, parts_of
from .trace import trace


def analyze(model, inputs, targets=(), loss=None, optimizer=None, train=True,
            device="cuda", *, checkpoint=None, batch_hint: int | None = None) -> Report:
    """Analyse one step of ``model`` and return its memory as formulas in :data:`fxmem.B`.

    ``inputs``: a tensor or tuple of tensors, dim 0 of each is B (only shapes and dtypes are
    used; they may be on the meta device). ``targets``: tensors passed to ``loss`` after the
    model output. ``loss(output, *targets)``; ``None``: the output is the loss or has
    ``.loss``. ``optimizer``: an optimizer class or ``callable(params)``; ``None``: no step.
    ``train=False``: inference under ``torch.no_grad()``. ``device``: ``"cuda"`` counts
    allocator blocks (512-byte rounding) and CUDA's optimizer defaults; ``"cpu"``: live bytes.
    ``checkpoint``: a plan, module paths whose forward is recomputed in backward
    (``torch.utils.checkpoint``, non-reentrant); modules already wrapped with
    ``checkpoint_wrapper`` count too. ``batch_hint``: the value of B used where the trace
    must decide something (default: the inputs' dim 0, or 8).

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
    t = trace(model, inputs, targets, loss, optimizer, train, device, batch_hint=batch_hint,
              checkpoint=checkpoint)
    lv = liveness(build_graph(t))
    return Report(lv, parts_of(lv), t.guards)
