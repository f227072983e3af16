"""The step being analysed, written once and run by both :mod:`fxmem.trace` (fake tensors)
and :mod:`fxmem.validate.measure` (real tensors), so that Python-level lifetimes are identical.

A training step is, in this order (the idiomatic loop, with the model output not kept in a
variable beyond the loss computation)::

    optimizer.zero_grad(set_to_none=True)      # or set_to_none=False: gradients stay allocated
    for _ in range(grad_accum):                # gradient accumulation: k micro-batches of B
        with torch.autocast(device, dtype=amp):    # when amp is set
            loss = loss_fn(model(*inputs), *targets)
        if grad_accum > 1:
            loss = loss / grad_accum
        scaler.scale(loss).backward()          # with a GradScaler; else loss.backward()
    scaler.step(optimizer); scaler.update()    # with a GradScaler; else optimizer.step()

With ``zero_grad_at="backward"`` the ``zero_grad`` moves to just before the first backward,
after the first micro-batch's forward, as Lightning's automatic optimization runs it (its
closure: ``training_step``, ``zero_grad``, ``backward``;
``lightning/pytorch/loops/optimization/automatic.py``): the previous step's gradients are
live through that forward.

An inference step is ``out = model(*inputs)`` under ``torch.no_grad()`` (or
``torch.inference_mode()``); ``out`` is kept.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Sequence

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_true

from ...errors import InputError
from ..compiled.options import Compile
from ..kernels.dtypes import AMP, accepted, dtype_of
from .messages import check_call, mixed_foreach

PHASES = ("zero_grad", "forward", "backward", "optimizer")


class _Unset:
    """A keyword argument not given: the :class:`Step`'s value (or its default) stands."""

    def __repr__(self):
        return "<from step>"


UNSET = _Unset()


@dataclass(frozen=True)
class Step:
    """How the step runs: the training-loop options, validated once. :func:`fxmem.analyze`,
    :func:`fxmem.measure`, :func:`fxmem.whatif`, :func:`fxmem.plan_checkpoints` and the
    ``fxmem`` command take one as ``step=`` or build it from the same keyword arguments
    (:meth:`of`), so an option is added here only.

    ``loss(output, *targets)``; ``None``: the output is the loss or has ``.loss``.
    ``optimizer``: an optimizer class or ``callable(params)``; ``None``: no optimizer step.
    ``train=False``: inference under ``torch.no_grad()`` (``inference_mode=True``: under
    ``torch.inference_mode()``). ``device``: ``"cuda"`` (CUDA's kernels, optimizer defaults
    and allocator blocks) or ``"cpu"`` (live bytes). ``set_to_none=False``: ``zero_grad``
    zeroes gradients in place, so they stay allocated between steps. ``grad_accum=k``: k
    forward-backward passes on micro-batches of B (loss divided by k) before one optimizer
    step. ``amp=torch.bfloat16`` (or float16, or a name: ``"bf16"``, ``"fp16"``, ...): forward
    and loss under ``torch.autocast``. ``grad_scaler``: through a ``torch.amp.GradScaler``;
    ``None`` (the default): with ``amp=torch.float16`` and an optimizer, as the AMP recipe
    does (:attr:`scaled`).
    ``compute_capability``: the GPU whose kernels ``device="cuda"`` follows,
    ``(major, minor)`` or a number such as ``8.0`` (default ``(9, 0)``, an H100).
    ``zero_grad_at``: ``"start"`` (before the first forward) or ``"backward"`` (after the
    first micro-batch's forward, before its backward: Lightning's order, the previous step's
    gradients live through that forward). ``backward_copy=True``: backward runs on a new
    tensor, ``loss / 1``, freed after it, the loss kept (accelerate's
    ``Accelerator.backward``, which divides by its own accumulation steps, 1 under the
    Hugging Face Trainer). ``compile=True`` (or a dict: ``activation_memory_budget``,
    ``mode``, ``options``): the model compiled with ``torch.compile``
    (:mod:`fxmem.trace.compiled.options`); under a parallel strategy, each of its repeated
    blocks compiled in place before the strategy wraps it, as torchtitan does.

    >>> import torch
    >>> s = Step(optimizer=torch.optim.AdamW, amp=torch.float16)
    >>> s.scaled, s.device, Step(compute_capability=8.0).compute_capability
    (True, 'cuda', (8, 0))
    >>> Step.of(s, device="cpu", grad_accum=4).grad_accum
    4
    >>> Step(grad_accum=0)
    Traceback (most recent call last):
    ...
    fxmem.errors.InputError: grad_accum must be a positive int, got 0
    """

    loss: Callable | None = None
    optimizer: Callable | None = None
    train: bool = True
    device: str = "cuda"
    set_to_none: bool = True
    grad_accum: int = 1
    inference_mode: bool = False
    amp: Any = None
    grad_scaler: bool | None = None
    compute_capability: tuple = (9, 0)
    zero_grad_at: str = "start"
    backward_copy: bool = False
    compile: Any = None

    def __post_init__(self):
        from ..kernels.cuda.kernels import check_capability

        if self.loss is not None and not callable(self.loss):
            raise InputError("loss must be callable(output, *targets), got "
                             f"{type(self.loss).__name__}")
        if isinstance(self.loss, type) and issubclass(self.loss, torch.nn.Module):
            raise InputError(f"loss is the class {self.loss.__name__}: pass an instance, "
                             f"{self.loss.__name__}()")
        if self.optimizer is not None and not callable(self.optimizer):
            raise InputError("optimizer must be an optimizer class or callable(params) -> "
                             "Optimizer" + (" (an optimizer made for other parameters: pass "
                                            "its class, or lambda p: Adam(p, lr=...))"
                                            if isinstance(self.optimizer, torch.optim.Optimizer)
                                            else f", got {self.optimizer!r}" + (
                                                " (a name: pass the class, e.g. "
                                                "torch.optim.Adam)" if isinstance(
                                                    self.optimizer, str) else "")))
        if self.device not in ("cpu", "cuda"):
            raise InputError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if not self.train and self.optimizer is not None:
            raise InputError("train=False runs no backward pass, so no optimizer step")
        if not isinstance(self.set_to_none, bool):
            raise InputError(f"set_to_none must be True or False, got {self.set_to_none!r}")
        if not isinstance(self.backward_copy, bool):
            raise InputError(f"backward_copy must be True or False, got {self.backward_copy!r}")
        if self.zero_grad_at not in ("start", "backward"):
            raise InputError(f"zero_grad_at must be 'start' or 'backward', got "
                             f"{self.zero_grad_at!r}")
        g = self.grad_accum
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise InputError(f"grad_accum must be a positive int, got {g!r}")
        if not self.train and g != 1:
            raise InputError("train=False runs no backward pass, so nothing to accumulate")
        if self.inference_mode and self.train:
            raise InputError("inference_mode=True is for inference: pass train=False too")
        if isinstance(self.amp, str) and self.amp.strip().lower() == "none":
            object.__setattr__(self, "amp", None)
        if self.amp is not None:
            try:
                object.__setattr__(self, "amp", dtype_of(self.amp, AMP))
            except InputError:
                raise InputError(f"amp is torch.bfloat16 or torch.float16 (or a name: "
                                 f"{accepted(AMP)}), got {self.amp!r}") from None
        if self.grad_scaler is not None and not isinstance(self.grad_scaler, bool):
            raise InputError(f"grad_scaler must be True, False or None, got "
                             f"{self.grad_scaler!r}")
        if self.grad_scaler and (not self.train or self.optimizer is None):
            raise InputError("grad_scaler=True needs a training step with an optimizer")
        object.__setattr__(self, "compile", Compile.of(self.compile))
        if self.compile is not None and self.device != "cuda":
            raise InputError("compile= lowers the step with inductor for CUDA: device='cuda' "
                             "(inductor's CPU code is not modelled)")
        object.__setattr__(self, "train", bool(self.train))
        object.__setattr__(self, "inference_mode", bool(self.inference_mode))
        object.__setattr__(self, "compute_capability",
                           check_capability(self.compute_capability))

    @property
    def scaled(self) -> bool:
        """Whether the step goes through a GradScaler (``grad_scaler`` resolved)."""
        if self.grad_scaler is not None:
            return self.grad_scaler
        return self.amp is torch.float16 and self.train and self.optimizer is not None

    @classmethod
    def of(cls, step: "Step | None" = None, **options) -> "Step":
        """``step`` (default: ``Step()``) with the ``options`` given (a value of
        :data:`UNSET` is not given); an unknown option is an :class:`fxmem.InputError`."""
        if step is not None and not isinstance(step, Step):
            raise InputError(f"step must be a fxmem.Step, got {type(step).__name__}")
        names = [f.name for f in fields(cls)]
        given = {k: v for k, v in options.items() if v is not UNSET}
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise InputError(f"unknown step option{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)}; a Step has {', '.join(names)}")
        return replace(step, **given) if step is not None else cls(**given)


@dataclass(frozen=True)
class StepSpec:
    """A :class:`Step` with the example batch it runs on (no tensors of the batch size
    kept); the step's options read through (``spec.amp`` is ``spec.step.amp``)."""

    step: Step
    inputs: tuple  # tuple[torch.Tensor, ...]
    targets: tuple
    batch_size: int  # the batch dim's size in the example tensors
    batch_dims: tuple = ()  # where B is in each input, then target: a dim, or None (no B)

    def __getattr__(self, name):
        if name == "step":  # not set yet (copy, pickle)
            raise AttributeError(name)
        return getattr(self.step, name)

    @property
    def grad_scaler(self) -> bool:
        return self.step.scaled


def _as_tuple(x, what: str) -> tuple:
    if x is None:
        return ()
    if isinstance(x, torch.Tensor):
        return (x,)
    if isinstance(x, (list, tuple)):
        return tuple(x)
    raise InputError(f"{what} must be a tensor or a tuple of tensors, got {type(x).__name__}")


def _is_dim(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def batch_dims(batch_dim, inputs: tuple, targets: tuple) -> tuple:
    """Where B is in each of ``inputs`` then ``targets`` (tensors), from ``batch_dim``: an int
    (the same dim in every tensor, negative counting from the end) or a tuple or list with
    one entry per input then target, an int or None (a tensor with no batch dim, such as an
    RNN's ``h0`` shaped ``(layers, B, H)`` given 1, or a table without B given None).

    >>> import torch
    >>> x, h0, y = torch.empty(7, 4, 16), torch.empty(2, 4, 32), torch.empty(7, 4)
    >>> batch_dims(1, (x, h0), (y,)), batch_dims([1, None, -1], (x, h0), (y,))
    ((1, 1, 1), (1, None, 1))
    >>> batch_dims(2, (x,), (y,))
    Traceback (most recent call last):
    ...
    fxmem.errors.InputError: batch_dim=2 is out of range for targets[0] of shape (7, 4): it has dims 0 to 1 (or -2 to -1)
    """
    named = [(f"inputs[{i}]", t) for i, t in enumerate(inputs)] + \
        [(f"targets[{i}]", t) for i, t in enumerate(targets)]
    if _is_dim(batch_dim):
        given = [batch_dim] * len(named)
    elif isinstance(batch_dim, (tuple, list)):
        if len(batch_dim) != len(named):
            raise InputError(
                f"batch_dim has {len(batch_dim)} entr{'y' if len(batch_dim) == 1 else 'ies'}; "
                f"it needs {len(named)}, one per input then target ({len(inputs)} input"
                f"{'s' * (len(inputs) != 1)}, {len(targets)} target{'s' * (len(targets) != 1)})"
                ": each the dim where B is, or None for a tensor with no batch dim")
        given = list(batch_dim)
    else:
        raise InputError("batch_dim is an int (where B is in every input and target) or a "
                         "tuple with one int or None per input then target, got "
                         f"{batch_dim!r}")
    out = []
    for (what, t), d in zip(named, given):
        if d is None:
            out.append(None)
            continue
        if not _is_dim(d):
            raise InputError(f"batch_dim for {what} is {d!r}: give the dim where B is (an "
                             "int), or None for a tensor with no batch dim")
        n = t.dim()
        if n == 0:
            raise InputError(f"{what} is 0-dimensional, so it has no batch dim: give None "
                             "for it in batch_dim (one entry per input then target)")
        if not -n <= d < n:
            raise InputError(f"batch_dim={d} is out of range for {what} of shape "
                             f"{tuple(t.shape)}: it has dims 0 to {n - 1} (or {-n} to -1)")
        out.append(d % n)
    if all(d is None for d in out):
        raise InputError("batch_dim gives no input or target a batch dim: B must be a dim of "
                         "at least one of them")
    return tuple(out)


def make_spec(model, inputs, targets=(), step: Step | None = None, batch_dim=0) -> StepSpec:
    """Check the model and the example batch against ``step`` before any work starts;
    ``batch_dim``: where B is (:func:`batch_dims`)."""
    step = Step() if step is None else step
    if not isinstance(model, torch.nn.Module):
        hint = f" (a class: pass an instance, {model.__name__}())" if isinstance(model, type) \
            and issubclass(model, torch.nn.Module) else ""
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}{hint}")
    for path, m in model.named_modules():
        if (isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse
                and step.train):
            raise InputError(f"{path or '(root)'} makes sparse gradients (sparse=True): not "
                             "modelled, since their size after coalescing depends on which "
                             "rows the batch touches; use sparse=False (and not SparseAdam)")
    ins, tgs = _as_tuple(inputs, "inputs"), _as_tuple(targets, "targets")
    if not ins:
        raise InputError("inputs must contain at least one tensor")
    for what, group in (("inputs", ins), ("targets", tgs)):
        for i, t in enumerate(group):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"{what}[{i}] is a {type(t).__name__}, not a tensor; "
                                 f"pass non-tensor arguments by wrapping the model")
    dims = batch_dims(batch_dim, ins, tgs)
    named = [f"inputs[{i}]" for i in range(len(ins))] + [f"targets[{i}]" for i in range(len(tgs))]
    sizes = [(n, d, int(t.shape[d])) for n, t, d in zip(named, ins + tgs, dims) if d is not None]
    if len({s for *_, s in sizes}) > 1:
        listing = ", ".join(f"{n} dim {d}={s}" for n, d, s in sizes)
        raise InputError(f"the batch dim's size differs between tensors: {listing} (say where "
                         "B is in each with batch_dim=)")
    if tgs and step.loss is None:
        raise InputError("targets were given but no loss function to pass them to")
    if step.train and not any(p.requires_grad for p in model.parameters()) \
            and not any(t.requires_grad for t in ins):
        raise InputError("the model has no parameter that requires grad, so a training step "
                         "has no backward pass: analyse inference (train=False; fxmem "
                         "analyze --inference)")
    check_call(model, ins)
    return StepSpec(step, ins, tgs, sizes[0][2], dims)


def compute_loss(out, targets: Sequence, loss_fn: Callable | None) -> torch.Tensor:
    """The loss tensor from the model output, as the training step uses it."""
    if loss_fn is not None:
        loss = loss_fn(out, *targets)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0 and guard_or_true(
                loss.numel() != 1):
            got = f"shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else \
                f"a {type(loss).__name__}"
            raise InputError(f"the loss function returned {got}, not a scalar tensor: reduce "
                             "it (e.g. .mean()) to the tensor backward starts from")
        return loss
    if isinstance(out, torch.Tensor):
        if out.dim() != 0 and guard_or_true(out.numel() != 1):  # a count's size: not 1
            raise InputError("loss=None needs the model to return a scalar loss "
                             f"(or an object with .loss); got shape {tuple(out.shape)}: "
                             "give a loss function (and its targets)")
        return out
    lossval = getattr(out, "loss", None)
    if lossval is None and isinstance(out, dict):
        lossval = out.get("loss")
    if not isinstance(lossval, torch.Tensor):
        raise InputError("loss=None needs the model to return a scalar loss or an object "
                         f"with .loss; got {type(out).__name__}")
    return lossval


def make_optimizer(factory: Callable, params: list, device: str,
                   spec: StepSpec | None = None) -> torch.optim.Optimizer:
    """Build the optimizer the target device would run.

    On CUDA torch.optim defaults to the foreach implementations; under fake CPU tensors it
    cannot tell, so a group whose ``foreach`` is unset is set to True for ``device="cuda"``.
    On CPU the per-parameter loop is the default and nothing is changed.
    """
    opt = factory(params)
    if not isinstance(opt, torch.optim.Optimizer):
        raise InputError(f"optimizer(params) returned {type(opt).__name__}, not an Optimizer")
    if spec is not None:
        check_optimizer(spec, opt)
    if device == "cuda":  # ZeRO-1: its local optimizer's groups, and its own, which it
        # copies into the local ones before each step (``_sync_param_groups``)
        for group in [*opt.param_groups, *getattr(opt, "optim", opt).param_groups]:
            if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                group["foreach"] = True
    _check_foreach(opt)
    return opt


def _check_foreach(opt) -> None:
    """A foreach step over a group mixing DTensors (a plan's shards) with plain tensors fails
    in eager PyTorch (DTensor refuses the mix at the step's first foreach op): said before
    the step is traced, as the trace would say it at its end (:func:`mixed_foreach`)."""
    from torch.distributed.tensor import DTensor

    from ...errors import ModelError

    for group in opt.param_groups:
        params = [p for p in group["params"] if p is not None]
        shards = sum(isinstance(p, DTensor) for p in params)
        whole = len(params) - shards
        if group.get("foreach") and shards and whole:
            raise ModelError(mixed_foreach(
                f"{shards} of a group's parameters are DTensors, {whole} "
                f"{'is' if whole == 1 else 'are'} not"), module="(optimizer)",
                phase="optimizer")


class _FiniteStepScaler(torch.amp.GradScaler):
    """A GradScaler that takes every step as finite. ``GradScaler.step`` reads its inf
    check's result (``found_inf.item()``), which fake tensors do not have; fxmem analyses the
    step that does run the optimizer. Everything else (scale, unscale, inf checks, update)
    runs as written. On the fake GPU (:mod:`fxmem.validate.fakegpu`) no kernel runs, so
    ``found_inf`` (``torch.full((), 0.0)``, a fill kernel) and the scale hold whatever their
    blocks held (an earlier host-to-device copy's bytes): the measured step is the same
    finite one. The skipped read is a device-to-host copy, which allocates no device
    memory."""

    finite_steps = True  # its steps are never skipped: the scale need not be read

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        return optimizer.step(*args, **kwargs)


def make_grad_scaler(spec: StepSpec, device: str, fake: bool = False):
    """The step's ``torch.amp.GradScaler`` on ``device`` (None without one); ``fake``: for
    fake tensors or the fake GPU, whose inf checks compute nothing (see
    :class:`_FiniteStepScaler`). Its scale and growth tracker are made now, as the first step
    of a training run leaves them."""
    if not spec.grad_scaler:
        return None
    scaler = (_FiniteStepScaler if fake else torch.amp.GradScaler)(device)
    scaler._lazy_init_scale_growth_tracker(torch.device(device))
    return scaler


def scaler_tensors(scaler) -> dict:
    """The tensors a GradScaler keeps between steps, by name."""
    if scaler is None:
        return {}
    return {"grad_scaler.scale": scaler._scale,
            "grad_scaler.growth_tracker": scaler._growth_tracker}


def needs_closure(optimizer) -> bool:
    """LBFGS re-evaluates the loss itself: its step takes a closure."""
    return isinstance(optimizer, torch.optim.LBFGS)


def warmup_steps(optimizer) -> int:
    """Steps before the optimizer's state is steady. LBFGS keeps the last ``history_size``
    curvature pairs, one per iteration after its very first: full after this many steps
    (when every iteration runs and is accepted)."""
    if needs_closure(optimizer):
        group = optimizer.param_groups[0]
        return -(-(group["history_size"] + 1) // group["max_iter"])
    return 1


def check_optimizer(spec: StepSpec, optimizer) -> None:
    """What a closure optimizer cannot be combined with."""
    if not needs_closure(optimizer):
        return
    if spec.grad_accum != 1:
        raise InputError(f"{type(optimizer).__name__} evaluates the loss itself in step(); "
                         "grad_accum does not apply")
    if spec.grad_scaler:
        raise InputError("GradScaler.step does not support closures (LBFGS): pass "
                         "grad_scaler=False")
    if optimizer.param_groups[0]["line_search_fn"] is not None:
        raise InputError("LBFGS with a line search evaluates the loss a data-dependent "
                         "number of times; fxmem models line_search_fn=None")


def _closure_step(forward, spec, inputs, targets, optimizer, on_phase):
    """``optimizer.step(closure)``, the closure being the usual zero_grad, forward, loss and
    backward (``zero_grad_at="backward"``: forward, loss, zero_grad, backward, as
    Lightning's closure); each evaluation goes through the phases again."""
    late = spec.zero_grad_at == "backward"

    def closure():
        if not late:
            on_phase("zero_grad")
            optimizer.zero_grad(set_to_none=spec.set_to_none)
        on_phase("forward")
        with _autocast(spec, inputs):
            loss = compute_loss(forward(*inputs), targets, spec.loss)
        if late:
            on_phase("zero_grad")
            optimizer.zero_grad(set_to_none=spec.set_to_none)
        on_phase("backward")
        _backward(loss / 1 if spec.backward_copy else loss, None)
        on_phase("optimizer")
        return loss

    on_phase("optimizer")
    return optimizer.step(closure)


def _autocast(spec: StepSpec, inputs: Sequence):
    """The autocast region of the step: forward and loss, as the AMP recipe writes it, for
    the device the tensors are on (fake tensors are CPU tensors: for ``device="cuda"`` the
    tracer emulates CUDA's rules there, :mod:`fxmem.trace.kernels.amp`)."""
    if spec.amp is None:
        return contextlib.nullcontext()
    return torch.autocast(inputs[0].device.type, dtype=spec.amp)


def _backward(loss, scaler) -> None:
    if scaler is not None:
        scaler.scale(loss).backward()
    else:
        loss.backward()


def run_step(forward: Callable, spec: StepSpec, inputs: Sequence, targets: Sequence,
             params: Sequence[torch.Tensor], optimizer, on_phase: Callable[[str], Any],
             micro_steps: int | None = None, scaler=None):
    """Run one step; call ``on_phase(name)`` as each phase starts. Returns the kept output.
    ``micro_steps``: forward-backward passes to run (default ``spec.grad_accum``; the
    tracer runs 2, since every micro-step after the first sees the same memory).
    ``scaler``: the GradScaler of a ``grad_scaler`` step (see :func:`make_grad_scaler`)."""
    if not spec.train:
        on_phase("forward")
        no_grad = torch.inference_mode() if spec.inference_mode else torch.no_grad()
        with no_grad, _autocast(spec, inputs):
            out = forward(*inputs)
        return out
    if needs_closure(optimizer):
        return _closure_step(forward, spec, inputs, targets, optimizer, on_phase)
    def zero_grad():
        on_phase("zero_grad")
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=spec.set_to_none)
        else:
            for p in params:
                if spec.set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    late = spec.zero_grad_at == "backward"
    if not late:
        zero_grad()
    for i in range(spec.grad_accum if micro_steps is None else micro_steps):
        on_phase("forward")
        with _autocast(spec, inputs):
            loss = compute_loss(forward(*inputs), targets, spec.loss)
        if spec.grad_accum > 1:
            loss = loss / spec.grad_accum
        if late and i == 0:
            zero_grad()
        on_phase("backward")
        _backward(loss / 1 if spec.backward_copy else loss, scaler)
    on_phase("optimizer")
    if optimizer is not None and scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    elif optimizer is not None:
        optimizer.step()
    return loss
