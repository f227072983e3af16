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

from dataclasses import dataclass, replace

from ..errors import InputError
from ..trace.records import Trace
from ..trace.saved import latest

_STATIC = ("param", "buffer", "grad", "optimizer_state")


@dataclass(frozen=True)
class SegmentSchedule:
    """What checkpointing one module call changes (op indices of the base trace).

    ``first_op..last_op``: its forward (after the module's own pre-hooks, e.g. FSDP2's
    all-gather, which checkpoint does not re-run: :attr:`ModuleCall.forward_op
    <fxmem.trace.records.ModuleCall.forward_op>`); ``stop``: the re-run covers ops ``first_op ..
    stop - 1`` (early stop after the last save); ``recompute_at``: the re-run happens right
    before this base op (``None``: nothing it saved is read back, no re-run);
    ``order``: rank of that first unpack, for re-runs before the same op; ``done_after``:
    op after which the last saved tensor is released (checkpoint then drops the inputs;
    ``None``: never); ``inputs``: storages of the activations entering it (read by it, or
    given to its forward: checkpoint holds every tensor argument, read or not).
    """

    path: str
    first_op: int
    last_op: int
    stop: int
    recompute_at: int | None
    order: int
    done_after: int | None
    inputs: tuple


def _inside(module: str, path: str) -> bool:
    return module == path or module.startswith(path + ".")


def schedule(trace: Trace, path: str) -> SegmentSchedule | None:
    """Where the checkpoint of module ``path`` acts in ``trace``; ``None`` if it saves
    nothing (checkpointing it changes nothing)."""
    calls = [c for c in trace.calls if c.path == path]
    if len(calls) != 1:
        raise InputError(f"cannot derive a plan with {path!r} from one trace: it runs "
                         f"{len(calls)} times in one step (analyze(..., checkpoint=plan) "
                         "traces such plans for real)")
    call = calls[0]
    packs = [p for p in trace.packs if _inside(p.module, path)]
    if not packs:
        return None
    unpacked = [p for p in packs if p.unpacked_at is not None]
    first = min(unpacked, key=lambda p: p.unpack_order) if unpacked else None
    ops = trace.ops
    storages = trace.storages
    read = {s for i in range(call.forward_op, call.last_op + 1) for s in ops[i].in_sids
            if storages[s].created_by < call.first_op}
    given = {s for s in call.arg_sids if storages[s].created_by < call.forward_op}
    inputs = sorted(s for s in read | given if storages[s].category not in _STATIC)
    return SegmentSchedule(path, call.forward_op, call.last_op, max(p.at for p in packs),
                           first.unpacked_at if first else None,
                           first.unpack_order if first else 0,
                           latest(*(p.released_after for p in packs)), tuple(inputs))


def derive(trace: Trace, plan) -> Trace:
    """The step under ``plan`` (module paths), from ``trace`` traced without a plan."""
    if trace.plan:
        raise InputError("derive a plan from a trace without one (this one has "
                         f"{list(trace.plan)})")
    if not trace.train:
        return replace(trace, plan=tuple(plan))  # no_grad: checkpoint saves nothing
    scheds = [s for s in (schedule(trace, p) for p in plan) if s is not None]
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
    new_storages = []
    for st in storages:
        held = packs_of.get(st.sid, ())
        kept = [p.released_after for p in held
                if not any(_inside(p.module, sc.path) for sc in scheds)]
        if (len(kept) == len(held) and st.sid not in keep_until) or st.resized_away:
            new_storages.append(st)  # (resized away: freed then, whoever refers to it)
            continue
        free = latest(st.unref_after if st.created_by >= 0 else None, *kept,
                       *keep_until.get(st.sid, ()))
        new_storages.append(replace(st, freed_after=free, saved=bool(kept),
                                    category=st.category if kept else _unsaved(st)))

    # 2. re-runs, in the order their first unpacks happened
    reruns = sorted((sc for sc in scheds if sc.recompute_at is not None),
                    key=lambda sc: (sc.recompute_at, sc.order))
    before: dict = {}
    for sc in reruns:
        before.setdefault(sc.recompute_at, []).append(sc)
    order = []  # ("op", base index) or ("re", schedule, base index), in derived order
    for i in range(len(ops) + 1):
        for sc in before.get(i, ()):
            order += [("re", sc, j) for j in range(sc.first_op, sc.stop)]
        if i < len(ops):
            order.append(("op", None, i))
    at = {(e[1].path if e[1] else None, e[2]): k for k, e in enumerate(order)}

    def moved(i):  # base op index -> derived index (for "freed after op i")
        return i if i is None or i < 0 else at[(None, i)]

    new_storages = [replace(st, created_by=moved(st.created_by), freed_after=moved(st.freed_after),
                            unref_after=moved(st.unref_after)) for st in new_storages]
    copies: dict = {}  # (path, base sid) -> sid of the recomputed copy
    for sc in reruns:
        for j in range(sc.first_op, sc.stop):
            for s in ops[j].new_sids:
                st = storages[s]
                inner = [p.dropped_after if p.unpacked_at is not None else p.released_after
                         for p in packs_of.get(s, ()) if _inside(p.module, sc.path)]
                if inner:  # kept until each saver's backward is done with it
                    free = moved(latest(*inner))
                else:  # dropped by Python in the re-run, or when it stops
                    end = sc.stop - 1
                    u = st.unref_after
                    free = at[(sc.path, u if u is not None and u <= end else end)]
                sid = len(new_storages)
                copies[(sc.path, s)] = sid
                new_storages.append(replace(st, sid=sid, created_by=at[(sc.path, j)],
                                            freed_after=free, unref_after=free, saved=False,
                                            category=_unsaved(st), saved_by=()))

    # 3. the ops, renumbered; re-run ops point at the op they repeat
    new_ops = []
    for k, (kind, sc, i) in enumerate(order):
        op = ops[i]
        if kind == "op":
            new_ops.append(replace(op, index=k, source=i))
            continue

        def m(sids, path=sc.path):
            return tuple(copies.get((path, s), s) for s in sids)

        new_ops.append(replace(op, index=k, phase="backward", out_sids=m(op.out_sids),
                               new_sids=m(op.new_sids), in_sids=m(op.in_sids),
                               written_sids=m(op.written_sids), autograd_node=None,
                               recompute=True, source=i))
    return replace(trace, ops=tuple(new_ops), storages=tuple(new_storages),
                   plan=tuple(sorted(plan)), packs=())


def _unsaved(st) -> str:
    """Category of a storage no longer saved by autograd (as a traced plan labels it)."""
    return "temporary" if st.category == "activation" else st.category
