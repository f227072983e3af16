"""FSDP2's own buffers, told apart while a rank is traced: what each is and its size at any
world size.

FSDP2 makes a few kinds of flat buffers, each sized by the padded shards of the parameters
it serves (``ceil(rows / world_size)`` rows each, ``FSDPParam._init_sharded_param``):
``foreach_all_gather``'s output (``world_size`` padded shards of each parameter),
a parameter's own gathered storage (``FSDPParam.alloc_all_gather_outputs``), the
all-gather's input when it is a cast to ``param_dtype`` (``_get_param_all_gather_inputs``),
``foreach_reduce``'s reduce-scatter input and output (``reduce_scatter_comm.allocate``,
in that order) and the output's cast to the parameters' dtype, and the shard of a gathered
parameter kept after the forward (``reshard_after_forward=int``,
``FSDPParam.to_sharded_post_forward``). :func:`labelled` wraps those sites while a step
is traced and writes a :class:`Buffer` for each storage they make into the recorder's
``fsdp_buffers`` (sid -> :class:`Buffer`); :mod:`fxmem.trace.parallel.other_ranks` sizes them
for another world size.

>>> Buffer("all_gather_output", ((10, 4), (3,)), 4).nbytes(4)  # 4 x (3 x 4 + 1) floats
208
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from math import prod
from typing import Iterator
from unittest import mock

# the kinds, and how many of the parameters' padded shards each holds: world_size of them
# (None), one, or world_size / post_forward of them
GATHERED = ("all_gather_output", "unsharded", "reduce_scatter_input")
ONE_SHARD = ("all_gather_input", "reduce_scatter_output")


def padded_rows(rows: int, world_size: int) -> int:
    """Rows of each rank's padded shard of a dim-0 size ``rows``."""
    return -(-rows // world_size)


@dataclass(frozen=True)
class Buffer:
    """One of FSDP2's flat buffers: its ``kind`` (``all_gather_output``, ``unsharded``,
    ``all_gather_input``, ``reduce_scatter_input``, ``reduce_scatter_output``,
    ``post_forward``), the whole ``shapes`` of the parameters it serves, its element size
    in bytes, and for ``post_forward`` the size of the mesh it is sharded over."""

    kind: str
    shapes: tuple
    itemsize: int
    post_forward: int = 1

    def shards(self, world_size: int) -> list:
        """Each parameter's padded shard over ``world_size`` ranks, in elements."""
        return [padded_rows(s[0] if s else 1, world_size) * prod(s[1:]) for s in self.shapes]

    def numel(self, world_size: int) -> int:
        """Its elements over ``world_size`` ranks."""
        shards = sum(self.shards(world_size))
        if self.kind in ONE_SHARD:
            return shards
        if self.kind in GATHERED:
            return world_size * shards
        return world_size * shards // self.post_forward  # (a kind of its own: post_forward)

    def nbytes(self, world_size: int) -> int:
        """Its bytes over ``world_size`` ranks."""
        return self.numel(world_size) * self.itemsize

    def holds_at(self, world_size: int) -> bool:
        """Is it sized by the rule above at ``world_size`` (a post-forward shard: its
        mesh divides it)?"""
        return self.kind in GATHERED + ONE_SHARD or (
            self.kind == "post_forward" and world_size % self.post_forward == 0)


def _local(t):
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def _shapes(fsdp_params) -> tuple:
    return tuple(tuple(p._orig_size) for p in fsdp_params)


@contextlib.contextmanager
def labelled(rec) -> Iterator:
    """While the block runs, each storage FSDP2's sites (the module docstring) make is
    written to ``rec.fsdp_buffers`` (``rec``: the recorder, whose ``sid`` knows it), as
    a :class:`Buffer`; the sites are put back on exit."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as co
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    gather, reduce, inputs = pg.foreach_all_gather, pg.foreach_reduce, \
        co._get_param_all_gather_inputs
    alloc, post = FSDPParam.alloc_all_gather_outputs, FSDPParam.to_sharded_post_forward
    out = rec.fsdp_buffers

    def note(t, buffer: Buffer, first: bool = False) -> None:
        sid = rec.sid(_local(t))
        if sid is not None and not (first and sid in out):
            out[sid] = buffer

    def get_inputs(fsdp_params):
        got = inputs(fsdp_params)
        flat = [t for ts in got for t in ts]
        if flat:  # a flat copy-in buffer of its own (a cast to param_dtype), not a shard
            sid = rec.sid(_local(flat[0]))
            if sid is not None and rec.names.get(sid, ("",))[0] != "param":
                note(flat[0], Buffer("all_gather_input", _shapes(fsdp_params),
                                     flat[0].element_size()), first=True)
        return got

    def foreach_all_gather(fsdp_params, *args, **kwargs):
        got = gather(fsdp_params, *args, **kwargs)
        if got is not None:
            t = got.all_gather_output
            note(t, Buffer("all_gather_output", _shapes(fsdp_params), t.element_size()))
        return got

    def foreach_reduce(fsdp_params, grads, *args, **kwargs):
        shapes = _shapes(fsdp_params)
        comm = kwargs.get("reduce_scatter_comm", args[2] if len(args) > 2 else None)
        kinds = iter(("reduce_scatter_input", "reduce_scatter_output"))
        allocate = getattr(comm, "allocate", None)

        def allocated(*a, **k):  # foreach_reduce's two allocations, in order
            t = allocate(*a, **k)
            note(t, Buffer(next(kinds, "unknown"), shapes, t.element_size()))
            return t
        if allocate is not None:
            comm.allocate = allocated
        try:
            got = reduce(fsdp_params, grads, *args, **kwargs)
        finally:
            if allocate is not None:
                del comm.allocate
        g = fsdp_params[0].sharded_param.grad
        if g is not None:  # the output cast to the parameters' dtype (else a view of it)
            note(g, Buffer("reduce_scatter_output", shapes, g.element_size()), first=True)
        return got

    def to_sharded_post_forward(self):
        post(self)
        data = getattr(self, "_sharded_post_forward_param_data", None)
        if data is not None:
            note(data, Buffer("post_forward", (tuple(self._orig_size),), data.element_size(),
                              self.post_forward_mesh_info.shard_mesh_size))

    def alloc_all_gather_outputs(self):
        alloc(self)
        for t in self.all_gather_outputs:
            note(t, Buffer("unsharded", (tuple(self._orig_size),), t.element_size()))

    with contextlib.ExitStack() as sites:
        for owner, name, site in ((pg, "foreach_all_gather", foreach_all_gather),
                                  (pg, "foreach_reduce", foreach_reduce),
                                  (co, "_get_param_all_gather_inputs", get_inputs),
                                  (FSDPParam, "alloc_all_gather_outputs", alloc_all_gather_outputs),
                                  (FSDPParam, "to_sharded_post_forward", to_sharded_post_forward)):
            sites.enter_context(mock.patch.object(owner, name, site))
        yield
