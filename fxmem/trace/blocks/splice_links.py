"""Storages passed between neighbouring blocks, where a run's interior blocks are copies of
its third block's spans, FSDP2's hooks' ops and its own
(:meth:`fxmem.trace.blocks.sharded.ShardedReuse.splice_runs`): in the real step each block
hands storages to the block before or after it (its all-gather output freed by the next
block's copy-out, the backward's prefetched all-gather, the reduce-scatter state freed by the
next post-backward); in the recorded one the third block's neighbours are the second block
and the last. :func:`relink` points each copy's such storages at its own neighbours' and
splits the links recorded between the third block and the last, each side its copy's.
It writes :class:`fxmem.trace.blocks.splice.Numbering`'s ``links`` (a copy's storage read
from a neighbour), ``op_renames`` (a recorded op's) and its storages' frees."""

from __future__ import annotations

from .reuse import NoReuse
from .splice_checks import windows


def _span_new(num, c, kind: str) -> list:
    """The new positions of call ``c``'s spans, window by window: ``kind`` "real" (a
    block traced for real, its spans recorded), "copy" (an interior stand-in, its
    windows replaced by the pattern's spans) or "last" (hooks recorded, its own ops a
    copy of the second block's)."""
    if kind == "copy":
        return [list(range(s, s + ln)) for s, ln in
                (num.copy_at[(id(c), w_no)] for w_no in range(len(windows(c))))]
    out = []
    for w in windows(c):
        pos = []
        for i in w:
            if i in num.new_real:
                pos.append(num.new_real[i])
            elif i in num.sw:
                s, ln = num.window_of(i)
                pos.extend(range(s, s + ln))
        out.append(pos)
    return out


def relink(num, calls: list) -> None:
    """A run copied with its hooks (its pattern's windows its spans): each copy's
    storages made for, or by, the block before or after it in the step; and the links
    FSDP2 recorded between the pattern and the last block (neighbours in the recorded
    step, not in the real one) split, each side its copy's."""
    ops, st = num.rec.ops, num.rec.storages
    prev, pat, inner = calls[0], calls[1], calls[2:]
    last = pat.next_unit
    pw = windows(pat)
    spans = {"prev": [list(w) for w in windows(prev)], "pat": [list(w) for w in pw]}
    new_last = _span_new(num, last, "last")
    if [len(w) for w in new_last] != [len(w) for w in pw] or \
            [len(w) for w in spans["prev"]] != [len(w) for w in pw]:
        raise NoReuse(f"{last.path}: its hooks and ops are laid out otherwise than "
                      f"{pat.path}'s")
    where_old = {}  # old op -> (unit, window, offset) for the real spans
    for unit in ("prev", "pat"):
        for w_no, w in enumerate(spans[unit]):
            for off, i in enumerate(w):
                where_old[i] = (unit, w_no, off)
    where_last = {}  # new position -> (window, offset) in the last block's spans
    for w_no, w in enumerate(new_last):
        for off, j in enumerate(w):
            where_last[j] = (w_no, off)
    inside, role_of, internal = num.pat_info[id(pat)]
    units = [pat, *inner, last]  # in forward order; a copy's neighbours are beside it
    kinds = ["real"] + ["copy"] * len(inner) + ["last"]
    new_spans = [_span_new(num, u, k) for u, k in zip(units, kinds)]

    def made_at(u: int, w_no: int, off: int, k: int):
        """The final sid of the k-th storage the op at (w_no, off) of unit ``u`` makes."""
        if kinds[u] == "copy":
            q = pw[w_no][off]
            return num.copies.get((id(units[u]), ops[q].new_sids[k]))
        j = new_spans[u][w_no][off]
        item = num.order[j]
        if item[0] != "r":
            raise NoReuse(f"{units[u].path}: a storage passed to a neighbour is made "
                          "by a copied op")
        return num.final.get(ops[item[1]].new_sids[k])

    def where_made(s):  # (unit "prev"/"pat"/"last", window, offset, k) or None
        r = st[s].created_by
        if r < 0:
            return None
        k = ops[r].new_sids.index(s) if s in ops[r].new_sids else None
        if k is None:
            return None
        if r in where_old:
            return (*where_old[r], k)
        j = num.new_real.get(r)
        if j is not None and j in where_last:
            return ("last", *where_last[j], k)
        return None

    def where_freed(s):  # (unit, window, offset) or None
        f = st[s].freed_after
        if f is None:
            return None
        if f in where_old:
            return where_old[f]
        j = num.after(f)
        return ("last", *where_last[j]) if j in where_last else None

    # the pattern's storages made in its spans and freed in a neighbour's
    for ps in internal:
        fr = where_freed(ps)
        if fr is None or fr[0] == "pat":
            continue
        side = -1 if fr[0] == "prev" else 1
        for u in range(1, len(units) - 1):
            num.storages[num.copies[(id(units[u]), ps)]].freed_after = \
                new_spans[u + side][fr[1]][fr[2]]
        if side == 1:  # the pattern's own, freed in the last block's span: by the first copy
            num.storages[num.final[ps]].freed_after = new_spans[1][fr[1]][fr[2]]
            _rename_in(num, last, ps, made_at(len(units) - 2, *where_made(ps)[1:]))
    # storages made in a neighbour's span and read or freed in the pattern's
    seen = set()
    in_pat = set(inside)
    freed_here = [s.sid for s in st if s.freed_after in in_pat]  # (read or not)
    for i in [*(i for w in pw for i in w), None]:
        for s in ((*ops[i].in_sids, *ops[i].out_sids, *ops[i].written_sids)
                  if i is not None else freed_here):
            if s in seen or s in role_of or st[s].created_by in inside:
                continue
            seen.add(s)
            wm = where_made(s)
            if wm is None or wm[0] == "pat":
                continue
            side = -1 if wm[0] == "prev" else 1
            for u in range(1, len(units) - 1):
                got = made_at(u + side, *wm[1:])
                if got is None:
                    raise NoReuse(f"{units[u].path}: no counterpart of a storage passed "
                                  "to it")
                num.links[(id(units[u]), s)] = got
            if side == 1:  # made by the last block: in the real step, by the last copy
                fr = where_freed(s)
                if fr is not None and fr[0] == "pat":
                    num.storages[num.final[s]].freed_after = \
                        new_spans[len(units) - 2][fr[1]][fr[2]]
                _rename_in(num, pat, s, made_at(1, *wm[1:]))
    _shards(num, prev, units)


def _shards(num, prev, units: list) -> None:
    """The sharded parameters of the block before, which the backward's prefetch gathers
    (FSDP2's all-gather reads them, roles ``("sp", name)``): a copy's, its block before's;
    the last block's, recorded reading the pattern's, the last copy's. ``prev``: the block
    before the pattern; ``units``: the pattern, the copies and the last block."""
    ops, pat, last = num.rec.ops, units[0], units[-1]
    prev_sp = {s: key for key, s in prev.roles.items() if key[0] == "sp"}
    for i in (i for w in windows(pat) for i in w):
        for s in ops[i].in_sids:
            if s in prev_sp:
                for u in range(1, len(units) - 1):
                    num.links[(id(units[u]), s)] = num.final[units[u - 1].roles[prev_sp[s]]]
    pat_sp = {s: key for key, s in pat.roles.items() if key[0] == "sp"}
    for i in (i for w in windows(last) for i in w):
        for s in ops[i].in_sids:
            if s in pat_sp:
                num.op_renames.setdefault(i, {})[s] = num.final[units[-2].roles[pat_sp[s]]]


def _rename_in(num, c, sid: int, new: int | None) -> None:
    """The recorded ops of call ``c``'s windows read ``new`` for ``sid``."""
    if new is None:
        raise NoReuse(f"{c.path}: no counterpart of a storage passed to it")
    for w in windows(c):
        for i in w:
            num.op_renames.setdefault(i, {})[sid] = new
