"""A way out of :func:`fxmem.report.fit.fit` for an FSDP2 step under autocast: FSDP2's own
mixed precision (``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=torch.float32)``)
with autocast kept, on the same GPUs.

Under autocast alone, FSDP2 gathers each block's fp32 parameters and every op that autocast
runs in bf16 casts its weight to a bf16 copy of its own: a copy that autograd saves for the
op's backward (a linear's gradient of its input needs the weight) and that autocast's weight
cache holds until the forward's outermost ``autocast`` exits. FSDP2 lets go of the gathered
fp32 parameters after each block; the copies stay, so at the end of the forward a rank holds
a bf16 copy of every weight of the model, whatever the number of GPUs, and a checkpoint plan
drops only the saved one (the cache's stays until the forward ends). With ``param_dtype``
set, FSDP2 gathers the weights in bf16 already and autocast casts nothing (it casts only
fp32 tensors); the gathered weights go after each block. torchtitan trains this way
(FSDP2's policy, no autocast under FSDP2). Measured on the fake GPU: docs/concepts.md, "the
ways out"; tests/test_precision_way.py.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .ways import WayOut, as_asked, at_point, cheapest_plan, choice_way, rank_reports


def searched(report) -> bool:
    """Whether :func:`param_dtype_way` searches anything for ``report``: an FSDP2 step under
    autocast without a ``param_dtype``."""
    from ..trace.parallel import FSDP

    strategy = getattr(report, "strategy", None)
    return isinstance(strategy, FSDP) and strategy.param_dtype is None and \
        rank_reports(report)[0].trace.amp is not None


def param_dtype_way(check, report, b, *, reanalyze=None, dims=None, **_):
    """FSDP2's ``param_dtype`` (the autocast dtype) with ``reduce_dtype=torch.float32`` on the
    same GPUs at ``b``: with no plan, or (when it does not fit without one) the cheapest
    plan there. Nothing for a step that is not FSDP2 under autocast without a
    ``param_dtype``."""
    if not searched(report):
        return
    strategy, amp = report.strategy, rank_reports(report)[0].trace.amp
    if reanalyze is None:
        yield "FSDP2's param_dtype: not searched (the report cannot analyse again)"
        return
    if rank_reports(report)[0].trace.compiled:
        yield "FSDP2's param_dtype: not searched for a compiled step"
        return
    # read at b and the dims' values alone: traced there, every size a number (Llama-3.1-
    # 70B's rank at B=1: 10.9 s, against 12.1 s in L)
    again = reanalyze(parallel=policy_of(strategy, amp), **{**as_asked(report, b),
                                                             **at_point(b, dims)})
    yield from param_dtype_at(check, again.at(**dims) if dims else again, b, report.plan)


def policy_of(strategy, amp):
    """FSDP2's ``strategy`` with ``param_dtype=amp``, ``reduce_dtype=torch.float32``."""
    return replace(strategy, param_dtype=amp, reduce_dtype=torch.float32)


def param_dtype_at(check, again, b, plan):
    """:func:`param_dtype_way` from ``again``, the step under FSDP2's mixed precision
    (``plan``: the step's own, as asked)."""
    strategy = again.strategy
    what = (f"FSDP2's param_dtype={strategy.param_dtype}, reduce_dtype=torch.float32 "
            "(autocast kept)")
    if check.fits(again, b):
        yield WayOut("param_dtype", strategy.world_size, check.need(again, b, True), what,
                     plan=plan, beyond="the same GPUs and plan")
        return
    if plan:
        yield f"{what}: does not fit B={b} under the step's plan either"
        return
    choice = cheapest_plan(check, again, b)
    if isinstance(choice, str):
        yield f"{what}: {choice}"
        return
    way = choice_way(check, choice, b, "param_dtype+checkpoint", strategy.world_size,
                     f"{what}, {{doing}} (re-running {{share}})")
    yield way if isinstance(way, str) else replace(way, beyond=f"{what} alone does not fit")
