"""Activation-checkpoint plans: which module forwards are recomputed in backward.

A *plan* is a set of module paths (``"layer1.0"``, ``"model.transformer.h.3"``) whose forward
runs under ``torch.utils.checkpoint`` non-reentrantly (``use_reentrant=False``) with the RNG
state preserved, so dropout draws the same masks when the forward is recomputed.

- :func:`normalize_plan` checks a plan against a model (one clear error per bad path).
- :func:`apply_checkpoints` wraps the plan's modules in place with PyTorch's own
  ``checkpoint_wrapper``, for the user's real training.
- :func:`checkpointing` is what :func:`fxmem.analyze` uses while tracing: the same
  ``torch.utils.checkpoint`` call, installed on the module instances only for the trace and
  removed afterwards, so module paths and parameter names stay the user's.

>>> import torch, fxmem
>>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
>>> fxmem.apply_checkpoints(m, ["0"])[0].__class__.__name__
'CheckpointWrapper'
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import checkpoint

from ..errors import InputError

WRAPPED = "._checkpoint_wrapped_module"  # the child name checkpoint_wrapper inserts


def user_path(path: str) -> str:
    """A module path without ``checkpoint_wrapper``'s inserted component."""
    return path.replace(WRAPPED, "").replace(WRAPPED[1:], "").strip(".")


def normalize_plan(model: torch.nn.Module, plan: Iterable[str] | None) -> tuple[str, ...]:
    """The plan as a sorted tuple of module paths, checked against ``model``.

    Raises :class:`fxmem.InputError` for a path that names no submodule, the root module, or
    a path inside another path of the plan (nested checkpoints are not plans: checkpoint the
    outer module, or the inner ones).
    """
    if plan is None:
        return ()
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return check_plan({user_path(m) for m in _named_modules(model)}, plan)


def check_plan(paths, plan: Iterable[str] | None) -> tuple[str, ...]:
    """``plan`` as a sorted tuple, checked against the module paths ``paths`` (see
    :func:`normalize_plan`)."""
    if plan is None:
        return ()
    if isinstance(plan, str):
        raise InputError(f"a checkpoint plan is a collection of module paths, got the string "
                         f"{plan!r} (write [{plan!r}])")
    out = []
    for p in plan:
        if not isinstance(p, str) or not p:
            raise InputError(f"checkpoint plan entries are non-empty module paths, got {p!r}")
        if p not in paths:
            raise InputError(f"checkpoint plan: the model has no submodule {p!r}"
                             f"{_paths_hint(p, paths)}")
        out.append(p)
    out = sorted(set(out))
    for a in out:
        for b in out:
            if b != a and b.startswith(a + "."):
                raise InputError(f"checkpoint plan: {b!r} is inside {a!r}; nested checkpoints "
                                 "are not a plan (keep one of them)")
    return tuple(out)


def _paths_hint(p: str, paths) -> str:
    """Which module paths the user may have meant: the closest names, else the top level.

    >>> _paths_hint("conv3", {"", "conv1", "conv2", "fc"})
    " (did you mean 'conv2', 'conv1'? the model's top-level modules: conv1, conv2, fc)"
    """
    import difflib

    known = sorted(q for q in paths if q)
    near = sorted(q for q in known if q.startswith(p) or p.startswith(q))[:3] or \
        difflib.get_close_matches(p, known, n=2, cutoff=0.6)
    top = [q for q in known if "." not in q]
    listed = ", ".join(top[:12]) + (f" and {len(top) - 12} more" if len(top) > 12 else "")
    parts = [f"did you mean {', '.join(map(repr, near))}?"] if near else []
    parts += [f"the model's top-level modules: {listed}"] if top else []
    return f" ({' '.join(parts)})" if parts else ""


def _named_modules(model):
    return {n: m for n, m in model.named_modules() if n}


def _submodule(model, path):
    for n, m in model.named_modules():
        if n and user_path(n) == path:
            return n, m
    raise InputError(f"checkpoint plan: the model has no submodule {path!r}")


def apply_checkpoints(model: torch.nn.Module, plan: Iterable[str]) -> torch.nn.Module:
    """Wrap each module of ``plan`` in place with PyTorch's ``checkpoint_wrapper``
    (non-reentrant, RNG state preserved) and return ``model``. Already wrapped modules are
    left as they are. Gradients are the same as without the plan, bit for bit.
    """
    for path in normalize_plan(model, plan):
        name, mod = _submodule(model, path)
        if isinstance(mod, CheckpointWrapper):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, checkpoint_wrapper(mod, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    return model


@contextlib.contextmanager
def checkpointing(model: torch.nn.Module, plan: Iterable[str], region=None):
    """Run the plan's module forwards under ``torch.utils.checkpoint`` until the block exits.

    Installs an instance attribute ``forward`` on each module of the plan (and on modules
    the user already wrapped with ``checkpoint_wrapper``), removed on exit. ``region(path,
    fn)``, if given, wraps the function that checkpoint runs (and re-runs in backward), so a
    tracer can tell recomputation apart.
    """
    targets = [_submodule(model, p) for p in normalize_plan(model, plan)]
    targets += [(n, m) for n, m in model.named_modules() if isinstance(m, CheckpointWrapper)]
    installed = []
    try:
        for name, mod in targets:
            if isinstance(mod, CheckpointWrapper):
                inner = mod._checkpoint_wrapped_module.forward
            else:
                inner = mod.forward
            fn = region(user_path(name), inner) if region else inner
            mod.forward = functools.partial(_checkpointed, fn)
            installed.append(mod)
        yield tuple(user_path(n) for n, _ in targets)
    finally:
        for mod in installed:
            del mod.forward


def _checkpointed(fn, *args, **kwargs):
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
