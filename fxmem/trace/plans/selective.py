"""Running a checkpoint region that is more than one module's plain checkpoint: selective
checkpointing (keep some op outputs) and a group of consecutive modules as one segment.

- :class:`SaveCalls` is a ``context_fn`` for ``torch.utils.checkpoint.checkpoint``: PyTorch's
  own ``create_selective_checkpoint_contexts`` with a policy that says ``MUST_SAVE`` for the
  listed ``(op, n)`` calls (the n-th call of that aten overload in the region's forward, as
  selective checkpointing counts them: torch/utils/checkpoint.py ``_CachingTorchDispatchMode``
  calls the policy for every op but ``SAC_IGNORED_OPS``) and ``PREFER_RECOMPUTE`` otherwise.
- :func:`install_group` makes consecutive sibling modules one non-reentrant checkpoint: the
  first one's call opens the checkpoint (``torch.utils.checkpoint``'s own
  ``_checkpoint_without_reentrant_generator``, exactly as ``checkpoint()`` drives it), the
  last one's call closes it, and the recomputation runs the members again in turn, each with
  the arguments its parent gave it and the previous member's output in place of the one the
  forward gave. Module paths and parameter names do not change. The members must run one
  right after the other, each given the previous one's output (or its first element, as
  Hugging Face layers return tuples), else :class:`fxmem.InputError` names the module.

>>> import torch, fxmem
>>> m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
...                           for _ in range(3)])
>>> plan = [fxmem.Region(("0", "1", "2"), save=(("aten.addmm.default", 1),))]
>>> m = fxmem.apply_checkpoints(m, plan)
>>> m(torch.randn(2, 8, requires_grad=True)).sum().backward()
"""

from __future__ import annotations

import functools
from collections import Counter

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    _checkpoint_without_reentrant_generator,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)

from ...errors import InputError


class SaveCalls:
    """``context_fn`` of selective checkpointing keeping the outputs of the ``save`` calls."""

    def __init__(self, save):
        self.save = frozenset((str(op), int(n)) for op, n in save)

    def __call__(self):
        return create_selective_checkpoint_contexts(_Policy(self.save))

    def __repr__(self):
        return f"SaveCalls({sorted(self.save)})"


class _Policy:
    def __init__(self, save):
        self.save, self.seen = save, Counter()

    def __call__(self, ctx, func, *args, **kwargs):
        # counted per pass: older PyTorch asks the policy again while recomputing
        key = (ctx.is_recompute, str(func))
        n = self.seen[key]
        self.seen[key] += 1
        return CheckpointPolicy.MUST_SAVE if (key[1], n) in self.save else \
            CheckpointPolicy.PREFER_RECOMPUTE


def context_fn(save):
    """The ``context_fn`` for a region saving the ``save`` calls (none: plain checkpoint)."""
    return SaveCalls(save) if save else noop_context_fn


class GroupForward:
    """The ``forward`` a group member gets (an instance attribute; ``original`` is its own;
    ``call``: what it calls, the group's step for member ``k`` or a wrapper of it)."""

    def __init__(self, group, k: int, original, call=None):
        self.group, self.k, self.original = group, k, original
        self.call = call if call is not None else functools.partial(group.call, k)

    def __call__(self, *args, **kwargs):
        return self.call(*args, **kwargs)


class _Group:
    def __init__(self, paths, forwards, ctx_fn):
        self.paths, self.forwards, self.context_fn = tuple(paths), list(forwards), ctx_fn
        self.run = None

    @property
    def label(self):
        return f"{self.paths[0]}..{self.paths[-1]}"

    def call(self, k, *args, **kwargs):
        if k == 0:
            if self.run is not None:  # the last forward failed halfway: forget it
                self.run.close()
            self.run = _Run(self, args, kwargs)
            return self.run.first(args, kwargs)
        run = self.run
        if run is None or run.next != k:
            before = self.paths[k - 1]
            raise InputError(f"checkpoint group {self.label}: {self.paths[k]} ran without "
                             f"{before} right before it (a group's modules run one after "
                             "the other, once per forward)")
        return run.follow(k, args, kwargs)


_CHAIN = object()  # where the previous member's output goes in a member's arguments


def _chain(out):
    """What a parent passes on from a member's output: it, or its first element."""
    return out[0] if isinstance(out, (tuple, list)) and out else out


class _Run:
    """One forward of a group: the checkpoint it holds open and each member's arguments."""

    def __init__(self, group, args, kwargs):
        self.group, self.records, self.next = group, [], 1
        self.out = self.gen = None

    def first(self, args, kwargs):
        g = self.group
        self.gen = _checkpoint_without_reentrant_generator(
            self.replay, True, g.context_fn, "default", False, True, *args, **kwargs)
        next(self.gen)
        return self._step(0, args, kwargs)

    def follow(self, k, args, kwargs):
        prev = _chain(self.out)
        found = [False]

        def mark(v):
            if v is prev and isinstance(v, torch.Tensor):
                found[0] = True
                return _CHAIN
            return v
        rec = (tuple(map(mark, args)), {n: mark(v) for n, v in kwargs.items()})
        if not found[0]:
            self.close()
            g = self.group
            raise InputError(f"checkpoint group {g.label}: {g.paths[k]} was not given the "
                             f"output of {g.paths[k - 1]} (only modules chained one into the "
                             "next can be checkpointed as one segment)")
        self.records.append(rec)
        return self._step(k, args, kwargs)

    def _step(self, k, args, kwargs):
        g = self.group
        try:
            out = g.forwards[k](*args, **kwargs)
        except BaseException as e:
            self.close(e)
            raise
        self.next = k + 1
        if k == len(g.forwards) - 1:  # the last member: the checkpointed forward is done
            self.out, g.run = None, None
            next(self.gen, None)
        else:
            self.out = out
        return out

    def close(self, exc=None):
        if self.gen is not None:
            try:
                self.gen.throw(exc or RuntimeError("checkpoint group abandoned"))
            except BaseException:  # noqa: BLE001 - the generator re-raises what it was given
                pass
        self.out = self.gen = None
        if self.group.run is self:
            self.group.run = None

    def replay(self, *args, **kwargs):
        """The group's forward again (checkpoint's recomputation)."""
        fwd = self.group.forwards
        out = fwd[0](*args, **kwargs)
        for (a, kw), f in zip(self.records, fwd[1:]):
            c = _chain(out)
            out = f(*(c if v is _CHAIN else v for v in a),
                    **{n: c if v is _CHAIN else v for n, v in kw.items()})
        return out


def install_group(modules, paths, save=(), wrap=None, ctx_fn=None, outer=None) -> list:
    """Make ``modules`` (consecutive siblings, in call order) one checkpoint saving the
    ``save`` calls (or with the ``context_fn`` ``ctx_fn``); ``wrap(path, forward)``, if
    given, wraps each member's own forward (a tracer marking the recomputation), run inside
    the checkpoint; ``outer(path, call)`` each member's call of the checkpoint, outside it
    (what it is given, before the checkpoint keeps it). Returns the modules whose
    ``forward`` was set."""
    forwards = [own_forward(m) for m in modules]
    if wrap is not None:
        forwards = [wrap(p, f) for p, f in zip(paths, forwards)]
    group = _Group(paths, forwards, ctx_fn if ctx_fn is not None else context_fn(save))
    for k, (m, p, f) in enumerate(zip(modules, paths, forwards)):
        call = functools.partial(group.call, k)
        m.forward = GroupForward(group, k, f, outer(p, call) if outer else None)
    return list(modules)


def own_forward(module):
    """The module's forward without a group's (``install_group``)."""
    f = module.forward
    return f.original if isinstance(f, GroupForward) else f


def group_of(module):
    """The group a module belongs to (``install_group``), or None."""
    f = module.__dict__.get("forward")
    return f.group if isinstance(f, GroupForward) else None
