"""The spliced step's graph side: the fx graph in the new order, and the first description
of each storage (:mod:`fxmem.trace.blocks.splice`)."""

from __future__ import annotations

import operator
from contextlib import nullcontext
from dataclasses import replace

import torch

from ..ledger.records import TensorDesc
from .reuse import NoReuse


def first_desc(old, order, final, sid_in, outer=None, renames=None) -> dict:
    """sid -> the first TensorDesc seen on it, in the new order (what the graph holds):
    ``old``, the recorded graph; ``order``, the spliced ops' sources; ``final``,
    ``sid_in``, ``outer`` and ``renames``, the storages' new numbers
    (:class:`fxmem.trace.blocks.splice.Numbering`, its ``op_renames``)."""
    from ..ledger.records import TensorDesc

    outer, renames = outer or {}, renames or {}
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
                    (a.meta.get("val"), True) for a in node.all_input_nodes
                    if a.op == "placeholder")
            by_index.setdefault(idx, []).append((vals, False))
    for item in order:
        if item[0] == "r":
            def fs(s, ren=renames.get(item[1], {})):
                return ren[s] if s in ren else final.get(s)
            vals_list = by_index.get(item[1], ())
        else:
            c, q = item[1], item[3]
            mapped = outer.get((id(c), q), {})

            def fs(s, c=c, q=q):
                try:
                    return sid_in(c, s, q)
                except NoReuse:
                    return None
            vals_list = by_index.get(item[3], ())
        for vals, read in vals_list:
            for v in (vals if isinstance(vals, tuple) else (vals,)):
                # (a storage the copy maps to another outside the blocks, as it is read:
                # the pattern's view of it is not the stand-in's)
                if isinstance(v, TensorDesc) and not (read and item[0] == "c"
                                                      and v.sid in mapped):
                    s = fs(v.sid)
                    if s is not None and s not in first:
                        first[s] = replace(v, sid=s)
    for v in later:  # read by no op
        first.setdefault(final[v.sid], replace(v, sid=final[v.sid]))
    return first


class Spliced:
    """The graph source of a spliced trace (``Trace.graph_source``): called, the whole
    step's graph (:func:`graph`, built when first asked for); ``old``, the recorded graph,
    and ``source_of[j]``, the recorded op whose node op ``j`` of the spliced step copies (or
    is): what reads one op's shapes alone (its FLOPs: :func:`fxmem.checkpoint.flops.op_flops`)
    reads that node, a copied op having its pattern op's shapes."""

    def __init__(self, old, order, final, sid_in, rename, renames=None):
        self.old, self._args = old, (order, final, sid_in, rename, renames)
        self.source_of = tuple(item[1] if item[0] == "r" else item[3] for item in order)

    def __call__(self) -> torch.fx.Graph:
        g = graph(self.old, *self._args)
        g.output(None)
        return g


def graph(old, order, final, sid_in, rename, renames=None) -> torch.fx.Graph:
    """The spliced step's fx graph: ``old``'s nodes in the new ``order``, each copy's
    reading the copy's own tensors, its module paths renamed (``rename``), a recorded op
    reading a copy's storage where ``renames`` (``Numbering.op_renames``) says so; built
    only when asked for (named dims; the FLOPs read the recorded graph, :class:`Spliced`)."""
    renames = renames or {}
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
    ordinal = _standins_tensors(groups, order)

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
                same = [x for x in got if _same_desc(x.meta.get("val"), v)] or got
                if n in ordinal:  # a stand-in's k-th of n such: the copy's k-th
                    k, count = ordinal[n]
                    if len(same) >= count:
                        return same[len(same) - count + k]
                return same[-1]
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
            mod_of, ren = None, renames.get(item[1])
            if ren:  # (what it reads on a renamed storage is looked up there)
                def fs(s, ren=ren):
                    return ren[s] if s in ren else real_fs(s)
        else:
            _, c, _, q, _ = item
            # a copy's ops read the copy's own earlier tensors (not whatever tensor was
            # last seen on that storage: a view's shape is not its storage's)
            nodes, local = groups.get(q, []), copies.setdefault(id(c), {})

            def fs(s, c=c, q=q):
                try:
                    return sid_in(c, s, q)
                except NoReuse:
                    return -1
            mod_of, ren = c, None
        for node in nodes:
            new = g.node_copy(node, lambda n, local=local, fs=fs, ren=ren:
                              local[n] if n in local and not (ren and _on(n, ren))
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


def _standins_tensors(groups: dict, order) -> dict:
    """A stand-in's own tensors (its window's nodes, not in the spliced step) -> (k, n):
    the k-th of the n it made on one storage with one shape, in the order it made them (a
    recorded op reading several, as the optimizer reads an FSDP2 stand-in's gradients, reads
    the copy's k-th such tensor)."""
    kept = {item[1] for item in order if item[0] == "r"} | {item[3] for item in order
                                                             if item[0] == "c"}
    by_key = {}
    for index, nodes in groups.items():
        if index in kept:
            continue
        for node in nodes:
            v = node.meta.get("val")
            if isinstance(v, TensorDesc):
                by_key.setdefault((v.sid, v.shape, v.dtype), []).append(node)
    return {node: (k, len(nodes)) for nodes in by_key.values() for k, node in enumerate(nodes)}


def _on(node, sids: dict) -> bool:
    """Whether ``node``'s value is a tensor on one of ``sids``."""
    v = node.meta.get("val")
    return isinstance(v, TensorDesc) and v.sid in sids


def _same_desc(a, b) -> bool:
    """Same shape and dtype (a node's value against the tensor a copied op reads)."""
    return getattr(a, "shape", None) == getattr(b, "shape", None) and \
        getattr(a, "dtype", None) == getattr(b, "dtype", None)
