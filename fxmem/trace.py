"""Stage 1: trace one whole step on fake tensors, with the batch size as a symbol.

The step (:mod:`fxmem.step`) runs for real, in eager order, under ``FakeTensorMode`` with a
``ShapeEnv``: dim 0 of every input and target is the symbol :data:`fxmem.B`, parameters and
all other dims are static, and nothing the size of the model or the batch is allocated. A
recorder (:class:`fxmem.tracking.StorageTracker`) sees every aten op, builds a
``torch.fx.Graph`` of the step, and records when eager PyTorch frees each storage.

The optimizer runs in steady state: before the recorded ``optimizer.step()``, one
unrecorded step creates its state, which then counts as live from the start of the step.

>>> import torch, fxmem
>>> from fxmem.trace import trace
>>> t = trace(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu")
>>> [s.size.expr for s in t.storages if s.category == "input"]
[32*B]
"""

from __future__ import annotations

import contextlib
import operator
import os
import traceback
from dataclasses import dataclass

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

from .checkpoint import checkpointing, normalize_plan, user_path
from .errors import FxmemError, InputError, SpecializationError, TraceError
from .guards import implied, lower_bounds, valid_when
from .rules import (CONSTANT_LIFT_OPS, DATA_DEPENDENT_OPS, DECOMPOSE_OPS, LAYOUT_ONLY_GUARD_OPS,
                    SKIP_NAMESPACES, SPLIT_ALIASED_OUTPUTS, STATS_IN_WEIGHT_DTYPE_OPS,
                    UNREDUCED_STORAGE_LOSSES, UNSIZED_WORKSPACE_OPS, RNNRouter, ValueOracle,
                    decomposition)
from .reuse import NoReuse, Reuse, find_runs, splice
from .saved import SavedTensors, latest
from .amp import emulate
from .compat import tracing_shims
from .kernels import check_capability, cuda_kernels
from .step import (StepSpec, make_grad_scaler, make_optimizer, make_spec, needs_closure,
                   run_step, scaler_tensors, warmup_steps)
from .symbols import B, Size, dim_symbol, plain
from .tracking import StorageTracker, frozen_gc


B_RANGE_MAX = 2**62  # the symbol's upper range; not reported as a condition

CATEGORIES = ("param", "buffer", "input", "grad", "optimizer_state", "activation", "temporary")

@dataclass(frozen=True)
class TensorDesc:
    """What an op output looked like: shape (ints or sympy in B), dtype, storage id."""

    shape: tuple
    dtype: torch.dtype
    sid: int


@dataclass(frozen=True)
class OpInfo:
    """One aten op of the step, in execution order."""

    index: int
    op: str  # e.g. "aten.addmm.default"
    phase: str  # zero_grad / forward / backward / optimizer
    # owning module path ("" = root, "<loss>", "<optimizer>"); in backward, the module whose
    # forward made the autograd node that runs it (AccumulateGrad: the parameter's module)
    module: str
    out_sids: tuple  # storages behind its outputs (aliases included)
    new_sids: tuple  # storages it created
    in_sids: tuple  # storages behind its tensor inputs
    written_sids: tuple  # storages it writes in place (schema alias annotations)
    autograd_node: str | None  # backward: the autograd node that ran it
    recompute: bool = False  # backward: re-running a checkpointed forward
    source: int | None = None  # the traced op this one repeats (plans derived from a trace)


@dataclass(frozen=True)
class ModuleCall:
    """One forward call of a submodule: its ops are ``first_op..last_op`` (none if
    ``last_op < first_op``)."""

    path: str
    first_op: int
    last_op: int


@dataclass(frozen=True)
class StorageInfo:
    """One storage live at some point of the step; ``size`` in bytes (a :class:`Size`)."""

    sid: int
    size: Size
    category: str
    name: str  # parameter / buffer / input name, else "" (see ``module``)
    module: str  # module path of the op that created it
    created_by: int  # op index; -1: live before the step
    freed_after: int | None  # op index after which eager PyTorch freed it; None: alive at end
    saved: bool  # saved for backward by autograd
    dtype: torch.dtype | None
    shape: tuple
    saved_by: tuple = ()  # module paths whose forward saved it for backward
    unref_after: int | None = None  # op index after which no Python reference held it
    # (autograd's saved copies aside: ``freed_after`` is the later of the two)


@dataclass(frozen=True)
class Trace:
    """Result of :func:`trace`: the step as ops and storages, and the shape guards."""

    graph_source: object  # the torch.fx.Graph, or a function that builds it (see ``graph``)
    ops: tuple
    storages: tuple
    guards: tuple  # sympy relations in B that the trace assumed
    batch_hint: int  # the value of B the trace used for decisions
    train: bool
    device: str
    has_optimizer: bool
    unmodelled: tuple = ()  # (op, module, what) allocations fxmem cannot size
    plan: tuple = ()  # module paths whose forward ran under activation checkpointing
    calls: tuple = ()  # ModuleCall per forward call of a submodule
    packs: tuple = ()  # fxmem.saved.Pack per tensor saved for backward in the forward
    grad_accum: int = 1  # micro-batches of B per optimizer step
    dims: tuple = ()  # names of input dims beyond B that are symbols too (e.g. ("L",))
    reused: tuple = ()  # blocks whose ops are copies of an identical block's (fxmem.reuse)
    compute_capability: tuple = (9, 0)  # the GPU whose kernels device="cuda" follows
    kernel_choices: tuple = ()  # (op, what CUDA runs) the routed kernels chose (fxmem.kernels)


def _graph(self) -> torch.fx.Graph:
    """The step as a ``torch.fx.Graph`` (one node per op; built on first use when blocks were
    copied, see :mod:`fxmem.reuse`)."""
    g = self.graph_source
    if not isinstance(g, torch.fx.Graph):
        g = g()
        object.__setattr__(self, "graph_source", g)
    return g


Trace.graph = property(_graph)


def _user_frame(frames) -> str | None:
    """``file:line in func`` of the innermost frame that is neither torch, fxmem nor stdlib."""
    skip = (os.path.dirname(torch.__file__), os.path.dirname(__file__),
            os.path.dirname(os.__file__), os.path.dirname(sympy.__file__))
    for fr in reversed(frames):
        if not fr.filename.startswith(skip) and not fr.filename.startswith("<"):
            return f"{fr.filename}:{fr.lineno} in {fr.name}"
    return None


class _Recorder(StorageTracker):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in SKIP_NAMESPACES:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def __init__(self, shape_env: ShapeEnv, sym, dim_syms: dict | None = None):
        super().__init__()
        self.shape_env, self.sym = shape_env, sym
        self.dim_syms = dim_syms or {}  # name -> ShapeEnv symbol of the other named dims
        self.subs = {sym: B, **{v: dim_symbol(n) for n, v in self.dim_syms.items()}}
        self._subbed: dict = {}
        self.phase = "setup"
        self.module_stack = [""]
        self.fn_module: dict[int, str] = {}  # autograd node sequence_nr -> forward module
        self._seq_next = 0  # autograd sequence numbers below this are in fn_module
        self.saved: set[int] = set()
        self.graph = torch.fx.Graph()
        self._node_of = WeakTensorKeyDictionary()
        self._placeholders: dict[int, torch.fx.Node] = {}
        self.names: dict[int, tuple[str, str]] = {}  # sid -> (category, name)
        self.ops: list[OpInfo] = []
        self.failed: tuple | None = None
        self.kernels = None  # fxmem.kernels.CudaKernels for device="cuda"
        self._host: tuple = ()  # outputs of the running op that CUDA keeps in host memory
        self.oracle = ValueOracle()
        self.unmodelled: dict = {}  # (op, module) -> what is not modelled
        self._n_repl = 0
        self.plan: tuple = ()
        self.calls: list[ModuleCall] = []  # forward module calls, in the order they ended
        self.call_starts: list[int] = []
        self.recomputing = 0  # > 0 while a checkpointed forward re-runs in backward
        self.saved_tensors = SavedTensors(self, lambda: (self.phase, self.module_stack[-1]),
                                          self._node_of)

    # where are we -----------------------------------------------------------------
    def module(self) -> str:
        if self.phase == "backward" and self.recomputing:
            return self.module_stack[-1]
        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                module = self.fn_module.get(node._sequence_nr())
                if module is None and hasattr(node, "variable"):  # AccumulateGrad
                    cat, name = self.names.get(self.sid(node.variable), (None, ""))
                    module = name.rpartition(".")[0] if cat == "param" else ""
                return module or ""
        if self.phase == "optimizer":
            return "<optimizer>"
        return self.module_stack[-1]

    # registration of storages that exist before the step -------------------------------
    def register_named(self, t: torch.Tensor, category: str, name: str) -> None:
        sid, new = self.register(t)
        if new or sid not in self.names:
            self.names[sid] = (category, name)

    def composite(self, func) -> bool:
        # a CUDA-only op given a stub CPU kernel (fxmem.kernels) is a kernel, as on CUDA
        return super().composite(func) and not (self.kernels is not None
                                                and func in self.kernels.stubbed)

    def name_workspace(self, sid: int, what: str) -> None:
        self.names[sid] = ("temporary", what)

    # dispatch ---------------------------------------------------------------------
    def run_op(self, func, args, kwargs):
        try:
            if func in DATA_DEPENDENT_OPS and self.phase in ("forward", "backward"):
                raise TraceError(
                    "the model reads a tensor's value (.item(), bool(), int() or a Python "
                    "condition on a tensor), so memory would depend on data",
                    op=str(func), module=self.module(), phase=self.phase,
                    source=_user_frame(traceback.extract_stack()))
            if func in DATA_DEPENDENT_OPS and self.phase == "optimizer":
                value = self.oracle(args[0])
                if value is not NotImplemented:
                    return value
                const = getattr(args[0], "constant", None)  # what the fake kernel returns
                if func is torch.ops.aten._local_scalar_dense.default and const is not None:
                    return const.item()  # e.g. Adam's step count, read per parameter
            if func in DECOMPOSE_OPS:
                with self:
                    return decomposition(func)(*args, **kwargs)
            if func in LAYOUT_ONLY_GUARD_OPS:
                with self.shape_env.suppress_guards():
                    return func(*args, **kwargs)
            out = func(*args, **kwargs)
            rule = UNSIZED_WORKSPACE_OPS.get(func)
            if rule is not None and rule[0](args):
                self.unmodelled.setdefault((func, self.module()), rule[1])
            if self.kernels is not None:  # what CUDA's kernel allocates (fxmem.kernels)
                out = self.kernels.outputs(func, args, kwargs, out)
                self._host = tuple(out[i] for i in self.kernels.host_outputs(func))
                what = self.kernels.unmodelled(func, args, kwargs, out)
                if what is not None:
                    self.unmodelled.setdefault((func, self.module()), what)
            pair = SPLIT_ALIASED_OUTPUTS.get(func)
            if pair and out[pair[0]].untyped_storage() is out[pair[1]].untyped_storage():
                out = (*out[:pair[1]], torch.empty_like(out[pair[1]]), *out[pair[1] + 1:])
            return out
        except TraceError:
            raise
        except Exception as e:
            if self.failed is None:
                self.failed = (str(func), self.module(), self.phase,
                               _user_frame(traceback.extract_stack()), e)
            raise

    def workspaces(self, func, args, kwargs, out) -> list:
        if self.kernels is None:
            return []
        # an empty tensor stands for each (a storage of its own), its size given as is: a
        # symbolic size through torch.empty could meet the fake mode's dispatch cache
        return [(torch.empty(0, dtype=torch.uint8), what, nbytes)
                for what, nbytes in self.kernels.workspaces(func, args, kwargs, out)]

    def output_nbytes(self, func, args, kwargs, t):
        if self._host and any(t is h for h in self._host):
            return 0  # a host tensor: no device memory (fxmem.kernels)
        if func in STATS_IN_WEIGHT_DTYPE_OPS and self.kernels is None:  # CPU kernels only
            x, w = args[0], args[1]
            if w is not None and w.dtype != x.dtype and t.dim() == 1 and x.dim() > 1:
                return t.numel() * w.element_size()  # a per-channel statistic
            return None
        pos = UNREDUCED_STORAGE_LOSSES.get(func)
        if pos is not None:
            reduction = args[pos] if len(args) > pos else kwargs.get("reduction", 1)
            if reduction != 0:
                return args[0].numel() * t.element_size()
        return None

    def _node(self, t: torch.Tensor) -> torch.fx.Node:
        node = self._node_of.get(t)
        if node is not None:
            return node
        sid, _ = self.register(t)
        if sid not in self._placeholders:
            cat, name = self.names.get(sid, ("external", f"s{sid}"))
            safe = "".join(c if c.isalnum() else "_" for c in f"{cat}_{name}")
            ph = self.graph.placeholder(safe)
            ph.meta["val"] = self._desc(t, sid)
            self._placeholders[sid] = ph
        return self._placeholders[sid]

    def _desc(self, t, sid) -> TensorDesc:
        shape = tuple(d if isinstance(d, int) else self._sub(d.node.expr) for d in t.shape)
        return TensorDesc(shape, t.dtype, sid)

    def _sub(self, expr):
        """``expr`` with the ShapeEnv's symbols replaced by B and the named dims (cached)."""
        got = self._subbed.get(expr)
        if got is None:
            got = self._subbed[expr] = expr.xreplace(self.subs)
        return got

    def on_op(self, index, func, args, kwargs, out, out_sids, new_sids):
        module = self.module()
        in_sids = []
        if func in CONSTANT_LIFT_OPS and out_sids and self.sid(args[0]) is None:
            self.alias(args[0], out_sids[0])

        def to_node(x):
            if isinstance(x, torch.Tensor):
                in_sids.append(self.register(x)[0])
                return self._node(x)
            if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return self._sub(x.node.expr)
            return x

        def walk(x):  # aten arguments: tensors, scalars and lists of them (no pytree cost)
            if type(x) in (list, tuple):  # what pytree maps (a torch.Size is a leaf)
                return type(x)(walk(v) for v in x)
            return to_node(x)

        fargs = walk(args)
        fkwargs = {k: walk(v) for k, v in kwargs.items()}
        node = self.graph.call_function(func, tuple(fargs), dict(fkwargs))
        node.meta.update(phase=self.phase, module=module, index=index)
        grad_node = None
        if self.phase == "forward":
            # Autograd numbers each node it makes, and makes an op's node before the op
            # reaches this mode (its output's grad_fn is set only later): the nodes made
            # since the last op belong to this op's module, whose backward they will run.
            seq = torch._C._autograd._get_sequence_nr()
            for k in range(self._seq_next, seq):
                self.fn_module[k] = module
            self._seq_next = max(self._seq_next, seq)
        if self.phase == "backward":
            n = torch._C._current_autograd_node()
            grad_node = n.name() if n is not None else None
        if isinstance(out, torch.Tensor):
            self._node_of[out] = node
            node.meta["val"] = self._desc(out, out_sids[0])
        elif isinstance(out, (tuple, list)):
            vals = []
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    g = self.graph.call_function(operator.getitem, (node, i))
                    self._node_of[o] = g
                    g.meta["val"] = self._desc(o, self.sid(o))
                    vals.append(g.meta["val"])
                else:
                    vals.append(None)  # keep positions (e.g. a gradient not asked for)
            node.meta["val"] = tuple(vals)
        self.ops.append(OpInfo(index, str(func), self.phase, module, tuple(out_sids),
                               tuple(new_sids), tuple(dict.fromkeys(in_sids)),
                               self._written(func, args, kwargs), grad_node,
                               self.phase == "backward" and self.recomputing > 0))
        if len(self.shape_env.replacements) != self._n_repl:
            self._n_repl = len(self.shape_env.replacements)
            self.check_specialized(str(func), module)

    def _written(self, func, args, kwargs) -> tuple:
        writes = _WRITES.get(func)
        if writes is None:
            writes = _WRITES[func] = tuple(
                (i, a.name) for i, a in enumerate(func._schema.arguments)
                if a.alias_info is not None and a.alias_info.is_write)
        out = []
        for i, name in writes:
            v = args[i] if i < len(args) else kwargs.get(name)
            for t in (v if isinstance(v, (list, tuple)) else (v,)):
                if isinstance(t, torch.Tensor):
                    out.append(self.sid(t))
        return tuple(s for s in out if s is not None)

    def check_specialized(self, op=None, module=None) -> None:
        for name, sym in (("B", self.sym), *self.dim_syms.items()):
            val = self.shape_env.replacements.get(sym)
            rng = self.shape_env.var_to_range.get(sym)
            if not ((val is not None and val.is_number)
                    or (rng is not None and rng.lower == rng.upper)):
                continue
            source = _user_frame(traceback.extract_stack())
            for g in self.shape_env.guards:
                if source is None and sym in g.expr.free_symbols:
                    source = _guard_source(g)
            value = val if val is not None else rng.lower
            what = "the batch size" if name == "B" else f"dim {name}"
            hint = ("compute sizes from x.shape[0] instead of constants or int()" if name == "B"
                    else "compute sizes from the tensor's shape instead of constants or int()")
            raise SpecializationError(
                f"{what} was specialized to {value}, so memory is not a formula in {name} "
                f"({hint})", op=op, module=module, source=source, phase=self.phase)

    # saved tensors ----------------------------------------------------------------
    def pack(self, t):
        sid = self.sid(t)
        if sid is not None:
            self.saved.add(sid)
        return self.saved_tensors.pack(t)

    def close(self) -> None:
        super().close()
        self.saved_tensors.close()


_WRITES: dict = {}  # op -> (position, name) of the arguments it writes in place


def _guard_source(guard) -> str | None:
    """The user's line a guard was created at, if the ShapeEnv recorded one."""
    user = getattr(getattr(guard, "sloc", None), "maybe_user_loc", None)
    return str(user).strip() or None if user else None


def check_dims(dims, spec: StepSpec) -> dict:
    """``dims``: name -> [(tensor, dim), ...], where tensor indexes the inputs followed by
    the targets and dim >= 1 (dim 0 is B). Each place of a name must have the same size in
    the example tensors. Returns the mapping with lists of int pairs."""
    if not dims:
        return {}
    if not isinstance(dims, dict):
        raise InputError(f"dims must be a dict name -> [(tensor, dim), ...], got {dims!r}")
    tensors = spec.inputs + spec.targets
    out = {}
    for name, places in dims.items():
        if not isinstance(name, str) or not name.isidentifier() or name == "B":
            raise InputError(f"a dim name is an identifier other than B, got {name!r}")
        places = [places] if isinstance(places, tuple) else list(places or ())
        if not places:
            raise InputError(f"dim {name} names no (tensor, dim) place")
        sizes = set()
        for place in places:
            if (not isinstance(place, tuple) or len(place) != 2
                    or not all(isinstance(v, int) for v in place)):
                raise InputError(f"dim {name}: a place is (tensor index, dim), got {place!r}")
            t_i, d = place
            if not 0 <= t_i < len(tensors):
                raise InputError(f"dim {name}: tensor {t_i} does not exist (inputs then "
                                 f"targets: {len(tensors)} tensors)")
            if not 1 <= d < tensors[t_i].dim():
                raise InputError(f"dim {name}: tensor {t_i} has no dim {d} (dim 0 is B)")
            sizes.add(int(tensors[t_i].shape[d]))
        if len(sizes) > 1:
            raise InputError(f"dim {name} has different sizes in the example tensors: "
                             f"{sorted(sizes)}")
        out[name] = places
    return out


def _fake_like(mode: FakeTensorMode, t: torch.Tensor, batch=None, param=False, named=None):
    shape = list(t.shape) if batch is None else [batch, *t.shape[1:]]
    for d, v in (named or {}).items():
        shape[d] = v
    with mode:
        f = torch.empty(shape, dtype=t.dtype, device="cpu")
    if param:
        f = torch.nn.Parameter(f, requires_grad=t.requires_grad)
    return f


def trace(model: torch.nn.Module, inputs, targets=(), loss=None, optimizer=None, train=True,
          device="cuda", batch_hint: int | None = None, checkpoint=None,
          set_to_none: bool = True, grad_accum: int = 1, inference_mode: bool = False,
          amp=None, grad_scaler=None, dims=None, reuse_blocks: bool = True,
          compute_capability=(9, 0), kernel_semantics: bool = True) -> Trace:
    """Trace one steady-state step of ``model``; see the module docstring. ``checkpoint``:
    a plan (module paths) whose forwards run under ``torch.utils.checkpoint`` for real.
    With ``amp`` and ``device="cuda"``, autocast follows CUDA's op lists
    (:func:`fxmem.amp.emulate`). ``dims``: other input dims that are symbols too, e.g.
    ``{"L": [(0, 1)]}`` (:func:`check_dims`). ``reuse_blocks``: trace two blocks of each
    run of identical blocks and copy them for the rest (:mod:`fxmem.reuse`); the step is
    traced again block by block when the blocks turn out not to behave alike.
    ``device="cuda"`` follows CUDA's kernels (:mod:`fxmem.kernels`) for a GPU of
    ``compute_capability``; ``kernel_semantics=False`` keeps the CPU's (with CUDA's autocast
    lists still emulated): only to compare with a real CPU step run under
    :func:`fxmem.amp.emulate`."""
    spec = make_spec(model, inputs, targets, loss, optimizer, train, device, set_to_none,
                     grad_accum, inference_mode, amp, grad_scaler)
    plan = normalize_plan(model, checkpoint)
    hint = batch_hint or (spec.batch_size if spec.batch_size >= 2 else 8)
    shape_env = ShapeEnv(specialize_zero_one=False, duck_shape=False)
    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)
    from torch._dynamo.source import ConstantSource

    sym = shape_env.create_symbol(hint, source=ConstantSource("B"),
                                  dynamic_dim=DimDynamic.DYNAMIC)
    # A finite range lets checks such as eager indexing's "skip a full slice" (B <= stop)
    # be decided statically, as they are for concrete sizes; the bound itself is never hit.
    shape_env.constrain_symbol_range(sym, compiler_min=1, compiler_max=B_RANGE_MAX)
    batch = shape_env.create_symintnode(sym, hint=hint)
    positions = check_dims(dims, spec)
    dim_syms, named = {}, {}
    for name, places in positions.items():
        t_i, d = places[0]
        size = int((spec.inputs + spec.targets)[t_i].shape[d])
        s_ = shape_env.create_symbol(size, source=ConstantSource(name),
                                     dynamic_dim=DimDynamic.DYNAMIC)
        shape_env.constrain_symbol_range(s_, compiler_min=1, compiler_max=B_RANGE_MAX)
        dim_syms[name] = s_
        node = shape_env.create_symintnode(s_, hint=size)
        for t_i, d in places:
            named.setdefault(t_i, {})[d] = node
    rec = _Recorder(shape_env, sym, dim_syms)
    rec.capability = check_capability(compute_capability)  # before any work, on any device
    if spec.device == "cuda" and kernel_semantics:  # CUDA's kernels, not the CPU's
        rec.kernels = cuda_kernels(rec.capability)
    handles = []
    try:
        with frozen_gc(), tracing_shims():
            return _run(model, spec, mode, rec, sym, batch, hint, handles, plan, named,
                        reuse_blocks)
    except FxmemError:
        raise
    except Exception as e:  # noqa: BLE001 - turned into one clear TraceError
        if _caused_by(e, NoReuse):
            retry = True
        else:
            raise _as_trace_error(e, rec) from e
    finally:
        rec.close()
        for h in handles:
            h.remove()
    if retry:  # the blocks did not behave alike: trace each one
        return trace(model, inputs, targets, loss, optimizer, train, device, batch_hint,
                     checkpoint, set_to_none, grad_accum, inference_mode, amp, grad_scaler,
                     dims, reuse_blocks=False, compute_capability=compute_capability,
                     kernel_semantics=kernel_semantics)


def _as_trace_error(e: Exception, rec: _Recorder) -> TraceError:
    reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    source = _user_frame(traceback.extract_tb(e.__traceback__))
    if rec.failed is not None and rec.failed[4] is e or (rec.failed and _chained(e, rec.failed[4])):
        op, module, phase, src, _ = rec.failed
        return TraceError(f"cannot trace this op on fake tensors: {reason}", op=op,
                          module=module, source=src or source, phase=phase)
    return TraceError(f"cannot trace the step on fake tensors: {reason}", op=None,
                      module=rec.module_stack[-1], source=source, phase=rec.phase)


def _causes(e):
    """``e`` and the exceptions it was raised from or during, innermost last."""
    seen = set()
    while e is not None and id(e) not in seen:
        yield e
        seen.add(id(e))
        e = e.__cause__ or e.__context__


def _caused_by(e, kind) -> bool:
    return any(isinstance(x, kind) for x in _causes(e))


def _chained(e, inner) -> bool:
    return any(x is inner for x in _causes(e))


def _run(model, spec: StepSpec, mode, rec: _Recorder, sym, batch, hint, handles,
         plan=(), named=None, reuse_blocks=False) -> Trace:
    # fake parameters and buffers, registered under their names
    named_p = list(model.named_parameters())
    named_b = [(n, b) for n, b in model.named_buffers() if b is not None]
    fparams = {n: _fake_like(mode, p, param=True) for n, p in named_p}
    fbufs = {n: _fake_like(mode, b) for n, b in named_b}
    named, n_in = named or {}, len(spec.inputs)
    fins = [_fake_like(mode, t, batch, named=named.get(i)) for i, t in enumerate(spec.inputs)]
    ftgs = [_fake_like(mode, t, batch, named=named.get(n_in + i))
            for i, t in enumerate(spec.targets)]
    for n, p in fparams.items():
        rec.register_named(p, "param", user_path(n))
    for n, b in fbufs.items():
        rec.register_named(b, "buffer", user_path(n))
    for i, t in enumerate(fins):
        rec.register_named(t, "input", f"inputs[{i}]")
    for i, t in enumerate(ftgs):
        rec.register_named(t, "input", f"targets[{i}]")

    # Global module hooks (removed in trace()'s finally): per-module hooks would be seen by
    # the model, e.g. nn.TransformerEncoderLayer turns its fused fast path off when it has any.
    name_of = {id(m): user_path(n) for n, m in model.named_modules()}

    def enter(mod, args):
        name = name_of.get(id(mod))
        if name is not None:
            rec.module_stack.append(name)  # returns None: inputs unchanged
            rec.call_starts.append(rec.op_count)

    def leave(mod, args, out):
        if id(mod) in name_of and len(rec.module_stack) > 1:
            name = rec.module_stack.pop()  # returns None: output unchanged
            start = rec.call_starts.pop() if rec.call_starts else rec.op_count
            if rec.phase == "forward" and name:
                rec.calls.append(ModuleCall(name, start, rec.op_count - 1))

    from torch.nn.modules.module import (register_module_forward_hook,
                                         register_module_forward_pre_hook)

    handles.append(register_module_forward_pre_hook(enter))
    handles.append(register_module_forward_hook(leave))

    state = {**fparams, **fbufs}
    params = list(fparams.values())

    def forward(*args):
        return model(*args)

    with mode:
        opt = make_optimizer(spec.optimizer, params, spec.device, spec) \
            if spec.optimizer else None
        scaler = make_grad_scaler(spec, "cpu", fake=True)
    for name, t in scaler_tensors(scaler).items():
        rec.register_named(t, "optimizer_state", name)

    cache = mode.cache_enabled

    def on_phase(name):
        # FakeTensorMode's dispatch cache pays when an op repeats with the same sizes many
        # times: Adam's foreach ops, and a stack whose every block is traced. With blocks
        # reused, a forward or backward op repeats about twice, and with symbolic sizes
        # making and checking an entry costs more than it saves (GPT-2 small, B and L
        # symbolic: 1.19 s with it off there, 1.67 s on; benchmarks/speed.py).
        mode.cache_enabled = cache and (reuse is None or name == "optimizer")
        if name == "forward":
            rec.module_stack[:] = [""]
            rec.call_starts.clear()
        if name == "backward":
            rec.module_stack[:] = ["<loss>"]
        if name == "optimizer":
            rec.phase = name  # the unrecorded step below reads as the optimizer's
            for n, p in fparams.items():
                if p.grad is not None:
                    sid = rec.sid(p.grad)
                    if sid is not None and rec.storages[sid].created_by >= 0:
                        rec.names[sid] = ("grad", n)
            if opt is not None and not needs_closure(opt):  # state: one unrecorded step
                rec.recording = False
                opt.step()
                rec.recording = True
                for i, p in enumerate(params):
                    for k, t in opt.state.get(p, {}).items():
                        if isinstance(t, torch.Tensor):
                            rec.register_named(t, "optimizer_state", f"{named_p[i][0]}.{k}")
        rec.phase = name

    def loss_fn_wrap(out, *tgs):
        rec.module_stack.append("<loss>")
        try:
            return spec.loss(out, *tgs)
        finally:
            rec.module_stack.pop()

    spec_run = spec if spec.loss is None else _replace_loss(spec, loss_fn_wrap)
    # Only models with RNN modules get the router: any active torch-function mode turns off
    # fast paths such as nn.TransformerEncoderLayer's fused inference kernel.
    has_rnn = any(isinstance(m, torch.nn.RNNBase) for m in model.modules())
    # On CUDA, fxmem.kernels routes the RNNs to what the CUDA build runs instead.
    router = RNNRouter() if has_rnn and rec.kernels is None else contextlib.nullcontext()
    # The fake parameters stay in place for the whole step, not just the forward: a
    # checkpointed module's forward runs again during backward.
    swap = _reparametrize_module(model, state, tie_weights=True)

    def region(path, fn):  # what checkpoint runs, and re-runs in backward
        def run(*args, **kwargs):
            depth, again = len(rec.module_stack), rec.phase == "backward"
            cdepth = len(rec.call_starts)
            if again:
                rec.module_stack.append(path)
                rec.recomputing += 1
            try:
                return fn(*args, **kwargs)
            finally:  # early stop raises out of the region: drop its stack entries
                del rec.module_stack[depth:]
                del rec.call_starts[cdepth:]
                rec.recomputing -= again
        return run

    reuse = None
    if (reuse_blocks and not plan and spec.grad_accum == 1 and (spec.set_to_none or not spec.train)
            and not needs_closure(opt)):
        runs = find_runs(model)
        if runs:
            reuse = Reuse(rec, runs, fparams, fbufs)
            handles.append(reuse)  # removed in trace()'s finally
            reuse.install()
    hooks = torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.saved_tensors.unpack)
    # CUDA's autocast rules on the fake CPU tensors, for the whole step (a checkpointed
    # module's re-run in backward enters autocast again)
    rules = emulate("cuda") if spec.amp is not None and spec.device == "cuda" else \
        contextlib.nullcontext()
    kernels = rec.kernels if rec.kernels is not None else contextlib.nullcontext()
    with checkpointing(model, plan, region) as rec.plan, swap, router, rules, kernels, mode, \
            rec, hooks:
        if spec.train and not spec.set_to_none:
            # steady state: the previous step left every gradient allocated. One unrecorded
            # forward and backward makes them (as fxmem.measure's warm-up step does).
            rec.recording = False
            run_step(forward, spec_run, fins, ftgs, params, None, lambda name: None,
                     micro_steps=1)
            rec.recording = True
            for n, p in fparams.items():
                if p.grad is not None:
                    rec.register_named(p.grad, "grad", user_path(n))
        if needs_closure(opt):
            # steady state: LBFGS's history is full after some steps; run them unrecorded
            rec.recording = False
            for _ in range(warmup_steps(opt)):
                run_step(forward, spec_run, fins, ftgs, params, opt,
                         lambda name: setattr(rec, "phase", name))
            rec.recording = True
            for k, v in opt.state[params[0]].items():
                leaves = [t for t in tree_leaves(v) if isinstance(t, torch.Tensor)]
                for i, t in enumerate(leaves):
                    rec.register_named(t, "optimizer_state",
                                       f"{k}[{i}]" if len(leaves) > 1 else k)
        out = run_step(forward, spec_run, fins, ftgs, params, opt, on_phase,
                       micro_steps=min(spec.grad_accum, 2), scaler=scaler)
    rec.close()
    rec.check_specialized()
    if reuse is not None:
        reuse.finish()
        splice(rec, reuse)
    end_index = len(rec.ops)
    del out
    return _finish(rec, sym, hint, spec, end_index)


def _replace_loss(spec: StepSpec, fn) -> StepSpec:
    from dataclasses import replace

    return replace(spec, loss=fn)


def _finish(rec: _Recorder, sym, hint, spec: StepSpec, n_ops: int) -> Trace:
    env = rec.shape_env

    done: dict = {}

    def to_expr(v):
        if isinstance(v, int):
            return sympy.Integer(v)
        raw = v.node.expr
        if raw in done:
            return done[raw]
        e = env.replace(raw) if hasattr(env, "replace") else raw
        e = done[raw] = plain(e.xreplace(rec.subs))
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
    for s in rec.storages:
        expr = to_expr(s.nbytes)
        if rec.dim_syms:
            expr = sympy.expand(expr)
        size = sizes.get(expr) or sizes.setdefault(expr, Size.of(expr))
        cat, name = rec.names.get(s.sid, (None, ""))
        if cat is None:
            created_in_forward = s.created_by >= 0 and phase_of_op[s.created_by] == "forward"
            cat = "activation" if (s.sid in rec.saved and created_in_forward) else "temporary"
        freed = s.freed_after  # while autograd holds no copy of it: its unref time
        if s.created_by >= 0 and s.sid in released:
            freed = latest(freed, released[s.sid])
        storages.append(StorageInfo(
            s.sid, size, cat, name, creator_module.get(s.sid, ""), s.created_by,
            freed, s.sid in rec.saved, None, (),
            saved_by.get(s.sid, ()), s.freed_after))
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
                _with(s, dtype=first[s.sid].dtype, shape=first[s.sid].shape) for s in storages]
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
    mixed = [sympy.simplify(g) for g in all_guards if len(g.free_symbols) > 1]
    guards += tuple(dict.fromkeys(g for g in mixed if not implied(g, lows)))
    graph = rec.graph
    if isinstance(graph, torch.fx.Graph):
        graph.output(None)
    else:
        def graph(build=graph):
            g = build()
            g.output(None)
            return g
    unmodelled = tuple((str(f), m, why) for (f, m), why in rec.unmodelled.items())
    return Trace(graph, tuple(rec.ops), tuple(storages), guards, hint, spec.train,
                 spec.device, spec.optimizer is not None, unmodelled, rec.plan,
                 tuple(sorted(rec.calls, key=lambda c: (c.first_op, -c.last_op))),
                 rec.saved_tensors.packs, spec.grad_accum, tuple(rec.dim_syms),
                 getattr(rec, "reused", ()),
                 rec.capability, rec.kernels.choices if rec.kernels is not None else ())


def _with(s: StorageInfo, **kw) -> StorageInfo:
    from dataclasses import replace

    return replace(s, **kw)
