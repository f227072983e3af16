"""The command line's parallel options as a strategy: ``--fsdp`` (with ``--replicate``,
``--offload``, ``--no-reshard``, the dtypes) or ``--ddp`` (with ``--zero1``), and ``--tp``
with ``--tp-plan`` (tensor parallelism, over FSDP2 when both are given)."""

from __future__ import annotations

from ..errors import InputError
from ..trace.kernels import dtype_of


def data_parallel(fsdp, ddp, zero1, reshard, param_dtype, reduce_dtype, replicate, offload):
    """The data-parallel strategy ``--fsdp`` or ``--ddp`` and their options name, or None."""
    if fsdp is not None and ddp is not None:
        raise InputError("give --fsdp or --ddp, not both")
    if ddp is None and zero1:
        raise InputError("--zero1 partitions DDP's optimizer state: give --ddp RANKS too")
    if fsdp is None:
        given = [o for o, v in (("--no-reshard", not reshard), ("--param-dtype", param_dtype),
                                ("--reduce-dtype", reduce_dtype),
                                ("--replicate", replicate is not None),
                                ("--offload", offload)) if v]
        if given:
            raise InputError(f"{given[0]} is an FSDP option: give --fsdp RANKS too")
        if ddp is None:
            return None
    from ..trace.parallel import DDP, FSDP

    if ddp is not None:
        return DDP(ddp, zero1=zero1)
    dtypes = {k: dtype_of(v, what=f"--{k.replace('_', '-')}")
              for k, v in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)) if v}
    return FSDP(fsdp, reshard_after_forward=reshard, replicate=replicate or 1, offload=offload,
                **dtypes)


def tensor_parallel(tp, tp_plan, ddp, data):
    """``--tp``'s strategy, over ``data`` (``--fsdp``'s) when given, or ``data`` itself."""
    if tp is None:
        if tp_plan is not None:
            raise InputError("--tp-plan is the plan of --tp: give --tp RANKS too")
        return data
    if ddp is not None:
        raise InputError("--tp composes with --fsdp (FSDP2 over TP on a 2-D mesh), not "
                         "--ddp: give --fsdp RANKS instead")
    from ..trace.parallel import TP, Parallel
    from .targets import load_object

    plan = None
    if tp_plan is not None:
        plan = load_object(tp_plan, what="--tp-plan")
        if not isinstance(plan, dict):
            raise InputError(f"--tp-plan {tp_plan} is a {type(plan).__name__}, not a dict of "
                             f"module path to a parallel style")
    tensor = TP(tp, plan)
    return tensor if data is None else Parallel(fsdp=data, tp=tensor)
