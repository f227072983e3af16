"""Values the data sets, which fake tensors do not have: where the trace goes through them
and what it says where it cannot.

- **A count.** ``nonzero`` of a boolean mask and the ops built on it make a tensor as long
  as the number of True values: ``x[mask]`` (``aten.index.Tensor``, whose kernel expands
  the mask with ``nonzero()``: aten/src/ATen/native/IndexingUtils.h ``expandTensors``),
  ``masked_select``, ``unique``. The fake kernel gives that length an unbacked symbol
  (torch/_subclasses/fake_impls.py ``nonzero``, memoized on the mask) whose range the
  ShapeEnv keeps in numbers only; fxmem keeps its bound as a formula, the mask's number of
  elements, and sizes a storage that depends on it at its largest (every element True).
  The report says whether such a storage can be at the peak
  (:attr:`fxmem.Report.unmodelled`). ``x[mask] = v`` (``index_put_``) changes no size: its
  result is ``x``; its backward (``grad[mask]``) and CUDA's temporaries are what the count
  sizes.
- **A value** read from a tensor (``.item()``, ``float(t)``): an unbacked symbol too. What
  only computes with it (``x * t.item()``) changes contents, not sizes: traced through.
- **A branch** on either (``if t.sum() > 0``, LayerDrop's ``if torch.rand([]) < p``): no
  fake value can decide it. PyTorch raises ``GuardOnDataDependentSymNode`` there, which
  :func:`branch_message` turns into the reason of a :class:`fxmem.DataDependentError`: the
  value it reads, whether it was drawn at random, and what to do, with the Hugging Face
  config flag responsible when there is one (:data:`HF_RANDOM_IN_TRAINING`).
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import re
from dataclasses import dataclass

import sympy
import torch
from torch.utils._sympy.symbol import SymT, symbol_is_type

aten = torch.ops.aten

TORCH_AND_FXMEM = (os.path.dirname(torch.__file__),
                   os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_INTERNAL = (*TORCH_AND_FXMEM, os.path.dirname(os.__file__), os.path.dirname(sympy.__file__))


def internal_file(filename: str) -> bool:
    """Is ``filename`` torch's, fxmem's, sympy's or the standard library's (not the user's
    nor a model library's)?"""
    return filename.startswith(_INTERNAL) or filename.startswith("<")


# Ops that draw random numbers, by aten name (every overload): a value read from their
# output, directly or through other ops, is drawn at random.
RANDOM_OPS = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
    "bernoulli", "bernoulli_", "uniform_", "normal", "normal_", "exponential_", "geometric_",
    "cauchy_", "log_normal_", "random_", "multinomial", "native_dropout",
})

# Ops whose fake kernel counts values of a tensor that is not one of their inputs (so no
# input carries the count's memo): op -> (args -> (elements counted, what, of ``n``)).
COUNTED = {
    # torch/_meta_registrations.py meta_masked_select: nonzero of the broadcast mask
    aten.masked_select.default: lambda a: (_broadcast_numel(a[0].shape, a[1].shape),
                                           "True values of a mask of {n} elements"),
    # torch/_subclasses/fake_impls.py unique2 / unique_dim / unique_consecutive
    aten._unique2.default: lambda a: (a[0].numel(), "distinct values among {n}"),
    aten.unique_dim.default: lambda a: (a[0].numel(), "distinct values among {n}"),
    aten.unique_consecutive.default: lambda a: (a[0].numel(), "runs of equal values among {n}"),
}

def _broadcast_numel(*shapes):
    """Elements of the broadcast shape, without guards (each size is the others' or 1):
    torch.broadcast_shapes would fix a symbolic size by comparing it."""
    rank, n = max(len(s) for s in shapes), 1
    for i in range(1, rank + 1):
        sizes = [s[-i] for s in shapes if len(s) >= i]
        n = n * functools.reduce(torch.sym_max, sizes)
    return n


# Hugging Face config attributes that make a model random in training (``self.training``):
# attribute -> (what it turns on, what setting it to 0.0 gives, when worth saying).
_LAYERDROP = ("LayerDrop", " (every layer runs: the largest step)")
HF_RANDOM_IN_TRAINING = {
    "layerdrop": _LAYERDROP, "encoder_layerdrop": _LAYERDROP, "decoder_layerdrop": _LAYERDROP,
    "mask_time_prob": ("SpecAugment", ""),
    "mask_feature_prob": ("SpecAugment", ""),
}


@dataclass(frozen=True)
class DataSymbol:
    """Where an unbacked symbol of the trace came from. ``what``: what it counts or reads;
    ``bound``: the largest it can be (a ShapeEnv expression), None when unknown (a value
    read from a tensor); ``random``: the random op a value read is drawn from."""

    what: str
    op: str
    module: str
    phase: str
    source: str | None
    bound: object = None
    random: str | None = None


def is_data_symbol(s) -> bool:
    return symbol_is_type(s, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT))


def data_symbols(x) -> set:
    """The unbacked symbols in ``x`` (a SymInt, SymFloat, SymBool or plain number)."""
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {s for s in x.node.expr.free_symbols if is_data_symbol(s)}
    return set()


def _tensors(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(a)


def count_of(func, args, sym):
    """``(elements counted, what is counted)`` (a template of ``n``) when ``sym`` counts
    values of a tensor that ``func`` got (the fake ``nonzero`` memoizes its count on the
    tensor it ran on) or counted itself (:data:`COUNTED`); None when the op says nothing."""
    for t in _tensors(args):
        memo = getattr(t, "nonzero_memo", None)
        if isinstance(memo, torch.SymInt) and memo.node.expr == sym:
            return t.numel(), ("True values of a mask of {n} elements"
                               if t.dtype in (torch.bool, torch.uint8)
                               else "non-zero values among {n}")
    rule = COUNTED.get(func)
    return rule(args) if rule is not None else None


def drawn_at_random(node, limit: int = 512) -> str | None:
    """The random op (e.g. ``aten.rand``) that the value of graph node ``node`` is computed
    from, looking back through at most ``limit`` nodes; None if none is found."""
    seen, todo = set(), [node]
    while todo and len(seen) < limit:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        parts = str(n.target).split(".")
        if n.op == "call_function" and len(parts) == 3 and parts[1] in RANDOM_OPS:
            return f"aten.{parts[1]}"
        todo.extend(n.all_input_nodes)
    return None


# --- what to do: the Hugging Face config flag responsible ----------------------------------------

def _active(config, attr: str):
    v = getattr(config, attr, None)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def config_hint(frames) -> str | None:
    """What to do, when a Hugging Face model's config turns on what made the trace stop:
    the innermost frame (``frames`` innermost first; torch's and fxmem's skipped) whose
    ``self`` is a module with a ``config`` and whose function, up to the line running,
    reads an active attribute of :data:`HF_RANDOM_IN_TRAINING`. None when there is none."""
    for fr in frames:
        code = fr.f_code
        if internal_file(code.co_filename):
            continue
        module = fr.f_locals.get("self")
        config = getattr(module, "config", None) if isinstance(module, torch.nn.Module) \
            else None
        if config is None:
            continue
        src = "".join(linecache.getlines(code.co_filename)[code.co_firstlineno - 1:fr.f_lineno])
        named = [a for a in HF_RANDOM_IN_TRAINING
                 if _active(config, a) and re.search(rf"config\.{a}\b", src)]
        if named:
            return _advice(module, config, named)
        if (getattr(config, "_experts_implementation", None) == "eager"
                and hasattr(module, "_is_expert_parallel")):
            return EAGER_EXPERTS
    return None


# transformers' MoE experts (integrations/moe.py use_experts_implementation marks the class
# with _is_expert_parallel): "eager" loops over the experts the routing chose, each on the
# tokens routed to it; "grouped_mm" and "batched_mm" (the default is grouped_mm) run every
# token-expert pair in tensors of fixed shapes
EAGER_EXPERTS = ('the MoE experts run as a loop over the experts the routing chose '
                 '(experts_implementation="eager"): model.set_experts_implementation('
                 '"grouped_mm"), or "batched_mm", computes them with fixed shapes')


def _advice(module, config, named) -> str:
    a = named[0]
    what, zero = HF_RANDOM_IN_TRAINING[a]
    ways = [f"set it to 0.0{zero}", "call model.eval()"]
    if a == "mask_time_prob" and "mask_time_indices" in _parameters(module):
        ways.insert(0, "pass mask_time_indices=...")
    also = "".join(f"; {b} = {_active(config, b)} too" for b in HF_RANDOM_IN_TRAINING
                   if b != a and _active(config, b))
    return (f"config.{a} = {_active(config, a)} ({what}) is random in training: "
            f"{', '.join(ways[:-1])} or {ways[-1]}{also}")


def _parameters(module) -> tuple:
    try:
        return tuple(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return ()


def branch_origin(cond, known: dict) -> DataSymbol | None:
    """The value read (or count) a Python branch on ``cond`` decides on: ``cond`` is the
    sympy condition of PyTorch's ``GuardOnDataDependentSymNode``; ``known``: symbol ->
    :class:`DataSymbol`."""
    syms = sorted((s for s in getattr(cond, "free_symbols", ()) if s in known), key=str)
    return known[syms[0]] if syms else None


def branch_message(origin: DataSymbol | None, hint: str | None) -> str:
    """The reason of a :class:`fxmem.DataDependentError` for a Python branch on ``origin``
    (:func:`branch_origin`); ``hint``: :func:`config_hint`'s advice."""
    if origin is not None and origin.random:
        what = (f"the step branches on a random value ({origin.random}), so its memory "
                "changes from step to step")
        todo = hint or ("fix the draw for the analysis (e.g. a drop probability of 0, so "
                        "that every layer runs) or, if it is random only in training, call "
                        "model.eval()")
    else:
        read = origin.what if origin is not None else "a value read from a tensor"
        what = f"the step branches on {read} (a Python condition, bool(), int() or .item())"
        todo = hint or ("fake tensors have no values: make the condition depend on shapes "
                        "or Python numbers, or trace each branch with it fixed")
    return f"{what}; {todo}"
