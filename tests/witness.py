"""An independent witness of a real eager step's memory: the ground truth under
``fxmem.measure``, sharing no code with ``fxmem``.

``fxmem.measure`` observes a real step with the same storage tracker the trace is built on
(``fxmem.trace.ledger.tracking``), so a mistake in that tracker (say, taking an op apart that the
dispatcher runs whole) would be made by the prediction and its check together. This module
imports nothing from ``fxmem``: a plain ``TorchDispatchMode`` that only counts the storages
the ops it is handed return (and ``UntypedStorage.resize_``), each live until eager PyTorch
frees it (``weakref.finalize``). It never re-dispatches, runs no Python dispatcher, applies
no kernel rule; the step is run by its own loop (:func:`witness_step`), the training loop of
the PyTorch recipes: zero_grad, forward and loss under autocast, (scaled) backward, step.

What it cannot see, by construction, and the one place it may differ from ``measure``: an
op that reaches a dispatch mode whole although its kernel is a composite (only under
``torch.inference_mode``, where autograd's keys are excluded: ``aten.lstm.input``), whose
C++ body then allocates inside the op. :attr:`Witness.opaque` names every such op it saw.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


class Witness(TorchDispatchMode):
    """Live bytes of the storages made while it is active, on top of ``baseline`` tensors'.

    ``peak_bytes``: the most bytes live at once (after an op's outputs are made, before
    later frees); ``ops``: the op names seen, in order; ``opaque``: ops seen whole whose
    kernel is a composite (their insides are not seen, see the module docstring)."""

    def __init__(self, baseline=()):
        super().__init__()
        self._seen = WeakIdKeyDictionary()  # storage -> its bytes when made
        self.live = 0
        self.ops: list[str] = []
        self.opaque: list[str] = []
        for t in baseline:
            self._add(t.untyped_storage())
        self.baseline_bytes = self.live
        self.peak_bytes = self.live
        self._on = True
        self._resize = None

    def _add(self, st) -> bool:
        if st in self._seen or st.device.type == "meta":
            return False
        n = st.nbytes()
        self._seen[st] = n
        self.live += n
        weakref.finalize(st, self._gone, n)
        return True

    def _gone(self, n: int) -> None:
        if self._on:
            self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func)
        self.ops.append(name)
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                          "CompositeImplicitAutograd") \
                and not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CPU"):
            self.opaque.append(name)
        made = [self._add(t.untyped_storage()) for t in tree_leaves(out)
                if isinstance(t, torch.Tensor)]
        if any(made):
            self.peak_bytes = max(self.peak_bytes, self.live)
        return out

    def __enter__(self):
        base = torch.UntypedStorage.resize_
        witness = self

        def resize_(st, size):  # FSDP2 frees and re-makes parameter storages in place
            old = st.nbytes()
            out = base(st, size)
            if witness._on and st.nbytes() != old:
                witness.live += st.nbytes() - old
                witness._seen[st] = st.nbytes()
                witness.peak_bytes = max(witness.peak_bytes, witness.live)
            return out

        self._resize = base
        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        out = super().__exit__(*exc)
        self._on = False
        return out


def tiled(t: torch.Tensor, b: int) -> torch.Tensor:
    """``t`` with dim 0 made ``b`` long by repeating its rows (labels and ids stay valid)."""
    idx = torch.arange(b) % t.shape[0]
    return t[idx].contiguous()


def _loss(out, targets, loss):
    if loss is not None:
        return loss(out, *targets)
    if isinstance(out, torch.Tensor):
        return out
    return out["loss"] if isinstance(out, dict) else out.loss


@contextlib.contextmanager
def _collector_skips_older_objects():
    """The objects made before the block frozen out of the cyclic collector for it
    (``gc.freeze``, undone after, unless the caller froze some already): a full collection
    inside then walks only what the block made, not every object of torch and the test
    process (about a second each time); frozen garbage is not collected, so it frees
    nothing inside. (fxmem has its own such block; the witness shares no code with it.)"""
    freeze = not gc.get_freeze_count()
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        if freeze:
            gc.unfreeze()


@_collector_skips_older_objects()
def witness_step(model, inputs, targets=(), loss=None, optimizer=None, *, B: int,
                 train: bool = True, inference_mode: bool = False, amp=None,
                 set_to_none: bool = True, grad_accum: int = 1, also=None) -> Witness:
    """One steady-state step of ``model`` (a deep copy) at batch size ``B`` on the CPU, as
    a training loop runs it after its first step, witnessed. ``optimizer``: a factory of
    the parameters; ``amp``: a dtype for ``torch.autocast`` (float16 goes through a
    ``torch.amp.GradScaler``, as the recipe says); ``also``: another context manager the
    witnessed step runs inside (``torch.profiler.profile``, a third witness). Its full
    collection before the witnessed step skips the objects made before the call."""
    model = copy.deepcopy(model)
    xs = [tiled(x, B) for x in inputs]
    ys = [tiled(y, B) for y in targets]
    params = [p for p in model.parameters()]
    opt = optimizer(params) if optimizer is not None and train else None
    scaler = torch.amp.GradScaler("cpu") if amp == torch.float16 and opt is not None else None

    def autocast():
        return torch.autocast("cpu", dtype=amp, enabled=amp is not None)

    def step():
        if not train:
            with torch.inference_mode() if inference_mode else torch.no_grad(), autocast():
                return model(*xs)
        if opt is not None:
            opt.zero_grad(set_to_none=set_to_none)
        else:
            for p in params:
                p.grad = None
        for _ in range(grad_accum):
            with autocast():
                loss_value = _loss(model(*xs), ys, loss)
            if grad_accum > 1:
                loss_value = loss_value / grad_accum
            (scaler.scale(loss_value) if scaler is not None else loss_value).backward()
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        elif opt is not None:
            opt.step()
        return loss_value

    for _ in range(8):  # the first step makes the optimizer's state; a skipped one does not
        scale = scaler.get_scale() if scaler is not None else None
        del_out = step()
        del del_out
        if scaler is None or scaler.get_scale() >= scale:
            break
    if train and set_to_none:
        for p in params:
            p.grad = None
    gc.collect()
    state = [t for t in tree_leaves(opt.state_dict()["state"]) if isinstance(t, torch.Tensor)] \
        if opt is not None else []
    grads = [p.grad for p in params if p.grad is not None]
    kept = [*params, *model.buffers(), *state, *grads, *xs, *ys]
    if scaler is not None:
        kept += [scaler._scale, scaler._growth_tracker]
    w = Witness(kept)
    del kept, state, grads
    with also if also is not None else contextlib.nullcontext(), w:
        out = step()
        del out
    return w
