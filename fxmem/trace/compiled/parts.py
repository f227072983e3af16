"""Blocks compiled on their own: ``torch.compile(block)`` put in the model, or
``block.compile()`` (torchtitan compiles each transformer block so).

Each such part is lowered as a model compiled whole is (:mod:`fxmem.trace.compiled.inductor`):
its call takes the trace's dispatch modes off while dynamo captures it, and its graphs' wrappers
run under them again; the eager code between the parts runs under the modes as any step's.
What a part's graphs allocate counts for the module its code came from, below the part's path.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._pytree import tree_leaves

from .inductor import check_compilable


def compiled_parts(model) -> list:
    """``(path, module)`` of each module of ``model`` compiled on its own, outermost first
    (none inside another): an ``OptimizedModule`` below the model, or a module compiled in
    place (``block.compile()``, ``model.compile()``: path ``""``).

    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> m[0].compile()
    >>> [p for p, _ in compiled_parts(m)]
    ['0']
    """
    from torch._dynamo.eval_frame import OptimizedModule

    if not isinstance(model, torch.nn.Module):
        return []
    top = model._orig_mod if isinstance(model, OptimizedModule) else model
    out = []
    for name, m in top.named_modules():
        if any(name.startswith(p + ".") or p == "" for p, _ in out):
            continue  # inside a part: lowered with it
        if (isinstance(m, OptimizedModule) and m is not model) or \
                getattr(m, "_compiled_call_impl", None) is not None:
            out.append((name, m))
    return out


def named_parts(parts: list) -> str:
    """The parts as a sentence's subject: "module 0 (and 1 more) is compiled on its own"
    (``parts``: ``(path, module)`` pairs, or the paths alone)."""
    parts = [p if isinstance(p, tuple) else (p, None) for p in parts]
    if parts[0][0] == "":
        return "the model is compiled in place (model.compile())"
    more = f" (and {len(parts) - 1} more)" if len(parts) > 1 else ""
    return f"module {parts[0][0]}{more} is compiled on its own"


def check_parts(model, checkpoint, parallel, spec) -> None:
    """Raise :class:`fxmem.InputError`, in one line, for what is not modelled of a model
    with parts compiled on their own: parts inside a model compiled whole (they would run
    eagerly under its fake tensors), on the CPU (inductor's CPU code), under a checkpoint
    plan but over whole parts (``torch.compile(block)`` or ``block.compile()``)
    (:func:`fxmem.trace.plans.checkpointing.check_parts_plan`) on one GPU or a strategy whose
    ``runs_planned_parts`` is True (FSDP2, HSDP, DDP, TP, FSDP2 x TP),
    a strategy whose ``runs_compiled_parts`` is False (DDP's ``static_graph``),
    or ``compile=`` (which compiles the model whole); a model compiled whole under an
    eager checkpoint plan or a strategy; and ``compile=`` under a strategy where its blocks
    compiled in place are not modelled (:func:`_check_compile_option`; ``spec``: the
    step's, for ``compile=``).

    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> m[0] = torch.compile(m[0])
    >>> try:
    ...     check_parts(torch.compile(m), None, None, None)
    ... except Exception as e:
    ...     print(str(e).split(":")[0])
    module 0 is compiled on its own inside a model compiled whole
    """
    from torch._dynamo.eval_frame import OptimizedModule

    from ...errors import InputError

    if parallel is not None and isinstance(model, OptimizedModule):
        raise InputError(f"the model is compiled whole under {_name(parallel)}: not "
                         "modelled yet; under FSDP2, DDP, TP and FSDP2 x TP its blocks compiled "
                         "on their own (torch.compile(block) put back in the model, or "
                         "compile= on the model itself) are")
    if parallel is not None and spec is not None and spec.compile is not None:
        _check_compile_option(model, parallel)
        return
    if isinstance(model, OptimizedModule):
        inner = compiled_parts(model._orig_mod)
        if inner:
            raise InputError(f"{named_parts(inner)} inside a model compiled whole: fxmem lowers "
                             "either the model compiled whole or its parts compiled on their "
                             "own; under the whole model's fake tensors the parts would run "
                             "eagerly")
        if checkpoint:
            raise InputError("the model is compiled whole (torch.compile(model)): eager "
                             "checkpoint plans over its compiled code are not modelled; its "
                             "plans are torch.compile's partitioner budgets (compile="
                             "{'activation_memory_budget': ...} on the model itself)")
        return
    parts = compiled_parts(model)
    if not parts:
        return
    what = named_parts(parts)
    if spec is not None and spec.device != "cuda":
        raise InputError(f"{what}: a compiled model (torch.compile) is traced on "
                         "device='cuda' only: inductor's CPU code is not modelled")
    if spec is not None and spec.compile is not None:
        raise InputError(f"{what}: compile= compiles the model whole; pass the model "
                         "without compile= (its parts' partitioner budget is "
                         "torch._functorch.config.activation_memory_budget)")
    if checkpoint and parallel is not None and not getattr(
            parallel, "runs_planned_parts", lambda: False)():  # (a Strategy's)
        raise InputError(f"{what}: checkpoint plans over parts compiled on their own under "
                         f"{_name(parallel)} are not modelled yet (on one GPU, under FSDP2 "
                         "and HSDP, CPU offload included, TP, FSDP2 x TP and DDP without "
                         "static_graph, they are)")
    if parallel is not None:
        _check_sharded(parts, parallel, what)


def check_lowerable(model, spec) -> None:
    """A parallel step with blocks compiled (``compile=``, or parts the user compiled):
    :func:`fxmem.trace.compiled.inductor.check_compilable` for ``spec``'s device, before any
    rank is wrapped, after the checks of what is modelled (:func:`check_parts`, the plan's)."""
    if spec.compile is not None or compiled_parts(model):
        check_compilable(spec.device)


def _check_compile_option(model, parallel) -> None:
    """``compile=`` under ``parallel``: its ``compile_blocks`` (the model's repeated blocks)
    each compiled in place (:meth:`fxmem.trace.compiled.options.Compile.blocks`) on a
    strategy that runs parts compiled on their own; else an :class:`fxmem.InputError` in one
    line. (A plan over those blocks is checked as over blocks compiled in place:
    :func:`fxmem.trace.plans.checkpointing.normalize_plan`.)"""
    from ...errors import InputError

    name = _name(parallel)
    parts = compiled_parts(model)
    if parts:
        raise InputError(f"{named_parts(parts)}: compile= under {name} compiles each of the "
                         "model's blocks itself; pass the model without compiled parts, or "
                         "without compile=")
    if not getattr(parallel, "runs_compiled_parts", lambda: False)():  # (a Strategy's)
        raise InputError(f"compile= under {name}: not modelled yet (under FSDP2 and HSDP, "
                         "CPU offload included; TP; FSDP2 x TP; DDP without static_graph, "
                         "it is)")
    if not parallel.compile_blocks(model):
        raise InputError(f"compile= under {name} compiles each of the model's repeated "
                         "blocks (a ModuleList or Sequential of modules of one class), and "
                         "this model has none: compile its parts yourself (torch.compile("
                         "block) put back in the model)")


def _check_sharded(parts: list, parallel, what: str) -> None:
    """Parts under ``parallel``: modelled under FSDP2 and HSDP (CPU offload included), TP,
    FSDP2 x TP (HSDP and CPU offload too) and DDP (ZeRO-1 included, not with
    ``static_graph``), each part a ``torch.compile(block)`` put in the model (as torchtitan
    did, then ``fully_shard``: FSDP2's hooks run eagerly around the compiled block) or a
    block compiled in place; else an :class:`fxmem.InputError` in one line."""
    from torch._dynamo.eval_frame import OptimizedModule

    from ...errors import InputError

    name = _name(parallel)
    if not getattr(parallel, "runs_compiled_parts", lambda: False)():  # (a Strategy's)
        raise InputError(f"{what}: parts compiled on their own under {name} are not "
                         "modelled yet (under FSDP2 and HSDP, CPU offload included; TP; "
                         "FSDP2 x TP; DDP without static_graph, ZeRO-1 included, they are)")
    if parts[0][0] == "":
        raise InputError(f"the model is compiled in place (model.compile()) under {name}: "
                         "not modelled yet; its blocks compiled on their own "
                         "(block.compile(), or torch.compile(block) put back) are")
    unknown = [p for p, m in parts
               if not isinstance(m, OptimizedModule) and in_place_context(m) is None]
    if unknown:  # (a _compiled_call_impl set by other code than Module.compile)
        raise InputError(f"module {unknown[0]} is compiled in place, not by "
                         f"module.compile(): under {name} fxmem models blocks compiled by "
                         "block.compile() or torch.compile(block) put back in the model")


def in_place_context(module):
    """The dynamo context ``module.compile()`` wrapped the module's call in (its backend and
    options), found in the compiled call's closure, or None.

    >>> m = torch.nn.Linear(2, 2)
    >>> m.compile(dynamic=True)
    >>> type(in_place_context(m)).__name__
    'OptimizeContext'
    """
    from torch._dynamo.eval_frame import _TorchDynamoContext

    call = getattr(module, "_compiled_call_impl", None)
    for cell in getattr(call, "__closure__", None) or ():
        if isinstance(cell.cell_contents, _TorchDynamoContext):
            return cell.cell_contents
    return None


def _name(parallel) -> str:
    return getattr(parallel, "name", type(parallel).__name__)


@contextlib.contextmanager
def parts_lowered(parts: list, taken: list, rec, hooked: bool = False,
                  planned: dict | None = None):
    """While the trace runs: each part's call runs with the trace's modes off
    (:func:`fxmem.trace.compiled.inductor.modes_suspended`, ``taken`` receiving them), and
    its graphs' lines count below the part's path (:func:`part_running`). Everything is
    restored on exit.

    ``hooked``: the model is a rank's, wrapped by FSDP2, whose hooks are on the blocks: a
    block compiled in place (``block.compile()``) runs them inside its compiled call, where
    dynamo runs them eagerly (they are ``torch._dynamo.disable``d: graph breaks around its
    forward's graph). The trace records them as it records any eager op: the block's call
    runs uncompiled, its hooks under the modes, and its ``forward`` compiled by the same
    dynamo context (backend and options), as ``torch.compile(block)`` put back in the model
    runs it. (On the fake GPU, the two ways of compiling measure the same, tests/
    test_fake_gpu_parallel.py.)

    ``planned``: path -> what runs instead, for the parts the checkpoint plan holds:
    ``torch.compile(checkpoint_wrapper(block))`` for ``torch.compile(block)``, the compiled
    call of ``checkpoint_wrapper(block)`` compiled in place for ``block.compile()``
    (:func:`fxmem.trace.plans.checkpointing.checkpointed_call`), whose checkpoint dynamo
    captures into its graphs (the partitioner re-runs the block's forward in the backward
    graph)."""
    from torch._dynamo.eval_frame import OptimizedModule

    from .inductor import modes_suspended

    def lowered(fn, path):
        def call(*args, **kwargs):
            before, rec.part = rec.part, path
            try:
                with modes_suspended(taken):
                    out = fn(*args, **kwargs)
            finally:
                rec.part = before
            for t in tree_leaves(out):  # its backward's graph: found by its autograd node
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    _mark(t.grad_fn, path, rec.part_nodes)
            return out
        return call

    undo = []
    try:
        for path, m in parts:
            if isinstance(m, OptimizedModule):
                attr, inner = "forward", f"{path}._orig_mod".lstrip(".")
                call = (planned or {}).get(path, m.forward)
            elif hooked:  # its call uncompiled, its forward compiled as the call was
                call = (planned or {}).get(path) or in_place_context(m)(m.forward)
                undo.append((m, "_compiled_call_impl", True, m._compiled_call_impl))
                object.__setattr__(m, "_compiled_call_impl", None)
                attr, inner = "forward", path
            else:
                attr, inner = "_compiled_call_impl", path
                call = (planned or {}).get(path, m._compiled_call_impl)
            undo.append((m, attr, attr in m.__dict__, m.__dict__.get(attr)))
            object.__setattr__(m, attr, lowered(call, inner))
        yield
    finally:
        for m, attr, had, old in reversed(undo):
            if had:
                object.__setattr__(m, attr, old)
            else:
                m.__dict__.pop(attr, None)


def _mark(node, path: str, nodes: dict, depth: int = 4) -> None:
    """AOTAutograd's backward nodes reached from ``node`` within ``depth`` steps (an
    output's view or alias node comes first) -> ``path``."""
    if node is None or depth == 0:
        return
    if type(node).__name__.startswith("CompiledFunction"):
        nodes[node._sequence_nr()] = path
        return
    for nxt, _ in node.next_functions:
        _mark(nxt, path, nodes, depth - 1)
