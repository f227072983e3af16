"""Saved tensors during tracing: who holds what, and until when.

A storage that autograd saves for backward stays alive for two reasons: Python variables
(locals, module outputs) and autograd's saved copies. A checkpoint plan removes the second
reason inside its segments, so predicting a plan from one trace needs the two apart.

On fake tensors the saved data is never read, so the tracer's ``saved_tensors_hooks`` store
a :class:`Held` record (shape, strides, storage id) instead of the tensor: the storage then
dies when Python drops it (its *unref* time), and the record dies when autograd releases
the saved copy (its *release* time). On unpack a fresh fake tensor with the same metadata is
made and mapped to the same storage id, so backward ops read the storage they would have
read. The storage's eager free time is the later of the two, as it is in eager PyTorch.

Storages that exist before the step (parameters, buffers, the batch) are held for real:
their lifetime does not change, only the release time is recorded.

Recorded per pack: the op position (ops recorded so far: a pack before an op's kernel runs
sees that op's index, a pack of its output the next one), the storage and the saving
module; per unpack: the first position at which each pack was read back.
"""

from __future__ import annotations

import weakref
from dataclasses import astuple, dataclass

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

_STAND_IN = [0]  # > 0 while SavedTensors.unpack makes a saved tensor's stand-in


def making_stand_in() -> bool:
    """Whether :meth:`SavedTensors.unpack` is making a saved tensor's stand-in: a fake
    tensor by design though made from no other tensor, an integer one too (the targets a
    causal LM's loss shifts and saves), which a mode that runs an integer tensor made from
    none for real (DDP's :class:`fxmem.trace.parallel.ddp.RealInts`) leaves alone."""
    return _STAND_IN[0] > 0


@dataclass(frozen=True)
class Pack:
    """One tensor saved for backward during the forward.

    ``at``: ops recorded before it was saved; ``sid``: its storage; ``module``: the module
    whose forward saved it; ``released_after``: op index after which autograd dropped it
    (``None``: still held at the end); ``unpacked_at``: ops recorded before its first
    unpack in backward (``None``: never read back); ``unpack_order``: the rank of that
    first unpack among all first unpacks (orders unpacks between the same two ops);
    ``dropped_after``: op index after which the tensor its last unpack returned died (the
    backward node's own reference: a checkpoint's recomputed tensor lives until then).
    """

    at: int
    sid: int
    module: str
    released_after: int | None
    unpacked_at: int | None
    unpack_order: int | None
    dropped_after: int | None = None


@dataclass
class _Record:
    """A :class:`Pack` while it is being recorded (same fields, mutable)."""

    at: int
    sid: int
    module: str
    released_after: int | None = None
    unpacked_at: int | None = None
    unpack_order: int | None = None
    dropped_after: int | None = None


def latest(*op_indices):
    """The last of some "freed after op i" indices, where ``None`` means never freed.

    >>> latest(3, 7), latest(3, None), latest()
    (7, None, -1)
    """
    return None if any(i is None for i in op_indices) else max(op_indices, default=-1)


class Held:
    """What the pack hook stores in place of a saved tensor (see the module docstring)."""

    __slots__ = ("index", "sid", "tensor", "meta", "node", "wraps", "__weakref__")

    def __init__(self, index, sid, tensor, meta, node, wraps=()):
        self.index, self.sid, self.tensor, self.meta, self.node = index, sid, tensor, meta, node
        self.wraps = wraps  # a wrapper subclass's layers around the plain tensor (_unwrap)


def _unwrap(t: torch.Tensor):
    """The plain tensor inside ``t`` and what rebuilds ``t`` around a stand-in for it:
    ``(class, the other attributes, the wrapped tensor's attribute, context, size,
    stride)`` per wrapper layer, outermost first (a ``DTensor`` that autograd saved: its
    local tensor, its mesh and spec; no tensor is held)."""
    wraps = []
    while is_traceable_wrapper_subclass(t):
        attrs, ctx = t.__tensor_flatten__()
        values = {a: getattr(t, a) for a in attrs}
        inner = [a for a, v in values.items() if isinstance(v, torch.Tensor)]
        if len(inner) != 1:
            break
        others = {a: v for a, v in values.items() if a != inner[0]}
        wraps.append((type(t), others, inner[0], ctx, t.shape, t.stride()))
        t = values[inner[0]]
    return t, tuple(wraps)


class SavedTensors:
    """Pack and unpack hooks for the tracer (``torch.autograd.graph.saved_tensors_hooks``).

    ``tracker`` is the :class:`fxmem.trace.ledger.tracking.StorageTracker` that owns storage ids;
    ``where()`` returns ``(phase, module)`` of the op being traced; ``node_of`` maps a fake
    tensor to its fx node (so the graph keeps its data flow through unpacked tensors).
    """

    def __init__(self, tracker, where, node_of):
        self.tracker, self.where, self.node_of = tracker, where, node_of
        self._packs: list[_Record] = []
        self._unpacks = 0
        self._finalizers: list[weakref.finalize] = []

    def pack(self, t: torch.Tensor):
        tr = self.tracker
        sid = tr.sid(t)
        phase, module = self.where()
        if sid is None or not tr.recording or phase != "forward":
            return _Plain(t)
        index = len(self._packs)
        self._packs.append(_Record(tr.op_count, sid, module))
        if tr.storages[sid].created_by < 0:  # lives through the step anyway
            held = Held(index, sid, t, None, None)
        else:
            t, wraps = _unwrap(t)
            st = t.untyped_storage()
            meta = (t.shape, t.stride(), t.storage_offset(), t.dtype, t.device,
                    st.nbytes() // t.element_size())
            held = Held(index, sid, None, meta, self.node_of.get(t), wraps)
        self._finalizers.append(weakref.finalize(held, self._on_release, index))
        return held

    def unpack(self, held):
        if isinstance(held, _Plain):
            return held.tensor
        tr = self.tracker
        rec = self._packs[held.index]
        if rec.unpacked_at is None and tr.recording:
            rec.unpacked_at, rec.unpack_order = tr.op_count, self._unpacks
            self._unpacks += 1
        if held.tensor is not None:
            return held.tensor
        shape, stride, offset, dtype, device, numel = held.meta
        was, tr.recording = tr.recording, False
        _STAND_IN[0] += 1
        try:
            if isinstance(offset, int) and offset == 0:  # as_strided on symbolic sizes costs more
                t = base = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            else:
                base = torch.empty((numel,), dtype=dtype, device=device)
                t = base.as_strided(shape, stride, offset)
        finally:
            tr.recording = was
            _STAND_IN[0] -= 1
        tr.alias(t, held.sid)
        rec.dropped_after = None  # alive until this stand-in dies
        self._finalizers.append(weakref.finalize(base.untyped_storage(), self._on_drop,
                                                 held.index))
        if held.node is not None:
            self.node_of[t] = held.node
        for cls, others, attr, ctx, size, stride in reversed(held.wraps):
            t = cls.__tensor_unflatten__({**others, attr: t}, ctx, size, stride)
        return t

    def _on_drop(self, index: int) -> None:
        tr = self.tracker
        if tr.recording:
            self._packs[index].dropped_after = tr.op_count - 1

    def _on_release(self, index: int) -> None:
        tr = self.tracker
        if tr.recording:
            self._packs[index].released_after = tr.op_count - 1

    def close(self) -> None:
        for f in self._finalizers:
            f.detach()
        self._finalizers.clear()

    @property
    def packs(self) -> tuple:
        return tuple(Pack(*astuple(p)) for p in self._packs)

    def release_times(self) -> dict:
        """sid -> op index after which autograd's last saved copy went away, and with it
        the last tensor an unpack returned (None: never). The unpacked tensor is the storage
        in eager PyTorch: a checkpoint's recomputed forward holds its input's so, past the
        release of the saved copy."""
        by_sid: dict = {}
        for p in self._packs:
            times = by_sid.setdefault(p.sid, [])
            times.append(p.released_after)
            if p.unpacked_at is not None:
                times.append(p.dropped_after)
        return {sid: latest(*times) for sid, times in by_sid.items()}

    def saved_by(self) -> dict:
        """sid -> sorted module paths whose forward saved it."""
        by_sid: dict = {}
        for p in self._packs:
            by_sid.setdefault(p.sid, set()).add(p.module)
        return {sid: tuple(sorted(mods)) for sid, mods in by_sid.items()}


class _Plain:
    """A saved tensor kept as it is (backward-of-backward, untracked tensors)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor
