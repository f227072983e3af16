"""A checkpoint plan's schedule, derived from one trace of the step without the plan.

Non-reentrant ``torch.utils.checkpoint`` changes three things for a segment S of the plan,
and each is read off the base trace (:class:`fxmem.trace.ledger.saved.Pack` records who saved what,
when autograd released it, and when Python dropped it):

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

The result is a :class:`fxmem.trace.ledger.records.Trace` (recomputed ops marked ``recompute=True``,
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
import weakref
from dataclasses import replace

import numpy as np

from ..errors import InputError
from ..formula.symbols import ZERO
from ..trace.ledger import Trace, with_fields
from ..trace.plans import Plan
from .numbers import _INDEX, NEVER, Derived, SizeValues
from .schedules import SegmentSchedule, _packs_by_module, _prefixes, schedule
from .uncached import held_by_locals, uncached


def derive(trace: Trace, plan) -> Trace:
    """The step under ``plan`` (a :class:`fxmem.Plan`, or entries for one), from ``trace``
    traced without a plan."""
    plan = _plan_of(trace, plan)
    if not trace.train:
        return replace(trace, plan=plan)  # no_grad: checkpoint saves nothing
    d = _Derivation(trace, plan)
    storages = trace.storages
    pos, created = d.pos, d.created.tolist()
    freed = [None if f == NEVER else f for f in d.freed.tolist()]
    new_storages = []
    held = _held_storages(trace, d.changes.records())
    for k, st in enumerate(held):  # a storage nothing moved stays the same record
        c, f, u = created[k], freed[k], st.unref_after
        u = u if u is None or u < 0 else int(pos[u])
        new_storages.append(st if (c, f, u) == (st.created_by, st.freed_after, st.unref_after)
                            else with_fields(st, created_by=c, freed_after=f, unref_after=u))
    for k, s in enumerate(d.copied.tolist(), len(storages)):
        st = storages[s]
        new_storages.append(with_fields(st, sid=k, created_by=created[k], freed_after=freed[k],
                                        unref_after=freed[k], saved=False,
                                        category=_unsaved(st), saved_by=()))
    for k in d.dropped.tolist():  # not made: a layer's cache (fxmem.checkpoint.uncached)
        new_storages[k] = with_fields(new_storages[k], size=ZERO)
    made_of = _made_of(d)
    out = replace(trace, ops=_derived_ops(trace, d, made_of), storages=tuple(new_storages),
                  plan=plan, packs=())
    _OPS_MADE[:] = [*_OPS_MADE[-1:], (weakref.ref(trace), made_of, weakref.ref(out))]
    return out


# the last two derivations: (base trace, what else their ops are made of, derived trace),
# held weakly (a report no longer used takes its traces with it)
_OPS_MADE: list = []


def _made_of(d) -> tuple:
    """What :func:`_derived_ops` makes the ops of, besides the base ops."""
    return (tuple((None if sc is None else sc.path, len(part)) for part, sc in d.parts),
            d.sources.tobytes(), d.copies)


def _derived_ops(trace: Trace, d, made_of: tuple) -> tuple:
    """:func:`derive`'s ops, renumbered, the re-run ops pointing at the op they repeat: a
    function of the base ops, the module each re-run belongs to, the base op each derived
    op is (``d.sources``) and the storage each re-run makes for a base one (``d.copies``),
    no size. The rank groups of a step over several GPUs share their ops (another rank's
    trace is rank 0's with other shard sizes: :mod:`fxmem.trace.parallel.other_ranks`), so
    a walk deriving a plan for each group makes them once (the second group's derivation
    had made its 17,000 records again for each plan over 5 GPUs). ``made_of``:
    :func:`_made_of` ``d``."""
    ops = trace.ops
    for base, of, made in _OPS_MADE:
        base, made = base(), made()
        if base is not None and made is not None and base.ops is ops and of == made_of:
            return made.ops
    had: dict = {}  # the last derivation's runs, where it was of these ops
    if _RUNS_MADE:
        ref, before = _RUNS_MADE[0]
        last = ref()
        if last is not None and last.ops is ops:
            had = before
    new_ops, runs, k = [], {}, 0
    firsts = {path: first for path, _, first in d._copied_runs}
    for part, sc in d.parts:
        if sc is None:  # base ops first..first + n - 1, as they are, from derived index k
            first, n = int(part[0]), len(part)
            key = first, n, k - first
            made = runs[key] = had.get(key) or [with_fields(ops[i], index=k + j, source=i)
                                                for j, i in enumerate(range(first, first + n))]
            new_ops += made
            k += n
            continue

        # a re-run: its schedule's ops from index k, its copies numbered from its first
        # (those it is handed over are its schedule's own)
        key = sc, k, firsts.get(sc.path)
        made = runs[key] = had.get(key) or _rerun(ops, part.tolist(), k, sc.path, d.copies)
        new_ops += made
        k += len(made)
    _RUNS_MADE[:] = [(weakref.ref(trace), runs)]
    return tuple(new_ops)


def _rerun(ops, sources: list, k: int, path: str, copies: dict) -> list:
    """The records of a re-run of base ops ``sources`` from derived index ``k`` (its
    storages the copies ``copies`` maps ``(path, base sid)`` to)."""
    def m(sids):
        return tuple(copies.get((path, s), s) for s in sids)
    return [with_fields(op, index=k + j, phase="backward", out_sids=m(op.out_sids),
                        new_sids=m(op.new_sids), in_sids=m(op.in_sids),
                        written_sids=m(op.written_sids), autograd_node=None, recompute=True,
                        source=i) for j, (i, op) in enumerate((i, ops[i]) for i in sources)]


# the last derivation's runs of ops, by (first base op, length, shift) for base ops as they
# are and (schedule, derived index, first copy's sid) for a re-run: their records are the
# same in the next plan's step wherever the same run lands as far on (a walk's next plan
# differs from the last in a few blocks: Llama-3.1-8B over 5 GPUs, 14,400 records a plan)
_RUNS_MADE: list = []


def derive_numbers(trace: Trace, plan, sizes) -> Derived:
    """:func:`derive`'s step under ``plan`` as a :class:`Derived`, ``sizes`` the device
    sizes of ``trace``'s storages (a :class:`SizeValues`, which a planner shares between
    its derivations, or a tuple) (a re-run's copy takes its original's): the same numbers
    as the derived trace's, in a fraction of the time and memory. A plan of one entry (a
    planner's candidate) derived from another trace of the same structure
    (:func:`_numbers_made`) is that derivation with these sizes."""
    plan = _plan_of(trace, plan)
    sizes = sizes if isinstance(sizes, SizeValues) else SizeValues(sizes)
    made = _numbers_made(trace) if len(plan) == 1 else None
    got = None if made is None else made.get(plan)
    if got is not None:
        return replace(got, base=sizes)
    got = _numbers(trace, plan, sizes)
    if made is not None:
        made[plan] = got
    return got


# the numbers of each one-entry plan derived from the last structure of trace seen, and that
# structure: a rank's step derived at another world size (fxmem.trace.parallel.other_ranks
# .at_world_size) keeps its ops, calls and saved tensors, and each storage's making, freeing
# and letting go: only sizes differ (Llama-3.1-8B's planner over 5 GPUs derived 320
# candidates the planner over 8 had derived from its trace)
_NUMBERS_MADE: list = []


def _numbers_made(trace: Trace) -> dict:
    """One-entry plan -> its :class:`Derived` (any sizes) for ``trace``'s structure: what
    :func:`_Derivation` reads of it, the same objects (ops, calls, saved tensors, cached
    layers) and the same arrays (each storage's making, freeing, letting go and resizing
    away, and which have a dim of size 0)."""
    if _NUMBERS_MADE and _NUMBERS_MADE[0]() is trace:  # (the same trace: no check)
        return _NUMBERS_MADE[2]
    arrays = (*_base(trace), *_pack_arrays(trace)[5:], _empty_dims(trace))
    if _NUMBERS_MADE:
        _, (ops, calls, packs, layers, train, known), made = _NUMBERS_MADE
        if ops is trace.ops and calls is trace.calls and packs is trace.packs and \
                layers is trace.cache_layers and train == trace.train and \
                all(np.array_equal(a, b) for a, b in zip(known, arrays)):
            _NUMBERS_MADE[0] = weakref.ref(trace)
            return made
    made = {}
    _NUMBERS_MADE[:] = [weakref.ref(trace), (trace.ops, trace.calls, trace.packs,
                                             trace.cache_layers, trace.train, arrays), made]
    return made


def _empty_dims(trace: Trace) -> np.ndarray:
    """Per storage: has its shape a dim of size 0 (:mod:`fxmem.checkpoint.uncached` reads
    it)? A bool array kept on the trace."""
    known = trace.__dict__.get("_empty_dims")
    if known is None:
        known = trace.__dict__["_empty_dims"] = np.fromiter(
            (any(d == 0 for d in (s.shape or ())) for s in trace.storages), bool,
            len(trace.storages))
    return known


def _numbers(trace: Trace, plan: Plan, sizes: SizeValues) -> Derived:
    """:func:`derive_numbers` made (no earlier derivation read)."""
    created, freed = bases = _base(trace)
    n = len(trace.ops)
    none = np.zeros(0, _INDEX)
    if not trace.train or not plan:
        return Derived.of(created, freed, sizes, none, np.arange(n, dtype=_INDEX),
                          np.zeros(n, bool), bases)
    d = _Derivation(trace, plan)
    again = np.concatenate([np.full(len(part), sc is not None) for part, sc in d.parts]) \
        if d.parts else np.zeros(0, bool)
    return Derived.of(d.created, d.freed, sizes, np.array(d.copied, _INDEX), d.sources, again,
                      bases, d.dropped)


def _plan_of(trace: Trace, plan) -> Plan:
    if trace.compiled:  # its ops are its graphs' buffers; what re-runs is the partitioner's
        raise InputError("a checkpoint plan is derived from an eager step's trace; this "
                         "step ran compiled (torch.compile): trace the plan, "
                         "fxmem.analyze(..., checkpoint=plan)")
    if trace.plan:
        raise InputError("derive a plan from a trace without one (this one has "
                         f"{list(trace.plan)})")
    return Plan.of(plan)


class _Derivation:
    """What ``plan`` changes in ``trace`` (a training step), as indices: ``changes``, the
    base storages whose holds autograd and the checkpoints change (:class:`_Changes`);
    ``copied``, the base storage behind each re-run's copy (sids ``len(storages)`` on);
    ``created`` and ``freed``, per storage of the derived step, in its op indices (int32,
    :data:`NEVER`: never freed); ``parts``, the derived step's ops in runs of
    ``(base ops, the schedule re-running them or None: the ops themselves)``, and
    ``sources``, the base op each derived op is or repeats; ``pos``: base op -> derived
    index; ``copies``: ``(path, base sid)`` -> the sid a re-run uses (made when read:
    :func:`derive` reads it, a planner's numbers do not)."""

    def __init__(self, trace: Trace, plan: Plan):
        scheds = [s for s in (schedule(trace, e) for e in plan) if s is not None]
        self.changes = _held_changes(trace, scheds)
        ops, storages = trace.ops, trace.storages
        n = len(ops)
        # re-runs, in the order their first unpacks happened; a selective checkpoint's kept
        # ops are not run again (their cached outputs are handed back)
        reruns = sorted((sc for sc in scheds if sc.recompute_at is not None),
                        key=lambda sc: (sc.recompute_at, sc.order))
        before: dict = {}
        for sc in reruns:
            before.setdefault(sc.recompute_at, []).append(sc)
        parts: list = []  # (base ops, schedule re-running them or None), in derived order
        pos = np.zeros(n, _INDEX)  # base op -> its derived index
        at = {}  # schedule -> derived index of each op of its range (or of the op before it)
        done = length = 0  # base ops placed, derived ops so far

        def place(stop):  # the base ops up to ``stop``, as they are
            nonlocal done, length
            if stop > done:
                pos[done:stop] = np.arange(length, length + stop - done)
                parts.append((np.arange(done, stop, dtype=_INDEX), None))
                length += stop - done
                done = stop

        for i in sorted(before):
            place(max(done, min(i, n)))
            for sc in before[i]:
                ops_of = np.arange(sc.first_op, max(sc.stop, sc.first_op), dtype=_INDEX)
                again = ~_kept(trace, sc)
                at[sc] = (length - 1 + np.cumsum(again)).astype(_INDEX)
                if again.any():
                    parts.append((ops_of[again], sc))
                    length += int(again.sum())
        place(n)

        base_created, base_freed = _base(trace)
        created = np.where(base_created < 0, base_created, pos[np.maximum(base_created, 0)]) \
            if n else base_created.copy()
        freed = base_freed.copy()
        freed[self.changes.sids] = self.changes.freed
        later = freed >= 0
        freed[later] = pos[freed[later]]
        lost = [uncached(trace, sc.modules) for sc in scheds]  # the cache a layer does not write
        for x, end, _ in (s for u in lost for s in u.sources):  # held by the attention's locals
            freed[x] = NEVER if freed[x] == NEVER else max(freed[x], pos[end])
        dropped = [np.fromiter(sorted(u.dropped), _INDEX) for u in lost]
        extra_created, extra_freed, copied = [], [], []
        later_sids, later_frees = [], []  # holds the re-runs and the caches extend: base sid,
        # derived "freed after" (NEVER: never), each freed after the latest of its own and these
        self._copied_runs, self._handed = [], {}  # (path, base sids, first copy), (path, s)
        first_copy = len(storages)
        for sc in reruns:
            made, sids, saved, after = _remade(trace, sc)
            where = at[sc]
            if not len(made):
                continue
            # kept until each saver inside is done with it, then freed after ``after``
            # (moved); else dropped by Python inside the re-run, after its op ``after``
            inner = where[np.clip(after - sc.first_op, 0, len(where) - 1)]
            free = np.where(saved, np.where(after >= 0, pos[np.maximum(after, 0)], after), inner)
            lost = uncached(trace, sc.modules)
            if lost.sources:
                free = held_by_locals(lost, sc, sids, saved, free, where)
            handed = _kept(trace, sc)[made - sc.first_op]  # the forward's own, handed over
            if handed.any():
                later_sids.append(sids[handed])
                later_frees.append(free[handed])
                self._handed.update(((sc.path, s), s) for s in sids[handed].tolist())
            new = ~handed
            copied.append(sids[new])
            extra_created.append(where[made[new] - sc.first_op])
            extra_freed.append(free[new])
            self._copied_runs.append((sc.path, sids[new], first_copy))
            if lost.dropped:
                gone = np.isin(sids[new], np.fromiter(lost.dropped, np.int64))
                dropped.append((first_copy + np.flatnonzero(gone)).astype(_INDEX))
            first_copy += int(new.sum())
        for s, (sc, j) in _cached(trace, scheds).items():  # in the cache until the re-run
            # takes it back, or (never taken: past the early stop) until the checkpoint is done
            end = int(at[sc][j - sc.first_op]) if sc in at and j < sc.stop else \
                (NEVER if sc.done_after is None else sc.done_after if sc.done_after < 0
                 else int(pos[sc.done_after]))
            later_sids.append([s])
            later_frees.append([end])
        if later_sids:
            sids = np.concatenate(later_sids).astype(np.int64)
            frees = np.concatenate(later_frees).astype(np.int64)
            last = np.where(freed == NEVER, _NOT, freed).astype(np.int64)
            np.maximum.at(last, sids, np.where(frees == NEVER, _NOT, frees))
            freed[sids] = np.where(last[sids] == _NOT, NEVER, last[sids])
        self.created = np.concatenate([created, *extra_created]).astype(_INDEX)
        self.freed = np.concatenate([freed, *extra_freed]).astype(_INDEX)
        self.copied = np.concatenate(copied).astype(_INDEX) if copied else np.zeros(0, _INDEX)
        self.parts, self.pos = parts, pos
        # storages the plan's uncached layers do not make (counted as no bytes)
        self.dropped = np.concatenate(dropped) if dropped else np.zeros(0, _INDEX)
        self.sources = np.concatenate([p for p, _ in parts]) if parts else \
            np.zeros(0, _INDEX)

    @functools.cached_property
    def copies(self) -> dict:
        out = dict(self._handed)
        for path, sids, first in self._copied_runs:
            out.update(zip(((path, s) for s in sids.tolist()),
                           range(first, first + len(sids))))
        return out


def _kept(trace: Trace, sc: SegmentSchedule) -> np.ndarray:
    """Whether each op of ``sc``'s re-run range (``first_op .. stop - 1``) is one whose
    outputs selective checkpointing keeps (``sc.cached``): a bool array (kept on the
    trace)."""
    known = trace.__dict__.setdefault("_kept", {})
    if sc not in known:
        out = np.zeros(max(sc.stop - sc.first_op, 0), bool)
        out[[j - sc.first_op for j in sc.cached if sc.first_op <= j < sc.stop]] = True
        known[sc] = out
    return known[sc]


def _remade(trace: Trace, sc: SegmentSchedule) -> tuple:
    """``(op, base sid, saved, after)`` arrays, one entry for each storage ``sc``'s re-run
    makes: ``saved``, kept until each saver inside it is done with it, then ``after`` is
    the base op after which the last lets go (:data:`NEVER`: never); else dropped by
    Python in the re-run, or when it stops: after base op ``after`` of the re-run (kept on
    the trace). Array operations over the trace's storages made and their packs
    (:func:`_made`), whatever the region: a planner asks for hundreds of regions (Llama-3.1-8B
    on one GPU: 606, its groups of up to 12 blocks; 0.18 to 0.20 s of its planner's 1.0 s
    op by op)."""
    known = trace.__dict__.setdefault("_remade", {})  # by region: what ``sc`` keeps aside
    key = (sc.first_op, sc.stop, sc.modules)
    if key not in known:
        m = _made(trace)
        lo, hi = np.searchsorted(m.op, [sc.first_op, max(sc.stop, sc.first_op)])
        first, last = m.ptr[lo], m.ptr[hi]  # their packs
        mods = set(sc.modules)
        prefixes = _prefixes(trace)
        modules = np.unique(m.module[first:last])
        inside = np.zeros(len(m.modules), bool)  # each module saving: inside the region?
        inside[modules] = [not mods.isdisjoint(prefixes[m.modules[i]]) for i in modules]
        held = inside[m.module[first:last]]  # each pack: by a module inside
        # each storage's last release of the packs held inside (never: after every op; no
        # such pack: _NO_PACK), one maximum over its packs
        times = m.after[first:last]
        times = np.where(held, np.where(times == NEVER, _ENDLESS, times), _NO_PACK)
        starts = m.ptr[lo:hi + 1] - first
        last_held = np.full(hi - lo, _NO_PACK, np.int64)
        with_packs = np.flatnonzero(starts[1:] > starts[:-1])
        if len(with_packs):
            last_held[with_packs] = np.maximum.reduceat(times, starts[with_packs])
        saved = last_held != _NO_PACK
        end = sc.stop - 1
        unref = m.unref[lo:hi]
        after = np.where(saved, np.where(last_held == _ENDLESS, NEVER, last_held),
                         np.where((unref == NEVER) | (unref > end), end, unref))
        known[key] = (m.op[lo:hi].astype(np.int64), m.sid[lo:hi].astype(np.int64), saved,
                      after.astype(np.int64))
    return known[key]


_NO_PACK, _ENDLESS = np.iinfo(np.int64).min, np.iinfo(np.int64).max  # (_remade's bounds)


class _Made:
    """Each storage an op makes, in op order (``op``, ``sid``, ``unref``: its last
    reference's op, :data:`NEVER` for none), and its packs after ``ptr[i]`` (``module``:
    an index in ``modules``; ``after``: the op after which the pack lets go, its
    ``dropped_after`` where it was unpacked, else its ``released_after``; :data:`NEVER`:
    never)."""

    def __init__(self, trace: Trace):
        packs_of, storages = _packs_of(trace), trace.storages
        ops, sids, unref, ptr, module, after, index = [], [], [], [0], [], [], {}
        for j, o in enumerate(trace.ops):
            for s in o.new_sids:
                ops.append(j)
                sids.append(s)
                u = storages[s].unref_after
                unref.append(NEVER if u is None else u)
                for p in packs_of.get(s, ()):
                    module.append(index.setdefault(p.module, len(index)))
                    a = p.dropped_after if p.unpacked_at is not None else p.released_after
                    after.append(NEVER if a is None else a)
                ptr.append(len(module))
        self.op, self.sid = np.array(ops, np.int64), np.array(sids, np.int64)
        self.unref, self.ptr = np.array(unref, np.int64), np.array(ptr, np.int64)
        self.module, self.after = np.array(module, np.int64), np.array(after, np.int64)
        self.modules = list(index)


def _made(trace: Trace) -> _Made:
    """:class:`_Made` of ``trace`` (kept on it)."""
    known = trace.__dict__.get("_made")
    if known is None:
        known = trace.__dict__["_made"] = _Made(trace)
    return known


def _base(trace: Trace) -> tuple:
    """Each storage's ``created_by`` and ``freed_after`` (:data:`NEVER` for None), int32
    arrays kept on the trace."""
    known = trace.__dict__.get("_created")
    if known is None:
        st = trace.storages
        known = trace.__dict__["_created"] = (
            np.fromiter((s.created_by for s in st), _INDEX, len(st)),
            np.fromiter((NEVER if s.freed_after is None else s.freed_after for s in st),
                        _INDEX, len(st)))
    return known


def _packs_of(trace: Trace) -> dict:
    """sid -> the trace's packs of it (kept on the trace: every derivation reads them)."""
    known = trace.__dict__.get("_packs_of")
    if known is None:
        known = {}
        for p in trace.packs:
            known.setdefault(p.sid, []).append(p)
        trace.__dict__["_packs_of"] = known
    return known


def _cached(trace: Trace, scheds) -> dict:
    """sid -> ``(schedule, op)`` of the selective checkpoint keeping it."""
    ops = trace.ops
    cache: dict = {}
    for sc in scheds:
        for j in sc.cached:
            for s in ops[j].out_sids:
                cache.setdefault(s, (sc, j))
    return cache


class _Changes:
    """The base storages whose holds a plan's forward changes (:func:`_held_changes`):
    ``sids`` and each one's ``freed`` (base op indices, :data:`NEVER`: never), arrays; and
    :meth:`records`, each one's ``(freed_after, saved, category)`` as a traced plan has
    them (:func:`derive` reads them; a planner's numbers do not)."""

    def __init__(self, trace: Trace, sids, freed, kept, by_plan: set):
        self.trace, self.sids, self.freed = trace, sids, freed
        self._kept, self._by_plan = kept, by_plan

    def records(self) -> dict:
        storages, ops, out = self.trace.storages, self.trace.ops, {}
        for sid, f, kept in zip(self.sids.tolist(), self.freed.tolist(), self._kept.tolist()):
            st, by_plan = storages[sid], sid in self._by_plan
            out[sid] = (None if f == NEVER else f, kept or by_plan,
                        st.category if kept else _held(st, ops) if by_plan else _unsaved(st))
        return out


def _held_changes(trace: Trace, scheds) -> _Changes:
    """The base storages whose holds the plan's forward changes: autograd's holds from
    inside a segment are gone, the segments' inputs wait for their backward (a
    :class:`_Changes`)."""
    keep_until: dict = {}
    for sc in scheds:
        if sc.recompute_at is not None:
            for s in sc.inputs:
                keep_until.setdefault(s, []).append(sc.done_after)
    cache = _cached(trace, scheds)
    inside = {m for sc in scheds for m in sc.modules}  # a module in one of them, or below
    mods, pack_sid, pack_mod, released, held, unref, resized = _pack_arrays(trace)
    planned = _within(trace, inside)  # per module in ``mods``
    in_plan = planned[pack_mod] if len(pack_mod) else np.zeros(0, bool)  # per pack
    n = len(trace.storages)
    kept = np.bincount(pack_sid[~in_plan], minlength=n)  # packs held from outside the plan
    last = np.full(n, -1, np.int64)  # the latest of their releases (_NOT: never)
    np.maximum.at(last, pack_sid[~in_plan], released[~in_plan])
    waits = np.full(n, -1, np.int64)  # the latest "done" of the checkpoints holding it
    by_plan = set(keep_until) | set(cache)
    for s, done in keep_until.items():
        waits[s] = max(_NOT if d is None else d for d in done)
    touched = np.union1d(np.unique(pack_sid[in_plan]),
                         np.fromiter(by_plan, np.int64, len(by_plan)))
    planned_hold = np.zeros(n, bool)
    planned_hold[np.fromiter(by_plan, np.int64, len(by_plan))] = True
    moved = ((kept[touched] != held[touched]) | planned_hold[touched]) & ~resized[touched]
    touched = touched[moved]
    free = np.maximum(np.maximum(unref[touched], last[touched]), waits[touched])
    return _Changes(trace, touched, np.where(free == _NOT, NEVER, free), kept[touched] > 0,
                    by_plan)


_NOT = np.iinfo(np.int64).max  # "never freed" where a latest is a maximum


def _pack_arrays(trace: Trace) -> tuple:
    """The trace's packs and storages as :func:`_held_changes` reads them (kept on the
    trace): the modules whose forwards saved tensors; per pack its storage, its module (an
    index in those) and ``released_after`` (:data:`_NOT`: never); per storage how many
    packs hold it, ``unref_after`` (:data:`_NOT`: never, and for a storage made before the
    step) and whether a resize freed it."""
    known = trace.__dict__.get("_pack_arrays")
    if known is None:
        mods = list(_packs_by_module(trace))
        index = {m: k for k, m in enumerate(mods)}
        packs, storages = trace.packs, trace.storages
        sids = np.array([p.sid for p in packs], np.int64)
        unref = [_NOT if st.created_by < 0 or st.unref_after is None else st.unref_after
                 for st in storages]
        known = trace.__dict__["_pack_arrays"] = (
            mods, sids, np.array([index[p.module] for p in packs], np.int64),
            np.array([_NOT if p.released_after is None else p.released_after for p in packs],
                     np.int64),
            np.bincount(sids, minlength=len(storages)), np.array(unref, np.int64),
            np.array([st.resized_away for st in storages], bool))
    return known


def _within(trace: Trace, inside: set) -> np.ndarray:
    """Per module of :func:`_pack_arrays`' modules: is it one of ``inside`` (module paths)
    or in one of them? Read from an array of each module's prefixes
    (:func:`fxmem.checkpoint.schedules._prefixes`) as indices (kept on the trace), padded
    with one that is never inside."""
    known = trace.__dict__.get("_prefix_indices")
    if known is None:
        prefixes = _prefixes(trace)
        rows = [prefixes[m] for m in _pack_arrays(trace)[0]]
        index: dict = {}
        for row in rows:
            for q in row:
                index.setdefault(q, len(index))
        table = np.full((len(rows), max(map(len, rows), default=0)), len(index), np.int64)
        for k, row in enumerate(rows):
            table[k, :len(row)] = [index[q] for q in row]
        known = trace.__dict__["_prefix_indices"] = index, table
    index, table = known
    marked = np.zeros(len(index) + 1, bool)
    marked[[index[m] for m in inside if m in index]] = True
    return marked[table].any(axis=1)


def _held_storages(trace: Trace, changes: dict) -> list:
    """The base storages as the plan's forward leaves them (:func:`_held_changes`)."""
    out = list(trace.storages)  # the others stay as they are
    for sid, (free, saved, category) in changes.items():
        out[sid] = with_fields(out[sid], freed_after=free, saved=saved, category=category)
    return out


def _held(st, ops) -> str:
    """Category of a storage a checkpoint holds for backward (a region's input, an output
    selective checkpointing keeps), as a traced plan labels it: made in the forward, an
    activation."""
    made_in_forward = st.created_by >= 0 and ops[st.created_by].phase == "forward"
    return "activation" if st.category == "temporary" and made_in_forward else st.category


def _unsaved(st) -> str:
    """Category of a storage no longer saved by autograd (as a traced plan labels it)."""
    return "temporary" if st.category == "activation" else st.category
