"""What a user sees of a trace: one line of fxmem's, and nothing of torch's.

- :func:`quiet`: torch's loggers and Python's warnings silenced while the step is traced
  (PyTorch logs a failing meta kernel's whole traceback before it raises; a model's own
  warnings and torch's ``UserWarning`` s would land between fxmem's lines), their levels and
  filters restored exactly afterwards.
- :func:`named_symbols`: the ShapeEnv's names of the batch and the named dims (``s44``)
  and of values the data sets (``u0``) never reach a message: an error raised while
  tracing says ``B``, ``L`` and ``n`` (with what ``n`` counts) instead.
- :func:`check_call`: the model's ``forward`` takes the inputs given, or a
  :class:`fxmem.TraceError` names its signature.
- :func:`loss_error`: a loss that fails on the model's output and the targets, with both
  shapes.
- :func:`fails_in_eager`: whether an op that failed in the trace fails in eager PyTorch too
  (the model's error, :class:`fxmem.errors.ModelError`), not only on fake tensors.
- :func:`causes`, :func:`caused_by`, :func:`chained`: an exception's chain (what it was
  raised from or during), which the trace reads to tell its own signals from failures.

>>> import logging, warnings
>>> before = (logging.getLogger("torch").level, list(warnings.filters))
>>> with quiet():
...     warnings.warn("not shown")
>>> (logging.getLogger("torch").level, list(warnings.filters)) == before
True
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import sys
import warnings
from typing import Iterator

import torch

from ...errors import FxmemError, TraceError, one_line
from ..kernels.datadep import internal_file, is_data_symbol

SILENT = logging.CRITICAL + 1
_STEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step.py")


def user_frame(frames) -> str | None:
    """``file:line in func`` of the innermost frame that is neither torch, fxmem nor stdlib,
    inside the step (the frames that called the step, such as the command's, are not the
    model's)."""
    for fr in reversed(frames):
        if fr.filename == _STEP:
            return None
        if not internal_file(fr.filename):
            return f"{fr.filename}:{fr.lineno} in {fr.name}"
    return None


def live_frames():
    """The Python frames calling this one, innermost first (their locals: the modules)."""
    frame = sys._getframe(1)
    while frame is not None:
        yield frame
        frame = frame.f_back


def _loggers(namespaces) -> list:
    """The existing loggers named ``namespace`` or ``namespace.*`` (none is created)."""
    prefixes = tuple(f"{n}." for n in namespaces)
    return [lg for name, lg in list(logging.Logger.manager.loggerDict.items())
            if isinstance(lg, logging.Logger) and (name in namespaces or name.startswith(prefixes))]


@contextlib.contextmanager
def quiet(namespaces=("torch",)) -> Iterator[None]:
    """Silence the loggers of ``namespaces`` (their levels raised past CRITICAL; a logger
    made inside the block inherits that) and every Python warning while the block runs;
    restore the levels and ``warnings.filters`` exactly on exit."""
    saved = [(lg, lg.level) for lg in _loggers(namespaces)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for lg, _ in saved:
                lg.setLevel(SILENT)
            yield
        finally:
            for lg, level in saved:
                lg.setLevel(level)


def symbol_names(subs: dict, data: dict) -> tuple:
    """``(names, notes)``: ShapeEnv symbol name -> what a message says instead (the batch
    ``B``, a named dim, ``n`` for a value the data sets), and what each ``n`` is."""
    names = {str(k): str(v) for k, v in subs.items()}
    notes = []
    for i, (s, origin) in enumerate(sorted(data.items(), key=lambda kv: str(kv[0]))):
        if not is_data_symbol(s):
            continue
        n = "n" if i == 0 else f"n{i + 1}"
        names[str(s)] = n
        notes.append(f"{n}: {getattr(origin, 'what', 'a value read from a tensor')}")
    return names, notes


def rename(text: str, names: dict) -> str:
    """``text`` with each whole-word symbol of ``names`` replaced.

    >>> rename("got shape (s44, 10) and [s44*s7, 3]", {"s44": "B", "s7": "L"})
    'got shape (B, 10) and [B*L, 3]'
    """
    if not names or not isinstance(text, str):
        return text
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, names), key=len,
                                                   reverse=True)) + r")\b")
    return pattern.sub(lambda m: names[m.group(1)], text)


# what the ShapeEnv calls a symbol: s0 (a size), u0 (an unbacked int), zuf0 (a float)
_INTERNAL_SYMBOL = re.compile(r"\b(?:s|u|zuf)\d+\b")


@contextlib.contextmanager
def named_symbols(rec) -> Iterator[None]:
    """An :class:`fxmem.FxmemError` leaving the block is rewritten in place with
    :func:`symbol_names` of recorder ``rec`` (its ``subs`` and ``data``)."""
    try:
        yield
    except FxmemError as e:
        names, notes = symbol_names(rec.subs, rec.data)
        for s in getattr(rec.shape_env, "var_to_val", {}):  # other sized symbols: their value
            names.setdefault(str(s), str(rec.shape_env.var_to_val[s]))
        used = [note for note in notes if re.search(rf"\b{note.partition(':')[0]}\b",
                                                    rename(str(e), names))]
        _rewrite(e, names, "; ".join(rename(n, names) for n in used))
        raise


def _rewrite(e: FxmemError, names: dict, note: str) -> None:
    if isinstance(e, TraceError):
        reason = rename(e.reason, names) + (f" ({note})" if note else "")
        source = e.source
        TraceError.__init__(e, reason, op=e.op, module=e.module, source=source, phase=e.phase)
    else:
        e.args = tuple(rename(a, names) for a in e.args)
        if note and e.args and isinstance(e.args[0], str):
            e.args = (f"{e.args[0]} ({note})", *e.args[1:])


def has_internal_symbol(text: str) -> bool:
    """Does ``text`` show a ShapeEnv symbol name (``s44``, ``u0``)?

    >>> has_internal_symbol("(B, 10)"), has_internal_symbol("got (s44, 10)")
    (False, True)
    """
    return bool(_INTERNAL_SYMBOL.search(text))


def _where(fn) -> str | None:
    try:
        code = inspect.unwrap(fn).__code__
    except AttributeError:
        return None
    return f"{code.co_filename}:{code.co_firstlineno} in {code.co_name}"


def check_call(model: torch.nn.Module, inputs: tuple) -> None:
    """The model's ``forward`` takes ``inputs`` as its positional arguments, or a
    :class:`fxmem.TraceError` naming its signature (where a wrapper hides the signature,
    nothing is checked)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*inputs)
    except TypeError as e:
        params = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        need = sum(p.default is p.empty for p in params)
        takes = f"{need}" if need == len(params) else f"{need} to {len(params)}"
        raise TraceError(f"{type(model).__name__}.forward{sig} takes {takes} input"
                         f"{'' if len(params) == 1 else 's'}, got {len(inputs)} ({e}): give "
                         "one input tensor per parameter", module="", phase="forward",
                         source=_where(model.forward)) from None


def _shape(t) -> str:
    if isinstance(t, torch.Tensor):
        dims = ", ".join(str(d) for d in t.shape)
        return f"({dims}{',' if t.dim() == 1 else ''}) {str(t.dtype).replace('torch.', '')}"
    return type(t).__name__


def _first_line(e: Exception) -> str:
    """The first line of torch's message (the rest is a C++ backtrace, if anything)."""
    text = str(e).strip()
    return one_line(text.splitlines()[0]) if text else ""


def loss_error(e: Exception, loss, out, targets, rec, source: str | None) -> TraceError:
    """The loss ``loss`` failed (``e``, raised in torch's code) on the model's output
    ``out`` and ``targets``: a :class:`fxmem.TraceError` naming both shapes; ``source``:
    the user's line in the loss, if it is the user's."""
    name = getattr(loss, "__name__", type(loss).__name__)
    tg = f"the targets {', '.join(_shape(t) for t in targets)}" if targets else "no targets"
    op = rec.failed[0] if rec.failed is not None else None
    torch_loss = str(getattr(loss, "__module__", "")).startswith("torch")
    hint = ("; give targets the loss takes (class indices (B,) int64 for cross_entropy, the "
            "output's shape for mse)") if torch_loss else ""
    return TraceError(f"the loss {name} fails on the model's output {_shape(out)} and {tg}: "
                      f"{type(e).__name__}: {_first_line(e)}{hint}", op=op, phase="loss",
                      source=source)


# hints for a failing op, by aten op and a piece of torch's message: what to do
_HINTS = (
    ("aten.embedding", "indices", "an Embedding looks up integer ids: give that input an "
                                  "integer dtype (int64)"),
)


# the same whatever the op: the message alone says what went wrong
_ANY_OP_HINTS = (
    (("Input type (", "should be the same"), "an input's dtype differs from the model's "
     "weights': give the inputs the weights' dtype (float32 unless the model was cast) and "
     "use amp (--amp fp16/bf16) for mixed precision"),
    (("must have the same dtype",), "an input's dtype differs from the model's weights': "
     "give the inputs the weights' dtype, and amp (--amp) for mixed precision"),
)


def mixed_foreach(reason: str) -> str:
    """The error of an optimizer's foreach step over DTensor shards and whole parameters
    (``reason``: what its groups mix), which DTensor refuses ("got mixed torch.Tensor and
    DTensor") at the step's first foreach op.

    >>> mixed_foreach("2 of a group's parameters are DTensors, 1 is not")[:58]
    "the optimizer's foreach step fails as eager PyTorch's does"
    """
    return (f"the optimizer's foreach step fails as eager PyTorch's does on a GPU: {reason} "
            "(its lists hold DTensor parameters, a plan's shards, beside plain ones the plan "
            "leaves whole, e.g. the norms: PyTorch's foreach ops refuse the mix, and on CUDA "
            "torch.optim steps foreach by default); step each parameter alone "
            "(--no-foreach; in Python optimizer=lambda p: torch.optim.AdamW(p, "
            "foreach=False)), or give every "
            "parameter a placement (SequenceParallel() for the norms, or FSDP2 over the TP "
            "plan: --fsdp with --tp)")


def op_hint(op: str | None, reason: str) -> str | None:
    """What to do about a failing op, when it is a common mistake in the inputs.

    >>> op_hint(None, "Input type (c10::Half) and bias type (float) should be the same")[:30]
    "an input's dtype differs from "
    """
    for name, word, hint in _HINTS:
        if op and op.startswith(name) and word in reason:
            return hint
    for words, hint in _ANY_OP_HINTS:
        if all(w in reason for w in words):
            return hint
    return None


def fails_in_eager(func, args, kwargs, shape_env, error: Exception) -> bool:
    """Does ``func`` fail on ``args`` in eager PyTorch too, as it failed in the trace with
    ``error``? The op is run again on meta tensors of the example's concrete sizes and
    strides (each symbol at its hint), outside every dispatch mode: no fake tensor, no
    symbol, no rule of fxmem's. True only when it raises the same kind of error there, so a
    shape or dtype mistake in the model (``Linear(63, 10)`` fed 64 features) is told from
    what only tracing cannot do. An error raised for fake tensors' or symbols' sake, and any
    op whose check needs values (meta tensors have none), is never the model's.

    >>> import torch
    >>> a, b = torch.empty(2, 64), torch.empty(63, 10)
    >>> fails_in_eager(torch.ops.aten.mm.default, (a, b), {}, None, RuntimeError("x"))
    True
    >>> fails_in_eager(torch.ops.aten.mm.default, (a, torch.empty(64, 10)), {}, None,
    ...                RuntimeError("x"))
    False
    """
    from torch._subclasses import fake_tensor as ft
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    from torch.utils._python_dispatch import _disable_current_modes
    from torch.utils._pytree import tree_map

    from ...errors import FxmemError

    trace_only = (NotImplementedError, GuardOnDataDependentSymNode, FxmemError,
                  ft.DataDependentOutputException, ft.DynamicOutputShapeException,
                  ft.UnsupportedOperatorException, ft.UnsupportedFakeTensorException)
    if isinstance(error, trace_only):
        return False

    def hint_int(d) -> int:  # a size at the example's value
        return int(d.node.shape_env.size_hint(d.node.expr)) if isinstance(d, torch.SymInt) \
            else int(d)

    def concrete(x):
        if isinstance(x, torch.SymInt):
            return hint_int(x)
        if isinstance(x, (torch.SymFloat, torch.SymBool)):
            raise ValueError("a symbolic scalar")
        if isinstance(x, torch.Tensor):
            return torch.empty_strided([hint_int(d) for d in x.shape],
                                       [hint_int(d) for d in x.stride()],
                                       dtype=x.dtype, device="meta")
        return x

    try:
        with _disable_current_modes():
            args, kwargs = tree_map(concrete, (args, kwargs))
            func(*args, **kwargs)
    except type(error):
        return True
    except Exception:  # noqa: BLE001 - it fails otherwise: not the same mistake
        return False
    return False


def causes(e):
    """``e`` and the exceptions it was raised from or during, innermost last."""
    seen = set()
    while e is not None and id(e) not in seen:
        yield e
        seen.add(id(e))
        e = e.__cause__ or e.__context__


def caused_by(e, kind) -> bool:
    return any(isinstance(x, kind) for x in causes(e))


def chained(e, inner) -> bool:
    return any(x is inner for x in causes(e))
