"""The records a trace is made of: :class:`Trace`, its ops, storages and module calls.

Frozen dataclasses, read by every later stage; :func:`fxmem.trace.trace` makes them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...formula.symbols import Size

B_RANGE_MAX = 2**62  # the symbol's upper range; not reported as a condition

CATEGORIES = ("param", "buffer", "input", "grad", "optimizer_state", "activation", "temporary")


@dataclass(frozen=True)
class TensorDesc:
    """What an op output looked like: shape (ints or sympy in B), dtype, storage id."""

    shape: tuple
    dtype: torch.dtype
    sid: int


def with_fields(record, **changes):
    """``dataclasses.replace`` for a record of this module, whose fields need no checks (no
    ``__post_init__``): a quarter of the time (2.4 against 8.2 us an :class:`OpInfo`), where a
    trace's splice, its finish and a plan's derivation copy every op and storage of the
    step.

    >>> op = OpInfo(0, "aten.mm.default", "forward", "fc", (1,), (1,), (0,), (), None)
    >>> with_fields(op, index=7, module="fc2") == OpInfo(7, "aten.mm.default", "forward",
    ...                                                  "fc2", (1,), (1,), (0,), (), None)
    True
    """
    new = object.__new__(type(record))
    new.__dict__.update(record.__dict__)
    new.__dict__.update(changes)
    return new


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
    blas: str | None = None  # CUDA matmuls: "cublas" or "cublaslt" (fxmem.trace.kernels.cuda.blas)
    # CUDA reductions: the op's arguments by name, tensors as (shape, strides, offset, dtype)
    # in B, for the replay's staging buffers (fxmem.trace.kernels.cuda.reduce_replay)
    reduce: tuple | None = None
    # CUDA convolutions (forward and backward): "depthwise" where the native depthwise kernel
    # runs instead of cuDNN (fxmem.trace.kernels.cuda.cudnn.conv_backend), else None
    conv: str | None = None


@dataclass(frozen=True)
class GraphRun:
    """One run of a graph inductor compiled (:mod:`fxmem.trace.compiled.inductor`): its
    wrapper's ops are ``first_op..last_op``, in the ``phase`` it ran in; ``inductor_bytes``:
    inductor's own estimate of the graph's peak (``torch._inductor.memory``: the buffers it
    allocates and the inputs it frees, at its size hints, i.e. at the trace's batch hint),
    None when inductor gave none."""

    phase: str
    first_op: int
    last_op: int
    inductor_bytes: int | None


@dataclass(frozen=True)
class ModuleCall:
    """One forward call of a submodule: its ops are ``first_op..last_op`` (none if
    ``last_op < first_op``); the first ``hook_ops`` of them ran in the module's own forward
    pre-hooks (FSDP2's all-gather of a sharded block), before its ``forward``."""

    path: str
    first_op: int
    last_op: int
    hook_ops: int = 0
    arg_sids: tuple = ()  # storages of the tensors its forward was given (args and kwargs)

    @property
    def forward_op(self) -> int:
        """The first op of the module's ``forward`` itself (after its own pre-hooks):
        where a checkpoint of it starts, and re-runs from."""
        return self.first_op + self.hook_ops


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
    data_bound: bool = False  # its size depends on a count the data sets (a mask's True
    # values): ``size`` is its largest (fxmem.trace.kernels.datadep)
    resized_away: bool = False  # freed by a resize to 0 (FSDP2's reshard), whatever still
    # refers to it: autograd's and checkpoint's references keep nothing of it
    # the CUDA stream it is allocated on: 0 the default stream, 1, 2, ... the others in the
    # order of their first allocation (FSDP2's all-gather and reduce-scatter streams;
    # fxmem.trace.ledger.tracking.StorageTracker.stream_index)
    stream: int = 0
    # which of FSDP2's own buffers it is (fxmem.trace.parallel.fsdp_buffers.Buffer), sized
    # by the world size; None: not one
    fsdp_buffer: object = None


@dataclass(frozen=True)
class Lifted:
    """How the formulas of a trace whose step fixes B as a Python int were obtained
    (:mod:`fxmem.trace.engine.lift`): the step traced with B an int at each of ``fitted`` and
    ``checked``, every size fitted through the first and checked at the second; ``source``
    and ``op``: where B became an int; ``seconds``: the time those traces took; ``cause``:
    why the symbolic trace could not be used."""

    source: str | None
    op: str | None
    fitted: tuple
    checked: tuple
    seconds: float
    cause: str = "makes B a Python int"

    def __str__(self) -> str:
        at = f" at {self.source}" if self.source else f" (noticed at {self.op})"
        lo, hi = self.fitted[0], self.fitted[-1]
        return (f"fitted, not derived: the step {self.cause}{at}, so the formula "
                f"was fitted from traces at B={lo}..{hi} and checked at "
                f"B={', '.join(map(str, self.checked))} ({self.seconds:.1f} s)")


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
    packs: tuple = ()  # fxmem.trace.ledger.saved.Pack per tensor saved for backward in the forward
    grad_accum: int = 1  # micro-batches of B per optimizer step
    dims: tuple = ()  # names of input dims beyond B that are symbols too (e.g. ("L",))
    # blocks whose ops are copies of an identical block's (fxmem.trace.blocks.reuse)
    reused: tuple = ()
    compute_capability: tuple = (9, 0)  # the GPU whose kernels device="cuda" follows
    # (op, what CUDA runs) the routed kernels chose (fxmem.trace.kernels.cuda.kernels)
    kernel_choices: tuple = ()
    # (op, module, what) storages sized by a count the data sets, at its largest
    # (``StorageInfo.data_bound``; fxmem.trace.kernels.datadep)
    data_sized: tuple = ()
    lifted: Lifted | None = None  # B fixed by the step: the sizes fitted (fxmem.trace.engine.lift)
    # names of the parameters and buffers in the order ``model.to(device)`` allocates them
    # (``Module._apply``: a module's children first, then its parameters, then its buffers):
    # where the allocator replay (fxmem.device.allocator) places them
    placement: tuple = ()
    # the model ran compiled: inductor's code (fxmem.trace.compiled.inductor)
    compiled: bool = False
    # the paths of the modules compiled on their own, outermost (fxmem.trace.compiled.parts);
    # "": the model compiled in place (model.compile())
    compiled_parts: tuple = ()
    graph_runs: tuple = ()  # GraphRun per run of a compiled graph, in order
    amp: torch.dtype | None = None  # the dtype the forward ran under autocast in (Step.amp)
    # the paths of the Hugging Face layers that write their key/value cache when given one
    # (run without it when checkpointed: fxmem.checkpoint.uncached)
    cache_layers: tuple = ()
    # the rank whose trace this rank's step was derived from (the same world size under
    # FSDP2: fxmem.trace.parallel.other_ranks); None: traced
    derived_from: int | None = None
    # the world size of the trace it was derived from, when another (fxmem.trace.parallel.
    # other_ranks.at_world_size); None: this one
    derived_world_size: int | None = None
    # a trace derived from another rank's (fxmem.trace.parallel.other_ranks), whose graph it
    # shares: (sid, its shape in the graph) of each storage the derivation gave another
    # shape, and (the graph's shape, this rank's) of each parameter's rows on the rank, for
    # the FLOPs of the ops writing them and of the optimizer's (fxmem.checkpoint.flops)
    shaped_as: tuple = ()
    reshaped: tuple = ()


def _graph(self) -> torch.fx.Graph:
    """The step as a ``torch.fx.Graph`` (one node per op; built on first use when blocks were
    copied, see :mod:`fxmem.trace.blocks.reuse`)."""
    g = self.graph_source
    if not isinstance(g, torch.fx.Graph):
        g = g()
        object.__setattr__(self, "graph_source", g)
    return g


Trace.graph = property(_graph)


def _calls_of(self, path: str) -> list:
    """The calls of the module at ``path``, in call order (an index kept on the trace: a
    planner asks it of each region it derives, hundreds)."""
    index = self.__dict__.get("_calls_by_path")
    if index is None:
        index = self.__dict__["_calls_by_path"] = {}
        for c in self.calls:
            index.setdefault(c.path, []).append(c)
    return index.get(path, [])


Trace.calls_of = _calls_of
