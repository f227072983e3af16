"""The user's model while a step is traced: its parameters and buffers swapped for fakes one
slot at a time (:func:`slots`), its modules' attributes put back afterwards
(:func:`attributes_kept`), and the buffers its forward assigns (:func:`watch_buffers`,
:class:`BufferAssigned`, :func:`register_buffers`), which make the tracer warm up first;
and the order ``model.to(device)`` places them in (:func:`placement`).
"""

from __future__ import annotations

import collections
import contextlib

import torch
from torch.nn.modules.module import register_module_buffer_registration_hook

from ..plans.checkpointing import user_path

# only these exact types: a subclass may refuse clear() or update() (transformers' ModelOutput)
_CONTAINERS = (dict, collections.OrderedDict, list, set)


@contextlib.contextmanager
def attributes_kept(model: torch.nn.Module):
    """Every submodule's attributes as they were before the trace, restored after it.
    A forward may keep tensors on its module (torchvision's RAFT ``CorrBlock.corr_pyramid``,
    caches of rotary or relative-position tables), or in a dict or list the module holds:
    during the trace those are fake tensors with autograd history, which would stay on the
    user's model and break a later ``copy.deepcopy`` or ``.to()``. An attribute that is a
    plain dict, list or set (``_parameters``, ``_buffers`` and ``_modules`` among them) keeps
    its identity and gets its items back; any other attribute is put back as it was."""
    kept = []
    for m in model.modules():
        attrs = dict(vars(m))
        items = {k: (dict(v) if isinstance(v, dict) else list(v) if type(v) is list
                     else set(v))
                 for k, v in attrs.items() if type(v) in _CONTAINERS}
        kept.append((m, attrs, items))
    try:
        yield
    finally:
        for m, attrs, items in kept:
            now = vars(m)  # compared by identity: a tensor's == is elementwise
            if now.keys() != attrs.keys() or any(now[k] is not v for k, v in attrs.items()):
                now.clear()
                now.update(attrs)
            for k, old in items.items():
                _restore_items(attrs[k], old)


def _restore_items(container, old) -> None:
    """``container`` (a dict, list or set) given back the items ``old`` holds, in place."""
    if isinstance(container, dict):
        if container.keys() != old.keys() or any(container[k] is not v for k, v in old.items()):
            container.clear()
            container.update(old)
    elif isinstance(container, list):
        if len(container) != len(old) or any(a is not b for a, b in zip(container, old)):
            container[:] = old
    elif {id(v) for v in container} != {id(v) for v in old}:
        container.clear()
        container.update(old)


def slots(model: torch.nn.Module, fakes: dict) -> dict:
    """The fake stand-in of each place a parameter or buffer is held, named once: each
    module under its first path. ``fakes``: id of a real tensor -> its fake.

    A module reachable by two paths (timm CoaT's ``crpe1`` is also every serial block's
    ``factoratt_crpe.crpe``) must not be named twice: ``_reparametrize_module(...,
    tie_weights=True)`` swaps each name in turn, so the second name of a shared slot saves
    the fake already put there as its "original", and the restore, in the same order,
    leaves the fake on the user's model (torch/nn/utils/stateless.py,
    ``_untie_named_tensors_map`` then ``NamedMemberAccessor.swap_tensors_dict``; PyTorch
    issue 164759). A parameter tied across two modules is two slots, each named here."""
    out = {}
    for path, m in model.named_modules():
        for d in (m._parameters, m._buffers):
            for k, t in d.items():
                if t is not None and id(t) in fakes:
                    out[f"{path}.{k}" if path else k] = fakes[id(t)]
    return out


class BufferAssigned(Exception):  # a signal to trace again, not an error
    """The traced forward assigns a module's buffer (``self.table = ...``, or
    ``register_buffer``): a cache made on the first call (ConViT's ``rel_indices``), or a
    buffer replaced on every call. ``fxmem.measure``, as training does, runs a step before
    the one it measures, and that step starts from the buffers the one before left, the old
    one freed when the forward replaces it. The tracer holds the buffers it swapped in, so
    it would see neither: it traces again with an unrecorded step first (``warm_up``)."""


def watch_buffers(rec, name_of: dict):
    """A hook (its handle returned) that raises :class:`BufferAssigned` when a module of the
    model (``name_of``: id -> path) assigns a buffer in the recorded forward or backward,
    after noting it as ``rec.assigned`` (a model may catch the exception)."""

    def assigned(mod, name, value):
        if rec.recording and rec.phase in ("forward", "backward") and id(mod) in name_of:
            rec.assigned = f"{name_of[id(mod)]}.{name}"
            raise BufferAssigned(rec.assigned)

    return register_module_buffer_registration_hook(assigned)


def register_buffers(rec, model) -> None:
    """The model's buffers now (its own frame: a loop variable left in the caller's would
    keep the last one alive, and a forward that replaces it would not free it)."""
    for n, b in model.named_buffers():
        rec.register_named(b, "buffer", user_path(n))


def global_forward_hook(hook):
    """``register_module_forward_hook(hook, with_kwargs=True)`` whose handle, removed, also
    drops the hook's with-kwargs flag: PyTorch's own handle leaves it in
    ``_global_forward_hooks_with_kwargs``, so that ``_has_any_global_hook()`` stays true
    after every trace and dynamo warns of global hooks at each later
    ``torch.compile(module)`` call (seen on 2.14.1 and 2.15)."""
    from torch.nn.modules import module
    from torch.utils.hooks import RemovableHandle

    handle = RemovableHandle(module._global_forward_hooks, extra_dict=[
        module._global_forward_hooks_always_called, module._global_forward_hooks_with_kwargs])
    module._global_forward_hooks[handle.id] = hook
    module._global_forward_hooks_with_kwargs[handle.id] = True
    return handle


def _apply_order(module, prefix=""):
    for name, child in module.named_children():
        yield from _apply_order(child, f"{prefix}{name}.")
    for table in (module._parameters, module._buffers):
        for name, t in table.items():
            if t is not None:
                yield prefix + name


def placement(model) -> tuple:
    """The user's names of ``model``'s parameters and buffers in the order
    ``model.to(device)`` moves them (``Module._apply``: each child first, then the module's
    own parameters, then its buffers; a shared one where first met), as ``fxmem.measure``
    places the model on the device (``Trace.placement``)."""
    return tuple(user_path(n) for n in dict.fromkeys(_apply_order(model)))
