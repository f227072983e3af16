"""Which block reuse a step gets: none, one GPU's, FSDP2's and TP's, or DDP's, by the strategy its
rank runs under, installed over the checkpoint plan's forwards for the step's length.

>>> from fxmem.trace.parallel import DDP, FSDP
>>> kept = FSDP(2, reshard_after_forward=False)
>>> reuses_under(FSDP(2)), reuses_under(DDP(2)), reuses_under(kept, train=False)
(True, True, False)
"""

from __future__ import annotations

import contextlib

from .replicated import ReplicatedReuse
from .reuse import Reuse, by_plan, find_runs
from .sharded import ShardedReuse, find_sharded_runs


def reuses_under(parallel, train: bool = True) -> bool:
    """Can the blocks of a step run under ``parallel`` be copied? Under DDP and ZeRO-1
    (:mod:`fxmem.trace.blocks.replicated`) and under TP; under FSDP2 (:class:`fxmem.FSDP`,
    HSDP and offload included, alone or over TP), but not for inference with
    ``reshard_after_forward=False`` (the warm-up step leaves every block gathered, its
    parameters first seen by the block's own ops); not under the user's own wrapping."""
    from ..parallel.ddp import DDP
    from ..parallel.fsdp import FSDP
    from ..parallel.tp import TP, Parallel

    if type(parallel) in (DDP, TP):
        return True
    if type(parallel) is Parallel:  # FSDP2 over TP: as FSDP2's
        parallel = parallel.fsdp
    return type(parallel) is FSDP and (train or parallel.reshard_after_forward is not False)


def runs_of(model, sharded: bool) -> list:
    """``model``'s runs of identical blocks (``sharded``: a rank's wrapped model,
    :func:`fxmem.trace.blocks.sharded.find_sharded_runs`), found before a checkpoint plan
    is installed on them."""
    return find_sharded_runs(model) if sharded else find_runs(model)


@contextlib.contextmanager
def copied(rec, runs: list, plan, sharded: bool, fparams: dict, fbufs: dict,
           replicated: bool = False, hookless: bool = False):
    """The block reuse of ``runs`` as checkpoint ``plan`` leaves them
    (:func:`fxmem.trace.blocks.reuse.by_plan`), installed over the plan's forwards until
    the block exits; None when no run is left. ``sharded``: a rank's wrapped model,
    :class:`~fxmem.trace.blocks.sharded.ShardedReuse` (``replicated``, under DDP:
    :class:`~fxmem.trace.blocks.replicated.ReplicatedReuse`), else the parameters and
    buffers are ``fparams`` and ``fbufs`` (:class:`~fxmem.trace.blocks.reuse.Reuse`)."""
    runs = by_plan(runs, plan)
    if not runs:
        yield None
        return
    if not sharded:
        got = Reuse(rec, runs, fparams, fbufs)
    else:
        got = ReplicatedReuse(rec, runs) if replicated else ShardedReuse(rec, runs, hookless)
    got.install()
    try:
        yield got
    finally:
        got.remove()
