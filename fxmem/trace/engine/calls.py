"""Module calls while the step runs: the module each op is in, and what checkpoint re-runs.

The recorder keeps a stack of module paths (``rec.module_stack``); these hooks push and pop
it, and record each forward call as a :class:`~fxmem.trace.ledger.records.ModuleCall` (its
first and last op, the ops its own pre-hooks ran, the storages it was given). The hooks are
global (``register_module_forward_pre_hook``), not per module: a hook on a module is seen
by the model, e.g. ``nn.TransformerEncoderLayer`` turns its fused fast path off when it
has any. :func:`region` and :func:`held` are what the trace gives
:func:`~fxmem.trace.plans.checkpointing.checkpointing`; :func:`loss_wrapper`, the loss
under the ``<loss>`` path.
"""

from __future__ import annotations

import traceback

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.utils._pytree import tree_leaves

from ...errors import FxmemError
from ..compiled import compiled_parts
from ..kernels.datadep import TORCH_AND_FXMEM
from ..ledger.records import ModuleCall
from ..plans.checkpointing import user_path, wrapped_modules
from .messages import caused_by, loss_error, user_frame
from .modstate import global_forward_hook, watch_buffers


class CallHooks:
    """The global module hooks of one trace of ``model`` (recording into ``rec``).

    ``name_of``: id of each module -> its user path. A module inside a
    ``checkpoint_wrapper`` is called by it, under the wrapper's path: one call, the
    wrapper's."""

    def __init__(self, rec, model: torch.nn.Module):
        self.rec = rec
        self.name_of = {id(m): user_path(n) for n, m in model.named_modules()}
        inside = wrapped_modules(model)
        self.call_of = {k: v for k, v in self.name_of.items() if k not in inside}

    def install(self, wrapper: torch.nn.Module, prepared: bool, handles: list,
                watch: bool) -> None:
        """Register the hooks (their handles appended to ``handles``, removed by the trace).

        Global hooks run before a module's own ones: under a parallel wrapping
        (``prepared``: FSDP2's pre-forward all-gather, TP's input redistribution), a
        pre-hook of the module's own, added last, marks where its forward begins, as
        checkpoint (which replaces the forward, the hooks outside it) re-runs it; only on
        modules with pre-hooks already, so no module sees a hook it would not have had, and
        not within a part compiled on its own (TP's linears in a ``torch.compile(block)``):
        dynamo would capture the hook into the part's graph as a side effect on the
        recorder, and within a checkpoint (a plan over the part) refuse it, a graph break
        that ran the block eagerly on its DTensors. The global hooks are off there too
        (:func:`fxmem.trace.compiled.inductor.modes_suspended`).
        ``watch``: a buffer the forward assigns raises
        :class:`~fxmem.trace.engine.modstate.BufferAssigned` (the step is traced again
        after a warm-up step)."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        inside = {id(m) for _, part in compiled_parts(wrapper) for m in part.modules()
                  if m is not part}
        hooked = {id(m): m for m in wrapper.modules()
                  if m._forward_pre_hooks and id(m) not in inside} if prepared else {}
        for m in hooked.values():
            handles.append(m.register_forward_pre_hook(self.began))
        handles.append(register_module_forward_pre_hook(self.enter))
        handles.append(global_forward_hook(self.leave))  # with kwargs; its removal complete
        if watch:
            handles.append(watch_buffers(self.rec, self.name_of))

    def enter(self, mod, args):
        name = self.call_of.get(id(mod))
        if name is not None:
            rec = self.rec
            rec.module_stack.append(name)  # returns None: inputs unchanged
            rec.call_starts.append(rec.op_count)
            rec.forward_starts.pop(len(rec.call_starts), None)

    def leave(self, mod, args, kwargs, out):
        rec = self.rec
        if id(mod) in self.call_of and len(rec.module_stack) > 1:
            name = rec.module_stack.pop()  # returns None: output unchanged
            inner = rec.forward_starts.pop(len(rec.call_starts), None)
            start = rec.call_starts.pop() if rec.call_starts else rec.op_count
            if rec.phase == "forward" and name:
                hook_ops = inner - start if inner is not None and inner >= start else 0
                rec.calls.append(ModuleCall(name, start, rec.op_count - 1, hook_ops,
                                            given(rec, args, kwargs)))

    def began(self, mod, args):  # after the module's own pre-hooks (FSDP2's all-gather):
        if id(mod) in self.call_of:  # the ops before this are not its forward's (not re-run)
            self.rec.forward_starts[len(self.rec.call_starts)] = self.rec.op_count


def given(rec, args, kwargs) -> tuple:
    """Storages of the tensors a module's forward was given (checkpoint holds them all,
    read or not); a tensor with no storage of its own (sparse, nested) is left out."""
    sids = set()
    for t in tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            try:
                sids.add(rec.sid(t))
            except (RuntimeError, NotImplementedError):
                continue
    return tuple(sorted(sids - {None}))


def region(rec):
    """What checkpoint runs for a region at ``path``, and re-runs in backward: in backward,
    under the region's path and counted as recomputation."""
    def wrap(path, fn):
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
    return wrap


def held(rec):
    """An output selective checkpointing keeps for backward: saved, as by autograd."""
    def hold(t):
        sid = rec.sid(t) if rec.recording else None
        if sid is not None:
            rec.saved.add(sid)
    return hold


def loss_wrapper(rec, loss):
    """``loss`` run under the ``<loss>`` path; an error it raises inside torch
    (:func:`in_torch`) becomes one line naming the loss and the user's source line."""
    def run(out, *tgs):
        rec.module_stack.append("<loss>")
        try:
            return loss(out, *tgs)
        except Exception as e:
            if not in_torch(e):
                raise
            raise loss_error(e, loss, out, tgs, rec, user_frame(
                traceback.extract_tb(e.__traceback__))) from e
        finally:
            rec.module_stack.pop()
    return run


def in_torch(e: Exception) -> bool:
    """Did ``e`` come from torch's code (a loss's kernel or shape check), not from a
    value or guard fxmem handles, nor from the user's own code?"""
    frames = traceback.extract_tb(e.__traceback__)
    return (not isinstance(e, FxmemError) and not caused_by(e, GuardOnDataDependentSymNode)
            and bool(frames) and frames[-1].filename.startswith(TORCH_AND_FXMEM))
