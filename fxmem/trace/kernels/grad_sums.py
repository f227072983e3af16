"""Autograd's gradient sums, done in place where eager PyTorch does them in place.

When a tensor gets more than one gradient, the autograd engine sums them in the input
buffer of the node that consumes them (``torch/csrc/autograd/input_buffer.cpp``,
``accumulate``; seen in place on 2.13.0+cpu's, 2.14.1's and 2.15's builds): with grad mode
off (backward without ``create_graph``), when the first gradient (``old_var``) is a plain
tensor (not a tensor subclass, not a ZeroTensor, not nested), non-overlapping and dense, and
the buffer holds its only reference and the only reference to its storage
(``can_accumulate_inplace``), and the second is not a subclass either, it runs
``old_var.add_(var)``: no allocation, and the first gradient's block lives on as the sum.
Otherwise ``old_var + var``, a new block.

On fake tensors, and under any dispatch mode, ``at::isTensorSubclassLike`` is true, so the
trace only ever sees the out-of-place ``aten.add.Tensor``. This module finds those sums and
decides, as the engine would have, which ran in place:

- which ``aten.add.Tensor`` is the engine's: a post hook on every node of the backward graph
  (registered before backward runs: ``call_function`` asks for post hooks before the node's
  ``apply``) marks the end of the node's call; the engine's sums of the node's outputs into
  the next nodes' buffers are the adds that follow under that node, before the next node
  runs. A hook on a node changes no lifetime: the engine's copy of the node's incoming
  gradients lives as long as the gradients themselves (until ``call_function`` returns);
  ``AccumulateGrad``, whose stealing of a gradient counts references, gets none.
- what the trace can tell at the add: grad mode, a view (a view's base holds its storage
  too), density, subclasses (the hooked node's outputs), the same storage twice;
- what it tells after: the buffer held the last reference to the first gradient's storage
  when that storage was freed right after the add (the buffer replaced it by the sum).

Such a sum then takes no bytes (its storage keeps its place in the trace with size 0) and
the first gradient's storage lives as long as the sum did, with its name (a parameter's
gradient when ``AccumulateGrad`` kept the sum). Applied for ``device="cuda"``, whose ground
truth (the fake GPU) runs no dispatch mode; on the CPU, ``fxmem.measure`` and the witness
observe the step through a dispatch mode, under which PyTorch never sums in place, so the
CPU prediction keeps the out-of-place sums they see (docs/validation.md)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

ADD = torch.ops.aten.add.Tensor
# the node that puts a gradient on its parameter, by the name autograd gives it
ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"
# A node with a post hook runs on a copy of its incoming gradients that the engine keeps for
# the hook (engine.cpp call_function); a compiled graph's backward frees them as it goes
# (its wrapper's ``del tangents_1``, fxmem.trace.compiled.inductor), so it gets none: a sum right
# after it stays out of place.
_COMPILED = "CompiledFunction"


def _key(node) -> tuple:
    return node._sequence_nr(), node.name()


def _dense(t: torch.Tensor) -> bool:
    """``is_non_overlapping_and_dense()`` when provable for every value of the symbols (the
    dims ordered by their strides' hints), else False; no guards."""
    from .cuda.sizing import _contiguous

    def hint(x):
        return x if isinstance(x, int) else x.node.hint or 0

    order = sorted(range(t.dim()), key=lambda d: -hint(t.stride()[d]))
    return _contiguous([t.shape[d] for d in order], [t.stride()[d] for d in order])


def may_sum_in_place(t: torch.Tensor) -> bool:
    """What :meth:`GradSums.note` asks of a first gradient at the add: not a view, not a
    ZeroTensor, not nested, non-overlapping and dense (its references are checked after)."""
    return not (t._is_view() or t._is_zerotensor() or t.is_nested or not _dense(t))


class GradSums:
    """The engine's gradient sums of one trace: hooks, candidates, and the rewrite."""

    def __init__(self):
        self._hooked: set = set()
        self._applied = None  # (key, outputs had a subclass) of the last node whose call ended
        self.candidates: list = []  # (op index, first gradient's sid, the sum's sid)
        # set while a splice of repeated blocks (fxmem.trace.blocks.splice) is to come: the sums are
        # applied after it, on the spliced trace, the pattern block's in each copy of it
        self.hold = False

    def hook_graph(self, roots) -> None:
        """A post hook on every node reachable from ``roots`` (autograd nodes) that has none
        of ours yet."""
        stack = [r for r in roots if r is not None]
        while stack:
            n = stack.pop()
            k = _key(n)
            if k in self._hooked:
                continue
            self._hooked.add(k)
            if n.name() == ACCUMULATE_GRAD:
                continue
            if n.name().startswith(_COMPILED):  # hooked, its incoming gradients would stay
                stack.extend(f for f, _ in n.next_functions if f is not None)
                continue
            try:
                n.register_hook(self._post(k))
            except (RuntimeError, TypeError, AttributeError):  # a node that takes no hooks
                continue
            stack.extend(f for f, _ in n.next_functions if f is not None)

    def _post(self, key):
        def hook(grad_inputs, grad_outputs):
            self._applied = (key, any(is_traceable_wrapper_subclass(g) for g in grad_inputs
                                      if isinstance(g, torch.Tensor)))
        return hook

    def note(self, node, index, func, args, kwargs, out_sids, sid) -> None:
        """Backward op ``index`` ran under autograd node ``node``: if it is the engine's sum of
        two gradients that may run in place, keep it for :meth:`apply`."""
        if node is None:
            return
        if _key(node) not in self._hooked:  # made in backward (a reentrant checkpoint's)
            self.hook_graph([node])
        if func is not ADD or self._applied != (_key(node), False) or torch.is_grad_enabled():
            return
        if len(args) != 2 or kwargs.get("alpha", 1) != 1 or not out_sids:
            return
        old, new = args
        if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
            return
        if not may_sum_in_place(old):
            return
        a = sid(old)
        if a is None or a == sid(new):
            return
        self.candidates.append((index, a, out_sids[0]))

    def apply(self, storages, names: dict) -> None:
        """Each kept sum whose first gradient's storage went right after it (the buffer held
        the last reference) ran in place: the sum's storage takes no bytes, the first
        gradient's lives until the sum's end, under the sum's name. Once: the candidates
        are used up (none while :attr:`hold` is set)."""
        if self.hold:
            return
        candidates, self.candidates = self.candidates, []
        root: dict = {}
        for index, a, c in candidates:
            sa, sc = storages[a], storages[c]
            if sa.freed_after != index or sc.created_by != index:
                continue
            r = root.get(a, a)
            storages[r].freed_after = sc.freed_after
            sc.nbytes = 0
            root[c] = r
            if c in names:
                names[r] = names[c]
