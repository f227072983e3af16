"""A checkpoint plan's schedule, derived from one trace of the step without the plan.

Non-reentrant ``torch.utils.checkpoint`` changes three things for a segment S of the plan,
and each is read off the base trace (:class:`fxmem.trace.saved.Pack` records who saved what, when
autograd released it, and when Python dropped it):

1. **Forward.** Tensors S saves for backward are not kept by autograd: a storage made
   inside S lives only as long as Python refers to it (its ``unref_after``) or a saver
   outside S holds it. S's inputs are kept by checkpoint until S's backward is done.
2. **Recomputation.** At the first unpack of anything S saved, S's forward runs again,
   up to the last save (*early stop*): the ops from S's first op up to the position of
   S's last pack. A recomputed copy of what S's modules save is handed over at unpack and
   lives until the backward nodes that read it drop it (the base trace sees that moment:
   the tensor it hands back at unpack is a fresh stand-in); other recomputed tensors die
   when Python drops them in the re-run, or when it stops.
3. **Everything else** is the base trace: op order, sizes, frees.

The result is a :class:`fxmem.trace.records.Trace` (recomputed ops marked ``recompute=True``,
``source`` = the op they repeat), so the liveness stage and the report work on it as on a
traced plan. ``tests/test_plans.py`` checks it against traces with the plan really applied
and against :func:`fxmem.measure` of the model wrapped by :func:`fxmem.apply_checkpoints`.

>>> import torch, fxmem
>>> m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
>>> base = fxmem.analyze(m, torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu")
>>> derived = base.with_plan(["0", "1"])
>>> derived.peak_bytes(64) == fxmem.analyze(m, torch.randn(4, 8), loss=lambda o: o.sum(),
...                                         device="cpu", checkpoint=["0", "1"]).peak_bytes(64)
True
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from ..errors import InputError
from ..trace.records import Trace
from ..trace.saved import latest
from ..trace.regions import Plan, modules_of

_STATIC = ("param", "buffer", "grad", "optimizer_state")


@dataclass(frozen=True)
class SegmentSchedule:
    """What checkpointing one region changes (op indices of the base trace).

    ``first_op..last_op``: its forward (after the first module's own pre-hooks, e.g. FSDP2's
    all-gather, which checkpoint does not re-run: :attr:`ModuleCall.forward_op
    <fxmem.trace.records.ModuleCall.forward_op>`); ``stop``: the re-run covers ops ``first_op ..
    stop - 1`` (early stop after the last save); ``recompute_at``: the re-run happens right
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


def _inside(module: str, path) -> bool:
    if not isinstance(path, str):
        return any(_inside(module, p) for p in path)
    return module == path or module.startswith(path + ".")


def region_calls(trace: Trace, entry) -> list:
    """The module calls of a plan entry, in call order; one per module, each once per step,
    and a group's modules one right after the other."""
    mods = modules_of(entry)
    out = []
    for path in mods:
        calls = [c for c in trace.calls if c.path == path]
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


def sac_calls(trace: Trace, first: int, last: int) -> dict:
    """``{(op, n): op index}`` for ops ``first..last``: each op call named as selective
    checkpointing counts them (torch/utils/checkpoint.py ``_CachingTorchDispatchMode``:
    every op but ``SAC_IGNORED_OPS``, numbered per overload)."""
    seen: dict = {}
    out = {}
    for i in range(first, last + 1):
        name = trace.ops[i].op
        if name in _sac_ignored():
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
    path = str(entry)
    first, last = calls[0].forward_op, calls[-1].last_op
    cached = frozenset()
    if getattr(entry, "save", ()):
        names = sac_calls(trace, first, last)
        missing = [s for s in entry.save if s not in names]
        if missing:
            raise InputError(f"checkpoint region {entry}: its forward has no call {missing[0]} "
                             f"(ops are named (aten op, n), the n-th call from 0)")
        cached = frozenset(names[s] for s in entry.save)
    packs = [p for p in trace.packs if _inside(p.module, mods)]
    if not packs:
        return None
    unpacked = [p for p in packs if p.unpacked_at is not None]
    first_unpack = min(unpacked, key=lambda p: p.unpack_order) if unpacked else None
    ops = trace.ops
    storages = trace.storages
    read = {s for i in range(first, last + 1) for s in ops[i].in_sids
            if storages[s].created_by < calls[0].first_op}
    given = {s for c in calls for s in c.arg_sids if storages[s].created_by < calls[0].forward_op}
    inputs = sorted(s for s in read | given if storages[s].category not in _STATIC)
    return SegmentSchedule(path, first, last, max(p.at for p in packs),
                           first_unpack.unpacked_at if first_unpack else None,
                           first_unpack.unpack_order if first_unpack else 0,
                           latest(*(p.released_after for p in packs)), tuple(inputs), cached,
                           mods)


def derive(trace: Trace, plan) -> Trace:
    """The step under ``plan`` (a :class:`fxmem.Plan`, or entries for one), from ``trace``
    traced without a plan."""
    if trace.plan:
        raise InputError("derive a plan from a trace without one (this one has "
                         f"{list(trace.plan)})")
    plan = Plan.of(plan)
    if not trace.train:
        return replace(trace, plan=plan)  # no_grad: checkpoint saves nothing
    scheds = [s for s in (schedule(trace, e) for e in plan) if s is not None]
    ops, storages = trace.ops, trace.storages
    packs_of: dict = {}  # sid -> [Pack]
    for p in trace.packs:
        packs_of.setdefault(p.sid, []).append(p)

    # 1. forward copies: autograd holds from inside a plan segment are gone; inputs wait
    keep_until: dict = {}
    for sc in scheds:
        if sc.recompute_at is not None:
            for s in sc.inputs:
                keep_until.setdefault(s, []).append(sc.done_after)
    cache: dict = {}  # sid -> (schedule, op) of a selective checkpoint keeping it
    for sc in scheds:
        for j in sc.cached:
            for s in ops[j].out_sids:
                cache.setdefault(s, (sc, j))
    planned: dict = {}  # module -> whether a segment of the plan holds it

    def outside(module: str) -> bool:
        if module not in planned:
            planned[module] = not any(_inside(module, sc.modules) for sc in scheds)
        return planned[module]

    new_storages = []
    for st in storages:
        held = packs_of.get(st.sid, ())
        kept = [p.released_after for p in held if outside(p.module)]
        if (len(kept) == len(held) and st.sid not in keep_until and st.sid not in cache) \
                or st.resized_away:
            new_storages.append(st)  # (resized away: freed then, whoever refers to it)
            continue
        free = latest(st.unref_after if st.created_by >= 0 else None, *kept,
                      *keep_until.get(st.sid, ()))
        by_plan = st.sid in keep_until or st.sid in cache  # the checkpoint holds it
        new_storages.append(replace(st, freed_after=free, saved=bool(kept) or by_plan,
                                    category=st.category if kept else
                                    _held(st, ops) if by_plan else _unsaved(st)))

    # 2. re-runs, in the order their first unpacks happened; a selective checkpoint's kept
    # ops are not run again (their cached outputs are handed back)
    reruns = sorted((sc for sc in scheds if sc.recompute_at is not None),
                    key=lambda sc: (sc.recompute_at, sc.order))
    before: dict = {}
    for sc in reruns:
        before.setdefault(sc.recompute_at, []).append(sc)
    order = []  # ("op", base index) or ("re", schedule, base index), in derived order
    at = {}  # (path or None, base index) -> derived index of it (or of the op before it)
    for i in range(len(ops) + 1):
        for sc in before.get(i, ()):
            for j in range(sc.first_op, sc.stop):
                if j not in sc.cached:
                    order.append(("re", sc, j))
                at[(sc.path, j)] = len(order) - 1
        if i < len(ops):
            at[(None, i)] = len(order)
            order.append(("op", None, i))

    def moved(i):  # base op index -> derived index (for "freed after op i")
        return i if i is None or i < 0 else at[(None, i)]

    new_storages = [_with(st, created_by=moved(st.created_by), freed_after=moved(st.freed_after),
                          unref_after=moved(st.unref_after)) for st in new_storages]
    copies: dict = {}  # (path, base sid) -> sid of the recomputed copy
    rerun = {sc.path for sc in reruns}
    for sc in reruns:
        for j in range(sc.first_op, sc.stop):
            for s in ops[j].new_sids:
                st = storages[s]
                inner = [p.dropped_after if p.unpacked_at is not None else p.released_after
                         for p in packs_of.get(s, ()) if _inside(p.module, sc.modules)]
                if inner:  # kept until each saver's backward is done with it
                    free = moved(latest(*inner))
                else:  # dropped by Python in the re-run, or when it stops
                    end = sc.stop - 1
                    u = st.unref_after
                    free = at[(sc.path, u if u is not None and u <= end else end)]
                if j in sc.cached:  # the forward's own tensor, handed over
                    old = new_storages[s]
                    new_storages[s] = replace(old, freed_after=latest(old.freed_after, free))
                    copies[(sc.path, s)] = s
                    continue
                sid = len(new_storages)
                copies[(sc.path, s)] = sid
                new_storages.append(replace(st, sid=sid, created_by=at[(sc.path, j)],
                                            freed_after=free, unref_after=free, saved=False,
                                            category=_unsaved(st), saved_by=()))
    for s, (sc, j) in cache.items():  # in the cache until the re-run takes it back, or
        # (never taken: past the early stop) until the checkpoint is done
        end = at[(sc.path, j)] if sc.path in rerun and j < sc.stop else moved(sc.done_after)
        old = new_storages[s]
        new_storages[s] = replace(old, freed_after=latest(old.freed_after, end))

    # 3. the ops, renumbered; re-run ops point at the op they repeat
    new_ops = []
    for k, (kind, sc, i) in enumerate(order):
        op = ops[i]
        if kind == "op":
            new_ops.append(_with(op, index=k, source=i))
            continue

        def m(sids, path=sc.path):
            return tuple(copies.get((path, s), s) for s in sids)

        new_ops.append(replace(op, index=k, phase="backward", out_sids=m(op.out_sids),
                               new_sids=m(op.new_sids), in_sids=m(op.in_sids),
                               written_sids=m(op.written_sids), autograd_node=None,
                               recompute=True, source=i))
    return replace(trace, ops=tuple(new_ops), storages=tuple(new_storages),
                   plan=plan, packs=())


def _with(record, **changes):
    """``dataclasses.replace`` for a record whose fields need no checks (a tenth of the
    time: a plan's derivation copies every op and storage of the step)."""
    new = object.__new__(type(record))
    new.__dict__.update(record.__dict__)
    new.__dict__.update(changes)
    return new


def _held(st, ops) -> str:
    """Category of a storage a checkpoint holds for backward (a region's input, an output
    selective checkpointing keeps), as a traced plan labels it: made in the forward, an
    activation."""
    made_in_forward = st.created_by >= 0 and ops[st.created_by].phase == "forward"
    return "activation" if st.category == "temporary" and made_in_forward else st.category


def _unsaved(st) -> str:
    """Category of a storage no longer saved by autograd (as a traced plan labels it)."""
    return "temporary" if st.category == "activation" else st.category
