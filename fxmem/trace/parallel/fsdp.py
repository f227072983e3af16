"""Data parallelism: the step as one rank of ``world_size`` runs it, with the user's own
PyTorch wrapping applied by fxmem (no formula of ours stands in for it).

:class:`FSDP` shards the model with FSDP2's ``fully_shard`` (``torch.distributed.fsdp``):
each block of the model's stacks, then the root, as torchtitan and the FSDP2 tutorial do.
The same spec wraps the model for a trace and for a real run:

- for a trace (:func:`sharded`), a copy of the model on the meta device (nothing the size
  of the model is allocated) is sharded over a *fake* process group of ``world_size`` ranks
  as rank ``rank`` (``torch.testing._internal.distributed.fake_pg``: collectives do
  nothing, each rank's shards and buffers are its own), and its storages made fake tensors
  of the trace's mode: FSDP2's own Python then runs in the traced step, its all-gathers,
  reduce-scatters and frees recorded like any op;
- for a real run (:func:`fxmem.validate.distributed`), the same wrapping of a real copy on
  a gloo process group of ``world_size`` processes.

Ranks differ only where the shards do: ``fully_shard`` cuts dim 0 of every parameter into
``world_size`` chunks as ``torch.chunk`` does (``ceil(n / world_size)`` rows each, the last
ranks shorter or empty, each padded to the same size: ``_fsdp_param.py``
``FSDPParam._init_sharded_param``). :meth:`FSDP.rank_groups` groups the ranks whose shards
are alike; one trace serves a group.

>>> import torch
>>> m = torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.Linear(5, 3))
>>> FSDP(4).rank_groups(m)
((0, 1), (2,), (3,))
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import sys
from dataclasses import dataclass
from typing import Iterator

import torch

from ...errors import InputError
from ..kernels.dtypes import NAMES, dtype_of
from .ddp import DDP, Kept, RealInts
from .strategy import Strategy, stack_blocks


@dataclass(frozen=True)
class FSDP(Strategy):
    """FSDP2 over ``world_size`` ranks (data parallel, parameters, gradients and optimizer
    state sharded). ``blocks``: module paths (or module classes) to ``fully_shard`` on their
    own before the root; ``None``: the blocks of the model's stacks of identical modules
    (a transformer's layers). ``reshard_after_forward``: FSDP2's option (``True``: free
    each block's gathered parameters after its forward and gather them again in backward;
    ``False``: keep them until backward; an int: reshard to that smaller world size).
    ``param_dtype``/``reduce_dtype``: FSDP2's ``MixedPrecisionPolicy`` (``None``: the
    parameters' dtype). ``replicate``: HSDP, ``replicate`` replicas of ``world_size /
    replicate`` shards each (``fully_shard`` on a 2-D mesh ``(replicate, shard)``: each
    rank holds its shard group's shards; gradients are reduce-scattered in the shard group,
    then all-reduced across the replicas). ``offload``: FSDP2's ``CPUOffloadPolicy``, the
    shards, their gradients and the optimizer state in host memory, the optimizer step on
    the host (:mod:`fxmem.trace.parallel.offload`). B is each rank's micro-batch.

    >>> FSDP(8).world_size, FSDP(8, reshard_after_forward=False).name
    (8, 'FSDP2 over 8 ranks (reshard_after_forward=False)')
    >>> h = FSDP(8, replicate=2)
    >>> h.name, h.mesh_shape, h.shards
    ('FSDP2 over 8 ranks (HSDP: 2 replicas of 4 shards)', (2, 4), 4)
    """

    world_size: int
    blocks: tuple | None = None
    reshard_after_forward: bool | int = True
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    replicate: int = 1
    offload: bool = False

    def __post_init__(self):
        w = self.world_size
        self.check_world_size("FSDP")
        n = self.replicate
        if isinstance(n, bool) or not isinstance(n, int) or n < 1 or w % n:
            raise InputError(f"FSDP: replicate is the number of HSDP replicas, a divisor of "
                             f"the world size {w}, got {n!r}")
        if not isinstance(self.offload, bool):
            raise InputError(f"FSDP: offload is True or False, got {self.offload!r}")
        r, s = self.reshard_after_forward, w // n
        if not isinstance(r, (bool, int)) or (not isinstance(r, bool) and not 1 <= r <= s):
            raise InputError(f"FSDP: reshard_after_forward is True, False or a world size "
                             f"from 1 to {s}, got {r!r}")
        if self.blocks is not None:
            blocks = (self.blocks,) if isinstance(self.blocks, (str, type)) else self.blocks
            if not isinstance(blocks, (tuple, list)) or not all(
                    isinstance(b, (str, type)) for b in blocks):
                raise InputError("FSDP: blocks is a list of module paths or module classes, "
                                 f"got {self.blocks!r}")
            object.__setattr__(self, "blocks", tuple(blocks))
        for field in ("param_dtype", "reduce_dtype"):
            v = getattr(self, field)
            if v is not None:
                got = dtype_of(v, what=f"FSDP {field}") if isinstance(v, str) else v
                if not isinstance(got, torch.dtype) or not got.is_floating_point:
                    raise InputError(f"FSDP: {field} is a floating dtype such as "
                                     f"torch.bfloat16, got {v!r}")
                object.__setattr__(self, field, got)

    @property
    def name(self) -> str:
        """A short description, e.g. ``FSDP2 over 8 ranks``."""
        opts = []
        if self.reshard_after_forward is not True:
            opts.append(f"reshard_after_forward={self.reshard_after_forward}")
        for field in ("param_dtype", "reduce_dtype"):
            if getattr(self, field) is not None:
                opts.append(f"{field}={NAMES[getattr(self, field)][0]}")
        if self.offload:
            opts.append("CPU offload")
        if self.replicate > 1:
            opts.insert(0, f"HSDP: {self.replicate} replicas of {self.shards} shards")
        return f"FSDP2 over {self.world_size} ranks" + (f" ({', '.join(opts)})" if opts else "")

    @property
    def shards(self) -> int:
        """Ranks a parameter is sharded over: the world size, or under HSDP a replica's."""
        return self.world_size // self.replicate

    @property
    def mesh_shape(self) -> tuple:
        """``(world_size,)``, or under HSDP ``(replicate, shards)``."""
        return (self.replicate, self.shards) if self.replicate > 1 else (self.world_size,)

    @property
    def mesh_dim_names(self):
        return ("replicate", "shard") if self.replicate > 1 else None

    def block_paths(self, model: torch.nn.Module) -> tuple:
        """The module paths ``fully_shard`` wraps before the root, outermost first."""
        named = dict(model.named_modules())
        if self.blocks is None:
            return stack_blocks(model)
        out = []
        for b in self.blocks:
            if isinstance(b, str):
                if b not in named or b == "":
                    raise InputError(f"FSDP: the model has no submodule {b!r}")
                out.append(b)
            else:  # a block under checkpoint_wrapper is of its module's class (as in
                # stack_blocks): the wrapper is sharded, as its path names it
                found = [n for n, m in named.items() if n and isinstance(
                    getattr(m, "_checkpoint_wrapped_module", m), b)]
                if not found:
                    raise InputError(f"FSDP: the model has no submodule of class "
                                     f"{b.__name__}")
                out.extend(found)
        return tuple(p for p in dict.fromkeys(out)
                     if not any(p.startswith(q + ".") for q in out if q != p))

    def apply(self, model: torch.nn.Module, mesh) -> torch.nn.Module:
        """``fully_shard`` ``model`` in place on ``mesh``: its blocks, then the root.
        Returns ``model``."""
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )

        mp = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype)
        # (pinned or not, host memory is not the device's; this machine cannot pin)
        off = CPUOffloadPolicy(pin_memory=False) if self.offload else OffloadPolicy()
        named = dict(model.named_modules())
        for path in self.block_paths(model):
            fully_shard(named[path], mesh=mesh, reshard_after_forward=self.reshard_after_forward,
                        mp_policy=mp, offload_policy=off)
        # the root's parameters are needed again at once in backward: FSDP2 does not
        # reshard the root after forward whatever the option (fully_shard's docstring)
        fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward,
                    mp_policy=mp, offload_policy=off)
        return model

    def shard_rows(self, rows: int, rank: int) -> int:
        """Rows of a dim-0 size ``rows`` that ``rank`` holds (``torch.chunk``'s split over
        its shard group; under HSDP rank ``r`` is shard ``r % shards`` of its replica)."""
        chunk, k = -(-rows // self.shards), rank % self.shards
        return max(0, min(rows, (k + 1) * chunk) - k * chunk)

    def runs_compiled_parts(self) -> bool:
        """Under FSDP2 and HSDP, CPU offload included: the rank's mesh then a CUDA one, its
        shards CUDA fakes (host fakes under CPU offload: :func:`sharded`), checked on the
        fake GPU's ranks."""
        return type(self) is FSDP

    def runs_planned_parts(self) -> bool:
        """A checkpoint plan over blocks ``torch.compile(block)`` put back, each lowered as
        ``torch.compile(checkpoint_wrapper(block))`` (torchtitan's recipe: checkpoint, compile,
        then shard), FSDP2's hooks eager around it; checked on the fake GPU's ranks, FSDP2
        and HSDP, CPU offload included."""
        return type(self) is FSDP

    def materialize(self, model: torch.nn.Module, mode, device: str = "cpu") -> None:
        """Fakes of ``mode`` for ``model``'s meta parameters and buffers, on ``device``; under
        CPU offload on the host whatever the mesh's device (FSDP2 refuses shards elsewhere)."""
        super().materialize(model, mode, "cpu" if self.offload else device)

    def rank_groups(self, model: torch.nn.Module) -> tuple:
        """The ranks, grouped by the rows of every parameter they hold (ranks of a group
        hold shards of the same shapes, so their memory is the same), first rank first."""
        rows = [p.shape[0] if p.dim() else 1 for p in _unique(model.parameters())]
        groups: dict = {}
        for r in range(self.world_size):
            groups.setdefault(tuple(self.shard_rows(n, r) for n in rows), []).append(r)
        return tuple(tuple(g) for g in groups.values())


def _unique(tensors) -> list:
    seen, out = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def check_parallel(parallel, rank: int = 0) -> None:
    """``parallel`` is a strategy fxmem knows, or None; ``rank`` one of its ranks."""
    if parallel is None:
        return
    if not isinstance(parallel, Strategy):
        raise InputError(f"parallel is fxmem.FSDP(world_size, ...), fxmem.DDP(world_size, ...), "
                         f"fxmem.TP(world_size, plan) or fxmem.Parallel(fsdp=..., tp=...), got "
                         f"{parallel!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) \
            or not 0 <= rank < parallel.world_size:
        raise InputError(f"rank is an int from 0 to {parallel.world_size - 1} for "
                         f"{parallel.name}, got {rank!r}")


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The user's model inside a wrapper module (``DistributedDataParallel``'s ``.module``),
    or ``model`` itself: its names, not the wrapper's (``layers.0``, not ``module.layers.0``)."""
    from torch._dynamo.eval_frame import OptimizedModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, OptimizedModule):  # torch.compile(model)
        model = model._orig_mod
    return model.module if isinstance(model, DistributedDataParallel) else model


def fully_sharded(module: torch.nn.Module) -> bool:
    """Is ``module`` ``fully_shard``-ed (an FSDP2 ``FSDPModule``; the outermost one is the
    root)?

    >>> fully_sharded(torch.nn.Linear(2, 2))
    False
    """
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def initialise(root: torch.nn.Module, skip=()) -> None:
    """FSDP2's state as a training step leaves it, made without running one: the root's
    lazy initialisation (``FSDPState._lazy_init``: the root, the shared streams, each
    parameter's padded shard), then every ``fully_shard``-ed module's parameters gathered
    and freed again (``FSDPModule.unshard`` and ``reshard``: the gathered parameters made,
    their storages resized to 0, as a step's reshard leaves them). A step after this one
    allocates and frees what a step after a real step does, op for op (checked against
    the warm-up step it replaces: ``tests/test_fsdp.py``). ``root``: the outermost
    module :func:`fully_sharded`. ``skip``: modules whose FSDP2 hooks the step does not run
    (copied whole: :class:`fxmem.trace.blocks.sharded.ShardedReuse`), not gathered."""
    root._get_fsdp_state()._lazy_init()
    skip = {id(m) for m in skip}
    for m in root.modules():
        if fully_sharded(m) and id(m) not in skip:
            m.unshard()
            m.reshard()


def empty_tied(model: torch.nn.Module, device: str = "cpu") -> None:
    """``model.to_empty(device=device)`` that keeps tied parameters tied: ``to_empty`` makes
    a new ``Parameter`` for each module that holds one when the device type changes
    (``Module._apply``), so a meta GPT-2's head and embedding would become two parameters,
    two gradients in DDP's buckets and two optimizer states (65,540 bytes too many on the
    tests' GPT-2).

    >>> with torch.device("meta"):
    ...     m = torch.nn.Sequential(torch.nn.Embedding(4, 2), torch.nn.Linear(2, 4, bias=False))
    >>> m[1].weight = m[0].weight
    >>> empty_tied(m)
    >>> m[1].weight is m[0].weight, m[0].weight.device.type
    (True, 'cpu')
    """
    made: dict = {}
    for mod in model.modules():
        for slots in (mod._parameters, mod._buffers):
            for k, t in slots.items():
                if t is None:
                    continue
                new = made.get(id(t))
                if new is None:
                    new = torch.empty_like(t, device=device)
                    if isinstance(t, torch.nn.Parameter):
                        new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
                    made[id(t)] = new
                slots[k] = new


def meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are on the meta device (ties
    kept; nothing the size of the model is allocated). A module compiled in place
    (``block.compile()``, which a copy drops: ``Module.__getstate__``) is compiled in the
    copy too, by the same dynamo context."""
    from ..compiled import in_place_context

    memo = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if id(t) not in memo and t is not None:
            m = t.detach().to("meta")
            memo[id(t)] = torch.nn.Parameter(m, requires_grad=t.requires_grad) \
                if isinstance(t, torch.nn.Parameter) else m
    copied = copy.deepcopy(model, memo)
    for (_, m), (_, c) in zip(model.named_modules(remove_duplicate=False),
                              copied.named_modules(remove_duplicate=False)):
        context = in_place_context(m)
        if context is not None:
            c._compiled_call_impl = context(c._call_impl)
    return copied


@contextlib.contextmanager
def fake_world(world_size: int, rank: int, mesh_shape: tuple | None = None,
               mesh_dim_names: tuple | None = None, device: str = "cpu") -> Iterator:
    """A fake process group of ``world_size`` ranks as rank ``rank`` (collectives do
    nothing), as the default group while the block runs, and its device mesh on ``device``
    (``mesh_shape``, default 1-D, dims named ``mesh_dim_names``); the group is destroyed
    on exit."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise InputError("a process group is initialised already: fxmem makes its own fake "
                         "one to trace a rank; call analyze before init_process_group, or "
                         "destroy the group first (a model you wrapped over it is analysed "
                         "as it is, without parallel=)")
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    # DTensor caches its sharding decisions per process, keyed by global shapes and meshes,
    # not by rank, and some hold a rank's local shapes (a view's): a real rank's process
    # has only its own; here ranks take turns in one process, so each starts afresh
    _clear_sharding_prop_cache()
    # init_process_group wraps sys.excepthook to prefix "[rank0]: " to each line of a
    # traceback (distributed_c10d.py, _distributed_excepthook), and destroying the group
    # leaves it: put the user's back
    hook = sys.excepthook
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield init_device_mesh(device, mesh_shape or (world_size,),
                               mesh_dim_names=mesh_dim_names)
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook
        _clear_sharding_prop_cache()


@contextlib.contextmanager
def sharded(model: torch.nn.Module, parallel: Strategy, rank: int, mode,
            device: str = "cpu", compile=None) -> Iterator:
    """A meta copy of ``model`` wrapped by ``parallel`` as rank ``rank`` sees it, its
    storages fake tensors of ``mode`` on ``device`` (``"cuda"``: a model with parts
    compiled on their own, sharded over a CUDA mesh, as inductor lowers them for the device
    their inputs are on); usable while the block runs. ``compile``
    (:class:`fxmem.trace.compiled.Compile`, ``compile=``): the copy's repeated blocks
    compiled in place before it is wrapped (:meth:`~fxmem.trace.compiled.Compile.blocks`).
    Yields the wrapped
    model and, for :class:`DDP`, the :class:`fxmem.trace.parallel.ddp.Kept` that saw its
    construction (to be active in the warm-up steps too; None for the others)."""
    with fake_world(parallel.world_size, rank, parallel.mesh_shape,
                    parallel.mesh_dim_names, device) as mesh:
        copied = meta_copy(model)
        if compile is not None:
            compile.blocks(copied, parallel.compile_blocks(copied))
        if not isinstance(parallel, DDP):  # shards on meta, then their storages made fakes
            parallel.apply(copied, mesh)
            parallel.materialize(copied, mode, device)
            yield copied, None
            return
        with mode:  # DDP's constructor broadcasts the parameters and builds its buckets
            empty_tied(copied, device)
        kept = Kept()
        kept.know([*copied.parameters(), *copied.buffers()])
        kept.real = RealInts()  # (the Reducer's integer bookkeeping)
        with mode, kept.real, kept:
            wrapped = parallel.apply(copied, mesh)
        yield wrapped, kept


