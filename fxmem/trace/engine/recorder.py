"""The recorder: a dispatch mode that sees every aten op of the traced step and keeps
what it allocated, wrote, saved and freed (and turns a failing op into a
:class:`fxmem.TraceError` naming it)."""

from __future__ import annotations

import operator
import traceback

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.weak import WeakTensorKeyDictionary

from ...errors import DataDependentError, ModelError, SpecializationError, TraceError
from ...formula.symbols import B, dim_symbol
from ..kernels.cuda import blas as cuda_blas
from ..kernels.cuda import call_order, cudnn, reduce_replay
from ..kernels.datadep import (
    TORCH_AND_FXMEM,
    branch_message,
    branch_origin,
    config_hint,
)
from ..kernels.grad_sums import ACCUMULATE_GRAD, GradSums
from ..kernels.rules import (
    CONSTANT_LIFT_OPS,
    DEVICE_QUERY,
    METADATA_QUERIES,
    PROFILER_MARKERS,
    SKIP_NAMESPACES,
    ValueOracle,
)
from ..kernels.values import KnownValues, passed, written_args
from ..ledger.records import ModuleCall, OpInfo, TensorDesc
from ..ledger.saved import SavedTensors
from ..ledger.tracking import RESIZE_OP, StorageTracker
from .eager_ops import EagerOps
from .messages import causes, chained, live_frames, op_hint, user_frame

_META = torch.device("meta")


def _call_node(graph: torch.fx.Graph, func, args: tuple, kwargs: dict | None = None):
    """``graph.call_function(func, args, kwargs)``, the arguments set on the node made
    without them: ``Graph.create_node`` walks a call's arguments with pytree to warn of a
    raw SymInt among them, and the recorder passes none (each size is its expression in B
    and the named dims). The same node (its name comes from ``func``; FX counts the uses
    of arguments set later as of those given at once): 10 against 18 us a node for a
    view's arguments (docs/benchmarks.md, session 61), 3,776 nodes a trace of
    Llama-3.1-8B over 8 GPUs.

    >>> g = torch.fx.Graph(); x = g.placeholder("x")
    >>> n = _call_node(g, torch.ops.aten.add.Tensor, (x, x), {"alpha": 2})
    >>> n.name, n.args == (x, x), n.kwargs, list(x.users)
    ('add_tensor', True, {'alpha': 2}, [add_tensor])
    """
    node = graph.call_function(func)
    node.args = args
    if kwargs:
        node.kwargs = kwargs
    return node


class Recorder(EagerOps, StorageTracker):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in SKIP_NAMESPACES:  # (two answered here: rules.py says why)
            if func is DEVICE_QUERY and type(args[0]) is FakeTensor:
                return _META if args[0].fake_mode.in_kernel_invocation else args[0].fake_device
            if func in PROFILER_MARKERS:
                with _disable_current_modes():
                    return func(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))
        if func in METADATA_QUERIES:
            return self.metadata(func, args, kwargs or {})
        return super().__torch_dispatch__(func, types, args, kwargs)

    def __init__(self, shape_env: ShapeEnv, sym, dim_syms: dict | None = None):
        super().__init__()
        self.shape_env, self.sym = shape_env, sym
        self.dim_syms = dim_syms or {}  # name -> ShapeEnv symbol of the other named dims
        self.subs = {sym: B, **{v: dim_symbol(n) for n, v in self.dim_syms.items()}}
        self._subbed: dict = {}
        self.sums = GradSums()  # autograd's sums of two gradients (fxmem.trace.kernels.grad_sums)
        self.phase = "setup"
        self.module_stack = [""]
        self.fn_module: dict[int, str] = {}  # autograd node sequence_nr -> forward module
        # op position -> the storage of the parameter whose AccumulateGrad step ran it
        self.accumulated: dict[int, int] = {}
        self._seq_next = 0  # autograd sequence numbers below this are in fn_module
        self.saved: set[int] = set()
        self.graph = torch.fx.Graph()
        self._node_of = WeakTensorKeyDictionary()
        self._placeholders: dict[int, torch.fx.Node] = {}
        self.names: dict[int, tuple[str, str]] = {}  # sid -> (category, name)
        # sid -> FSDP2's own buffer it is (fxmem.trace.parallel.fsdp_buffers.Buffer)
        self.fsdp_buffers: dict = {}
        self.ops: list[OpInfo] = []
        self.failed: tuple | None = None
        self.kernels = None  # fxmem.trace.kernels.cuda.kernels.CudaKernels for device="cuda"
        self._host: tuple = ()  # outputs of the running op that CUDA keeps in host memory
        self._sized: tuple = ()  # (output, bytes) of the running op, sized by a CPU rule
        self.oracle = ValueOracle()
        # tensors filled with one known value (fxmem.trace.kernels.values)
        self.values = KnownValues()
        self.assigned: str | None = None  # a buffer the forward assigns (modstate.BufferAssigned)
        self.unmodelled: dict = {}  # (op, module) -> what is not modelled
        self._n_repl = 0
        self.plan: tuple = ()
        self.offload = False  # an FSDP2 rank with CPU offload: host storages left out
        self.calls: list[ModuleCall] = []  # forward module calls, in the order they ended
        self.call_starts: list[int] = []
        self.forward_starts: dict[int, int] = {}  # call depth -> op its forward began at,
        # after the module's own pre-hooks (fxmem.trace.ledger.records.ModuleCall.hook_ops)
        self.recomputing = 0  # > 0 while a checkpointed forward re-runs in backward
        self.running = None  # () -> the module of the compiled graph's line running
        self.part = None  # the part compiled on its own whose forward runs (compiled.parts)
        self.part_nodes: dict = {}  # a part's backward node's sequence number -> its path
        self.graph_runs: list = []  # GraphRun per run of a compiled graph (compiled.inductor)
        self.saved_tensors = SavedTensors(self, lambda: (self.phase, self.module_stack[-1]),
                                          self._node_of)
        self._unguarded: tuple | None = None  # (symbolic size, suppress_guards context)
        # unbacked symbols (counts of a mask's True values, values read from tensors) ->
        # where they came from (fxmem.trace.kernels.datadep); none exist before the step
        self.data: dict = {}
        self._n_symbols = len(shape_env.var_to_range)

    # where are we -----------------------------------------------------------------
    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        """Before a backward pass on CUDA, hooks mark where each node's call ends."""
        if name == "backward" and self.kernels is not None and self._phase != "backward":
            self.sums.hook_graph([t.grad_fn for t in list(self._node_of.keys())])
        self._phase = name

    def module(self) -> str:
        if self.running is not None:  # a compiled graph's (fxmem.trace.compiled.inductor)
            path = self.running()
            if path is not None:
                return path
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

    def name_workspace(self, sid: int, what: str) -> None:
        self.names[sid] = ("temporary", what)

    # the step's graph -----------------------------------------------------------
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
        if self.kernels is not None:  # in the order CUDA's kernel makes them
            new_sids = call_order.new_storage_order(func, args, kwargs, out, new_sids, self.sid)
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

        node = _call_node(self.graph, func, tuple(walk(args)),
                          {k: walk(v) for k, v in kwargs.items()})
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
            if grad_node == ACCUMULATE_GRAD:
                self.accumulated[len(self.ops)] = self.sid(n.variable)
            if self.kernels is not None:
                self.sums.note(n, index, func, args, kwargs, out_sids, self.sid)
        if isinstance(out, torch.Tensor):
            self._node_of[out] = node
            node.meta["val"] = self._desc(out, out_sids[0])
        elif isinstance(out, (tuple, list)):
            vals = []
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    g = _call_node(self.graph, operator.getitem, (node, i))
                    self._node_of[o] = g
                    g.meta["val"] = self._desc(o, self.sid(o))
                    vals.append(g.meta["val"])
                else:
                    vals.append(None)  # keep positions (e.g. a gradient not asked for)
            node.meta["val"] = tuple(vals)
        if len(self.shape_env.var_to_range) > self._n_symbols:  # counts exist in this step
            self.note_counts(func, args, new_sids)
        self.ops.append(OpInfo(index, str(func), self.phase, module, tuple(out_sids),
                               tuple(new_sids), tuple(dict.fromkeys(in_sids)),
                               self._written(func, args, kwargs), grad_node,
                               self.phase == "backward" and self.recomputing > 0,
                               blas=None if self.kernels is None
                               else cuda_blas.library(func, args, kwargs),
                               reduce=None if self.kernels is None
                               else reduce_replay.record(func, args, kwargs, self._sub),
                               conv=None if self.kernels is None
                               else cudnn.conv_backend(func, args, kwargs)))
        if len(self.shape_env.replacements) != self._n_repl:
            self._n_repl = len(self.shape_env.replacements)
            self.check_specialized(str(func), module)

    def on_resize(self, index: int, st, sid: int) -> None:
        """A storage resized from 0 (FSDP2's ``alloc_storage``): an op of its own that makes
        storage ``sid`` (:data:`fxmem.trace.ledger.tracking.RESIZE_OP`)."""
        nbytes = self.storages[sid].nbytes
        module = self.module()
        node = _call_node(self.graph, RESIZE_OP, (None, nbytes))
        node.meta.update(phase=self.phase, module=module, index=index,
                         val=TensorDesc((nbytes,), torch.uint8, sid))
        self.ops.append(OpInfo(index, str(RESIZE_OP), self.phase, module, (sid,), (sid,), (),
                               (), None, self.phase == "backward" and self.recomputing > 0))
        # not an activation even when autograd saves a view of it: FSDP2 frees it by
        # resizing, whatever is saved (its gathered parameters, all-gather buffers)
        self.names[sid] = ("temporary", "resized in place (FSDP2's gathered parameters)")

    def _written(self, func, args, kwargs) -> tuple:
        out = []
        for v in passed(written_args(func), args, kwargs):
            for t in (v if isinstance(v, (list, tuple)) else (v,)):
                if isinstance(t, torch.Tensor):
                    out.append(self.sid(t))
        return tuple(s for s in out if s is not None)

    def check_specialized(self, op=None, module=None, hint=None) -> None:
        for name, sym in (("B", self.sym), *self.dim_syms.items()):
            val = self.shape_env.replacements.get(sym)
            rng = self.shape_env.var_to_range.get(sym)
            if not ((val is not None and val.is_number)
                    or (rng is not None and rng.lower == rng.upper)):
                continue
            source = _fixed_at(self.shape_env, sym) or user_frame(traceback.extract_stack())
            for g in self.shape_env.guards:
                if source is None and sym in g.expr.free_symbols:
                    source = _guard_source(g)
            value = val if val is not None else rng.lower
            what = "the batch size" if name == "B" else f"dim {name}"
            # len(x), int(x.shape[0]) and range(x.shape[0]) are Python ints: they fix the
            # symbol whatever fxmem does (CPython's len() converts with __index__); a
            # Hugging Face config flag may be what turned on the code that does so
            hint = hint or config_hint(live_frames()) or (
                "compute sizes from x.shape[0] instead of constants, int() or len(x)"
                if name == "B" else
                # (a dim traced from a size of 1: PyTorch's broadcasting fixes such a size,
                # whatever the model does; B is traced from 2 or more for that reason)
                f"a size of 1 is one PyTorch's broadcasting fixes: give {name} = 2 or more "
                f"(an example input that long; on the command line --seq 2 or --dim "
                f"{name}=2); the formula then holds from {name} = 2"
                if value == 1 else
                "compute sizes from the tensor's shape instead of constants, int() or len()")
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
        self.sums.apply(self.storages, self.names)
        if self._unguarded is not None:  # a failed step: guards back on
            self._unguarded[1].__exit__(None, None, None)
            self._unguarded = None


def failed_in_model_code(e: Exception, rec: Recorder) -> bool:
    """Did ``e`` come from the model's own Python code (neither torch's nor fxmem's), outside
    any aten op, while the step ran? Such code may need B as a number where it holds a
    symbolic size: ``np.arange(x.shape[0])`` makes an array of objects, which
    ``torch.from_numpy`` refuses."""
    if rec.failed is not None or rec.phase not in ("forward", "backward"):
        return False
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and not frames[-1].filename.startswith(TORCH_AND_FXMEM)


def _fixed_at(shape_env, sym) -> str | None:
    """The user's line where ``sym`` became a number: the frame the ShapeEnv recorded with
    its ``Eq(sym, value)`` guard (``len(x)`` makes no op, so the op that notices is a later
    one, on a later line)."""
    for g in reversed(shape_env.guards):
        frame = getattr(getattr(g, "sloc", None), "framework_loc", None)
        if (isinstance(g.expr, sympy.Eq) and g.expr.free_symbols == {sym}
                and isinstance(frame, traceback.FrameSummary)):
            return user_frame([frame])
    return None


def _guard_source(guard) -> str | None:
    """The user's (or a model library's) line a guard was created at, if the ShapeEnv
    recorded one: its ``framework_loc``, the frame that asked (a Python int read of a
    symbol, such as ``range(x.shape[0])``), when that is not torch's nor fxmem's."""
    sloc = getattr(guard, "sloc", None)
    user = getattr(sloc, "maybe_user_loc", None)
    if user:
        return str(user).strip() or None
    fr = getattr(sloc, "framework_loc", None)
    if isinstance(fr, traceback.FrameSummary):
        return user_frame([fr])
    return None


def _as_trace_error(e: Exception, rec: Recorder) -> TraceError:
    reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    source = user_frame(traceback.extract_tb(e.__traceback__))
    guard = next((x for x in causes(e) if isinstance(x, GuardOnDataDependentSymNode)), None)
    if guard is not None:  # a Python branch on a value the data sets
        frames = []
        tb = guard.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        failed = rec.failed if rec.failed is not None and chained(e, rec.failed[4]) else None
        origin = branch_origin(guard.cond, rec.data)
        return DataDependentError(
            branch_message(origin, config_hint(reversed(frames))),
            op=failed[0] if failed else origin.op if origin is not None else None,
            # the module running the branch (forward hooks left on the stack); in backward,
            # where no stack is kept, the module that read the value
            module=failed[1] if failed else origin.module if origin is not None
            and rec.phase != "forward" else rec.module_stack[-1],
            source=(failed[3] if failed else None) or user_frame(
                traceback.extract_tb(guard.__traceback__)) or source
            or (origin.source if origin is not None else None),
            phase=failed[2] if failed else rec.phase)
    if rec.failed is not None and rec.failed[4] is e or (rec.failed and chained(e, rec.failed[4])):
        op, module, phase, src, _, eager = rec.failed
        hint = op_hint(op, reason)
        if eager:  # the model's own error, not the trace's
            return ModelError(f"the model fails at this op, as eager PyTorch would on these "
                              f"shapes and dtypes: {reason}" + (f"; {hint}" if hint else ""),
                              op=op, module=module, source=src or source, phase=phase)
        return TraceError(f"cannot trace this op on fake tensors: {reason}"
                          + (f"; {hint}" if hint else ""), op=op,
                          module=module, source=src or source, phase=phase)
    hint = op_hint(None, reason)
    return TraceError(f"cannot trace the step on fake tensors: {reason}"
                      + (f"; {hint}" if hint else ""), op=None,
                      module=rec.module_stack[-1], source=source, phase=rec.phase)
