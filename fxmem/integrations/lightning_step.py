"""Lightning's training step, analysed before the job starts: the step ``Trainer.fit`` runs
for a ``LightningModule`` (``lightning`` or ``pytorch_lightning``, 2.x), mirrored in a
:class:`fxmem.Step` (:func:`lightning_step`), and the largest batch size whose step fits a
budget (:func:`batch_size_for`). The callback that uses them at ``fit`` start:
:mod:`fxmem.integrations.lightning`.

What the automatic optimization of ``Trainer.fit`` runs for one optimizer step
(``lightning/pytorch/loops/optimization/automatic.py``, ``plugins/precision/``), and how it
is mirrored:

- the batch as the loop hands it over (``precision.convert_input``,
  ``on_before_batch_transfer``, ``on_after_batch_transfer``), its tensors fxmem's inputs
  (B at dim 0, as Lightning's ``extract_batch_size`` assumes; 0-dim tensors and other
  values kept as they are);
- ``training_step(batch, batch_idx)`` under the precision's forward context, its loss (the
  output, or its ``"loss"``) divided by ``accumulate_grad_batches`` (also by 1) and a
  detached copy of it kept to the step's end (``ClosureResult``); ``self.log`` calls are
  skipped (their copies of logged scalars are not modelled);
- the closure's order: ``training_step``, then ``zero_grad`` (``set_to_none=True``), then
  ``backward``, so the previous step's gradients are live through the first micro-batch's
  forward (``Step(zero_grad_at="backward")``);
- ``"16-mixed"``/``"bf16-mixed"``: autocast with ``cache_enabled=False`` (Lightning's
  ``MixedPrecision.autocast_context_manager``), a GradScaler with ``"16-mixed"``;
  ``"16-true"``, ``"bf16-true"``, ``"64-true"``: the module as the plugin converted it, its
  forward under the plugin's default dtype and the batch's floats converted;
- the optimizer ``configure_optimizers`` made (its class, defaults and parameter groups,
  rebuilt over fxmem's parameters), after ``gradient_clip_val`` clipping by norm or value as
  ``Precision.clip_gradients`` does;
- ``accumulate_grad_batches`` micro-batches (one batch on the device at a time).

Refused with :class:`fxmem.InputError`: manual optimization, strategies other than one
device (for DDP or FSDP analyse with ``fxmem.analyze(parallel=...)``), precision plugins
other than the above, an overridden ``configure_gradient_clipping``.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..analyze import analyze
from ..checkpoint.choose import PlanChoice
from ..errors import InfeasibleBudgetError, InputError
from ..trace.engine import Step
from ..trace.kernels import autocast_cache_off
from ..trace.plans import apply_checkpoints
from ..validate.measure import measure
from .common import clipping, confirmed_plan, largest, least_peak_message, live_budget


class LightningBatch(torch.nn.Module):
    """The LightningModule's ``training_step`` as a module fxmem runs: ``forward(*tensors)``
    puts the tensors back into the batch's structure (``spec``, with the batch's other
    values ``leaves``), calls ``training_step`` and returns the loss as the closure hands
    it to backward (divided by ``normalize``, ``accumulate_grad_batches`` when 1: fxmem's
    step divides by more). ``autocast_cache``: False to run with autocast's weight cache
    off (Lightning's autocast); ``context``: the precision's forward context (``"-true"``
    precisions), or None. Deep copies share the module's Trainer."""

    def __init__(self, module, spec, leaves, positions, *, normalize: bool = True,
                 autocast_cache: bool = True, context=None, batch_idx: bool = True):
        super().__init__()
        self.module = module
        self.spec, self.leaves, self.positions = spec, list(leaves), tuple(positions)
        self.normalize, self.autocast_cache, self.context = normalize, autocast_cache, context
        self.batch_idx = batch_idx
        self.kept = None  # the closure's detached copy of the loss, until the next call

    def forward(self, *tensors):
        leaves = list(self.leaves)
        for i, t in zip(self.positions, tensors):
            leaves[i] = t
        batch = tree_unflatten(leaves, self.spec)
        args = (batch, 0) if self.batch_idx else (batch,)
        cache = contextlib.nullcontext() if self.autocast_cache else autocast_cache_off()
        with _quiet(self.module), cache, \
                (self.context() if self.context is not None else contextlib.nullcontext()):
            out = self.module.training_step(*args)
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if not isinstance(loss, torch.Tensor):
            raise InputError(f"{type(self.module).__name__}.training_step returned "
                             f"{type(out).__name__}: fxmem needs the loss (a tensor, or a dict "
                             "with 'loss'); a step skipped with None has no memory to predict")
        if self.normalize:
            loss = loss / 1
        self.kept = loss.detach().clone()
        return loss

    def __deepcopy__(self, memo):
        trainer = getattr(self.module, "_trainer", None)
        if trainer is not None:
            memo.setdefault(id(trainer), trainer)
        memo.setdefault(id(self.spec), self.spec)  # immutable; its copy warns in torch 2.13
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new


@contextlib.contextmanager
def _quiet(module):
    """``module.log`` and ``log_dict`` as no-ops (instance attributes, removed on exit):
    outside the Trainer's own loop they would raise, and they would keep fake tensors."""
    def skip(*args, **kwargs):
        return None

    saved = {k: module.__dict__[k] for k in ("log", "log_dict") if k in module.__dict__}
    module.__dict__.update(log=skip, log_dict=skip)
    try:
        yield
    finally:
        for k in ("log", "log_dict"):
            module.__dict__.pop(k, None)
        module.__dict__.update(saved)


def lightning_package(trainer, sub: str = ""):
    """The ``lightning.pytorch`` or ``pytorch_lightning`` package ``trainer`` comes from, or
    its submodule ``sub`` (``"utilities.parsing"``)."""
    import importlib

    root = type(trainer).__module__.split(".")[0]
    package = "lightning.pytorch" if root == "lightning" else root
    return importlib.import_module(f"{package}.{sub}" if sub else package)


def _precision(pl, trainer):
    """``(amp, grad_scaler, context, convert)`` for the trainer's precision plugin."""
    plugin = trainer.precision_plugin
    P = pl.plugins.precision
    if isinstance(plugin, P.MixedPrecision) and type(plugin) is P.MixedPrecision:
        amp = torch.bfloat16 if plugin.precision == "bf16-mixed" else torch.float16
        return amp, plugin.scaler is not None, None, None
    if type(plugin) in (P.HalfPrecision, P.DoublePrecision):
        return None, False, plugin.forward_context, plugin.convert_input
    if type(plugin) is P.Precision:
        return None, False, None, None
    raise InputError(f"precision plugin {type(plugin).__name__}: fxmem models Lightning's "
                     "32-true, 16-mixed, bf16-mixed, 16-true, bf16-true and 64-true")


def _optimizer(trainer, module, device: str):
    """``callable(params)``: the optimizer ``configure_optimizers`` made, rebuilt over
    ``params`` (the module's parameters, or their fakes, in ``named_parameters`` order),
    clipping first as the Trainer does."""
    opts = list(trainer.optimizers)
    if len(opts) != 1:
        raise InputError(f"configure_optimizers made {len(opts)} optimizers; automatic "
                         "optimization steps one")
    opt = opts[0]
    helpers = lightning_package(trainer, "utilities.model_helpers")
    if helpers.is_overridden("configure_gradient_clipping", module):
        raise InputError(f"{type(module).__name__} overrides configure_gradient_clipping: fxmem "
                         "models Lightning's own (gradient_clip_val and "
                         "gradient_clip_algorithm)")
    named = list(module.named_parameters())
    index = {id(p): i for i, (_, p) in enumerate(named)}
    groups = []
    for g in opt.param_groups:
        missing = [p for p in g["params"] if id(p) not in index]
        if missing:
            raise InputError(f"{type(opt).__name__} holds {len(missing)} tensors that are not "
                             f"parameters of {type(module).__name__}")
        groups.append(([index[id(p)] for p in g["params"]],
                       {k: v for k, v in g.items() if k != "params"}))
    cls = type(opt)
    accepted = inspect.signature(cls.__init__).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in accepted.values()):
        defaults = {k: v for k, v in opt.defaults.items() if k in accepted}
    else:
        defaults = dict(opt.defaults)
    clip_val = trainer.gradient_clip_val
    algorithm = str(getattr(trainer.gradient_clip_algorithm, "value",
                            trainer.gradient_clip_algorithm or "norm"))
    if clip_val is not None and float(clip_val) > 0:
        opt_cls = clipping(cls, float(clip_val) if algorithm == "norm" else None,
                           None, max_value=float(clip_val) if algorithm == "value" else None)
    else:
        opt_cls = cls

    def make(params):
        params = list(params)
        if len(params) != len(named):
            raise InputError(f"the optimizer got {len(params)} parameters for a module with "
                             f"{len(named)}")
        return opt_cls([{**options, "params": [params[i] for i in idx]}
                        for idx, options in groups], **defaults)

    make.__name__ = make.__qualname__ = f"configure_optimizers' {cls.__name__}"
    return make


def _check(pl, trainer, module) -> None:
    if not module.automatic_optimization:
        raise InputError(f"{type(module).__name__} uses manual optimization: fxmem models "
                         "Lightning's automatic optimization (analyse your loop with "
                         "fxmem.analyze)")
    if not isinstance(trainer.strategy, pl.strategies.SingleDeviceStrategy):
        raise InputError(f"strategy {type(trainer.strategy).__name__}: fxmem's Lightning "
                         "integration models one device; for DDP or FSDP analyse the step with "
                         "fxmem.analyze(..., parallel=fxmem.DDP(n) or fxmem.FSDP(n))")


def _flat(batch):
    """``(spec, leaves, positions, dims)``: the batch's structure, its leaves, where its
    tensors are among them and their batch dims (0, or None for a 0-dim tensor)."""
    leaves, spec = tree_flatten(batch)
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    if not positions:
        raise InputError(f"the batch ({type(batch).__name__}) holds no tensors")
    dims = tuple(0 if leaves[i].dim() else None for i in positions)
    if all(d is None for d in dims):
        raise InputError("the batch's tensors are all 0-dim: no batch dim to scale")
    return spec, leaves, positions, dims


@dataclass(frozen=True)
class LightningStep:
    """Lightning's training step as fxmem runs it: ``module`` (a :class:`LightningBatch`
    around the LightningModule), its example ``inputs`` (the batch's tensors), the
    :class:`fxmem.Step` and ``batch_dim``. :meth:`analyze` and :meth:`measure` run it with
    the module in train mode (restored afterwards)."""

    module: LightningBatch
    inputs: tuple
    step: Step
    batch_dim: tuple
    cpu_optimizer: object = field(default=None, repr=False)  # the optimizer for measure

    @contextlib.contextmanager
    def prepared(self):
        modes = [(m, m.training) for m in self.module.modules()]
        try:
            self.module.train()
            yield self
        finally:
            self.module.kept = None
            for m, mode in modes:
                m.training = mode

    def analyze(self, **options):
        """:func:`fxmem.analyze` of this step (``options``: its keywords, e.g.
        ``checkpoint=plan, retrace=True``)."""
        with self.prepared():
            return analyze(self.module, self.inputs, step=self.step, batch_dim=self.batch_dim,
                           **options)

    def measure(self, B: int, **options):  # noqa: N803
        """:func:`fxmem.measure` of this step at batch size ``B`` on the CPU (or on CUDA when
        the step's device is ``"cuda"`` and one is here)."""
        step = self.step
        if step.device != "cuda" or not torch.cuda.is_available():
            step = Step.of(step, device="cpu", optimizer=self.cpu_optimizer)
        with self.prepared():
            return measure(self.module, self.inputs, step=step, batch_dim=self.batch_dim,
                           B=B, **options)


def lightning_step(trainer, module, batch, *, device: str | None = None) -> LightningStep:
    """The training step ``trainer.fit(module)`` runs on ``batch`` (one batch of the train
    dataloader, as it yields it), once the Trainer has set up (``on_fit_start`` or later:
    its optimizer made, its precision applied): see the module's docstring for what is
    mirrored. ``device``: the device fxmem predicts for (default: the Trainer's, ``"cuda"``
    or ``"cpu"``)."""
    pl = lightning_package(trainer)
    _check(pl, trainer, module)
    if device is None:
        device = "cuda" if trainer.strategy.root_device.type == "cuda" else "cpu"
    amp, scaled, context, convert = _precision(pl, trainer)
    if convert is not None:
        batch = convert(batch)
    batch = module._on_before_batch_transfer(batch, dataloader_idx=0)
    batch = module.on_after_batch_transfer(batch, dataloader_idx=0)
    spec, leaves, positions, dims = _flat(batch)
    sig = inspect.signature(module.training_step).parameters
    k = int(trainer.accumulate_grad_batches)
    wrapper = LightningBatch(module, spec, [None if i in positions else v
                                            for i, v in enumerate(leaves)], positions,
                             normalize=k == 1, autocast_cache=amp is None, context=context,
                             batch_idx=len(sig) >= 2 or "batch_idx" in sig)
    step = Step(optimizer=_optimizer(trainer, wrapper.module, device), device=device,
                amp=amp, grad_scaler=scaled if amp is not None else None, grad_accum=k,
                set_to_none=True, zero_grad_at="backward")
    inputs = tuple(leaves[i] for i in positions)
    return LightningStep(wrapper, inputs, step, dims, _optimizer(trainer, module, "cpu"))


@dataclass(frozen=True)
class LightningFit:
    """The batch size for ``fit``: ``batch_size``, ``peak_bytes`` (the predicted peak of
    the step at that batch size, live bytes; on CUDA counted in the allocator's 512-byte
    blocks), ``budget_bytes`` it fits and ``by`` (what answered,
    :meth:`fxmem.Report.max_batch_size`); ``checkpoint``: a :class:`fxmem.PlanChoice` when
    a checkpoint plan is needed (paths of the :class:`LightningBatch`, ``module.``-prefixed;
    :meth:`apply_checkpoint` applies it); ``report``: the step's :class:`fxmem.Report`
    (traced with the plan, if any)."""

    batch_size: int
    peak_bytes: int
    budget_bytes: int
    by: str
    checkpoint: PlanChoice | None = None
    report: object = field(default=None, repr=False, compare=False)

    def apply_checkpoint(self, module):
        """Apply :attr:`checkpoint`'s plan to the LightningModule ``module`` in place
        (PyTorch's ``checkpoint_wrapper``); returns ``module``."""
        if self.checkpoint is not None:
            apply_checkpoints(LightningBatch(module, None, [], ()), self.checkpoint.plan)
        return module


def batch_size_for(step: LightningStep, budget_bytes: int | None = None, *, by: str | None = None,
                   gpu=None, context_bytes: int | None = None,
                   max_recompute: float | None = None, report=None) -> LightningFit:
    """The largest batch size whose ``step`` (:func:`lightning_step`) fits ``budget_bytes``
    (or ``gpu="H100-80GB"``), answered as :meth:`fxmem.Report.max_batch_size` answers
    (``by``), as a :class:`LightningFit`. ``max_recompute`` (a fraction of the step's
    FLOPs): a checkpoint plan re-running at most that share may be used, for the largest
    batch; when no batch fits without one, the plan of least recompute that fits is looked
    for. Plans are confirmed by tracing the step with them and fit by live bytes.
    ``report``: the step's report, if analysed already. Raises
    :class:`fxmem.InfeasibleBudgetError` when nothing fits."""
    if budget_bytes is None and gpu is None:
        raise InputError("give budget_bytes (or gpu=)")
    report = report if report is not None else step.analyze()
    budget = dict(budget_bytes=budget_bytes, by=by, gpu=gpu, context_bytes=context_bytes)
    if max_recompute is None:
        most = largest(report, budget)
        if most is not None:
            b = int(most)
            return LightningFit(b, int(report.peak_bytes(b)), most.budget_bytes, most.by,
                                None, report)
    live = live_budget(budget)
    mr = 1.0 if max_recompute is None else max_recompute
    found = confirmed_plan(report, lambda plan: step.analyze(checkpoint=plan, retrace=True),
                           live, mr)
    if found is None:
        message, least = least_peak_message(
            report, f"no batch size, with or without a plan re-running at most {mr:.0%} of "
                    "the step,", live)
        raise InfeasibleBudgetError(message, minimum_bytes=least)
    b, choice, traced = found
    return LightningFit(b, int(traced.peak_bytes(b)), live, "live", choice, traced)


__all__ = ["lightning_step", "batch_size_for", "LightningStep", "LightningFit",
           "LightningBatch"]
