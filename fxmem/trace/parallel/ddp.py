"""DDP and ZeRO-1: the step as one rank of ``world_size`` runs it under PyTorch's own
``DistributedDataParallel`` (``torch.nn.parallel``), optionally with the optimizer state
partitioned by ``ZeroRedundancyOptimizer`` (``torch.distributed.optim``).

Every rank holds the whole model and its whole gradients; DDP's Reducer (C++) adds its
gradient buckets: flat buffers, one per bucket of parameters (``bucket_cap_mb`` each, the
first smaller), allocated with ``at::empty`` when DDP is constructed and again when the
buckets are rebuilt in the order the gradients came in, in the forward after the first
backward (the third with ``static_graph``: ``reducer.cpp`` ``Reducer::rebuild_buckets``).
The autograd hooks copy each gradient into its bucket (scaled by ``1 / world_size``) and
all-reduce the bucket in place, then copy it back to the gradient; with
``gradient_as_bucket_view=True`` the gradients are views of the buckets instead (no
gradient of its own). ``static_graph=True`` adds two ``int32`` maps of one entry per
parameter (``local_used_map_`` and its device copy).

The same wrapping serves a trace and a real run:

- for a trace (:func:`fxmem.trace.parallel.fsdp.sharded`), a copy of the model's parameters
  made fakes of the trace's mode, then wrapped by ``DistributedDataParallel`` inside that
  mode over :class:`_EchoGroup`, a process group whose collectives leave their tensors as
  they are and finish at once (the fake process group's work has no result, which the
  Reducer reads: ``comm.cpp`` ``parseCppCommHookResult``). The storages the construction
  and the warm-up steps make and keep (:class:`Kept`: the buckets) are live from the
  recorded step's start, category ``grad``;
- for a real run (:mod:`fxmem.validate.distributed`), the same wrapping over gloo.

ZeRO-1 (``zero1=True``): the optimizer the step names becomes
``ZeroRedundancyOptimizer(params, optimizer_class=that optimizer)``: each rank keeps the
state of its partition of the parameters only, steps them, and broadcasts them to the
other ranks (in place: ``dist.broadcast`` of each parameter from its owner). The partition
is ZeRO's own greedy one (:meth:`DDP.partition`); ranks that own parameters of the same
shapes in the same order are alike (:meth:`DDP.rank_groups`), one trace each group.

>>> import torch
>>> m = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Linear(5, 3))
>>> DDP(2).rank_groups(m), DDP(2, zero1=True).rank_groups(m)
(((0, 1),), ((0,), (1,)))
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ...errors import InputError
from ..ledger.saved import making_stand_in
from ..ledger.tracking import StorageTracker
from .strategy import Strategy


@dataclass(frozen=True)
class DDP(Strategy):
    """``DistributedDataParallel`` over ``world_size`` ranks (each rank a whole replica;
    gradients all-reduced in buckets). ``bucket_cap_mb``, ``gradient_as_bucket_view``,
    ``static_graph``: DDP's own options (the bucket cap in MiB, as DDP reads it).
    ``zero1``: the optimizer state partitioned over the ranks by
    ``ZeroRedundancyOptimizer`` (ZeRO stage 1, with DDP underneath as it is used). B is
    each rank's micro-batch.

    >>> DDP(8).name, DDP(4, zero1=True).name
    ('DDP over 8 ranks', 'DDP over 4 ranks (ZeRO-1)')
    """

    world_size: int
    bucket_cap_mb: float = 25
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    zero1: bool = False

    def __post_init__(self):
        self.check_world_size("DDP")
        cap = self.bucket_cap_mb
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
            raise InputError(f"DDP: bucket_cap_mb is a positive number of MiB, got {cap!r}")
        for field in ("gradient_as_bucket_view", "static_graph", "zero1"):
            if not isinstance(getattr(self, field), bool):
                raise InputError(f"DDP: {field} is True or False, got "
                                 f"{getattr(self, field)!r}")

    @property
    def name(self) -> str:
        """A short description, e.g. ``DDP over 8 ranks (ZeRO-1)``."""
        opts = []
        if self.bucket_cap_mb != 25:
            opts.append(f"bucket_cap_mb={self.bucket_cap_mb}")
        for field in ("gradient_as_bucket_view", "static_graph"):
            if getattr(self, field):
                opts.append(f"{field}=True")
        if self.zero1:
            opts.append("ZeRO-1")
        return f"DDP over {self.world_size} ranks" + (f" ({', '.join(opts)})" if opts else "")

    @property
    def warmup_steps(self) -> int:
        """Steps before the state is steady: DDP rebuilds its buckets in the forward after
        the first backward (``static_graph``: after the second)."""
        return 3 if self.static_graph else 2

    def apply(self, model: torch.nn.Module, mesh) -> torch.nn.Module:
        """``model`` wrapped by ``DistributedDataParallel`` over ``mesh``'s group (a fake
        group: :class:`_EchoGroup` of its rank and size)."""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        group, sync = mesh.get_group(), {}
        if dist.get_backend(group) == "fake":  # the Reducer reads its all-reduce's result
            group = _EchoGroup(group.rank(), group.size())
            # one rank traced: no check that every rank's parameters have the same shapes
            # (it writes them into a tensor's data, which fake tensors have none of:
            # ``_verify_params_across_processes``), no broadcast of rank 0's values (its
            # flat copy is freed when DDP's constructor returns): nothing that outlives it
            sync = {"init_sync": False}
        return DistributedDataParallel(
            model, device_ids=None, process_group=group, bucket_cap_mb=self.bucket_cap_mb,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            static_graph=self.static_graph, **sync)

    def runs_compiled_parts(self) -> bool:
        """Blocks compiled on their own (``torch.compile(block)`` put back, or
        ``block.compile()``): each rank's whole replica CUDA fakes (on a CUDA mesh), its
        blocks lowered as on one GPU; DDP's forward makes dynamo split each block's graph at
        its buckets' bounds (``DDPOptimizer``), in the trace as in a real run, and the
        Reducer's hooks fire as the compiled backward's gradients reach the parameters.
        Checked on the fake GPU's ranks, ZeRO-1 and ``gradient_as_bucket_view`` too. Not
        with ``static_graph``: its Reducer copies its map of used parameters to the device
        through pinned host memory, which the trace's fakes do not give it (an internal
        assert in ``reducer.cpp``)."""
        return type(self) is DDP and not self.static_graph

    def runs_planned_parts(self) -> bool:
        """A checkpoint plan over blocks ``torch.compile(block)`` put back, each lowered as
        ``torch.compile(checkpoint_wrapper(block))`` in each rank's replica, as torchtitan's
        recipe (checkpoint, compile, then wrap) runs it; checked on the fake GPU's ranks,
        ZeRO-1 and ``gradient_as_bucket_view`` too."""
        return self.runs_compiled_parts()

    def optimizer(self, factory):
        """The optimizer factory each rank runs: ``factory`` itself, or with ``zero1``,
        ``ZeroRedundancyOptimizer`` over it (``factory``: an optimizer class or
        ``callable(params)``)."""
        if not self.zero1 or factory is None:
            return factory
        return _Zero1(factory)

    def partition(self, model: torch.nn.Module) -> list:
        """With ``zero1``: the indices (in ``model.parameters()``) of the parameters each
        rank owns, rank 0 first, as ``ZeroRedundancyOptimizer._partition_parameters``
        assigns them (largest first, each to the rank with the fewest elements so far,
        the lowest such rank on a tie)."""
        params = list(model.parameters())
        order = sorted(range(len(params)), key=lambda i: params[i].numel(), reverse=True)
        owned: list = [[] for _ in range(self.world_size)]
        sizes = [0] * self.world_size
        for i in order:
            r = sizes.index(min(sizes))
            owned[r].append(i)
            sizes[r] += params[i].numel()
        return owned

    def rank_groups(self, model: torch.nn.Module) -> tuple:
        """All ranks alike; with ``zero1``, the ranks grouped by the shapes and dtypes of
        the parameters they own, in their order (:meth:`partition`)."""
        if not self.zero1:
            return (tuple(range(self.world_size)),)
        params = list(model.parameters())
        groups: dict = {}
        for r, idx in enumerate(self.partition(model)):
            key = tuple((tuple(params[i].shape), params[i].dtype) for i in idx)
            groups.setdefault(key, []).append(r)
        return tuple(tuple(g) for g in groups.values())


class _Zero1:
    """``ZeroRedundancyOptimizer(params, optimizer_class=factory)`` as a factory (a class,
    not a closure, so that forked ranks and copies see the same one)."""

    def __init__(self, factory):
        self.factory = factory

    def __call__(self, params):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=self.factory)

    def __repr__(self):
        return f"ZeroRedundancyOptimizer({getattr(self.factory, '__name__', self.factory)})"


def local_optimizer(opt):
    """The optimizer that holds the state: ZeRO's local one (``opt.optim``), else ``opt``."""
    zero = sys.modules.get("torch.distributed.optim")  # not imported: no ZeRO (0.28 s saved)
    return opt.optim if zero is not None and isinstance(opt, zero.ZeroRedundancyOptimizer) \
        else opt


def _done(result):
    from torch._C._distributed_c10d import _create_work_from_future
    from torch.futures import Future

    fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _echo_group_class():
    import torch.distributed as dist

    class _Echo(dist.ProcessGroup):
        """A process group of one rank's view whose collectives leave every tensor as it
        is and are done at once, their result the tensors (what DDP's Reducer reads)."""

        def __init__(self, rank: int, world_size: int):
            super().__init__(rank, world_size)
            self._size = world_size

        def size(self):
            return self._size

        def getBackendName(self):  # noqa: N802 - ProcessGroup's name
            return "fxmem-echo"

        def allreduce(self, tensors, opts=None):
            return _done(tensors)

        def broadcast(self, tensors, opts=None):
            return _done(tensors)

        def allgather(self, outputs, inputs, opts=None):  # every rank's the same
            for outs, t in zip(outputs, inputs):
                for o in outs:
                    o.copy_(t)
            return _done(outputs)

        def barrier(self, opts=None):
            return _done([])

    return _Echo


def _EchoGroup(rank: int, world_size: int):  # noqa: N802 - made like a class
    """A :class:`torch.distributed.ProcessGroup` (Python) whose collectives do nothing
    and return their tensors; not registered with ``torch.distributed``."""
    return _echo_group_class()(rank, world_size)


class Kept(StorageTracker):
    """The storages made while this mode is active (a wrapper's construction, warm-up
    steps) that are still alive: :meth:`left`. Storages :meth:`know` names beforehand
    (the parameters, buffers) are not made here. ``real``: for a trace, the
    :class:`RealInts` mode to keep active from the wrapper's construction to the step's
    end."""

    real = None

    def know(self, tensors) -> None:
        for t in tensors:
            if t is not None:
                self.register(t)
        self._known = {self.sid(t) for t in tensors if t is not None}

    def left(self, exclude=()) -> list:
        """The ``UntypedStorage`` s made here and still alive, oldest first, but those of
        ``exclude`` (tensors)."""
        known = getattr(self, "_known", set())
        skip = {self.sid(t) for t in exclude if t is not None}
        out = []
        for st, sid in list(self._sid_of.items()):
            info = self.storages[sid]
            if sid in known or sid in skip or info.freed_after is not None \
                    or sid in self.resized_away or info.created_by < 0:
                continue
            out.append((sid, st))
        return [st for _, st in sorted(out, key=lambda x: x[0])]


def wrapper_name(model) -> str:
    """What holds a wrapped model's own storages: ``DDP reducer`` for DDP, else the
    model's class name."""
    from torch.nn.parallel import DistributedDataParallel

    return "DDP reducer" if isinstance(model, DistributedDataParallel) else \
        type(model).__name__


class RealInts(TorchDispatchMode):
    """For a trace: integer tensors made from no fake tensor are real, and so is every op
    on real tensors only (nothing else is real in a trace). DDP's Reducer writes and reads
    such tensors through their data pointers, which a fake tensor has none of: the bucket
    indices when it rebuilds its buckets (``reducer.cpp`` ``sync_bucket_indices``: a few
    bytes, freed before it returns), and with ``static_graph`` its map of the parameters
    used (``local_used_map_``, one ``int32`` per parameter, kept: counted as the
    Reducer's; read in the first iteration's backward)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _bookkeeping(func, args, kwargs):
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)


def _fake_arg(args) -> bool:
    """Is a positional argument, or an item of a list or tuple of them, a fake tensor? Most
    of a step's ops: :func:`_bookkeeping` answers those at once (walking every op's
    arguments took a tenth of a DDP trace: Llama-3.1-8B over 8 ranks with ZeRO-1)."""
    for a in args:
        if isinstance(a, FakeTensor) or isinstance(a, (list, tuple)) and any(
                isinstance(t, FakeTensor) for t in a):
            return True
    return False


def _bookkeeping(func, args, kwargs) -> bool:
    """Does an op run on real tensors only, or make an integer tensor (not a bool one) of
    plain sizes from none (not a saved tensor's stand-in:
    :func:`fxmem.trace.ledger.saved.making_stand_in`)? A bool mask from no tensor is the
    step's (math attention's causal mask on a V100: at a symbolic L no real kernel takes
    its sizes, at a plain one it had been real, its bytes uncounted)."""
    if _fake_arg(args):  # the step's (most ops: answered before walking their arguments)
        return False
    if making_stand_in() or func in _LIFTS:  # a constant of the model's, lifted as on one GPU
        return False
    leaves = tree_leaves((args, kwargs))
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if tensors:
        return not any(isinstance(t, FakeTensor) for t in tensors)
    dtype = kwargs.get("dtype")
    return dtype is not None and not dtype.is_floating_point and not dtype.is_complex \
        and dtype is not torch.bool \
        and not any(isinstance(v, (torch.SymInt, torch.SymFloat)) for v in leaves)
