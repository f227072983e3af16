"""Storage-level allocation tracking, shared by the tracer and the CPU measurement.

:class:`StorageTracker` is a ``TorchDispatchMode``: every aten op that runs while it is
active is recorded, with the storages its outputs create. Each storage gets a
``weakref.finalize`` callback, so the moment eager PyTorch drops the last reference to it
(a Python variable going away, autograd releasing saved tensors) is recorded in order. The
tracker never holds a strong reference to a tensor or a storage: holding one would change
the very lifetimes it measures.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from dataclasses import dataclass

import torch
from torch._C import DispatchKey
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


@dataclass
class StorageEvent:
    """A storage created (``kind="alloc"``) or freed (``"free"``) after op ``op_index``.

    Frees seen before the first op carry ``op_index = -1``.
    """

    kind: str
    sid: int
    op_index: int


@dataclass
class TrackedStorage:
    sid: int
    nbytes: object  # int, or torch.SymInt while tracing
    created_by: int  # op index, -1 for storages registered before the step
    freed_after: int | None = None  # op index after which it was freed; None: alive at end


def _composite(func) -> bool:
    """Is ``func`` implemented by a CompositeImplicitAutograd kernel (calls to other ops)?

    An op the c10 dispatcher does not know is not: the dispatch modes also receive
    TorchScript builtins, e.g. ``aten::size(Tensor self) -> int[]`` when a C++ kernel asks a
    tensor with symbolic sizes for its concrete ones (fxmem.trace.rules.METADATA_QUERIES),
    and looking one up by name raises "operator aten::size does not exist"."""
    cached = _COMPOSITE.get(func)
    if cached is None:
        cached = _COMPOSITE[func] = _in_dispatcher(func) and \
            torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                           "CompositeImplicitAutograd")
    return cached


def _in_dispatcher(func) -> bool:
    """Is ``func`` an operator of the c10 dispatcher (not a TorchScript-only builtin)?"""
    try:
        torch._C._dispatch_find_schema_or_throw(func._schema.name, func._schema.overload_name)
    except RuntimeError:
        return False
    return True


_COMPOSITE: dict = {}


class StorageTracker(TorchDispatchMode):
    """Records ops and storage lifetimes in eager order. Subclasses add what they need."""

    def __init__(self):
        super().__init__()
        self._sid_of = WeakIdKeyDictionary()
        self._finalizers: dict[int, weakref.finalize] = {}
        self.storages: list[TrackedStorage] = []
        self.events: list[StorageEvent] = []
        self.op_count = 0
        self.recording = True

    # storages -------------------------------------------------------------------------
    def sid(self, t: torch.Tensor) -> int | None:
        """The id of the storage behind ``t``, or None if it was never seen."""
        return self._sid_of.get(t.untyped_storage())

    def register(self, t: torch.Tensor, created_by: int = -1, nbytes=None) -> tuple[int, bool]:
        """The storage id of ``t``, registering its storage if new. Returns (sid, new).

        ``nbytes`` overrides the storage's own size (a kernel rule knows better).
        """
        st = t.untyped_storage()
        sid = self._sid_of.get(st)
        if sid is not None:
            return sid, False
        sid = len(self.storages)
        self._sid_of[st] = sid
        self.storages.append(TrackedStorage(sid, st.nbytes() if nbytes is None else nbytes,
                                            created_by))
        self._finalizers[sid] = weakref.finalize(st, self._on_free, sid)
        if created_by >= 0:
            self.events.append(StorageEvent("alloc", sid, created_by))
        return sid, True

    def alias(self, t: torch.Tensor, sid: int) -> None:
        """Count ``t``'s storage as storage ``sid`` (a stand-in for it: no free is recorded)."""
        self._sid_of[t.untyped_storage()] = sid

    def _on_free(self, sid: int) -> None:
        if self.recording:
            self.storages[sid].freed_after = self.op_count - 1
            self.events.append(StorageEvent("free", sid, self.op_count - 1))

    def close(self) -> None:
        """Stop listening: later frees are not part of the step."""
        self.recording = False
        for f in self._finalizers.values():
            f.detach()
        self._finalizers.clear()

    # dispatch -------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.composite(func):
            # Only under inference_mode (autograd's keys excluded) does a composite op such
            # as aten.lstm.input reach this mode whole; its C++ body would then allocate
            # unseen. Run that body (not a Python decomposition registered for it) with this
            # mode active, so its ops and their storages are seen one by one.
            with self:
                return func._op_dk(DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
        if not self.recording:  # still run through run_op's rules
            return self.run_op(func, args, kwargs)
        out = self.run_op(func, args, kwargs)
        index = self.op_count
        self.op_count += 1
        outs, new = [], []
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                sid, is_new = self.register(t, index, self.output_nbytes(func, args, kwargs, t))
                outs.append(sid)
                if is_new:
                    new.append(sid)
        temporaries = self.workspaces(func, args, kwargs, out)
        for t, what, nbytes in temporaries:  # made by the kernel, freed when it ends
            sid, _ = self.register(t, index, nbytes)
            self.name_workspace(sid, what)
            new.append(sid)
        self.on_op(index, func, args, kwargs, out, outs, new)
        return out

    def composite(self, func) -> bool:
        """Does ``func`` reach this mode whole although its kernel is a composite?"""
        return _composite(func)

    def run_op(self, func, args, kwargs):
        return func(*args, **kwargs)

    def output_nbytes(self, func, args, kwargs, t):
        """Bytes of a new output storage when they differ from its nbytes(); None: no rule."""
        return None

    def workspaces(self, func, args, kwargs, out) -> list:
        """``(tensor, what, nbytes)`` for each temporary the real kernel of ``func``
        allocates while it runs (beyond its outputs): recorded as storages of ``nbytes`` the op
        creates (``tensor`` stands for it), freed after it."""
        return []

    def name_workspace(self, sid: int, what: str) -> None:
        """Hook for subclasses: storage ``sid`` is a kernel's temporary, ``what``."""

    def on_op(self, index, func, args, kwargs, out, out_sids, new_sids) -> None:
        """Hook for subclasses: op ``index`` ran and produced these storages."""


_gc_frozen_here = 0  # depth of fxmem's own frozen_gc blocks on this process


@contextlib.contextmanager
def frozen_gc():
    """The cyclic collector's full passes over every object of torch, transformers and the
    model cost about a sixth of an analysis: exempt the objects made before the block
    (``gc.freeze``; garbage it makes is still collected), undone on exit. Not when the
    caller froze objects already, and only once when such blocks nest (``analyze`` runs
    ``trace``): ``gc.get_freeze_count`` walks every frozen object."""
    global _gc_frozen_here
    frozen = not _gc_frozen_here and not gc.get_freeze_count()
    if frozen:
        gc.freeze()
    _gc_frozen_here += 1
    try:
        yield
    finally:
        _gc_frozen_here -= 1
        if frozen:
            gc.unfreeze()
