"""The records of a finished trace: the recorder's ops and storages turned into a
:class:`fxmem.trace.ledger.records.Trace`, every size a formula in B (and the named dims), the
lifetimes eager PyTorch gave them, the conditions the trace assumed.
"""

from __future__ import annotations

import sympy
import torch

from ...errors import DataDependentError, TraceError
from ...formula.guards import implied, lower_bounds, simplified, valid_when
from ...formula.symbols import B, Size, dim_symbol, plain
from ..kernels.datadep import data_symbols
from ..ledger.records import B_RANGE_MAX, StorageInfo, TensorDesc, Trace, with_fields
from ..ledger.saved import latest
from ..parallel.offload import host_storages
from .recorder import Recorder
from .step import StepSpec


def finish(rec: Recorder, sym, hint, spec: StepSpec, n_ops: int) -> Trace:
    """The :class:`Trace` of the step ``rec`` recorded (``sym``: the batch symbol, ``hint``
    its example value)."""
    env = rec.shape_env

    done: dict = {}
    largest = _largest_counts(rec)

    def to_expr(v):
        if isinstance(v, int):
            return sympy.Integer(v)
        raw = v.node.expr
        if raw in done:
            return done[raw]
        e = env.replace(raw) if hasattr(env, "replace") else raw
        e = done[raw] = plain(e.xreplace(largest).xreplace(rec.subs))
        extra = e.free_symbols - {B, *(dim_symbol(n) for n in rec.dim_syms)}
        if extra:
            raise TraceError(f"a storage size depends on data ({sorted(map(str, extra))}), "
                             "not only on the batch size")
        return e

    creator_module = {}
    for op in rec.ops:
        for s in op.new_sids:
            creator_module[s] = op.module
    phase_of_op = [op.phase for op in rec.ops]
    storages = []
    sizes: dict = {}
    released = rec.saved_tensors.release_times()
    saved_by = rec.saved_tensors.saved_by()
    data_sized: dict = {}
    host = host_storages({sid: c for sid, (c, _) in rec.names.items()},
                         {s.sid: phase_of_op[s.created_by] for s in rec.storages
                          if s.created_by >= 0}, rec.host) if rec.offload else set()
    for s in rec.storages:
        counts = data_symbols(s.nbytes)
        if counts:
            _check_bounded(rec, s, counts, data_sized)
        # an offloaded rank's host memory takes no device memory (fxmem.trace.parallel.offload)
        expr = to_expr(s.nbytes) if s.sid not in host else sympy.Integer(0)
        if rec.dim_syms:
            expr = sympy.expand(expr)
        size = sizes.get(expr) or sizes.setdefault(expr, Size.of(expr))
        cat, name = rec.names.get(s.sid, (None, ""))
        if cat is None:
            created_in_forward = s.created_by >= 0 and phase_of_op[s.created_by] == "forward"
            cat = "activation" if (s.sid in rec.saved and created_in_forward) else "temporary"
        # while autograd holds no copy of it: its unref time (a storage resized to 0 is
        # freed then, whatever refers to it)
        freed = s.freed_after
        if s.created_by >= 0 and s.sid in released and s.sid not in rec.resized_away:
            freed = latest(freed, released[s.sid])
        storages.append(StorageInfo(
            s.sid, size, cat, name, creator_module.get(s.sid, ""), s.created_by,
            freed, s.sid in rec.saved, None, (),
            saved_by.get(s.sid, ()), s.freed_after, bool(counts),
            s.created_by >= 0 and s.sid in rec.resized_away, s.stream,
            rec.fsdp_buffers.get(s.sid)))
    # dtype/shape of the first tensor seen on each storage, from the graph
    first = getattr(rec, "first_desc", None)
    if first is None:
        first = {}
        for node in rec.graph.nodes:
            vals = node.meta.get("val")
            for v in (vals if isinstance(vals, tuple) else (vals,)):
                if isinstance(v, TensorDesc) and v.sid not in first:
                    first[v.sid] = v
    storages = [s if s.sid not in first else
                with_fields(s, dtype=first[s.sid].dtype, shape=first[s.sid].shape)
                for s in storages]
    if spec.device == "cuda":  # constants made on the host take no device memory
        zero = Size.of(sympy.Integer(0))
        on_host = _host_constants(rec.ops, storages)
        storages = [with_fields(s, size=zero) if s.sid in on_host else s for s in storages]
    rng = env.var_to_range.get(sym)
    all_guards = [g.expr.xreplace(rec.subs) for g in env.guards]
    guards = valid_when([g for g in all_guards if g.free_symbols <= {B}],
                        int(rng.lower) if rng is not None else 1,
                        int(rng.upper) if rng is not None and isinstance(rng.upper, sympy.Integer)
                        and int(rng.upper) < B_RANGE_MAX else None)
    for name in rec.dim_syms:  # a named dim's own conditions, then the mixed ones
        x = dim_symbol(name)
        guards += valid_when([g for g in all_guards if g.free_symbols == {x}], symbol=x)
    lows = lower_bounds(guards, [B, *map(dim_symbol, rec.dim_syms)])
    mixed = [simplified(g) for g in all_guards if len(g.free_symbols) > 1]
    guards += tuple(dict.fromkeys(g for g in mixed if not implied(g, lows)))
    graph = rec.graph  # or, blocks copied, its source, which ends the graph it builds
    if isinstance(graph, torch.fx.Graph):  # (fxmem.trace.blocks.Spliced)
        graph.output(None)
    unmodelled = tuple((str(f), m, why) for (f, m), why in rec.unmodelled.items())
    unmodelled += tuple(("check", "", f"a check on data assumed to pass (fake tensors have no "
                         f"values; a step that fails it raises): {note}")
                        for note in getattr(env, "assumed", ()))
    return Trace(graph, tuple(rec.ops), tuple(storages), guards, hint, spec.train,
                 spec.device, spec.optimizer is not None, unmodelled, rec.plan,
                 tuple(sorted(rec.calls, key=lambda c: (c.first_op, -c.last_op))),
                 rec.saved_tensors.packs, spec.grad_accum, tuple(rec.dim_syms),
                 getattr(rec, "reused", ()),
                 rec.capability, rec.kernels.choices if rec.kernels is not None else (),
                 tuple((op, m, what) for (op, m), what in data_sized.items()),
                 placement=getattr(rec, "placement", ()),
                 compiled=getattr(rec, "compiled", False),
                 compiled_parts=getattr(rec, "compiled_parts", ()),
                 graph_runs=tuple(rec.graph_runs), amp=spec.amp,
                 cache_layers=getattr(rec, "cache_layers", ()))


def _largest_counts(rec: Recorder) -> dict:
    """Each count the data sets (a mask's True values) -> its largest value, the number of
    elements it counts among (fxmem.trace.kernels.datadep); the counts with no known bound are
    left."""
    env = rec.shape_env
    out = {}
    for sym, d in rec.data.items():
        if d.bound is not None:
            b = sympy.sympify(d.bound)
            out[sym] = env.replace(b) if hasattr(env, "replace") else b
    return out


def _check_bounded(rec: Recorder, s, counts: set, data_sized: dict) -> None:
    """Storage ``s`` is sized by ``counts``: each must have a bound (else the trace stops,
    naming where the value was read); ``data_sized[(op, module)]`` says which counts."""
    op = rec.ops[s.created_by] if 0 <= s.created_by < len(rec.ops) else None
    made = f"what {op.op} makes" if op is not None else "a storage"
    whats = []
    for sym in sorted(counts, key=str):
        d = rec.data.get(sym)
        if d is None or d.bound is None:
            read = d.what if d is not None else f"a value the data sets ({sym})"
            where = d if d is not None else op
            raise DataDependentError(
                f"the size of {made} is {read}, which fake tensors do not have and "
                "fxmem knows no bound of: compute sizes from shapes, not tensor values",
                op=where.op if where is not None else None,
                module=where.module if where is not None else None,
                source=getattr(where, "source", None),
                phase=where.phase if where is not None else None)
        whats.append(d.what)
    if op is not None:
        key = (op.op, op.module)
        if key not in data_sized:
            data_sized[key] = f"a size the data sets, taken at its largest: {', '.join(whats)}"


LIFT_OPS = ("aten.lift_fresh.default", "aten.lift.default")


def _host_constants(ops, storages) -> set:
    """The storages of ``torch.tensor(...)`` constants that a CUDA step keeps on the host.
    On CPU fake tensors a constant made on the host (``device="cpu"``, or no device) and
    one made on the device (``device=p.device``) are the same ``lift_fresh``; what tells
    them apart is what they are used with: a CUDA op takes a host tensor among device
    tensors only as a 0-dim scalar, and a host op takes no device tensor, so a constant
    whose every use has host tensors only for its other operands is on the host. Those
    host tensors are torch.optim's per-parameter ``step`` counters (0-dim, on the CPU unless
    ``capturable`` or ``fused``: ``fxmem.memory.sizes``), and so torch.optim's increment
    ``torch._foreach_add_(steps, torch.tensor(1.0, device="cpu"))`` (seen on 2.14.1's and
    2.15's binaries on the fake GPU: no device allocation). A constant used with a device
    tensor stays on the device, as ``torch.tensor(x, device=p.device)`` is."""
    host = {s.sid for s in storages if s.category == "optimizer_state"
            and s.name.endswith(".step") and s.shape == ()}
    lifted = {sid for op in ops if op.op in LIFT_OPS for sid in op.new_sids}
    uses: dict = {}
    for op in ops:
        for sid in (set(op.in_sids) & lifted) - set(op.new_sids):  # (the lift reads it too)
            uses.setdefault(sid, []).append(op)
    def host_only(op, sid) -> bool:
        others = (set(op.in_sids) | set(op.written_sids)) - {sid}
        return bool(others) and others <= host

    return {sid for sid, used in uses.items() if all(host_only(op, sid) for op in used)}

