"""The step being analysed, written once and run by both :mod:`fxmem.trace` (fake tensors)
and :mod:`fxmem.measure` (real tensors), so that Python-level lifetimes are identical.

A training step is, in this order (the idiomatic loop, with the model output not kept in a
variable beyond the loss computation)::

    optimizer.zero_grad(set_to_none=True)      # or set_to_none=False: gradients stay allocated
    for _ in range(grad_accum):                # gradient accumulation: k micro-batches of B
        loss = loss_fn(model(*inputs), *targets)
        if grad_accum > 1:
            loss = loss / grad_accum
        loss.backward()
    optimizer.step()

An inference step is ``out = model(*inputs)`` under ``torch.no_grad()`` (or
``torch.inference_mode()``); ``out`` is kept.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .errors import InputError

PHASES = ("zero_grad", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class StepSpec:
    """Validated user arguments describing the step (no tensors of the batch size kept)."""

    inputs: tuple  # tuple[torch.Tensor, ...]; dim 0 is B
    targets: tuple
    loss: Callable | None
    optimizer: Callable | None
    train: bool
    device: str
    batch_size: int  # dim 0 of the example tensors
    set_to_none: bool = True  # zero_grad drops gradients (False: zeroes them in place)
    grad_accum: int = 1  # micro-batches per optimizer step (B is the micro-batch)
    inference_mode: bool = False  # inference under torch.inference_mode(), not no_grad()
    amp: Any = None  # torch.autocast dtype for the forward and the loss (None: no autocast)


def _as_tuple(x, what: str) -> tuple:
    if x is None:
        return ()
    if isinstance(x, torch.Tensor):
        return (x,)
    if isinstance(x, (list, tuple)):
        return tuple(x)
    raise InputError(f"{what} must be a tensor or a tuple of tensors, got {type(x).__name__}")


def make_spec(model, inputs, targets=(), loss=None, optimizer=None, train=True,
              device="cuda", set_to_none=True, grad_accum=1,
              inference_mode=False, amp=None) -> StepSpec:
    """Check the user's arguments before any work starts."""
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    ins, tgs = _as_tuple(inputs, "inputs"), _as_tuple(targets, "targets")
    if not ins:
        raise InputError("inputs must contain at least one tensor")
    sizes = []
    for what, group in (("inputs", ins), ("targets", tgs)):
        for i, t in enumerate(group):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"{what}[{i}] is a {type(t).__name__}, not a tensor; "
                                 f"pass non-tensor arguments by wrapping the model")
            if t.dim() == 0:
                raise InputError(f"{what}[{i}] is 0-dimensional; dim 0 must be the batch")
            sizes.append((f"{what}[{i}]", int(t.shape[0])))
    if len({s for _, s in sizes}) > 1:
        listing = ", ".join(f"{n}={s}" for n, s in sizes)
        raise InputError(f"dim 0 (the batch) differs between tensors: {listing}")
    if loss is not None and not callable(loss):
        raise InputError(f"loss must be callable(output, *targets), got {type(loss).__name__}")
    if tgs and loss is None:
        raise InputError("targets were given but no loss function to pass them to")
    if optimizer is not None and not callable(optimizer):
        raise InputError("optimizer must be an optimizer class or callable(params) -> Optimizer")
    if device not in ("cpu", "cuda"):
        raise InputError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if not train and optimizer is not None:
        raise InputError("train=False runs no backward pass, so no optimizer step")
    if not isinstance(set_to_none, bool):
        raise InputError(f"set_to_none must be True or False, got {set_to_none!r}")
    if isinstance(grad_accum, bool) or not isinstance(grad_accum, int) or grad_accum < 1:
        raise InputError(f"grad_accum must be a positive int, got {grad_accum!r}")
    if not train and grad_accum != 1:
        raise InputError("train=False runs no backward pass, so nothing to accumulate")
    if inference_mode and train:
        raise InputError("inference_mode=True is for inference: pass train=False too")
    if amp is not None:
        if amp not in (torch.bfloat16, torch.float16):
            raise InputError(f"amp is torch.bfloat16 or torch.float16, got {amp!r}")
        if device != "cpu":
            raise InputError("amp is modelled for device='cpu' (CPU autocast) only; CUDA's "
                             "autocast op lists are not emulated yet")
    return StepSpec(ins, tgs, loss, optimizer, bool(train), device, sizes[0][1], set_to_none,
                    grad_accum, bool(inference_mode), amp)


def compute_loss(out, targets: Sequence, loss_fn: Callable | None) -> torch.Tensor:
    """The loss tensor from the model output, as the training step uses it."""
    if loss_fn is not None:
        return loss_fn(out, *targets)
    if isinstance(out, torch.Tensor):
        if out.dim() != 0 and out.numel() != 1:
            raise InputError("loss=None needs the model to return a scalar loss "
                             f"(or an object with .loss); got shape {tuple(out.shape)}")
        return out
    lossval = getattr(out, "loss", None)
    if lossval is None and isinstance(out, dict):
        lossval = out.get("loss")
    if not isinstance(lossval, torch.Tensor):
        raise InputError("loss=None needs the model to return a scalar loss or an object "
                         f"with .loss; got {type(out).__name__}")
    return lossval


def make_optimizer(factory: Callable, params: list, device: str) -> torch.optim.Optimizer:
    """Build the optimizer the target device would run.

    On CUDA torch.optim defaults to the foreach implementations; under fake CPU tensors it
    cannot tell, so a group whose ``foreach`` is unset is set to True for ``device="cuda"``.
    On CPU the per-parameter loop is the default and nothing is changed.
    """
    opt = factory(params)
    if not isinstance(opt, torch.optim.Optimizer):
        raise InputError(f"optimizer(params) returned {type(opt).__name__}, not an Optimizer")
    if device == "cuda":
        for group in opt.param_groups:
            if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                group["foreach"] = True
    return opt


def _autocast(spec: StepSpec):
    """The autocast region of the step: forward and loss, as the AMP recipe writes it."""
    if spec.amp is None:
        return contextlib.nullcontext()
    return torch.autocast(spec.device, dtype=spec.amp)


def run_step(forward: Callable, spec: StepSpec, inputs: Sequence, targets: Sequence,
             params: Sequence[torch.Tensor], optimizer, on_phase: Callable[[str], Any],
             micro_steps: int | None = None):
    """Run one step; call ``on_phase(name)`` as each phase starts. Returns the kept output.
    ``micro_steps``: forward-backward passes to run (default ``spec.grad_accum``; the
    tracer runs 2, since every micro-step after the first sees the same memory)."""
    if not spec.train:
        on_phase("forward")
        with torch.inference_mode() if spec.inference_mode else torch.no_grad(), _autocast(spec):
            out = forward(*inputs)
        return out
    on_phase("zero_grad")
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=spec.set_to_none)
    else:
        for p in params:
            if spec.set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
    for _ in range(spec.grad_accum if micro_steps is None else micro_steps):
        on_phase("forward")
        with _autocast(spec):
            loss = compute_loss(forward(*inputs), targets, spec.loss)
        if spec.grad_accum > 1:
            loss = loss / spec.grad_accum
        on_phase("backward")
        loss.backward()
    on_phase("optimizer")
    if optimizer is not None:
        optimizer.step()
    return loss
