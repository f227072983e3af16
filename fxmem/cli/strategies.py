"""The command line's model-parallel options beside ``--fsdp``/``--ddp``: ``--replicate``
and ``--offload`` (FSDP2's HSDP and CPU offload), ``--tp`` and ``--tp-plan`` (tensor
parallelism, over FSDP2 when both are given)."""

from __future__ import annotations

import dataclasses

from ..errors import InputError


def sharding(replicate, offload, data):
    """``--fsdp``'s strategy with ``--replicate``'s HSDP replicas and ``--offload``."""
    from ..trace.parallel import FSDP

    for flag, given in (("--replicate", replicate is not None), ("--offload", offload)):
        if given and not isinstance(data, FSDP):
            raise InputError(f"{flag} is an FSDP2 option: give --fsdp RANKS too")
    if replicate is not None:
        data = dataclasses.replace(data, replicate=replicate)
    return dataclasses.replace(data, offload=True) if offload else data


def tensor_parallel(tp, tp_plan, ddp, data):
    """``--tp``'s strategy, over ``data`` (``--fsdp``'s) when given, or ``data`` itself."""
    if tp is None:
        if tp_plan is not None:
            raise InputError("--tp-plan is the plan of --tp: give --tp RANKS too")
        return data
    if ddp is not None:
        raise InputError("--tp composes with --fsdp (FSDP2 over TP on a 2-D mesh), not "
                         "--ddp: give --fsdp RANKS instead")
    from ..trace.tp import TP, Parallel
    from .targets import load_object

    plan = None
    if tp_plan is not None:
        plan = load_object(tp_plan, what="--tp-plan")
        if not isinstance(plan, dict):
            raise InputError(f"--tp-plan {tp_plan} is a {type(plan).__name__}, not a dict of "
                             f"module path to a parallel style")
    tensor = TP(tp, plan)
    return tensor if data is None else Parallel(fsdp=data, tp=tensor)
