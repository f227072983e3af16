"""Storage-level allocation tracking, shared by the tracer and the CPU measurement.

:class:`StorageTracker` is a ``TorchDispatchMode``: every aten op that runs while it is
active is recorded, with the storages its outputs create. Each storage gets a
``weakref.finalize`` callback, so the moment eager PyTorch drops the last reference to it
(a Python variable going away, autograd releasing saved tensors) is recorded in order. The
tracker never holds a strong reference to a tensor or a storage: holding one would change
the very lifetimes it measures.

Two things eager code does besides aten ops are seen too:

- a tensor subclass that wraps plain tensors (``DTensor``, a collective's
  ``AsyncCollectiveTensor``) is not recorded itself: the tracker declines it, the subclass
  runs its ops on the tensors it wraps, and those ops are recorded; a wrapper's storage is
  the storage of the tensor it wraps;
- ``UntypedStorage.resize_``, which FSDP2 uses to free and re-allocate a parameter's
  all-gathered storage in place (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``
  ``free_storage``/``alloc_storage``): while :func:`storage_resizes` is active, a resize to 0
  frees the storage and a resize from 0 allocates a new one (recorded as an op of its own,
  :data:`RESIZE_OP`).

Each storage the step makes is also tagged with the stream it is allocated on (PyTorch's
caching allocator keeps each stream's blocks apart): the stream ``torch.cpu.stream(s)``
selected. On the CPU fakes of a trace, device-agnostic code that allocates on streams of
its own does so through ``torch.cpu``: FSDP2 on a CPU mesh takes ``torch.cpu`` as its
device handle (``_get_device_handle``), makes its all-gather and reduce-scatter streams
with ``torch.cpu.Stream`` (distinct objects) and selects them with ``torch.cpu.stream``,
which keeps the current one as ``torch.cuda.stream`` does on a GPU (``torch/cpu/__init__.py``
``StreamContext``). Index 0 is the default stream, then 1, 2, ... in the order the step
first allocates on the others.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import weakref
from dataclasses import dataclass

import torch
from torch._C import DispatchKey
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    is_traceable_wrapper_subclass,
    is_traceable_wrapper_subclass_type,
)
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
    stream: int = 0  # the stream it was allocated on (StorageTracker.stream_index)


# Ops with a CompositeImplicitAutograd kernel *and* a kernel of their own for a device: the
# dispatcher runs the device's kernel (autograd's slot takes a composite only where the
# backend has no kernel: c10/core/dispatch/OperatorEntry.cpp, computeDispatchTableEntry),
# so on that device they are one op that allocates its outputs, never the composite's ops.
# "cpu": read off the registrations of the CPU build (2.13.0+cpu) and the CUDA one
# (2.14.1+cu130), which agree; "cuda": the CUDA build's registrations, and
# aten/src/ATen/native/native_functions.yaml (silu_backward, mish_backward: "CPU, CUDA"
# dispatch entries beside "CompositeImplicitAutograd: math_*"; _fused_rms_norm: "CUDA:
# _fused_rms_norm_cuda" beside its composite). A build that runs decides for its own
# devices (:func:`has_backend_kernel`); these tables decide for CUDA on a CPU build, and
# ``tests/test_ground_truth.py`` fails when a release adds an op to either list.
BACKEND_KERNEL_OVER_COMPOSITE = {
    "cpu": frozenset({"aten::silu_backward", "aten::mish_backward",
                      "aten::native_channel_shuffle"}),
    "cuda": frozenset({"aten::silu_backward", "aten::mish_backward", "aten::_fused_rms_norm"}),
}
_DISPATCH_KEY = {"cpu": "CPU", "cuda": "CUDA"}


def builds_kernels_for(device: str) -> bool:
    """Does the running build register kernels for ``device`` (a CUDA build for "cuda")?"""
    return torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor",
                                                          _DISPATCH_KEY[device])


@functools.lru_cache(maxsize=None)
def has_backend_kernel(name: str, device: str) -> bool:
    """Has the op ``name`` (``"aten::silu_backward"``) a kernel of its own for ``device``
    ("cpu" or "cuda"), which the dispatcher runs in place of its composite? From the running
    build's registrations when it has kernels for ``device``, else from
    :data:`BACKEND_KERNEL_OVER_COMPOSITE`.

    >>> has_backend_kernel("aten::silu_backward", "cpu"), has_backend_kernel("aten::matmul", "cpu")
    (True, False)
    >>> has_backend_kernel("aten::_fused_rms_norm", "cuda")
    True
    """
    if builds_kernels_for(device):
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, _DISPATCH_KEY[device])
    return name in BACKEND_KERNEL_OVER_COMPOSITE[device]


def _composite(func) -> bool:
    """Is ``func`` implemented by a CompositeImplicitAutograd kernel (calls to other ops)?

    An op the c10 dispatcher does not know is not: the dispatch modes also receive
    TorchScript builtins, e.g. ``aten::size(Tensor self) -> int[]`` when a C++ kernel asks a
    tensor with symbolic sizes for its concrete ones (fxmem.trace.kernels.rules.METADATA_QUERIES),
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

# the op a storage's resize from 0 is recorded as: PyTorch's own name for resizing a
# storage in place (torch/_inductor/resize_storage_bytes.py; eager code calls the method)
RESIZE_OP = torch.ops.inductor.resize_storage_bytes_.default


def plain(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor whose storage holds ``t``'s data: ``t`` itself, or the one tensor a
    wrapper subclass wraps (``DTensor._local_tensor``), recursively."""
    while is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()  # DTensor's: its local tensor and its mesh
        inner = [v for v in map(functools.partial(getattr, t), attrs)
                 if isinstance(v, torch.Tensor)]
        if len(inner) != 1:
            break
        t = inner[0]
    return t


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
        self._current = WeakIdKeyDictionary()  # storage -> [sid of its live allocation]
        # storages freed by a resize to 0: gone then, whatever still refers to them
        self.resized_away: set[int] = set()
        self.host: set[int] = set()  # host memory, not the device's (fxmem.trace.parallel.offload)
        self.backend = "cpu"  # whose kernels run: "cuda" when the tracer follows CUDA's
        # the streams storages were made on, default first (stream_index); the stream
        # objects themselves, so that an id is never reused; torch.cpu's (streams_on)
        self._device = torch.cpu
        self._streams: list = [torch.cpu.current_stream()]
        # storages an unrecorded op made on another stream (a warm-up step) -> its index
        self._made_on = WeakIdKeyDictionary()

    # storages -------------------------------------------------------------------------
    def sid(self, t: torch.Tensor) -> int | None:
        """The id of the storage behind ``t``, or None if it was never seen."""
        return self._sid_of.get(plain(t).untyped_storage())

    def register(self, t: torch.Tensor, created_by: int = -1, nbytes=None) -> tuple[int, bool]:
        """The storage id of ``t`` (a tensor, or an ``UntypedStorage`` itself), registering
        its storage if new. Returns (sid, new).

        ``nbytes`` overrides the storage's own size (a kernel rule knows better).
        """
        st = t if isinstance(t, torch.UntypedStorage) else plain(t).untyped_storage()
        sid = self._sid_of.get(st)
        if sid is not None:
            return sid, False
        return self._new(st, st.nbytes() if nbytes is None else nbytes, created_by), True

    def _new(self, st, nbytes, created_by: int) -> int:
        sid = len(self.storages)
        self._sid_of[st] = sid
        stream = self.stream_index() if created_by >= 0 else self._made_on.get(st, 0)
        self.storages.append(TrackedStorage(sid, nbytes, created_by, stream=stream))
        cell = self._current.get(st)
        if cell is None:  # the first allocation of this storage: its end is the storage's
            cell = self._current[st] = [sid]
            self._finalizers[sid] = weakref.finalize(st, self._on_gone, cell)
        cell[0] = sid
        if created_by >= 0:
            self.events.append(StorageEvent("alloc", sid, created_by))
        return sid

    def streams_on(self, device: str) -> None:
        """Read the streams of ``device`` (``"cpu"``, the default, or ``"cuda"``: a trace on
        CUDA fakes, a compiled step's, where FSDP2 runs on a CUDA mesh and selects its
        streams with ``torch.cuda.stream``), the one current now the default."""
        self._device = getattr(torch, device)
        self._streams = [self._device.current_stream()]

    def stream_index(self) -> int:
        """The stream an allocation now goes to: 0 for the default stream (the one current
        when the tracker was made), else 1, 2, ... for the others ``torch.cpu.stream`` (or
        :meth:`streams_on`'s device's) selected, in the order of their first allocation."""
        s = self._device.current_stream()
        for i, known in enumerate(self._streams):
            if known == s:  # (torch.cuda makes a new object per call: not `is`)
                return i
        self._streams.append(s)
        return len(self._streams) - 1

    def mark_host(self, t: torch.Tensor) -> None:
        """``t``'s storage is host memory: it takes no device memory."""
        sid = self.sid(t)
        if sid is not None:
            self.host.add(sid)

    def alias(self, t: torch.Tensor, sid: int) -> None:
        """Count ``t``'s storage as storage ``sid`` (a stand-in for it: no free is recorded)."""
        self._sid_of[plain(t).untyped_storage()] = sid

    def _on_gone(self, cell: list) -> None:
        self._on_free(cell[0])

    def _on_free(self, sid: int) -> None:
        if self.recording and self.storages[sid].freed_after is None:
            self.storages[sid].freed_after = self.op_count - 1
            self.events.append(StorageEvent("free", sid, self.op_count - 1))

    def resized(self, st, old: int, new: int) -> None:
        """``st.resize_(new)`` ran on a storage of ``old`` bytes: a resize to 0 frees the
        storage's allocation, a resize from 0 makes a new one (a :data:`RESIZE_OP` op);
        any other resize is a new allocation that replaces the old one."""
        if not self.recording or old == new:
            return
        sid = self._sid_of.get(st)
        if sid is not None and old:
            self._on_free(sid)
            self.resized_away.add(sid)
        if new:
            index = self.op_count
            self.op_count += 1
            sid = self._new(st, new, index)
            self.on_resize(index, st, sid)

    def on_resize(self, index: int, st, sid: int) -> None:
        """Hook for subclasses: op ``index`` is a resize that made storage ``sid``."""

    def close(self) -> None:
        """Stop listening: later frees are not part of the step."""
        self.recording = False
        for f in self._finalizers.values():
            f.detach()
        self._finalizers.clear()

    # dispatch -------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(map(is_traceable_wrapper_subclass_type, types)):
            return NotImplemented  # the subclass runs its ops on plain tensors: those count
        if self.composite(func):
            # Only under inference_mode (autograd's keys excluded) does a composite op such
            # as aten.lstm.input reach this mode whole; its C++ body would then allocate
            # unseen. Run that body (not a Python decomposition registered for it) with this
            # mode active, so its ops and their storages are seen one by one.
            with self:
                return func._op_dk(DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
        if not self.recording:  # still run through run_op's rules
            out = self.run_op(func, args, kwargs)
            self._note_stream(args, kwargs, out)
            return out
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

    def _note_stream(self, args, kwargs, out) -> None:
        """Outside the recording (a warm-up step): the storages an op made on a stream other
        than the default one, so that one still there when the step starts is placed on its
        stream (FSDP2's gradients kept across steps are views of a reduce-scatter output,
        made on the reduce-scatter stream). An output on an input's storage is not made."""
        if self._device.current_stream() == self._streams[0]:
            return
        given = {id(plain(x).untyped_storage()) for x in tree_leaves((args, kwargs))
                 if isinstance(x, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = plain(t).untyped_storage()
                if id(st) not in given and st not in self._made_on:
                    self._made_on[st] = self.stream_index()

    def composite(self, func) -> bool:
        """Does ``func`` reach this mode whole although its kernel is a composite (none of
        its own for :attr:`backend`, which the dispatcher would run instead)?"""
        return _composite(func) and not has_backend_kernel(func.name(), self.backend)

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


_RESIZING: list = []  # the trackers storage_resizes() reports to, innermost last


@contextlib.contextmanager
def storage_resizes(tracker: StorageTracker):
    """While the block runs, ``UntypedStorage.resize_`` also reports to ``tracker``
    (:meth:`StorageTracker.resized`). The method is wrapped process-wide, as dispatch modes
    are, and unwrapped when the last such block ends.

    >>> tr = StorageTracker()
    >>> t = torch.empty(4)
    >>> with storage_resizes(tr):
    ...     _ = t.untyped_storage().resize_(0), t.untyped_storage().resize_(16)
    >>> [(e.kind, tr.storages[e.sid].nbytes) for e in tr.events]
    [('alloc', 16)]
    """
    if not _RESIZING:
        def resize_(st, size):
            old = st.nbytes()
            out = _BASE_RESIZE(st, size)
            for tr in tuple(_RESIZING):
                tr.resized(st, old, st.nbytes())
            return out

        torch.UntypedStorage.resize_ = resize_
    _RESIZING.append(tracker)
    try:
        yield
    finally:
        _RESIZING.remove(tracker)
        if not _RESIZING:
            del torch.UntypedStorage.resize_


_BASE_RESIZE = torch._C.StorageBase.resize_

_gc_frozen_here = 0  # depth of fxmem's own frozen_gc blocks on this process
_gc_ours = False  # the outermost of them froze (its exit unfreezes every object)


@contextlib.contextmanager
def frozen_gc():
    """The cyclic collector's full passes over every object of torch, transformers and the
    model cost about a sixth of an analysis: exempt the objects made before the block
    (``gc.freeze``; garbage it makes is still collected), undone on exit. Not when the
    caller froze objects already, and only once when such blocks nest (``analyze`` runs
    ``trace``): ``gc.get_freeze_count`` walks every frozen object."""
    global _gc_frozen_here, _gc_ours
    frozen = not _gc_frozen_here and not gc.get_freeze_count()
    if frozen:
        gc.freeze()
        _gc_ours = True
    _gc_frozen_here += 1
    try:
        yield
    finally:
        _gc_frozen_here -= 1
        if frozen:
            gc.unfreeze()
            _gc_ours = False


def freeze_more() -> None:
    """In a :func:`frozen_gc` block that froze: exempt the objects made since too (a
    finished trace, read from then on and dropped whole if at all), undone when the block
    ends; else nothing. A command's full passes had each walked every trace made before it
    (Llama-3.1-70B ``--fsdp 64 --checkpoint auto``: 15 passes, 17.4 s under load).

    >>> import gc
    >>> was = gc.get_freeze_count()
    >>> freeze_more()  # outside such a block: nothing
    >>> gc.get_freeze_count() == was
    True
    """
    if _gc_ours:
        gc.freeze()
