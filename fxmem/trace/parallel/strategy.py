"""What every parallel strategy fxmem wraps a model with has (:class:`Strategy`): the base
of :class:`fxmem.FSDP`, :class:`fxmem.DDP`, :class:`fxmem.TP` and :class:`fxmem.Parallel`."""

from __future__ import annotations

import torch

from ...errors import InputError


class Strategy:
    """What every parallel strategy fxmem wraps a model with has: ``world_size`` ranks on a
    device mesh of ``mesh_shape`` (named ``mesh_dim_names``), ``apply(model, mesh)``,
    ``rank_groups(model)``, ``name`` (:class:`fxmem.FSDP`, :class:`fxmem.DDP`, :class:`fxmem.TP`, ...)."""

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
        ``device``."""
        with mode:
            model.to_empty(device=device)
