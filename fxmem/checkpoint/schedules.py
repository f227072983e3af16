"""Where a checkpoint plan's regions act in a trace of the step without the plan: each
entry's :class:`SegmentSchedule` (its forward's ops, its re-run's early stop, when the re-run
happens, what it keeps aside), read off the trace's module calls and the tensors their
forwards saved (:class:`fxmem.trace.ledger.saved.Pack`). :mod:`fxmem.checkpoint.plans`
derives the step under a plan from them; a planner asks them of each candidate, hundreds,
so each is kept on the trace, and what does not depend on the op outputs a selective plan
keeps is kept once per region.

>>> import torch, fxmem
>>> m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
>>> t = fxmem.analyze(m, torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu").trace
>>> sc = schedule(t, "0")
>>> sc.first_op <= sc.last_op < sc.recompute_at
True
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import InputError
from ..trace.ledger import Trace, latest
from ..trace.plans import modules_of
from .uncached import uncached

_STATIC = ("param", "buffer", "grad", "optimizer_state")


@dataclass(frozen=True)
class SegmentSchedule:
    """What checkpointing one region changes (op indices of the base trace).

    ``first_op..last_op``: its forward (after the first module's own pre-hooks, e.g. FSDP2's
    all-gather, which checkpoint does not re-run: :attr:`ModuleCall.forward_op
    <fxmem.trace.ledger.records.ModuleCall.forward_op>`); ``stop``: the re-run covers ops ``first_op
    .. stop - 1`` (early stop after the last save); ``recompute_at``: the re-run happens right
    before this base op (``None``: nothing it saved is read back, no re-run);
    ``order``: rank of that first unpack, for re-runs before the same op; ``done_after``:
    op after which the last saved tensor is released (checkpoint then drops the inputs;
    ``None``: never); ``inputs``: storages of the activations entering it (read by it, or
    given to its forward: checkpoint holds every tensor argument, read or not);
    ``cached``: ops whose outputs selective checkpointing keeps (not re-run).
    """

    path: str
    first_op: int
    last_op: int
    stop: int
    recompute_at: int | None
    order: int
    done_after: int | None
    inputs: tuple
    cached: frozenset = frozenset()
    modules: tuple = ()


def region_calls(trace: Trace, entry) -> list:
    """The module calls of a plan entry, in call order; one per module, each once per step,
    and a group's modules one right after the other."""
    mods = modules_of(entry)
    out = []
    for path in mods:
        calls = trace.calls_of(path)
        if len(calls) != 1:
            raise InputError(f"cannot derive a plan with {path!r} from one trace: it runs "
                             f"{len(calls)} times in one step (analyze(..., checkpoint=plan) "
                             "traces such plans for real)")
        out.append(calls[0])
    out.sort(key=lambda c: c.first_op)
    for a, b in zip(out, out[1:]):
        if b.first_op != a.last_op + 1 or b.forward_op != b.first_op:
            between = "runs ops between them" if b.first_op != a.last_op + 1 else \
                f"{b.path}'s forward pre-hooks run ops"
            raise InputError(f"checkpoint group {entry}: {a.path} and {b.path} are not one "
                             f"segment (the model {between}); checkpoint them apart")
    return out


def sac_calls(trace: Trace, first: int, last: int, modules=()) -> dict:
    """``{(op, n): op index}`` for ops ``first..last``: each op call named as selective
    checkpointing counts them (torch/utils/checkpoint.py ``_CachingTorchDispatchMode``:
    every op but ``SAC_IGNORED_OPS``, numbered per overload), in the forward of the
    checkpointed ``modules``: without their cache's ops (:mod:`fxmem.checkpoint.uncached`)."""
    seen: dict = {}
    out = {}
    skipped = uncached(trace, modules).skipped
    for i in range(first, last + 1):
        name = trace.ops[i].op
        if name in _sac_ignored() or i in skipped:
            continue
        n = seen.get(name, 0)
        seen[name] = n + 1
        out[(name, n)] = i
    return out


@functools.lru_cache(maxsize=1)
def _sac_ignored() -> frozenset:
    from torch.utils.checkpoint import SAC_IGNORED_OPS
    return frozenset(map(str, SAC_IGNORED_OPS))


def schedule(trace: Trace, entry) -> SegmentSchedule | None:
    """Where the checkpoint of plan entry ``entry`` (a module path or a
    :class:`fxmem.Region`) acts in ``trace``; ``None`` if it saves nothing (checkpointing it
    changes nothing). Kept on the trace: a planner derives many plans sharing entries."""
    known = trace.__dict__.setdefault("_schedules", {})
    if entry not in known:
        known[entry] = _schedule(trace, entry)
    return known[entry]


def _schedule(trace: Trace, entry) -> SegmentSchedule | None:
    calls = region_calls(trace, entry)
    mods = modules_of(entry)
    first, last = calls[0].forward_op, calls[-1].last_op
    cached = frozenset()
    if getattr(entry, "save", ()):
        names = sac_calls(trace, first, last, mods)
        missing = [s for s in entry.save if s not in names]
        if missing:
            raise InputError(f"checkpoint region {entry}: its forward has no call {missing[0]} "
                             f"(ops are named (aten op, n), the n-th call from 0)")
        cached = frozenset(names[s] for s in entry.save)
    region = _region(trace, mods, calls)
    return None if region is None else SegmentSchedule(str(entry), *region, cached, mods)


def _region(trace: Trace, mods: tuple, calls: list) -> tuple | None:
    """What :class:`SegmentSchedule` says of the region of modules ``mods`` (``calls``,
    their :func:`region_calls`) whatever op outputs a selective plan keeps: ``(first_op,
    last_op, stop, recompute_at, order, done_after, inputs)``, or None where it saves
    nothing. Kept on the trace: a block's candidates are a dozen entries over one region
    (whole, and keeping each set of op outputs)."""
    known = trace.__dict__.setdefault("_regions", {})
    if mods in known:
        return known[mods]
    first, last = calls[0].forward_op, calls[-1].last_op
    within, prefixes = set(mods), _prefixes(trace)
    packs = [p for _, p in sorted(kp for m, ps in _packs_by_module(trace).items()
                                  if not within.isdisjoint(prefixes[m])
                                  for kp in ps)]  # in the trace's order
    if not packs:
        known[mods] = None
        return None
    unpacked = [p for p in packs if p.unpacked_at is not None]
    first_unpack = min(unpacked, key=lambda p: p.unpack_order) if unpacked else None
    ops = trace.ops
    storages = trace.storages
    read = {s for i in range(first, last + 1) for s in ops[i].in_sids
            if storages[s].created_by < calls[0].first_op}
    given = {s for c in calls for s in c.arg_sids if storages[s].created_by < calls[0].forward_op}
    inputs = sorted(s for s in read | given if storages[s].category not in _STATIC)
    known[mods] = (first, last, max(p.at for p in packs),
                   first_unpack.unpacked_at if first_unpack else None,
                   first_unpack.unpack_order if first_unpack else 0,
                   latest(*(p.released_after for p in packs)), tuple(inputs))
    return known[mods]


def _packs_by_module(trace: Trace) -> dict:
    """module path -> ``(position in trace.packs, pack)`` of the packs its forward made
    (kept on the trace)."""
    known = trace.__dict__.get("_packs_by_module")
    if known is None:
        known = {}
        for k, p in enumerate(trace.packs):
            known.setdefault(p.module, []).append((k, p))
        trace.__dict__["_packs_by_module"] = known
    return known


def _module_prefixes(module: str) -> tuple:
    """``module`` and the paths of the modules it is in: ``"a.b"``: ``("a", "a.b")``."""
    parts = module.split(".")
    return tuple(".".join(parts[:k]) for k in range(1, len(parts) + 1))


def _prefixes(trace: Trace) -> dict:
    """module path -> :func:`_module_prefixes`, for the modules whose forwards saved
    tensors (kept on the trace)."""
    known = trace.__dict__.get("_prefixes")
    if known is None:
        known = trace.__dict__["_prefixes"] = {m: _module_prefixes(m)
                                               for m in _packs_by_module(trace)}
    return known
