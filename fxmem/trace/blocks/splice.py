"""Splicing copied blocks into a trace: each stand-in of :mod:`fxmem.trace.blocks.reuse` becomes a
copy of the second traced block's ops, storages and saved tensors, renamed to the
stand-in's inputs, outputs, parameters and gradients."""

from __future__ import annotations

import operator
from contextlib import nullcontext
from dataclasses import replace

import sympy
import torch

from ..ledger.saved import _Record
from ..ledger.tracking import TrackedStorage
from .reuse import _ACC, NoReuse, Reuse


def splice(rec, reuse: Reuse) -> None:
    """Rewrite ``rec`` (ops, storages, saved tensors, module calls, graph) so that each
    stand-in's ops become a copy of its run's second block. Raises :class:`NoReuse`."""
    runs = []
    for run in reuse.runs:
        calls = reuse.calls[run.paths]
        if len(calls) != len(run.paths) - reuse.skip.get(run.paths, 0):
            raise NoReuse(f"{calls[-1].path if calls else run.paths[0]}: not every block "
                          "of the run was called")
        if len(calls) > 2:
            runs.append(calls)
    if not runs:
        return
    _Splice(rec, runs).apply()


class _Splice:
    def __init__(self, rec, runs):
        self.rec, self.runs = rec, runs
        self.old_graph = rec.graph
        self.ops = rec.ops
        self.n = len(rec.ops)

    def _size(self, v):
        """A storage size as the ShapeEnv finally knows it (guards may equate symbols)."""
        if isinstance(v, int):
            return v
        env = self.rec.shape_env
        return sympy.expand(env.replace(v.node.expr))

    # windows ---------------------------------------------------------------------------
    @staticmethod
    def _windows(c) -> list:
        w = [range(*c.fwd)]
        if c.bwd[0] is not None:
            w.append(range(*c.bwd))
        return w

    def _check(self, calls) -> None:
        first, pat = calls[0], calls[1]
        if first.bwd[0] is not None and first.bwd[1] is None and pat.bwd[1] is not None:
            # the first block's input needs no gradient (the model's input): its backward
            # is as long as the second's, which the comparison below checks
            first.bwd[1] = min(self.n, first.bwd[0] + len(range(*pat.bwd)))
        has_bwd = {c.bwd[0] is not None and c.bwd[1] is not None for c in calls}
        partly = {c.bwd[0] is not None or c.bwd[1] is not None for c in calls}
        if len(has_bwd) != 1 or partly != has_bwd:
            raise NoReuse(f"{pat.path}: the blocks' backward passes differ")
        for c in calls[2:]:  # a stand-in's backward: the AccumulateGrad steps right after it
            if c.bwd[0] is not None:
                j = c.bwd[1]
                while j < self.n and self.ops[j].autograd_node == _ACC:
                    j += 1
                c.bwd[1] = j
            if any(len(w) == 0 for w in self._windows(c)):
                raise NoReuse(f"{c.path}: its stand-in ran no op")
            for i, g in c.final_gx.items():
                if c.roles.get(("gx", i)) != g:
                    raise NoReuse(f"{c.path}: its input's gradient comes from elsewhere too")
        st = self.rec.storages
        self._check_gradients(calls)
        wf, wp = self._windows(first), self._windows(pat)
        for a, b in zip(wf, wp):
            if [self.ops[i].op for i in a] != [self.ops[i].op for i in b]:
                raise NoReuse(f"{first.path} and {pat.path} run different ops")
            na = [s for i in a for s in self.ops[i].new_sids]
            nb = [s for i in b for s in self.ops[i].new_sids]
            if [self._size(st[s].nbytes) for s in na] != [self._size(st[s].nbytes) for s in nb]:
                raise NoReuse(f"{first.path} and {pat.path} allocate different sizes")
            inside_a = {i for w in wf for i in w}
            inside_b = {i for w in wp for i in w}
            role_a, role_b = set(first.roles.values()), set(pat.roles.values())
            for sa, sb in zip(na, nb):
                fa, fb = st[sa].freed_after, st[sb].freed_after
                if sb in role_b or sa in role_a:
                    continue
                if (fb is None) != (fa is None):
                    raise NoReuse(f"{pat.path}: a storage outlives one block, not the other")
                if fb is not None and fb not in inside_b and fa != fb:
                    raise NoReuse(f"{pat.path}: a storage outlives its block "
                                  "and is freed at another time than the first block's")
                if fb is not None and (fb in inside_b) != (fa in inside_a):
                    raise NoReuse(f"{pat.path}: a storage outlives one block, not the other")
        used = {}
        for i, op in enumerate(self.ops):
            for s in op.in_sids:
                used.setdefault(s, []).append(i)
        for c, nxt in zip(calls[2:], [*calls[3:], None]):
            if nxt is None:
                continue
            for key, s in c.roles.items():
                # (from the start of its call: FSDP2's pre-hook wraps its inputs first)
                if key[0] == "o" and any(i not in range(nxt.pre, nxt.fwd[1])
                                         and self.ops[i].phase == "forward"
                                         for i in used.get(s, ())):
                    raise NoReuse(f"{c.path}: its output is read outside the next block")

    def _check_gradients(self, calls) -> None:
        """A stand-in's gradients must be laid out as a real block's would be.

        A stand-in makes its input's gradient with the input's strides, which need not be
        those of the gradient the block's backward really computes: torchvision's ViT
        blocks output a transposed layout (``nn.MultiheadAttention(batch_first=True)``)
        and get a contiguous gradient. The block before it then runs its backward on a
        gradient laid out otherwise than for real (``reshape`` copies a non-contiguous
        one), the pattern block included, whose copies then carry the error; the pattern's
        own input gradient follows from it, so only the last stand-in's output gradient,
        which comes from outside the run, shows it. So every block's gradients must have
        the pattern's strides (an expanded gradient, as ``out.sum()``'s, is not a
        contiguous one either: ops such as ``view`` behave differently on it). And a
        stand-in's parameter gradients are tensors of their own, whereas a real block's
        may share one storage (the gradient of ``torch.cat`` of parameters, as BEiT's
        q/k/v bias, is split into views of one buffer three times their size): the
        pattern's must be one storage each, of the stand-in's size."""
        pat, st = calls[1], self.rec.storages
        for c in calls[2:]:
            for key, strides in pat.grad_strides.items():
                if c.grad_strides.get(key, strides) != strides:
                    raise NoReuse(f"{c.path}: its gradient {key} is laid out other than "
                                  f"{pat.path}'s")
        grads = {k: s for k, s in pat.roles.items() if k[0] == "g"}
        if len(set(grads.values())) != len(grads):
            raise NoReuse(f"{pat.path}: parameters' gradients share a storage")
        for c in calls[2:]:
            for key, s in grads.items():
                t = c.roles.get(key)
                if t is not None and self._size(st[t].nbytes) != self._size(st[s].nbytes):
                    raise NoReuse(f"{c.path}: the gradient {key} has another size than "
                                  f"{pat.path}'s")

    def apply(self) -> None:
        rec, ops = self.rec, self.ops
        for calls in self.runs:
            self._check(calls)
        # stand-in windows and the pattern each copies
        sw = {}  # first op index of a stand-in window -> (call, pattern, window no.)
        in_sw = {}  # op index -> window start
        for calls in self.runs:
            pat = calls[1]
            for c in calls[2:]:
                for w_no, w in enumerate(self._windows(c)):
                    sw[w.start] = (c, pat, w_no, w)
                    for i in w:
                        in_sw[i] = w.start
        # new order: ("r", i) or ("c", call, pattern, pattern op index, window no.)
        order, new_real, copy_at = [], {}, {}
        i = 0
        while i < self.n:
            if i in sw:
                c, pat, w_no, w = sw[i]
                pw = self._windows(pat)[w_no]
                copy_at[(id(c), w_no)] = (len(order), len(pw))
                order.extend(("c", c, pat, q, w_no) for q in pw)
                i = w.stop
                continue
            new_real[i] = len(order)
            order.append(("r", i))
            i += 1
        n_new = len(order)

        def window_of(i):
            c, _, w_no, _ = sw[in_sw[i]]
            return copy_at[(id(c), w_no)]

        def after(i):  # "freed after real op i" in the new order
            if i is None or i < 0:
                return i
            if i in new_real:
                return new_real[i]
            s, ln = window_of(i)
            return s + ln - 1

        def before(i):  # "ops recorded before" position i
            if i is None:
                return None
            if i >= self.n:
                return n_new
            if i in new_real:
                return new_real[i]
            return window_of(i)[0]

        # storages -----------------------------------------------------------------------
        st = rec.storages
        pat_info = {}
        for calls in self.runs:
            pat = calls[1]
            pw = self._windows(pat)
            inside = {i: (w_no, i - w.start) for w_no, w in enumerate(pw) for i in w}
            role_of = {s: key for key, s in pat.roles.items()}
            internal = [s for w in pw for i in w for s in ops[i].new_sids if s not in role_of]
            pat_info[id(pat)] = (inside, role_of, internal)

        def copy_index(c, rel):
            w_no, r = rel
            return copy_at[(id(c), w_no)][0] + r

        created = {}  # real sid -> new created_by (stand-in role targets)
        freed = {}  # real sid -> new freed_after (pattern frees it inside its windows)
        standin_sids = {s for i in in_sw for s in ops[i].new_sids}
        keep_targets = set()
        for calls in self.runs:
            pat = calls[1]
            inside, role_of, _ = pat_info[id(pat)]
            for c in calls[2:]:
                for key, ps in pat.roles.items():
                    ts = c.roles.get(key)
                    if ts is None:
                        if st[ps].created_by in inside:
                            raise NoReuse(f"{c.path}: no counterpart of {key}")
                        continue
                    if st[ps].created_by in inside:
                        created[ts] = copy_index(c, inside[st[ps].created_by])
                        keep_targets.add(ts)
                    # freed inside the pattern: so in the copy, unless something else
                    # (e.g. autograd's root gradient) kept the stand-in's one alive longer
                    f, f_real = st[ps].freed_after, st[ts].freed_after
                    if (f is not None and f in inside and f_real in in_sw
                            and sw[in_sw[f_real]][0] is c):
                        freed[ts] = copy_index(c, inside[f])
        dropped = standin_sids - keep_targets
        final = {}
        new_st = []
        for s in st:
            if s.sid in dropped:
                continue
            final[s.sid] = len(new_st)
            cb = created.get(s.sid, s.created_by if s.created_by < 0 else
                             new_real.get(s.created_by))
            if cb is None:
                raise NoReuse("a storage made by a stand-in has no counterpart")
            fa = freed.get(s.sid, after(s.freed_after))
            new_st.append(TrackedStorage(len(new_st), s.nbytes, cb, fa, s.stream))
        copies = {}  # (call id, pattern sid) -> final sid
        for calls in self.runs:
            pat = calls[1]
            inside, _, internal = pat_info[id(pat)]
            for c in calls[2:]:
                for ps in internal:
                    p = st[ps]
                    f = p.freed_after
                    fa = (None if f is None else copy_index(c, inside[f]) if f in inside
                          else after(f))
                    copies[(id(c), ps)] = len(new_st)
                    new_st.append(TrackedStorage(len(new_st), p.nbytes,
                                                 copy_index(c, inside[p.created_by]), fa,
                                                 p.stream))

        def sid_in(c, ps):  # a pattern storage, in stand-in c's copy
            got = copies.get((id(c), ps))
            if got is not None:
                return got
            key = pat_info[id(c.pattern)][1].get(ps)
            if key is not None:
                return final[c.roles[key]]
            if ps in dropped:
                raise NoReuse(f"{c.path} reads a stand-in's storage")
            return final[ps]

        for calls in self.runs:
            for c in calls[2:]:
                c.pattern = calls[1]

        def rename(c, module):
            p = c.pattern.path
            if module == p or module.startswith(p + "."):
                return c.path + module[len(p):]
            return module

        # ops ----------------------------------------------------------------------------
        def real_sids(t):
            if any(s in dropped for s in t):
                raise NoReuse("an op outside the blocks reads a stand-in's storage")
            return tuple(final[s] for s in t)

        new_ops = []
        for j, item in enumerate(order):
            if item[0] == "r":
                op = ops[item[1]]
                new_ops.append(replace(op, index=j, out_sids=real_sids(op.out_sids),
                                       new_sids=real_sids(op.new_sids),
                                       in_sids=real_sids(op.in_sids),
                                       written_sids=real_sids(op.written_sids)))
            else:
                _, c, pat, q, _ = item
                op = ops[q]

                def m(t, c=c):
                    return tuple(sid_in(c, s) for s in t)
                new_ops.append(replace(op, index=j, module=rename(c, op.module),
                                       out_sids=m(op.out_sids), new_sids=m(op.new_sids),
                                       in_sids=m(op.in_sids), written_sids=m(op.written_sids)))
        # saved tensors ------------------------------------------------------------------
        packs = []
        for p in rec.saved_tensors._packs:
            if p.sid in dropped:
                raise NoReuse("a stand-in's storage was saved for backward")
            packs.append((_Record(before(p.at), final[p.sid], p.module, after(p.released_after),
                                  before(p.unpacked_at), None, after(p.dropped_after)),
                          p.unpack_order))
        for calls in self.runs:
            pat = calls[1]
            inside = pat_info[id(pat)][0]
            ends = {w_no: w.stop for w_no, w in enumerate(self._windows(pat))}

            def rel_before(i, c):  # a position inside (or at the end of) a pattern window
                if i is None:
                    return None
                if i in inside:
                    return copy_index(c, inside[i])
                for w_no, stop in ends.items():
                    if i == stop:
                        s, ln = copy_at[(id(c), w_no)]
                        return s + ln
                raise NoReuse(f"{pat.path}: a saved tensor is used outside its block")

            def rel_after(i, c):
                if i is None:
                    return None
                if i in inside:
                    return copy_index(c, inside[i])
                raise NoReuse(f"{pat.path}: a saved tensor outlives its block")

            mine = [p for p in rec.saved_tensors._packs
                    if p.module == pat.path or p.module.startswith(pat.path + ".")]
            for c in calls[2:]:
                for p in mine:
                    packs.append((_Record(rel_before(p.at, c), sid_in(c, p.sid),
                                          rename(c, p.module), rel_after(p.released_after, c),
                                          rel_before(p.unpacked_at, c), None,
                                          rel_after(p.dropped_after, c)), p.unpack_order))
        ranked = sorted((r.unpacked_at, o, n) for n, (r, o) in enumerate(packs)
                        if r.unpacked_at is not None)
        for rank, (_, _, n) in enumerate(ranked):
            packs[n][0].unpack_order = rank
        # module calls -------------------------------------------------------------------
        calls_new = []
        standin_paths = {c.path for calls in self.runs for c in calls[2:]}
        for mc in rec.calls:  # a stand-in's own call stays (its hooks' ops are real ones)
            if any(mc.path.startswith(p + ".") for p in standin_paths):
                continue
            calls_new.append(replace(mc, first_op=before(mc.first_op),
                                     last_op=after(mc.last_op),
                                     arg_sids=tuple(final[s] for s in mc.arg_sids
                                                    if s not in dropped)))
        for calls in self.runs:
            pat = calls[1]
            inside = pat_info[id(pat)][0]
            for c in calls[2:]:
                for mc in rec.calls:
                    if mc.path.startswith(pat.path + "."):
                        first = (copy_index(c, inside[mc.first_op]) if mc.first_op in inside
                                 else copy_at[(id(c), 0)][0])
                        last = (copy_index(c, inside[mc.last_op]) if mc.last_op in inside
                                else first - 1)
                        calls_new.append(replace(mc, path=rename(c, mc.path),
                                                 first_op=first, last_op=last,
                                                 arg_sids=tuple(sid_in(c, s)
                                                                for s in mc.arg_sids)))
        # the rest of the recorder -------------------------------------------------------
        saved = {final[s] for s in rec.saved if s not in dropped}
        for calls in self.runs:
            pat = calls[1]
            role_of = pat_info[id(pat)][1]
            for c in calls[2:]:
                saved |= {sid_in(c, s) for s in rec.saved
                          if (id(c), s) in copies or s in role_of}
        names = {final[s]: v for s, v in rec.names.items() if s not in dropped}
        # kernels' named temporaries (fxmem.trace.kernels.cuda.kernels)
        for (cid, ps), sid in copies.items():
            if rec.names.get(ps, ("",))[0] == "temporary":
                names[sid] = rec.names[ps]
        unmodelled = dict(rec.unmodelled)
        for calls in self.runs:
            for c in calls[2:]:
                for (f, mod), why in rec.unmodelled.items():
                    unmodelled.setdefault((f, rename(c, mod)), why)
        rec.first_desc = self._first_desc(order, final, sid_in)
        rec.sums.candidates = self._sums(new_real, final, dropped, pat_info, copy_index, sid_in)

        def graph():  # built when first asked for (FLOPs, named dims): a sixth of a splice
            return self._graph(order, new_real, final, sid_in, rename)
        rec.ops, rec.storages, rec.calls = new_ops, new_st, calls_new
        rec.saved_tensors._packs = [r for r, _ in packs]
        rec.saved, rec.names, rec.unmodelled, rec.graph = saved, names, unmodelled, graph
        rec.events = []
        rec.op_count = n_new
        rec.reused = tuple(c.path for calls in self.runs for c in calls[2:])

    def _sums(self, new_real, final, dropped, pat_info, copy_index, sid_in) -> list:
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
            if index in new_real and a not in dropped and s not in dropped:
                out.append((new_real[index], final[a], final[s]))
            for calls in self.runs:
                inside = pat_info[id(calls[1])][0]
                if index in inside:
                    given = [r for r, v in calls[1].roles.items() if r[0] == "gy" and v == a]
                    out += [(copy_index(c, inside[index]), sid_in(c, a), sid_in(c, s))
                            for c in calls[2:]
                            if all(c.grad_summable.get(r, True) for r in given)]
        return sorted(out)

    def _first_desc(self, order, final, sid_in) -> dict:
        """sid -> the first TensorDesc seen on it, in the new order (what the graph holds)."""
        from ..ledger.records import TensorDesc

        old = self.old_graph
        by_index, first, later = {}, {}, []
        for node in old.nodes:
            vals = node.meta.get("val")
            if node.op == "placeholder":  # one made before a later op: in the op's turn
                if isinstance(vals, TensorDesc) and vals.sid in final:
                    (later.append(vals) if by_index else
                     first.setdefault(final[vals.sid], replace(vals, sid=final[vals.sid])))
                continue
            src = node.args[0] if node.target is operator.getitem else node
            idx = src.meta.get("index") if isinstance(src, torch.fx.Node) else None
            if idx is not None:
                if src is node:  # the storages it reads first (a copy's parameters)
                    by_index.setdefault(idx, []).extend(
                        a.meta.get("val") for a in node.all_input_nodes
                        if a.op == "placeholder")
                by_index.setdefault(idx, []).append(vals)
        for item in order:
            if item[0] == "r":
                def fs(s):
                    return final.get(s)
                vals_list = by_index.get(item[1], ())
            else:
                c = item[1]

                def fs(s, c=c):
                    try:
                        return sid_in(c, s)
                    except NoReuse:
                        return None
                vals_list = by_index.get(item[3], ())
            for vals in vals_list:
                for v in (vals if isinstance(vals, tuple) else (vals,)):
                    if isinstance(v, TensorDesc):
                        s = fs(v.sid)
                        if s is not None and s not in first:
                            first[s] = replace(v, sid=s)
        for v in later:  # read by no op
            first.setdefault(final[v.sid], replace(v, sid=final[v.sid]))
        return first

    # the fx graph, in the new order --------------------------------------------------------
    def _graph(self, order, new_real, final, sid_in, rename):
        from ..ledger.records import TensorDesc

        old = self.old_graph
        groups, placeholders = {}, []
        for node in old.nodes:
            if node.op == "placeholder":
                placeholders.append(node)
            elif node.op == "call_function" and "index" in node.meta:
                groups[node.meta["index"]] = [node]
            elif node.op == "call_function" and node.target is operator.getitem:
                src = node.args[0]
                if "index" in src.meta:
                    groups[src.meta["index"]].append(node)
        g = torch.fx.Graph()
        env, by_sid, copies = {}, {}, {}  # by_sid: sid -> nodes whose value is on it

        def desc(v, fs):
            if isinstance(v, TensorDesc):
                return TensorDesc(v.shape, v.dtype, fs(v.sid))
            if isinstance(v, tuple):
                return tuple(desc(x, fs) for x in v)
            return v

        def real_fs(s):
            return final.get(s, -1)

        for ph in placeholders:
            new = g.node_copy(ph)
            new.meta = dict(ph.meta)
            new.meta["val"] = desc(ph.meta.get("val"), real_fs)
            env[ph] = new
            v = new.meta["val"]
            if isinstance(v, TensorDesc):
                by_sid.setdefault(v.sid, []).append(new)

        def lookup(n, fs):
            if fs is real_fs and n in env:
                return env[n]
            v = n.meta.get("val")
            target = fs(v.sid) if isinstance(v, TensorDesc) else None
            if target is not None:
                got = by_sid.get(target)
                if got is not None:  # the last tensor on that storage of the same shape
                    same = [x for x in got if _same_desc(x.meta.get("val"), v)]
                    return (same or got)[-1]
                if target == real_fs(v.sid) and n in env:
                    return env[n]
            elif n in env:
                return env[n]
            first = next(iter(g.nodes), None)
            with g.inserting_before(first) if first is not None else nullcontext():
                ph = g.placeholder(f"copied_{len(env)}_{len(by_sid)}")
            ph.meta["val"] = desc(v, fs)
            if target is not None:
                by_sid.setdefault(target, []).append(ph)
            return ph

        for j, item in enumerate(order):
            if item[0] == "r":
                nodes, local, fs = groups.get(item[1], []), env, real_fs
                mod_of = None
            else:
                _, c, _, q, _ = item
                # a copy's ops read the copy's own earlier tensors (not whatever tensor was
                # last seen on that storage: a view's shape is not its storage's)
                nodes, local = groups.get(q, []), copies.setdefault(id(c), {})

                def fs(s, c=c):
                    try:
                        return sid_in(c, s)
                    except NoReuse:
                        return -1
                mod_of = c
            for node in nodes:
                new = g.node_copy(node, lambda n, local=local, fs=fs: local[n] if n in local
                                  else lookup(n, fs))
                new.meta = dict(node.meta)
                new.meta["val"] = desc(node.meta.get("val"), fs)
                if "index" in node.meta:
                    new.meta["index"] = j
                if mod_of is not None and "module" in node.meta:
                    new.meta["module"] = rename(mod_of, node.meta["module"])
                local[node] = new
                vals = new.meta["val"]
                for v in (vals if isinstance(vals, tuple) else (vals,)):
                    if isinstance(v, TensorDesc):
                        by_sid.setdefault(v.sid, []).append(new)
        return g


def _same_desc(a, b) -> bool:
    """Same shape and dtype (a node's value against the tensor a copied op reads)."""
    return getattr(a, "shape", None) == getattr(b, "shape", None) and \
        getattr(a, "dtype", None) == getattr(b, "dtype", None)
