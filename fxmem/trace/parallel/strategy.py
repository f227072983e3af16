"""What every parallel strategy fxmem wraps a model with has (:class:`Strategy`): the base
of :class:`fxmem.FSDP`, :class:`fxmem.DDP`, :class:`fxmem.TP` and :class:`fxmem.Parallel`."""

from __future__ import annotations

import functools

import torch

from ...errors import InputError


class Strategy:
    """What every parallel strategy fxmem wraps a model with has: ``world_size`` ranks on a
    device mesh of ``mesh_shape`` (named ``mesh_dim_names``), ``apply(model, mesh)``,
    ``rank_groups(model)``, ``name`` (:class:`fxmem.FSDP`, :class:`fxmem.DDP`,
    :class:`fxmem.TP`, ...)."""

    @property
    def mesh_shape(self) -> tuple:
        """The device mesh's shape: one dim of ``world_size`` ranks."""
        return (self.world_size,)

    mesh_dim_names = None
    offload = False  # FSDP2's CPU offload (fxmem.trace.parallel.offload)
    warmup_steps = 1  # steps before the state is steady (FSDP2's lazy init is in the first)

    def check_world_size(self, who: str) -> None:
        """``world_size`` is a positive int; else an :class:`fxmem.InputError` naming ``who``."""
        w = self.world_size
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise InputError(f"{who}: world_size is a positive int (the number of ranks), "
                             f"got {w!r}")

    def runs_compiled_parts(self) -> bool:
        """Are parts of a model compiled on their own (``torch.compile(block)``) modelled
        under this strategy (:func:`fxmem.trace.compiled.parts.check_parts`)? Under
        :class:`fxmem.FSDP`, :class:`fxmem.TP`, :class:`fxmem.DDP` (not with
        ``static_graph``) and FSDP2 x TP (:class:`fxmem.Parallel`), each checked on the fake
        GPU's ranks."""
        return False

    def compile_blocks(self, model: torch.nn.Module) -> tuple:
        """The paths ``compile=`` compiles in place in a rank's copy of ``model`` before this
        strategy wraps it (:meth:`fxmem.trace.compiled.Compile.blocks`): its repeated blocks
        (:func:`stack_blocks`), as torchtitan compiles each transformer block; the code around
        them (embeddings, the last norm, the head, the loss) runs eagerly."""
        return stack_blocks(model)

    def runs_planned_parts(self) -> bool:
        """Is a checkpoint plan over parts compiled on their own (``torch.compile(block)``
        put back, each lowered as ``torch.compile(checkpoint_wrapper(block))``, or a block
        compiled in place, as ``checkpoint_wrapper(block)`` compiled in place) modelled
        under this strategy (:func:`fxmem.trace.compiled.parts.check_parts`,
        :func:`fxmem.trace.plans.checkpointing.check_parts_plan`)? Where checked on the fake
        GPU's ranks against torchtitan's recipe built by PyTorch alone, both ways."""
        return False

    def optimizer(self, factory):
        """The optimizer factory each rank runs: ``factory`` itself (on its shards); ZeRO-1
        wraps it (:class:`fxmem.DDP`)."""
        return factory

    def materialize(self, model: torch.nn.Module, mode, device: str = "cpu") -> None:
        """Give ``model``'s meta parameters and buffers storages: fakes of ``mode`` on
        ``device``, those ``model.to_empty(device=device)`` makes under ``mode``, each made
        by the meta kernel (:func:`_empty`)."""
        with mode:
            model._apply(functools.partial(_empty, mode=mode, device=device))


def _empty(t: torch.Tensor, mode, device: str) -> torch.Tensor:
    """``torch.empty_like(t, device=device)`` under ``mode`` (:meth:`Strategy.materialize`):
    of a meta tensor, or of a ``DTensor`` around one (FSDP2's shards: its local tensor's,
    wrapped as the ``DTensor`` was, :func:`dtensor_like`), by
    :func:`fxmem.trace.kernels.meta_kernels.empty_fake`, else dispatched."""
    from torch.distributed.tensor import DTensor

    from ..kernels.meta_kernels import empty_fake
    from ..ledger.tracking import plain

    if type(t) is DTensor:
        local = plain(t)
        if type(local) in (torch.Tensor, torch.nn.Parameter) and local.is_meta:
            return dtensor_like(empty_fake(local, mode, device), t)
    elif type(t) in (torch.Tensor, torch.nn.Parameter) and t.is_meta:
        return empty_fake(t, mode, device)
    return torch.empty_like(t, device=device)


def dtensor_like(local: torch.Tensor, like) -> torch.Tensor:
    """``local`` as a ``DTensor`` of ``like``'s mesh, placements, shape and strides (its own
    dtype), as ``DTensor.from_local(local, ..., run_check=False, shape=..., stride=...)``
    makes it, less its autograd function and the alias of ``local`` it wraps (both
    dispatched through a trace: 0.15 s of an 8B's FSDP2 trace for the optimizer's state);
    nor does it move ``local`` to the mesh's device (FSDP2's CPU-offloaded shards of a CUDA
    mesh stay on the host, as ``empty_like`` and the optimizer's step leave them)."""
    return dtensor_of(local, like.device_mesh, like.placements, like.shape, like.stride())


def dtensor_of(local: torch.Tensor, mesh, placements, shape, stride) -> torch.Tensor:
    """``local`` as a ``DTensor`` over ``mesh`` with ``placements``, of global ``shape`` and
    ``stride`` (:func:`dtensor_like`, from a DTensor's parts)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    spec = DTensorSpec(mesh, placements, tensor_meta=TensorMeta(shape, stride, local.dtype))
    return DTensor(local, spec, requires_grad=False)


def stack_blocks(model: torch.nn.Module) -> tuple:
    """The blocks of the model's stacks: the children of each outermost ``ModuleList`` or
    ``Sequential`` with two or more children, all of one class (a transformer's layers,
    a ResNet stage's blocks; a block under ``checkpoint_wrapper`` is of its module's class,
    so a plan applied to some blocks wraps the same blocks), outermost first.

    >>> m = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in "ab"]),
    ...                         torch.nn.ReLU())
    >>> stack_blocks(m)
    ('0.0', '0.1')
    """
    out: list = []
    for name, mod in model.named_modules():
        if any(name.startswith(p + ".") for p in out):
            continue
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
            kids = list(mod.named_children())
            if len(kids) >= 2 and len({type(getattr(k, "_checkpoint_wrapped_module", k))
                                       for _, k in kids}) == 1:
                out.extend(f"{name}.{n}" if name else n for n, _ in kids)
    return tuple(out)
