"""The Hugging Face ``Trainer``'s training step, analysed before the job starts.

``Trainer(auto_find_batch_size=True)`` finds a batch size by running real steps on the GPU and
shrinking the batch after each out-of-memory error. :func:`batch_size_for` answers the same
question from the model, the ``TrainingArguments`` and one example batch, exactly and without
a GPU: the largest ``per_device_train_batch_size`` whose step fits a budget, with
``gradient_accumulation_steps`` and a checkpoint plan when asked for an effective batch or when
even a batch of one does not fit. :class:`FxmemCallback` logs the prediction beside the peak
the Trainer's real steps reach.

The step is the one the Trainer runs (``transformers/trainer.py``, ``training_step``,
``compute_loss`` and the optimizer step of ``_run_epoch``), mirrored in a :class:`fxmem.Step`
(:func:`trainer_step`):

- the batch (a collator's dict of tensors, B at dim 0) is passed as keywords, with
  ``num_items_in_batch`` (the labels to predict, a 0-dim float tensor) when the model takes
  loss keywords, and the loss is the output's ``.loss``;
- the optimizer is the class and keywords ``Trainer.get_optimizer_cls_and_kwargs(args)``
  gives (``optim``: ``adamw_torch``, ``adamw_torch_fused``, ``sgd``, ``adagrad``,
  ``rmsprop``, ``adafactor``; others raise :class:`fxmem.InputError`), with the Trainer's two
  parameter groups (weight decay, and none for biases and norms: on CUDA they matter, a
  foreach optimizer's temporaries are per group), and the gradient clipping the Trainer runs
  before every optimizer step (``clip_grad_norm_`` with ``max_grad_norm``, or with an
  infinite norm when it is 0: it still measures the norm);
- ``bf16``/``fp16``: forward and loss under autocast, the output's half-precision tensors
  then copied to float32 as accelerate's ``convert_outputs_to_fp32`` does, and with ``fp16``
  a GradScaler;
- ``gradient_accumulation_steps`` micro-batches before the step, the loss divided by their
  number when the model does not normalise it with ``num_items_in_batch``; all of them
  fetched before the first and held to the step's end, as ``get_batch_samples`` does;
- ``gradient_checkpointing`` (``activation_checkpointing``): the model traced with
  ``activation_checkpointing_enable`` applied as the Trainer applies it (undone afterwards);
- the loss divided by the accumulation steps when the model does not normalise it (by 1
  too), and backward on accelerate's copy of it (``Accelerator.backward``: ``loss / 1``
  under the Trainer, held through backward);
- zero_grad with ``set_to_none=True`` (``model.zero_grad()``), the model in train mode.

``torch_compile``, DeepSpeed and FSDP are refused with a clear error (FSDP: analyse with
:class:`fxmem.FSDP`).

>>> import torch, transformers
>>> from fxmem.integrations import hf
>>> cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
>>> model = transformers.GPT2LMHeadModel(cfg)
>>> args = transformers.TrainingArguments("out", optim="sgd", report_to=[])
>>> ids = torch.randint(0, 64, (2, 16))
>>> batch = {"input_ids": ids, "labels": ids}
>>> step = hf.trainer_step(model, args, batch, device="cpu")
>>> budget = step.analyze().peak_bytes(12)
>>> fit = hf.batch_size_for(model, args, batch, budget, device="cpu")
>>> fit.per_device_train_batch_size, fit.peak_bytes <= budget
(12, True)
>>> fit.peak_bytes == step.measure(12).peak_bytes
True
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from dataclasses import dataclass, field

import torch

from ..analyze import analyze
from ..checkpoint.choose import PlanChoice
from ..errors import InfeasibleBudgetError, InputError
from ..trace.engine import Step
from ..trace.plans import apply_checkpoints
from ..validate.measure import measure
from .common import clipping, confirmed_plan, largest, least_peak_message, live_budget
from .trainer_callback import FxmemCallback  # noqa: F401 - part of this module's API


def _transformers():
    try:
        import transformers
    except ImportError:
        raise InputError("fxmem.integrations.hf needs transformers: pip install "
                         "'fxmem[hf]'") from None
    return transformers


# the optimizers the Trainer builds that fxmem models: torch.optim's and transformers' Adafactor
TORCH_OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop",
                    "adafactor")


class TrainerBatch(torch.nn.Module):
    """The model called as the Trainer calls it: ``model(**batch)``, the batch's tensors
    given positionally in ``keys`` order (fxmem's inputs), ``num_items_in_batch`` as a
    keyword when the model takes loss keywords, and with ``amp`` the output's float16 and
    bfloat16 tensors copied to float32 (accelerate's ``convert_outputs_to_fp32``).

    The loss's divisions before backward: ``training_step`` divides it by the accumulation
    steps when the model does not normalise it with ``num_items_in_batch``, by 1 too, a new
    tensor: with ``accum`` > 1 fxmem's ``loss / grad_accum`` stands for it, with 1 the
    output's ``loss`` is replaced by ``loss / 1`` here. (``Accelerator.backward``'s copy
    is the step's ``backward_copy``.)"""

    def __init__(self, model, keys, num_items: bool = False, amp: bool = False):
        super().__init__()
        self.model, self.keys, self.num_items, self.amp = model, tuple(keys), num_items, amp
        self.accum = 1  # the step's micro-batches (TrainerStep sets it)

    def forward(self, *tensors):
        n = len(self.keys)
        kwargs = dict(zip(self.keys, tensors[:n]))
        if self.num_items:
            kwargs["num_items_in_batch"] = tensors[n]
        out = self.model(**kwargs)
        if self.amp:
            from accelerate.utils.operations import convert_to_fp32

            out = convert_to_fp32(out)
        if not self.num_items and self.accum == 1 and getattr(out, "loss", None) is not None:
            out["loss"] = out["loss"] / 1
        return out


def trainer_optimizer(args, model, device: str = "cuda"):
    """``callable(params)``: the optimizer the Trainer builds for ``args`` (its class and
    keywords from ``Trainer.get_optimizer_cls_and_kwargs``), over its two parameter groups
    (:meth:`Trainer.get_decay_parameter_names`), clipping gradients first as the Trainer
    does. ``params`` are ``model``'s parameters (or their fakes) in ``named_parameters`` order.
    """
    T = _transformers()
    name = str(getattr(args.optim, "value", args.optim))
    if name not in TORCH_OPTIMIZERS:
        raise InputError(f"optim={name!r}: fxmem models the Trainer's torch optimizers "
                         f"({', '.join(TORCH_OPTIMIZERS)}); pass one of them, or analyse your "
                         "optimizer with fxmem.analyze(optimizer=...)")
    try:
        cls, kwargs = T.Trainer.get_optimizer_cls_and_kwargs(args, model)
    except (ValueError, ImportError) as e:
        raise InputError(f"optim={name!r}: the Trainer cannot build it here ({e})") from None
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or \
            {"params", "model", "optimizer_dict"} & set(kwargs):
        raise InputError(f"optim={name!r}: the Trainer builds {cls!r} over its own parameter "
                         "layout, which fxmem does not model")
    names = [n for n, _ in model.named_parameters()]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    decay = set(T.Trainer.get_decay_parameter_names(None, model))
    wd = args.weight_decay
    norm = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else math.inf
    opt_cls = clipping(cls, norm, True if device == "cuda" else None)

    def make(params):
        params = list(params)
        if len(params) != len(names):
            raise InputError(f"the optimizer got {len(params)} parameters for a model with "
                             f"{len(names)}")
        named = [(n, p) for n, p in zip(names, params) if n in trainable]
        groups = [{"params": [p for n, p in named if n in decay], "weight_decay": wd},
                  {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
        return opt_cls(groups, **dict(kwargs))

    make.__name__ = make.__qualname__ = f"Trainer's {cls.__name__}"
    return make


def _checkpointing(args):
    """``(on, kwargs)``: the Trainer's activation checkpointing (``gradient_checkpointing``
    before transformers 5)."""
    on = getattr(args, "activation_checkpointing", None)
    if on is None:
        on = getattr(args, "gradient_checkpointing", False)
    kw = getattr(args, "activation_checkpointing_kwargs", None)
    if kw is None:
        kw = getattr(args, "gradient_checkpointing_kwargs", None)
    return bool(on), dict(kw or {})


def _checkpointing_on(model) -> bool:
    """Whether the model's activation checkpointing is on already."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


def _accepts_loss_kwargs(model) -> bool:
    """Whether the Trainer passes ``num_items_in_batch`` to the model (its
    ``model_accepts_loss_kwargs``)."""
    if hasattr(model, "accepts_loss_kwargs"):
        return bool(model.accepts_loss_kwargs)
    return any(p.kind == inspect.Parameter.VAR_KEYWORD
               for p in inspect.signature(model.forward).parameters.values())


def _check_args(args) -> None:
    T = _transformers()
    if not isinstance(args, T.TrainingArguments):
        raise InputError(f"args must be a transformers.TrainingArguments, got "
                         f"{type(args).__name__}")
    if args.torch_compile:
        raise InputError("torch_compile=True: fxmem analyses the eager step; compiled "
                         "graphs fuse and free differently (set torch_compile=False)")
    if getattr(args, "deepspeed", None):
        raise InputError("DeepSpeed is not modelled by fxmem")
    if getattr(args, "fsdp", None):
        raise InputError("the Trainer's FSDP: analyse the step with fxmem.analyze(..., "
                         "parallel=fxmem.FSDP(world_size))")
    if args.fp16 and args.bf16:
        raise InputError("fp16 and bf16 are both set")


def _batch(example_batch) -> tuple:
    """``(keys, tensors)`` of a collator's batch."""
    if not isinstance(example_batch, dict) or not example_batch:
        raise InputError("example_batch is what the Trainer's data collator returns: a dict "
                         f"of tensors, got {type(example_batch).__name__}")
    for k, v in example_batch.items():
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            raise InputError(f"example_batch[{k!r}] must be a tensor with the batch at dim "
                             f"0, got {type(v).__name__}")
    return tuple(example_batch), tuple(example_batch.values())


@dataclass(frozen=True)
class TrainerStep:
    """The Trainer's training step as fxmem runs it: ``module`` (the model called as the
    Trainer calls it, :class:`TrainerBatch`), its example ``inputs`` (one micro-batch:
    :meth:`batch` gives a step's), the :class:`fxmem.Step` and ``batch_dim``.
    :meth:`analyze` and :meth:`measure` run it with the model in train mode and the
    Trainer's checkpointing applied, both undone afterwards."""

    module: torch.nn.Module
    inputs: tuple
    step: Step
    batch_dim: tuple
    checkpointing: tuple = (False, {})  # (on, kwargs) as the Trainer enables it
    model: torch.nn.Module = field(default=None, repr=False)
    args: object = field(default=None, repr=False)  # the TrainingArguments

    @contextlib.contextmanager
    def prepared(self):
        """The model as the Trainer runs it: in train mode (``model.train()``), with its
        activation checkpointing enabled when ``args`` asks; restored on exit."""
        model = self.model
        modes = [(m, m.training) for m in model.modules()]
        on, kw = self.checkpointing[0], dict(self.checkpointing[1])
        enable = on and not _checkpointing_on(model)
        try:
            model.train()
            if enable:
                every, offload = kw.pop("every_n_layers", 1), kw.pop("offload", False)
                if offload:
                    raise InputError("activation checkpointing with offload=True (saved "
                                     "activations in pinned host memory) is not modelled")
                if hasattr(model, "activation_checkpointing_enable"):
                    model.activation_checkpointing_enable(
                        activation_checkpointing_kwargs=kw or None, every_n_layers=every)
                else:
                    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw or None)
            yield self
        finally:
            if enable:
                (getattr(model, "activation_checkpointing_disable", None)
                 or model.gradient_checkpointing_disable)()
            for m, mode in modes:
                m.training = mode

    def batch(self, k: int) -> tuple:
        """``(inputs, batch_dim)`` of a step of ``k`` micro-batches: the Trainer fetches all
        of them before the first (``get_batch_samples``) and holds them to the step's end,
        so the ``k - 1`` others are inputs the model is not called with (:class:`TrainerBatch`
        uses the first ones)."""
        n = len(self.module.keys)
        return self.inputs + self.inputs[:n] * (k - 1), self.batch_dim + (0,) * (n * (k - 1))

    def analyze(self, **options):
        """:func:`fxmem.analyze` of this step (``options``: its keywords, e.g.
        ``grad_accum=4``)."""
        k = options.get("grad_accum", self.step.grad_accum)
        inputs, dims = self.batch(k)
        self.module.accum = k
        with self.prepared():
            return analyze(self.module, inputs, step=self.step, batch_dim=dims, **options)

    def measure(self, B: int, **options):  # noqa: N803
        """:func:`fxmem.measure` of this step at batch size ``B``: on the CPU (the
        optimizer as the Trainer builds it there), or on CUDA when the step's device is
        ``"cuda"`` and one is here."""
        step = self.step
        if step.device != "cuda" or not torch.cuda.is_available():
            step = Step.of(step, device="cpu",
                           optimizer=trainer_optimizer(self.args, self.model, "cpu"))
        k = options.get("grad_accum", self.step.grad_accum)
        inputs, dims = self.batch(k)
        self.module.accum = k
        with self.prepared():
            return measure(self.module, inputs, step=step, batch_dim=dims, B=B, **options)


def trainer_step(model, args, example_batch, *, device: str = "cuda") -> TrainerStep:
    """The training step ``Trainer(model, args)`` runs on ``example_batch`` (a dict of
    tensors as its data collator returns, the batch at dim 0, with ``labels``): see the
    module's docstring for what is mirrored. ``device``: the device fxmem predicts for
    (``"cuda"``, or ``"cpu"`` for live bytes on the CPU)."""
    _check_args(args)
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    keys, tensors = _batch(example_batch)
    if "labels" not in keys:
        raise InputError("example_batch has no 'labels': the Trainer's loss is the model "
                         "output's .loss, which the model computes from labels")
    amp = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    num_items = _accepts_loss_kwargs(model)
    inputs = tensors
    dims = (0,) * len(tensors)
    if num_items:  # what the Trainer counts: labels to predict (a causal LM's shifted)
        labels = example_batch["labels"]
        inputs += (labels[..., 1:].ne(-100).sum().to(torch.float32),)
        dims += (None,)
    step = Step(optimizer=trainer_optimizer(args, model, device), device=device, amp=amp,
                grad_accum=args.gradient_accumulation_steps, set_to_none=True,
                backward_copy=True)
    return TrainerStep(TrainerBatch(model, keys, num_items, amp is not None), inputs, step,
                       dims, _checkpointing(args), model, args)


@dataclass(frozen=True)
class TrainerFit:
    """What :func:`batch_size_for` found: the ``TrainingArguments`` values to train with.

    ``per_device_train_batch_size`` and ``gradient_accumulation_steps``; ``peak_bytes``: the
    predicted peak of the step at that batch size (live bytes; on CUDA counted in the
    allocator's 512-byte blocks), ``budget_bytes`` it fits and ``by`` (what the largest
    batch size was answered by, :meth:`fxmem.Report.max_batch_size`); ``checkpoint``: a
    :class:`fxmem.PlanChoice` when a checkpoint plan is needed (its paths are the
    :class:`TrainerBatch`'s, ``model.``-prefixed: :meth:`apply_checkpoint` applies it to the
    model; its own ``B`` and ``peak_bytes`` are the planner's derived figures, while this
    fit's are those of the step traced with the plan); ``report``: the step's
    :class:`fxmem.Report` (traced with the plan, if any)."""

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    peak_bytes: int
    budget_bytes: int
    by: str
    checkpoint: PlanChoice | None = None
    report: object = field(default=None, repr=False, compare=False)

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step on this device: batch size x accumulation steps."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    def training_arguments(self, args):
        """A copy of ``args`` with this batch size and accumulation steps."""
        out = copy.deepcopy(args)
        out.per_device_train_batch_size = self.per_device_train_batch_size
        out.gradient_accumulation_steps = self.gradient_accumulation_steps
        return out

    def apply_checkpoint(self, model):
        """Apply :attr:`checkpoint`'s plan to ``model`` in place (PyTorch's
        ``checkpoint_wrapper``, :func:`fxmem.apply_checkpoints`); returns ``model``."""
        if self.checkpoint is not None:
            apply_checkpoints(TrainerBatch(model, ()), self.checkpoint.plan)
        return model


def batch_size_for(model, args, example_batch, budget_bytes: int | None = None, *,
                   device: str = "cuda", by: str | None = None, gpu=None,
                   context_bytes: int | None = None, target_batch_size: int | None = None,
                   max_recompute: float | None = None) -> TrainerFit:
    """The largest ``per_device_train_batch_size`` whose step under ``args`` fits
    ``budget_bytes`` (or ``gpu="H100-80GB"``: that card's memory less the CUDA context),
    answered as :meth:`fxmem.Report.max_batch_size` answers (``by``; on ``device="cuda"``
    by default the caching allocator replayed), as a :class:`TrainerFit`.

    ``target_batch_size``: the effective batch wanted per device; the answer is then the
    fewest ``gradient_accumulation_steps`` k (``args``' own ignored) whose micro-batch
    ``target_batch_size / k`` (a divisor) fits. ``max_recompute`` (a fraction of the step's
    FLOPs): a checkpoint plan re-running at most that share may be used, for the largest
    batch (or, with a target, wherever no plan fits). When even a batch of one does not fit,
    the plan of least recompute that fits is looked for. Plans fit by live bytes
    (``by="live"``). Raises :class:`fxmem.InfeasibleBudgetError` when nothing fits. The step
    and its checks: :func:`trainer_step`."""
    if target_batch_size is not None and (isinstance(target_batch_size, bool) or not isinstance(
            target_batch_size, int) or target_batch_size < 1):
        raise InputError(f"target_batch_size must be a positive int, got {target_batch_size!r}")
    step = trainer_step(model, args, example_batch, device=device)
    if max_recompute is not None and step.checkpointing[0]:
        raise InputError("args turn on the Trainer's gradient checkpointing, which fxmem does "
                         "not plan on top of: drop max_recompute, or the flag")
    budget = dict(budget_bytes=budget_bytes, by=by, gpu=gpu, context_bytes=context_bytes)
    reports: dict = {}

    def report(k):
        if k not in reports:
            reports[k] = step.analyze(grad_accum=k)
        return reports[k]

    def plain(k, b, most):
        return TrainerFit(b, k, report(k).peak_bytes(b), most.budget_bytes, most.by, None,
                          report(k))

    live = live_budget(budget) if budget_bytes is not None or gpu is not None else None
    mr = 1.0 if max_recompute is None else max_recompute

    def planned(k, b=None):
        """The plan for micro-batch ``b`` (None: the largest batch with one), confirmed by
        tracing the step with it: a :class:`TrainerFit` or None."""
        found = confirmed_plan(report(k), lambda plan: step.analyze(
            grad_accum=k, checkpoint=plan, retrace=True), live, mr, b)
        if found is None:
            return None
        got, choice, traced = found
        return TrainerFit(got, k, traced.peak_bytes(got), live, "live", choice, traced)

    def infeasible(k, what):
        message, least = least_peak_message(report(k), what, live)
        raise InfeasibleBudgetError(message, minimum_bytes=least)

    if target_batch_size is None:
        k = args.gradient_accumulation_steps
        most = None if max_recompute is not None else largest(report(k), budget)
        if most is not None:
            return plain(k, int(most), most)
        if live is None:
            raise InputError("give budget_bytes (or gpu=)")
        return planned(k) or infeasible(k, f"no batch size, with or without a plan re-running "
                                           f"at most {mr:.0%} of the step,")
    t = target_batch_size
    divisors = [k for k in range(1, t + 1) if t % k == 0]

    def search(with_plans: bool):
        for k in divisors:
            # k >= 2: the micro-batches after the first see the gradients, and the step holds
            # all k batches, so a batch over the budget with 2 is over it with more
            b, r = t // k, report(min(k, 2))
            if b < r.min_batch_size:
                continue
            most = largest(r, budget)
            if most is not None and most >= b:
                most = largest(report(k), budget)
                if most is not None and most >= b:
                    return plain(k, b, most)
            if with_plans and (found := planned(k, b)) is not None:
                return found
        return None

    found = None if max_recompute is not None else search(False)
    if found is None:
        if live is None:
            raise InputError("give budget_bytes (or gpu=)")
        found = search(True)
    return found or infeasible(min(t, 2), f"no effective batch of {t} (micro-batches of a "
                                          f"divisor of it, plans re-running at most {mr:.0%})")


__all__ = ["batch_size_for", "trainer_step", "trainer_optimizer", "TrainerFit", "TrainerStep",
           "TrainerBatch", "FxmemCallback"]
