"""Compiled models (``torch.compile``): inductor's own code, run on the trace's fake tensors.

A model given as ``torch.compile(model)`` (an ``OptimizedModule``) is traced with its
forward compiled for real: dynamo captures it, AOTAutograd partitions it (what is saved for
backward is its choice), inductor lowers both graphs for the GPU and writes the Python
wrapper that allocates every buffer (``empty_strided_cuda``), calls the fused kernels and
the library ones (``extern_kernels.mm(..., out=buf)``) and ``del``\\ s each buffer after its
last use, reusing some in place of new ones. The trace then runs that wrapper on its fake
tensors: each buffer is an ``aten.empty_strided`` recorded like any op, at its symbolic
size in B, each ``del`` a free seen as eager frees are (a weak reference to the storage),
the library kernels the ops whose rules fxmem has (cuBLAS's workspace); the fused kernels'
launches do nothing (they allocate nothing: inductor sizes their scratch as buffers of its
own).

Dynamo cannot capture under an active dispatch mode (it runs the model eagerly then), so
:func:`modes_suspended` takes the trace's modes off while the compiled model is called, and the
compiled graphs enter them again when they run (:func:`inductor_on_fakes`). Lowering for
CUDA needs a CUDA build of PyTorch and a device (a real GPU, or the fake GPU:
:mod:`fxmem.validate.fakegpu`).
"""

from __future__ import annotations

import bisect
import contextlib
import re
import sys

import torch

from ...errors import FxmemError, InputError, TraceError
from ..ledger.records import GraphRun


def is_compiled(model) -> bool:
    """Whether ``model`` is ``torch.compile(module)``."""
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(model, OptimizedModule)


def check_compilable(device: str) -> None:
    """Raise :class:`fxmem.InputError` when this process cannot lower a compiled step for
    ``device``: inductor needs a CUDA build of PyTorch that sees a device."""
    if device != "cuda":
        raise InputError("a compiled model (torch.compile) is traced on device='cuda' only: "
                         "inductor's CPU code is not modelled")
    if not torch.cuda.is_available():
        raise InputError("tracing a compiled model (torch.compile) needs a CUDA build of "
                         "PyTorch with a device: a GPU, or the fake GPU (fxmem run in a CUDA "
                         "build's Python with the stub: fxmem.validate.fakegpu)")


def _wrapper_globals(compiled) -> dict:
    fn = compiled.current_callable
    return getattr(fn, "__func__", fn).__globals__


def _no_check(*args, **kwargs) -> None:
    """A wrapper's check of its inputs' sizes and strides: the trace's sizes are symbols,
    which these checks (C++ that reads concrete sizes) cannot take."""


def _on_fakes(g: dict) -> None:
    """Make a wrapper module's helpers dispatch (so that the trace's modes see them): its
    C++ fast paths build tensors that no mode sees."""
    g["empty_strided_cuda"] = lambda size, stride, dtype: torch.empty_strided(
        size, stride, dtype=dtype, device="cuda")
    g["reinterpret_tensor"] = lambda t, size, stride, offset=0: torch.as_strided(
        t, size, stride, offset)
    for name in [n for n in g if n.startswith("assert_") and callable(g[n])]:
        g[name] = _no_check  # assert_size_stride, assert_tensor_metadata, ...: C++ sizes
    if "copy_if_misaligned" in g:
        g["copy_if_misaligned"] = lambda t: t


def module_path(node) -> str | None:
    """The module path (as ``named_modules`` gives it, from the compiled module) of the
    forward code an FX node of a compiled graph came from: dynamo's ``nn_module_stack``
    (``"L['self'].transformer.h[0].attn"``), which AOTAutograd copies to each backward node
    as ``fwd_nn_module_stack``; None when the node has neither (the loss, the graph's
    glue).

    >>> import types
    >>> module_path(types.SimpleNamespace(meta={"nn_module_stack": {
    ...     "a": ("L['self']", object), "b": ("L['self'].h[0]._modules['mlp']", object)}}))
    'h.0.mlp'
    """
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    path = str(list(stack.values())[-1][0])
    path = re.sub(r"^L\['self'\]|^L__self__", "", path)
    path = path.replace(".__dict__['_modules']", "._modules")  # (a wrapper compiled in place)
    path = re.sub(r"\._modules\['([^']*)'\]|\['([^']*)'\]|\[(\d+)\]",
                  lambda m: "." + next(x for x in m.groups() if x is not None), path)
    return path.strip(".")


class Lines:
    """Module paths of the lines of the wrappers inductor wrote: inductor marks where each
    fused node's code begins (``wrapper_code.line_map``: line, the node's last FX origin),
    so what a line allocates (a buffer, a library call's output and workspace) belongs to
    the module of the mark before it (:meth:`running`, ``Recorder.running``)."""

    def __init__(self):
        self.files = {}

    def add(self, file: str, line_map) -> None:
        # (a line may hold two marks, one of them of no module: the unknown first)
        marks = sorted(((line, module_path(node)) for line, node in line_map
                        if hasattr(node, "meta")), key=lambda m: (m[0], m[1] or ""))
        self.files[file] = ([m[0] for m in marks], [m[1] for m in marks])

    def running(self, file: str):
        """``() -> module path``: the module of the line the wrapper in ``file`` is running
        (the wrapper's frame found on the stack; None outside it or where nothing is known):
        what the line allocates counts for it, its buffers (``empty_strided_cuda``) and its
        library calls' outputs and workspaces (``extern_kernels.mm``, cuBLAS's)."""
        got = self.files.get(file)
        if got is None:
            return None
        lines, paths = got

        def module() -> str | None:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename != file:
                frame = frame.f_back
            if frame is None:
                return None
            k = bisect.bisect_right(lines, frame.f_lineno) - 1
            return paths[k] if k >= 0 else None
        return module


def part_running(rec) -> str | None:
    """The path of the part compiled on its own whose graph runs (its module's names,
    ``_orig_mod`` within a ``torch.compile(block)``: :mod:`fxmem.trace.compiled.parts`): in
    its forward, the part called; in backward, the part whose forward made the autograd node
    running; None for a model compiled whole."""
    if rec.part is not None:
        return rec.part
    node = torch._C._current_autograd_node()
    return None if node is None else rec.part_nodes.get(node._sequence_nr())


def below(part: str | None, running):
    """``running`` (:meth:`fxmem.trace.compiled.inductor.Lines.running`'s, a path within
    the compiled module, or None) as a path in the model, below ``part``: the part's own
    where no line is marked."""
    if not part:
        return running

    def module():
        path = None if running is None else running()
        return f"{part}.{path}" if path else part
    return module


@contextlib.contextmanager
def inductor_on_fakes(modes: list, compile, rec):
    """While the trace runs: each graph inductor compiled runs its wrapper under ``modes``
    (the trace's dispatch modes, outermost first, as :func:`modes_suspended` took them off;
    a graph that runs under modes already, the backward's, keeps those) with its kernel
    launches doing nothing.
    Inductor's settings for this: both graphs lowered before the step runs, one compile
    thread, no FX-graph or AOTAutograd cache (a cached graph may have been compiled at another
    size hint), and ``compile``'s partitioner budget
    (:class:`fxmem.trace.compiled.options.Compile`). Joint-graph constant folding stays on, as
    in a real run: it makes the constants it folds for real on the device, with the fake mode
    off (a few bytes), and without it the joint graph differs from a real run's, and so,
    under a partitioner budget below 1.0, does the backward's order (GPT-2 small at 0.5:
    3,146,240 B over at B=2). ``rec``: the trace's recorder, in which what a wrapper
    allocates counts for the module its code came from (:class:`Lines`). Everything is
    restored on exit."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor.graph import GraphLowering
    from torch._inductor.output_code import CompiledFxGraph
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    original_call, original_run = CompiledFxGraph.__call__, CachingAutotuner.run
    original_lines = GraphLowering._compile_to_module_lines
    lines, estimates = Lines(), {}  # wrapper file -> inductor's estimate of its peak

    def compile_lines(self, wrapper_code):
        mod = original_lines(self, wrapper_code)
        lines.add(mod.__file__, wrapper_code.line_map)
        estimates[mod.__file__] = own_estimate(self)
        return mod

    def call(self, inputs):
        g = _wrapper_globals(self)
        _on_fakes(g)
        with contextlib.ExitStack() as stack:
            active = {id(m) for m in _get_current_dispatch_mode_stack()}
            if not any(id(m) in active for m in modes):
                for m in modes:
                    stack.enter_context(m)
            before = rec.running  # a part's lines below its path (compiled.parts)
            rec.running = below(part_running(rec), lines.running(g.get("__file__")))
            first, phase = len(rec.ops), rec.phase
            try:
                return original_call(self, inputs)
            finally:
                rec.running = before
                rec.graph_runs.append(GraphRun(phase, first, len(rec.ops) - 1,
                                               estimates.get(g.get("__file__"))))

    def run(self, *args, **kwargs):  # a fused kernel's launch: nothing to allocate
        return None

    settings = dict(compile_threads=1,
                    fx_graph_cache=False, fx_graph_remote_cache=False)
    lazy = {"force_non_lazy_backward_lowering": True} \
        if hasattr(functorch_config, "force_non_lazy_backward_lowering") else {}
    lazy.update(enable_autograd_cache=False, enable_remote_autograd_cache=False)
    budget = compile.settings() if compile is not None else contextlib.nullcontext()
    with inductor_config.patch(settings), functorch_config.patch(lazy), budget:
        CompiledFxGraph.__call__, CachingAutotuner.run = call, run
        GraphLowering._compile_to_module_lines = compile_lines
        try:
            yield
        finally:
            CompiledFxGraph.__call__, CachingAutotuner.run = original_call, original_run
            GraphLowering._compile_to_module_lines = original_lines


def own_estimate(graph) -> int | None:
    """Inductor's own estimate of the peak of the graph ``graph`` (a ``GraphLowering``)
    emitted: ``torch._inductor.memory.prepare_planning_info`` on its scheduler's nodes in
    their final order, what ``reorder_for_peak_memory`` weighs (the buffers it allocates
    and the graph inputs it frees, at its size hints), in bytes; None when this release
    has no such estimate or it fails."""
    try:
        from torch._inductor.memory import prepare_planning_info
        from torch.utils._ordered_set import OrderedSet

        sched = graph.scheduler
        peak, _ = prepare_planning_info(
            list(sched.nodes), sched.name_to_buf, sched.name_to_fused_node,
            OrderedSet(graph.graph_inputs.keys()), OrderedSet(graph.get_output_names()))
        return int(peak)
    except Exception:  # noqa: BLE001 - an estimate shown beside fxmem's, never needed
        return None


def _breaks() -> dict:
    from torch._dynamo.utils import counters

    return dict(counters["graph_break"])


@contextlib.contextmanager
def modes_suspended(out: list):
    """The dispatch modes taken off while a compiled model is called (dynamo captures with
    none active); ``out`` receives them, outermost first. The eager code between the graphs
    of a model with graph breaks would run with them off, unseen: a graph break raises
    :class:`fxmem.TraceError` naming dynamo's reason."""
    from torch.nn.modules import module
    from torch.utils._python_dispatch import _disable_current_modes, _pop_mode

    hooks = (module._global_forward_pre_hooks, module._global_forward_hooks)
    saved = [dict(h) for h in hooks]
    for h in hooks:  # the trace's module hooks: not inside a captured graph
        h.clear()
    before = _breaks()
    try:
        with _disable_current_modes() as old:
            out[:] = list(reversed(old))
            try:
                yield
            except FxmemError:
                raise
            except Exception as e:  # noqa: BLE001 - one line, and the trace's modes back
                while torch._C._len_torch_dispatch_stack():  # left by the failed call
                    _pop_mode()
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise TraceError(f"the compiled model does not run on the trace's fake "
                                 f"tensors: {type(e).__name__}: {first[:200]}") from e
    finally:
        for h, s in zip(hooks, saved):
            h.update(s)
    new = [why for why, n in _breaks().items() if n > before.get(why, 0)]
    if new:
        first = " ".join(str(new[0]).split())
        raise TraceError(f"the compiled model has a graph break ({first[:160]}): fxmem traces "
                         "compiled models whole (torch.compile(model, fullgraph=True) shows "
                         "where it breaks)")
