"""What a checkpointed Hugging Face layer does not make: its key/value cache.

A Hugging Face decoder layer given a cache appends its keys and values to it
(``DynamicLayer.update`` in transformers' ``cache_utils.py``): it makes an empty tensor in
the keys' dtype (``torch.tensor([])``, an ``aten.lift_fresh``), concatenates the keys onto
it (``aten.cat``), and the attention reads the concatenation, which the cache holds until
the step's output goes. Checkpointed, the layer runs without the cache
(:func:`fxmem.trace.plans.checkpointing.uncached`, as transformers' own gradient
checkpointing does): the attention reads the keys and values themselves, which the
attention's locals hold until its forward returns (the concatenation had taken their
names), and autocast casts only what is not in its dtype already (a concatenation takes the
empty tensor's dtype, the keys', so fp32 keys made the values' concatenation fp32, cast
back for the attention).

A plan derived from the step with the cache (:mod:`fxmem.checkpoint.plans`) reads here what
the layer's forward and its re-run do instead (:func:`uncached`): the concatenations, the
empty tensors and those casts are not made (their ops not run, so selective
checkpointing's count of op calls skips them), and each key or value tensor lives until
the attention's forward ends, or as long as a dropped tensor it stands for was saved.
Exact (tests/test_plan_kinds_hf.py) for Llama, Qwen 2 and 3 and Phi, on the CPU's and
CUDA's kernels, under autocast and FSDP2. Not exact where the attention copies the
concatenation in its own dtype when that differs from the values' (``repeat_kv`` before
an attention with a mask under autocast, with fp32 keys: Mistral with a sliding window,
Gemma 2): the copy is counted in the cache's dtype and its cast back kept, so the derived
peak is above the traced one (32,768 bytes per unit of B on a 3-layer Gemma 2, width 64,
at L=256 on CUDA's kernels); the plan the planner chooses is traced
(:mod:`fxmem.checkpoint.confirm`).

>>> import torch, fxmem
>>> m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
>>> r = fxmem.analyze(m, torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu")
>>> uncached(r.trace, ("0",)) is NOTHING  # no layer that writes a cache
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.ledger import Trace
from .numbers import NEVER


@dataclass(frozen=True)
class Uncached:
    """How checkpointed modules' forward changes without their cache (the base trace's op
    indices and storage ids): ``dropped``, the storages it does not make; ``skipped``, the
    ops that made them, which it does not run; ``sources``, ``(sid, end, stands_for)`` per
    key or value tensor: held until base op ``end`` (the last of the module call that
    updated the cache), read where the dropped storages ``stands_for`` were."""

    dropped: frozenset
    skipped: frozenset
    sources: tuple


NOTHING = Uncached(frozenset(), frozenset(), ())

_CAT, _EMPTY, _CAST = "aten.cat.default", "aten.lift_fresh.default", "aten._to_copy.default"


def uncached(trace: Trace, modules) -> Uncached:
    """What the checkpointed ``modules`` (a plan entry's paths) do not make, as
    :class:`Uncached`, for those that are layers writing a cache (``trace.cache_layers``);
    :data:`NOTHING` for none, or when a layer's cache ops are not the pattern the module
    docstring describes (the derivation then keeps them: not exact). Kept on the trace."""
    layers = set(modules).intersection(trace.cache_layers)
    if not layers:
        return NOTHING
    known = trace.__dict__.setdefault("_uncached", {})
    key = tuple(sorted(layers))
    if key not in known:
        found = [_of_call(trace, c) for c in trace.calls if c.path in layers]
        known[key] = NOTHING if not found or None in found else Uncached(
            frozenset().union(*(f.dropped for f in found)),
            frozenset().union(*(f.skipped for f in found)),
            tuple(s for f in found for s in f.sources))
    return known[key]


def _of_call(trace: Trace, call) -> Uncached | None:
    """:class:`Uncached` of one call of a layer; None when an empty tensor it makes is not
    one the cache's concatenation starts from. Kept on the trace (a layer is in many
    regions: each group of blocks around it)."""
    known = trace.__dict__.setdefault("_uncached_calls", {})
    key = (call.path, call.first_op)
    if key not in known:
        known[key] = _found(trace, call)
    return known[key]


def _found(trace: Trace, call) -> Uncached | None:
    ops, storages = trace.ops, trace.storages
    lo, hi = call.forward_op, call.last_op
    empties = {s: i for i in range(lo, hi + 1) if ops[i].op == _EMPTY for s in ops[i].new_sids
               if any(d == 0 for d in storages[s].shape)}
    dropped, skipped, sources = set(), set(), []
    for i in range(lo, hi + 1):
        op = ops[i]
        if op.op != _CAT or len(op.in_sids) != 2 or op.in_sids[0] not in empties \
                or len(op.new_sids) != 1:
            continue
        empty, x = op.in_sids
        c = op.new_sids[0]
        end = _end_of(trace, i)
        stands = [c]
        # autocast's cast of the values for the concatenation alone (the CPU's autocast
        # casts cat's inputs to the widest dtype): the values are the cast's input
        j = storages[x].created_by
        if lo <= j and ops[j].op == _CAST and len(ops[j].in_sids) == 1 \
                and storages[ops[j].in_sids[0]].dtype != storages[x].dtype \
                and not any(x in ops[k].in_sids for k in range(j + 1, end + 1) if k != i):
            stands.append(x)
            skipped.add(j)
            x = ops[j].in_sids[0]
        for j in range(i + 1, end + 1):  # casts back to the keys' or values' own dtype
            o = ops[j]
            if o.op == _CAST and o.in_sids == (c,) and len(o.new_sids) == 1 \
                    and storages[o.new_sids[0]].dtype == storages[x].dtype:
                stands.append(o.new_sids[0])
                skipped.add(j)
        dropped.update((empty, *stands))
        skipped.update((i, empties.pop(empty)))
        sources.append((x, end, tuple(stands)))
    if empties:
        return None
    return Uncached(frozenset(dropped), frozenset(skipped), tuple(sources))


def _end_of(trace: Trace, i: int) -> int:
    """The last op of the innermost module call that ran op ``i``."""
    return min((c.last_op for c in trace.calls_of(trace.ops[i].module)
                if c.first_op <= i <= c.last_op), default=i)


def held_by_locals(lost: Uncached, sc, sids, saved, free, where) -> np.ndarray:
    """``free`` (the derived "freed after" of each storage the re-run of ``sc``, a
    :class:`~fxmem.checkpoint.schedules.SegmentSchedule`, makes: base ``sids``, ``saved`` by an
    op inside, ``where`` each re-run op's derived index) with each key or value tensor of
    a layer re-run without its cache (``lost``) held by the attention's locals until its
    forward ends, and as long as a dropped tensor it stands for was saved."""
    free = free.copy()
    index = {s: k for k, s in enumerate(sids.tolist())}
    for x, end, stands in lost.sources:
        if x not in index:
            continue
        holds = [free[index[x]], where[min(end, sc.stop - 1) - sc.first_op]]
        holds += [free[index[d]] for d in stands if d in index and saved[index[d]]]
        free[index[x]] = NEVER if NEVER in holds else max(holds)
    return free


__all__ = ["NOTHING", "Uncached", "held_by_locals", "uncached"]
