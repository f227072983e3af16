"""Splicing copied blocks into a trace: each stand-in of :mod:`fxmem.trace.blocks.reuse` becomes a
copy of the second traced block's ops, storages and saved tensors, renamed to the
stand-in's inputs, outputs, parameters and gradients.

In steps (:meth:`_Splice.apply`): the runs checked (:mod:`fxmem.trace.blocks.splice_checks`);
the new numbering of ops and storages (:class:`Numbering`); then, each in the new numbering,
the ops, the saved tensors, the module calls and the rest of the recorder (names, what is
saved, what is not modelled, the gradient sums); the graph is built only when asked for
(:mod:`fxmem.trace.blocks.splice_graph`)."""

from __future__ import annotations

from dataclasses import replace

from ..kernels.grad_sums import ACCUMULATE_GRAD
from ..ledger.records import with_fields
from ..ledger.saved import _Record
from ..ledger.tracking import TrackedStorage
from .reuse import NoReuse, Reuse
from .splice_checks import check_run, windows
from .splice_graph import Spliced, first_desc
from .splice_links import relink


def splice(rec, reuse: Reuse) -> None:
    """Rewrite ``rec`` (ops, storages, saved tensors, module calls, graph) so that each
    stand-in's ops become a copy of its run's second block. Raises :class:`NoReuse`."""
    runs = [calls for calls in reuse.splice_runs() if len(calls) > 2]
    if not runs:
        return
    _Splice(rec, runs).apply()


class Numbering:
    """The spliced step's numbering: each op's new position (``order``: ``("r", i)`` for
    recorded op ``i``, ``("c", call, pattern, pattern op index, window no.)`` for a copy)
    and each storage's new sid (``final`` for recorded ones, ``copies`` for a copy's own),
    with the stand-ins' own storages ``dropped``. ``runs``: each run's calls (the first
    block, the pattern, then the stand-ins); ``rec``: the recorder, before the splice."""

    def __init__(self, rec, runs: list):
        self.rec, self.runs, self.n = rec, runs, len(rec.ops)
        for calls in runs:
            for c in calls[2:]:
                c.pattern = calls[1]
        self._order()
        self._storages()

    # ops ---------------------------------------------------------------------------------
    def _order(self) -> None:
        self.sw = {}  # first op index of a stand-in window -> (call, pattern, window no.)
        self.in_sw = {}  # op index -> window start
        for calls in self.runs:
            pat = calls[1]
            for c in calls[2:]:
                for w_no, w in enumerate(windows(c)):
                    self.sw[w.start] = (c, pat, w_no, w)
                    for i in w:
                        self.in_sw[i] = w.start
        order, self.new_real, self.copy_at = [], {}, {}
        i = 0
        while i < self.n:
            if i in self.sw:
                c, pat, w_no, w = self.sw[i]
                pw = windows(pat)[w_no]
                self.copy_at[(id(c), w_no)] = (len(order), len(pw))
                order.extend(("c", c, pat, q, w_no) for q in pw)
                i = w.stop
                continue
            self.new_real[i] = len(order)
            order.append(("r", i))
            i += 1
        self.order, self.n_new = order, len(order)

    def window_of(self, i: int) -> tuple:
        """(first new position, length) of the copy standing where recorded op ``i`` was."""
        c, _, w_no, _ = self.sw[self.in_sw[i]]
        return self.copy_at[(id(c), w_no)]

    def after(self, i):
        """"Freed after recorded op ``i``", in the new order."""
        if i is None or i < 0:
            return i
        if i in self.new_real:
            return self.new_real[i]
        s, ln = self.window_of(i)
        return s + ln - 1

    def before(self, i):
        """"Ops recorded before" position ``i``, in the new order."""
        if i is None:
            return None
        if i >= self.n:
            return self.n_new
        if i in self.new_real:
            return self.new_real[i]
        return self.window_of(i)[0]

    def copy_index(self, c, rel: tuple) -> int:
        """The new position of a pattern op (``rel``: window no., offset) in ``c``'s copy."""
        w_no, r = rel
        return self.copy_at[(id(c), w_no)][0] + r

    @staticmethod
    def rename(c, module: str) -> str:
        """A module path of ``c``'s pattern block, as in ``c``."""
        p = c.pattern.path
        if module == p or module.startswith(p + "."):
            return c.path + module[len(p):]
        return module

    # storages ----------------------------------------------------------------------------
    def _storages(self) -> None:
        ops, st = self.rec.ops, self.rec.storages
        self.pat_info = {}  # pattern call id -> (op -> (window, offset), sid -> role, own)
        for calls in self.runs:
            pat = calls[1]
            inside = {i: (w_no, i - w.start) for w_no, w in enumerate(windows(pat)) for i in w}
            role_of = {s: key for key, s in pat.roles.items()}
            internal = [s for w in windows(pat) for i in w for s in ops[i].new_sids
                        if s not in role_of]
            self.pat_info[id(pat)] = (inside, role_of, internal)
        created, freed, keep = self._role_targets()
        standin_sids = {s for i in self.in_sw for s in ops[i].new_sids}
        self.dropped = standin_sids - keep
        self.final, self.storages = {}, []
        for s in st:
            if s.sid in self.dropped:
                continue
            self.final[s.sid] = len(self.storages)
            cb = created.get(s.sid, s.created_by if s.created_by < 0 else
                             self.new_real.get(s.created_by))
            if cb is None:
                raise NoReuse("a storage made by a stand-in has no counterpart")
            fa = freed.get(s.sid, self.after(s.freed_after))
            self.storages.append(TrackedStorage(len(self.storages), s.nbytes, cb, fa, s.stream))
        self.copies = {}  # (call id, pattern sid) -> final sid
        for calls in self.runs:
            inside, _, internal = self.pat_info[id(calls[1])]
            for c in calls[2:]:
                for ps in internal:
                    p = st[ps]
                    f = p.freed_after
                    fa = (None if f is None else self.copy_index(c, inside[f]) if f in inside
                          else self.after(f))
                    self.copies[(id(c), ps)] = len(self.storages)
                    self.storages.append(TrackedStorage(
                        len(self.storages), p.nbytes, self.copy_index(c, inside[p.created_by]),
                        fa, p.stream))
        self.links, self.op_renames = {}, {}  # (fxmem.trace.blocks.splice_links)
        for calls in self.runs:
            if calls[1].spans and calls[1].next_unit is not None:
                relink(self, calls)
        self._outer()

    def _outer(self) -> None:
        """Storages outside the blocks that the pattern's ``AccumulateGrad`` steps read or
        write (DDP's gradient buckets, which need not hold the same parameters in every
        block): in a copy, those the stand-in's own steps used, gradient by gradient
        (``outer``: (call id, pattern op) -> {pattern sid: stand-in sid})."""
        self.outer = {}
        for calls in self.runs:
            pat = calls[1]
            _, role_of, internal = self.pat_info[id(pat)]
            theirs = self._steps(windows(pat), role_of, {*role_of, *internal})
            if not any(outside for _, outside in theirs.values()):
                continue
            for c in calls[2:]:
                c_role = {s: key for key, s in c.roles.items()}
                made = {s for w in windows(c) for i in w for s in self.rec.ops[i].new_sids}
                mine = self._steps(windows(c), c_role, {*c_role, *made})
                if mine.keys() != theirs.keys() or any(
                        len(mine[k][1]) != len(v[1]) for k, v in theirs.items()):
                    raise NoReuse(f"{c.path}: its gradients' steps differ from "
                                  f"{pat.path}'s")
                for k, (q, outside) in theirs.items():
                    self.outer[(id(c), q)] = dict(zip(outside, mine[k][1]))

    def _steps(self, wins, role_of: dict, own: set) -> dict:
        """(a gradient's role, n-th step on it) -> (op, the storages it uses outside
        ``own``) of each ``AccumulateGrad`` step in ``wins``. A gradient with no role (a
        view of DDP's bucket) is known by its parameter's role."""
        got, seen = {}, {}
        for w in wins:
            for i in w:
                op = self.rec.ops[i]
                if op.autograd_node != ACCUMULATE_GRAD:
                    continue
                keys = {role_of[s] for s in op.in_sids if role_of.get(s, ("",))[0] == "g"}
                if not keys:
                    param = role_of.get(self.rec.accumulated.get(i), ("",))
                    if param[0] in ("p", "pb"):
                        keys = {("g", param[1])}
                if len(keys) != 1:
                    continue
                key = keys.pop()
                n = seen[key] = seen.get(key, -1) + 1
                got[(key, n)] = (i, tuple(s for s in (*op.in_sids, *op.out_sids,
                                                      *op.written_sids) if s not in own))
        return got

    def _role_targets(self) -> tuple:
        """The stand-ins' storages that take a pattern storage's role (its outputs, its
        input's gradient): when the copy makes them (``created``: sid -> new op) and
        frees them (``freed``), and which are kept (``keep``)."""
        st = self.rec.storages
        created, freed, keep = {}, {}, set()
        for calls in self.runs:
            pat = calls[1]
            inside = self.pat_info[id(pat)][0]
            for c in calls[2:]:
                for key, ps in pat.roles.items():
                    ts = c.roles.get(key)
                    if ts is None:
                        if st[ps].created_by in inside:
                            raise NoReuse(f"{c.path}: no counterpart of {key}")
                        continue
                    if st[ps].created_by in inside:
                        created[ts] = self.copy_index(c, inside[st[ps].created_by])
                        keep.add(ts)
                    # freed inside the pattern: so in the copy, unless something else
                    # (e.g. autograd's root gradient) kept the stand-in's one alive longer
                    f, f_real = st[ps].freed_after, st[ts].freed_after
                    if (f is not None and f in inside and f_real in self.in_sw
                            and self.sw[self.in_sw[f_real]][0] is c):
                        freed[ts] = self.copy_index(c, inside[f])
        return created, freed, keep

    def sid_in(self, c, ps: int, q: int | None = None) -> int:
        """A pattern storage, in stand-in ``c``'s copy (of pattern op ``q``)."""
        got = self.links.get((id(c), ps))
        if got is not None:
            return got
        got = self.outer.get((id(c), q), {}).get(ps)
        if got is not None:
            return self.final[got]
        got = self.copies.get((id(c), ps))
        if got is not None:
            return got
        key = self.pat_info[id(c.pattern)][1].get(ps)
        if key is not None:
            return self.final[c.roles[key]]
        if ps in self.dropped:
            raise NoReuse(f"{c.path} reads a stand-in's storage")
        return self.final[ps]

    def real_sids(self, sids: tuple, renames: dict | None = None) -> tuple:
        """Recorded storages outside the blocks, renumbered; ``renames``, a recorded op's
        storages passed between neighbours (``op_renames``: :mod:`.splice_links`), first."""
        renames = renames or {}
        if any(s in self.dropped and s not in renames for s in sids):
            raise NoReuse("an op outside the blocks reads a stand-in's storage")
        return tuple(renames[s] if s in renames else self.final[s] for s in sids)


class _Splice:
    def __init__(self, rec, runs):
        self.rec, self.runs = rec, runs

    def apply(self) -> None:
        rec = self.rec
        by_path = {c.path: c for calls in self.runs for c in calls}
        for calls in self.runs:
            check_run(rec, calls, by_path)
        num = Numbering(rec, self.runs)
        old_graph, new_ops = rec.graph, self._ops(num)
        packs = self._packs(num)
        calls_new = self._calls(num)
        saved, names, unmodelled = self._rest(num)
        rec.first_desc = first_desc(old_graph, num.order, num.final, num.sid_in, num.outer,
                                    num.op_renames)
        rec.sums.candidates = self._sums(num)

        # the graph is built when first asked for (named dims): a sixth of a splice
        built = Spliced(old_graph, num.order, num.final, num.sid_in, num.rename,
                        num.op_renames)
        rec.ops, rec.storages, rec.calls = new_ops, num.storages, calls_new
        rec.saved_tensors._packs = packs
        rec.saved, rec.names, rec.unmodelled, rec.graph = saved, names, unmodelled, built
        rec.fsdp_buffers = self._buffers(num)
        rec.events = []
        # storages freed by a resize to 0 (FSDP2's reshard), in the new numbering: a copy's
        # as its pattern's (FSDP2's reshard copied)
        away = rec.resized_away
        rec.resized_away = {num.final[s] for s in away if s not in num.dropped} | {
            sid for (_, ps), sid in num.copies.items() if ps in away}
        rec.op_count = num.n_new
        rec.reused = tuple(c.path for c in sorted(  # in the order they ran
            (c for calls in self.runs for c in calls[2:]), key=lambda c: c.fwd[0]))

    def _ops(self, num: Numbering) -> list:
        """Every op in the new order: a recorded one renumbered, or a copy of a pattern op
        under the stand-in's module paths and storages."""
        ops, new_ops = self.rec.ops, []
        for j, item in enumerate(num.order):
            if item[0] == "r":
                op = ops[item[1]]
                ren = num.op_renames.get(item[1])
                new_ops.append(with_fields(op, index=j,
                                           out_sids=num.real_sids(op.out_sids, ren),
                                           new_sids=num.real_sids(op.new_sids, ren),
                                           in_sids=num.real_sids(op.in_sids, ren),
                                           written_sids=num.real_sids(op.written_sids, ren)))
            else:
                _, c, pat, q, _ = item
                op = ops[q]

                def m(t, c=c, q=q):
                    return tuple(num.sid_in(c, s, q) for s in t)
                new_ops.append(with_fields(op, index=j, module=num.rename(c, op.module),
                                           out_sids=m(op.out_sids), new_sids=m(op.new_sids),
                                           in_sids=m(op.in_sids),
                                           written_sids=m(op.written_sids)))
        return new_ops

    def _packs(self, num: Numbering) -> list:
        """The saved tensors' records in the new numbering (a copy's saves its pattern's),
        ranked again by when each is unpacked."""
        rec, packs = self.rec, []
        for p in rec.saved_tensors._packs:
            if p.sid in num.dropped:
                raise NoReuse("a stand-in's storage was saved for backward")
            packs.append((_Record(num.before(p.at), num.final[p.sid], p.module,
                                  num.after(p.released_after), num.before(p.unpacked_at),
                                  None, num.after(p.dropped_after)), p.unpack_order))
        for calls in self.runs:
            pat = calls[1]
            inside = num.pat_info[id(pat)][0]
            ends = {w_no: w.stop for w_no, w in enumerate(windows(pat))}

            def rel_before(i, c):  # a position inside (or at the end of) a pattern window
                if i is None:
                    return None
                if i in inside:
                    return num.copy_index(c, inside[i])
                for w_no, stop in ends.items():
                    if i == stop:
                        s, ln = num.copy_at[(id(c), w_no)]
                        return s + ln
                raise NoReuse(f"{pat.path}: a saved tensor is used outside its block")

            def rel_after(i, c):
                if i is None:
                    return None
                if i in inside:
                    return num.copy_index(c, inside[i])
                raise NoReuse(f"{pat.path}: a saved tensor outlives its block")

            mine = [p for p in rec.saved_tensors._packs
                    if p.module == pat.path or p.module.startswith(pat.path + ".")]
            for c in calls[2:]:
                for p in mine:
                    packs.append((_Record(rel_before(p.at, c), num.sid_in(c, p.sid),
                                          num.rename(c, p.module),
                                          rel_after(p.released_after, c),
                                          rel_before(p.unpacked_at, c), None,
                                          rel_after(p.dropped_after, c)), p.unpack_order))
        ranked = sorted((r.unpacked_at, o, n) for n, (r, o) in enumerate(packs)
                        if r.unpacked_at is not None)
        for rank, (_, _, n) in enumerate(ranked):
            packs[n][0].unpack_order = rank
        return [r for r, _ in packs]

    def _calls(self, num: Numbering) -> list:
        """The module calls in the new numbering: a stand-in's own call stays (its hooks'
        ops are real ones), the calls inside it are its pattern's, renamed."""
        rec, calls_new = self.rec, []
        standin_paths = {c.path for calls in self.runs for c in calls[2:]}
        # a stand-in copied with its pattern's FSDP2 hooks (spans): their ops are its own
        # pre-hooks' ops, as the pattern's own call counts them
        hook_ops = {c.path: pc.hook_ops for calls in self.runs if calls[1].spans
                    for pc in rec.calls if pc.path == calls[1].path for c in calls[2:]}
        for mc in rec.calls:
            if any(mc.path.startswith(p + ".") for p in standin_paths):
                continue
            calls_new.append(replace(mc, first_op=num.before(mc.first_op),
                                     last_op=num.after(mc.last_op),
                                     hook_ops=hook_ops.get(mc.path, mc.hook_ops),
                                     arg_sids=tuple(num.final[s] for s in mc.arg_sids
                                                    if s not in num.dropped)))
        for calls in self.runs:
            pat = calls[1]
            inside = num.pat_info[id(pat)][0]
            for c in calls[2:]:
                for mc in rec.calls:
                    if mc.path.startswith(pat.path + "."):
                        first = (num.copy_index(c, inside[mc.first_op])
                                 if mc.first_op in inside else num.copy_at[(id(c), 0)][0])
                        last = (num.copy_index(c, inside[mc.last_op])
                                if mc.last_op in inside else first - 1)
                        calls_new.append(replace(mc, path=num.rename(c, mc.path),
                                                 first_op=first, last_op=last,
                                                 arg_sids=tuple(num.sid_in(c, s)
                                                                for s in mc.arg_sids)))
        return calls_new

    def _rest(self, num: Numbering) -> tuple:
        """What autograd saved, the storages' names and what is not modelled, in the new
        numbering (a copy's as its pattern's)."""
        rec = self.rec
        saved = {num.final[s] for s in rec.saved if s not in num.dropped}
        for calls in self.runs:
            role_of = num.pat_info[id(calls[1])][1]
            for c in calls[2:]:
                saved |= {num.sid_in(c, s) for s in rec.saved
                          if (id(c), s) in num.copies or s in role_of}
        names = {num.final[s]: v for s, v in rec.names.items() if s not in num.dropped}
        # kernels' named temporaries (fxmem.trace.kernels.cuda.kernels)
        for (cid, ps), sid in num.copies.items():
            if rec.names.get(ps, ("",))[0] == "temporary":
                names[sid] = rec.names[ps]
        unmodelled = dict(rec.unmodelled)
        for calls in self.runs:
            for c in calls[2:]:
                for (f, mod), why in rec.unmodelled.items():
                    unmodelled.setdefault((f, num.rename(c, mod)), why)
        return saved, names, unmodelled

    def _buffers(self, num: Numbering) -> dict:
        """FSDP2's own buffers (:mod:`fxmem.trace.parallel.fsdp_buffers`) in the new
        numbering (a copy's as its pattern's)."""
        had = self.rec.fsdp_buffers
        out = {num.final[s]: b for s, b in had.items() if s not in num.dropped}
        out.update((sid, had[ps]) for (_, ps), sid in num.copies.items() if ps in had)
        for calls in self.runs:  # a stand-in's own, its pattern's one (FSDP2's gradients)
            for c in calls[2:]:
                out.update((num.final[c.roles[key]], had[ps]) for key, ps
                           in calls[1].roles.items() if ps in had and key in c.roles)
        return out

    def _sums(self, num: Numbering) -> list:
        """Autograd's gradient sums that may run in place (:mod:`fxmem.trace.kernels.grad_sums`,
        applied after the splice) in the new numbering: the real ops' and, for each stand-in,
        its copies of the pattern block's (a block's sum into the gradient of its input, which
        a stand-in makes, included). A copy's sum whose first gradient is the gradient the
        stand-in was given stays out of place where that gradient could not be summed into
        (a view, say: the last block of a run, given a gradient from outside it; timm's
        ConvNeXt, whose stage's last block gets the permuted gradient of the next stage's
        LayerNorm2d)."""
        out = []
        for index, a, s in self.rec.sums.candidates:
            if index in num.new_real and a not in num.dropped and s not in num.dropped:
                out.append((num.new_real[index], num.final[a], num.final[s]))
            for calls in self.runs:
                inside = num.pat_info[id(calls[1])][0]
                if index in inside:
                    given = [r for r, v in calls[1].roles.items() if r[0] == "gy" and v == a]
                    out += [(num.copy_index(c, inside[index]), num.sid_in(c, a),
                             num.sid_in(c, s))
                            for c in calls[2:]
                            if all(c.grad_summable.get(r, True) for r in given)]
        return sorted(out)
