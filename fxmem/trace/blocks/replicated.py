"""Repeated blocks under DDP: trace two of them, copy their ops for the rest.

Under ``DistributedDataParallel`` the blocks carry no hooks of their own: the Reducer's
hooks sit on each parameter's gradient accumulator and copy the gradient into its bucket
(``detach`` and ``mul.out`` by ``1 / world_size``, run as autograd's ``AccumulateGrad``)
as soon as it is ready, inside the block's backward. A stand-in's window takes in those
steps (:func:`fxmem.trace.blocks.splice_checks.check_run`), so the copy of the pattern's
ops brings them, renamed to the stand-in's parameters and gradients, as the
:class:`~fxmem.trace.blocks.sharded.ShardedReuse` it extends copies FSDP2's. Under
``gradient_as_bucket_view=True`` a gradient is a view of its bucket, with no storage of
its own to rename: each step is known by its parameter (the recorder notes whose
``AccumulateGrad`` ran it), and the bucket it writes is mapped to the stand-in's step on
the same parameter's (:meth:`fxmem.trace.blocks.splice.Numbering._outer`).

What the Reducer does differently from FSDP2 is remember an order: its buckets are
rebuilt, in the forward after the first backward, in the order the gradients came in
(``reducer.cpp`` ``Reducer::rebuild_buckets``), which sets the buckets' sizes and the
order the step copies them back. The warm-up steps before the recorded one (one to learn
the order, one to rebuild) run a run's later blocks as stand-ins, so a stand-in must hand
its parameters' gradients to the Reducer in the order the real block's backward would.
That order is asked of autograd itself: when the warm-up's third block (traced for real)
has run its forward, it runs again on the same arguments, and ``torch.autograd.grad``
over those outputs captures its parameters' gradients without accumulating them (no
Reducer hook runs), each capture, made where autograd would accumulate, seen in the
engine's order (:func:`_ready_order`).
A stand-in then passes its output through one :class:`_Tap` per parameter, the last
applied for the first parameter, so that in backward the gradients are made, and
accumulated, one by one in that order. After the recorded step, the order is checked
against the pattern block's own (its ``AccumulateGrad`` steps): any difference raises
:class:`~fxmem.trace.blocks.reuse.NoReuse`, and the step is traced block by block.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .reuse import NoReuse, grad_meta, grad_of
from .sharded import ShardedReuse, _call_key, _Warm


class _Tap(torch.autograd.Function):
    """Passes a block's output through and, in backward, gives parameter ``p`` a gradient
    of its own shape (in the warm-up only)."""

    @staticmethod
    def forward(ctx, out, p):
        ctx.meta = grad_meta(p)
        ctx.set_materialize_grads(False)
        return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad_of(ctx.meta)


def _ready_order(block, args, kwargs, params: list) -> list:
    """The names of ``params`` (``(name, tensor)``) in the order ``block``'s backward makes
    their gradients ready, asked of autograd: the block run again on the same arguments,
    as it is (no checkpoint plan's forward, nor a stand-in's, and without a Hugging Face
    layer's key/value cache: :func:`fxmem.trace.plans.checkpointing.uncached`; autocast's
    casts made again), and
    ``torch.autograd.grad`` over its outputs, which captures each gradient where it
    would be accumulated, in the engine's order, and accumulates nothing (a checkpoint
    re-runs the same graph: its order is the same, which the recorded step checks)."""
    from ..kernels.amp import autocast_cache_off
    from ..plans.checkpointing import uncached

    seen: list = []
    with _plain(block), torch.enable_grad(), autocast_cache_off():
        out = uncached(block, block)(*args, **kwargs)
        ins = [t for t in tree_flatten((args, kwargs))[0]
               if isinstance(t, torch.Tensor) and t.requires_grad]
        outs = [t for t in tree_flatten(out)[0]
                if isinstance(t, torch.Tensor) and t.requires_grad]
        handles = [p.register_hook(lambda g, n=n: seen.append(n)) for n, p in params]
        try:
            torch.autograd.grad(outs, [*ins, *(p for _, p in params)],
                                [torch.empty_like(o) for o in outs], allow_unused=True)
        finally:
            for h in handles:
                h.remove()
    return seen


@contextlib.contextmanager
def _plain(block):
    """``block`` and its modules without the forwards set on them (a plan's checkpoint, a
    stand-in's): their classes' own, until the block exits."""
    own = [(m, m.__dict__.pop("forward")) for m in block.modules() if "forward" in m.__dict__]
    try:
        yield
    finally:
        for m, f in own:
            m.forward = f


class ReplicatedReuse(ShardedReuse):
    """:class:`~fxmem.trace.blocks.sharded.ShardedReuse` for blocks under DDP (see the
    module docstring)."""

    def __init__(self, rec, runs):
        super().__init__(rec, runs)
        self._order: dict = {}  # run -> its parameters' names, in their gradients' order

    def _warming(self, run, k, orig, args, kwargs):
        learnt = run.paths in self._order
        if k >= 3 and learnt:
            return self._tapped(run, k, orig, args, kwargs)
        out = super()._warming(run, k, orig, args, kwargs)
        if k != 2 or learnt:
            return out
        params = [(n, p) for n, p in self.params(run.paths[k]) if p.requires_grad]
        order = _ready_order(self.modules[run.paths[k]], args, kwargs, params)
        if sorted(order) != sorted(n for n, _ in params):
            raise NoReuse(f"{run.paths[k]}: not every parameter gets a gradient once")
        self._order[run.paths] = order
        return out

    def _tapped(self, run, k, orig, args, kwargs):
        """A later block in the warm-up: :class:`~fxmem.trace.blocks.sharded._Warm`'s
        outputs, its parameters' gradients made one by one in the learnt order."""
        seen = self._warm.get(run.paths)
        key, tensors = _call_key(args, kwargs)
        if seen is None or seen[0] != key:  # traced for real, as ShardedReuse does
            return orig(*args, **kwargs)
        _, out_spec, metas = seen
        grad_in = [t for t in tensors if t.requires_grad]
        outs = list(_Warm.apply(metas, len(grad_in), *grad_in))
        at = next((i for i, m in enumerate(metas) if m[3]), None)
        if at is None:
            raise NoReuse(f"{run.paths[k]}: no output needs a gradient")
        params = dict(self.params(run.paths[k]))
        for name in reversed(self._order[run.paths]):
            outs[at] = _Tap.apply(outs[at], params[name])
        return tree_unflatten(outs, out_spec)

    def finish(self) -> None:
        """:meth:`ShardedReuse.finish`, and the pattern block's gradients checked to have
        come in the order its stand-ins gave them in the warm-up."""
        super().finish()
        rec = self.rec
        for run in self.runs:
            order, calls = self._order.get(run.paths), self.calls[run.paths]
            if order is None or len(calls) < 3:
                continue
            pat = calls[1]
            names = {s: n[1] for n, s in pat.roles.items() if n[0] == "pb"}
            got: list = []
            for i in range(*pat.bwd):  # each parameter's AccumulateGrad steps, in order
                name = names.get(rec.accumulated.get(i))
                if name is not None and name not in got:
                    got.append(name)
            if got != order:
                raise NoReuse(f"{pat.path}: its gradients came in another order than "
                              "its stand-ins gave them in the warm-up")
