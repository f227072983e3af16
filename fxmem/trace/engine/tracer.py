"""Stage 1: trace one whole step on fake tensors, with the batch size as a symbol.

The step (:mod:`fxmem.trace.engine.step`) runs for real, in eager order, under
``FakeTensorMode`` with a ``ShapeEnv``: the batch dim of every input and target (dim 0, or
where ``batch_dim`` says) is the symbol :data:`fxmem.B`, parameters and all other dims are
static, and nothing the size of the model or the batch is allocated. A recorder
(:class:`fxmem.trace.ledger.tracking.StorageTracker`) sees every aten op, builds a
``torch.fx.Graph`` of the step, and records when eager PyTorch frees each storage.

The optimizer runs in steady state: before the recorded ``optimizer.step()``, one
unrecorded step creates its state, which then counts as live from the start of the step.

>>> import torch, fxmem
>>> from fxmem.trace import trace
>>> t = trace(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu")
>>> [s.size.expr for s in t.storages if s.category == "input"]
[32*B]
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils._pytree import tree_leaves

from ...errors import FxmemError, InputError, SpecializationError
from ..blocks.installed import copied, reuses_under, runs_of
from ..blocks.optimizer_state import copies_state, copy_state, standin_pairs, without_grads
from ..blocks.reuse import NoReuse, traced_for_real
from ..blocks.splice import splice
from ..compiled.inductor import check_compilable, inductor_on_fakes, is_compiled, modes_suspended
from ..compiled.parts import check_parts, compiled_parts, parts_lowered
from ..kernels.amp import emulate
from ..kernels.checks import CheckingShapeEnv
from ..kernels.compat import plain_backward_first, tracing_shims
from ..kernels.cuda.kernels import cuda_kernels
from ..kernels.flat_weights import flat_rnn_params
from ..kernels.rules import RNNRouter
from ..kernels.symbolic import symbolic_kernels
from ..kernels.values import eager_branches
from ..ledger.records import Trace
from ..ledger.tracking import frozen_gc, storage_resizes
from ..parallel.ddp import local_optimizer, wrapper_name
from ..parallel.fsdp import FSDP, check_parallel, fully_sharded, initialise, sharded, unwrapped
from ..parallel.fsdp_buffers import labelled
from ..parallel.local_step import on_local_shards
from ..parallel.offload import offloaded
from ..parallel.tp import metadata_unrecorded
from ..parallel.wrapped import AsWrapped
from ..plans import cache_layers
from ..plans.checkpointing import checkpointed_call, checkpointing, normalize_plan, user_path
from ..plans.regions import modules_of
from .calls import CallHooks, held, loss_wrapper, region
from .dims import symbols
from .finish import finish
from .lift import lift, parity_checked
from .messages import caused_by, named_symbols, quiet
from .modstate import (
    BufferAssigned,
    attributes_kept,
    placement,
    register_buffers,
    slots,
)
from .recorder import (
    Recorder,
    _as_trace_error,
    failed_in_model_code,
)
from .step import (
    UNSET,
    Step,
    StepSpec,
    make_grad_scaler,
    make_optimizer,
    make_spec,
    needs_closure,
    run_step,
    scaler_tensors,
    warmup_steps,
)

CACHED_FROM = 4  # blocks traced for real from which FakeTensorMode's cache is on (_Phases)


def _fake_like(mode: FakeTensorMode, t: torch.Tensor, batch=None, param=False, named=None,
               batch_dim=0, device="cpu"):
    shape = list(t.shape)
    if batch is not None and batch_dim is not None:
        shape[batch_dim] = batch
    for d, v in (named or {}).items():
        shape[d] = v
    with mode:
        f = torch.empty(shape, dtype=t.dtype, device=device)
    if param:
        f = torch.nn.Parameter(f, requires_grad=t.requires_grad)
    return f


def quietly(fn):
    """``fn`` run under :func:`fxmem.trace.engine.messages.quiet`: torch's log and warnings
    silenced."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with quiet():
            return fn(*args, **kwargs)
    return run


@quietly
def trace(model: torch.nn.Module, inputs, targets=(), loss=UNSET, optimizer=UNSET, train=UNSET,
          device=UNSET, *, step: Step | None = None, batch_hint: int | None = None,
          checkpoint=None, dims=None, reuse_blocks: bool = True, kernel_semantics: bool = True,
          concrete_batch: int | None = None, warm_up: bool = False, batch_dim=0,
          parallel=None, rank: int = 0, check_parity: bool = True, concrete_dims=None,
          **options) -> Trace:
    """Trace one steady-state step of ``model``; see the module docstring. The step is
    ``step`` with the options given here (``loss``, ``optimizer``, ``train``, ``device`` and
    any other :class:`~fxmem.trace.engine.step.Step` field as a keyword). ``checkpoint``:
    a plan (module paths) whose forwards run under ``torch.utils.checkpoint`` for real.
    With ``amp`` and ``device="cuda"``, autocast follows CUDA's op lists
    (:func:`fxmem.trace.kernels.amp.emulate`). ``dims``: other input dims that are symbols too, e.g.
    ``{"L": [(0, 1)]}`` (:func:`fxmem.trace.engine.dims.check_dims`). ``reuse_blocks``: trace
    two blocks of each run of identical blocks and copy them for the rest
    (:mod:`fxmem.trace.blocks.reuse`); the step is traced again block by block when the
    blocks turn out not to behave alike.
    ``device="cuda"`` follows CUDA's kernels (:mod:`fxmem.trace.kernels.cuda.kernels`) for a GPU of
    ``compute_capability``; ``kernel_semantics=False`` keeps the CPU's (with CUDA's autocast
    lists still emulated): only to compare with a real CPU step run under
    :func:`fxmem.trace.kernels.amp.emulate`. ``warm_up``: one unrecorded forward and backward run
    first, so that the recorded step starts from the buffers it left; the step is traced
    so when its forward turns out to (re)assign a buffer (:class:`BufferAssigned`).
    ``batch_dim``: where B is in the inputs and targets (default 0;
    :func:`fxmem.trace.engine.step.batch_dims`).

    When the step fixes B as a Python int (``len(x)``, ``int(x.shape[0])``), the step is
    traced at several concrete batch sizes and the sizes fitted as polynomials in B
    (:mod:`fxmem.trace.engine.lift`); ``concrete_batch``: trace at that batch size, with B a plain
    int (every size then a number); ``concrete_dims``: ``{name: size}``, named dims of
    ``dims`` traced at that size as plain ints, the inputs made so (with ``concrete_batch``,
    one point: no size is a symbol, the fastest trace).

    ``parallel``: the step of rank ``rank`` of a data-parallel run (:class:`fxmem.FSDP`,
    :class:`fxmem.DDP`),
    the model wrapped as that strategy wraps it (:mod:`fxmem.trace.parallel.fsdp`); B is the
    rank's micro-batch."""
    step = Step.of(step, loss=loss, optimizer=optimizer, train=train, device=device, **options)
    spec = make_spec(model, inputs, targets, step, batch_dim)
    check_parallel(parallel, rank)
    check_parts(model, checkpoint, parallel, spec)  # fxmem.trace.compiled.parts
    plain_backward_first()  # forks stay usable on a CUDA build (fxmem.trace.kernels.compat)
    if parallel is not None:  # blocks are copied under FSDP2 only (fxmem.trace.blocks.sharded)
        reuse_blocks = reuse_blocks if reuses_under(parallel, spec.train) else False
        spec = _replace_optimizer(spec, parallel.optimizer(spec.optimizer))  # ZeRO-1
    plan = normalize_plan(model, checkpoint, parallel, spec.compile)
    if batch_hint is not None and (isinstance(batch_hint, bool) or not isinstance(batch_hint, int)
                                   or batch_hint < 1):
        raise InputError(f"batch_hint must be a positive int, got {batch_hint!r}")
    hint = concrete_batch or batch_hint or (spec.batch_size if spec.batch_size >= 2 else 8)
    shape_env = CheckingShapeEnv(specialize_zero_one=False, duck_shape=False)
    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)
    sym, batch, dim_syms, named = symbols(shape_env, spec, hint, concrete_batch, dims,
                                           concrete_dims)
    rec = Recorder(shape_env, sym, dim_syms)
    rec.capability = step.compute_capability
    if spec.device == "cuda" and kernel_semantics:  # CUDA's kernels, not the CPU's
        rec.kernels = cuda_kernels(rec.capability)
        rec.backend = "cuda"  # an op with a CUDA kernel of its own runs whole (tracking)
    def again(**changes) -> Trace:  # this step traced again, some options changed
        options = dict(step=step, batch_hint=batch_hint, checkpoint=checkpoint, dims=dims,
                       reuse_blocks=reuse_blocks, kernel_semantics=kernel_semantics,
                       concrete_batch=concrete_batch, warm_up=warm_up, batch_dim=batch_dim,
                       parallel=parallel, rank=rank, check_parity=check_parity,
                       concrete_dims=concrete_dims)
        return trace(model, inputs, targets, **{**options, **changes})

    with named_symbols(rec):  # B and the named dims in messages, not s44
        handles, retry, fixed = [], False, None
        try:
            with frozen_gc(), tracing_shims(), symbolic_kernels(), attributes_kept(model), \
                    _as_rank(model, parallel, rank, mode, rec, spec.compile) as (ranked, kept):
                traced = _run(ranked, spec, mode, rec, sym, batch, hint, handles, plan, named,
                              reuse_blocks, warm_up, prepared=parallel is not None,
                              kept=kept, warm_steps=getattr(parallel, "warmup_steps", 1),
                              parallel=parallel)
            if rec.assigned is None:
                if concrete_batch is not None or not check_parity:
                    return traced
                return parity_checked(traced, lambda b: again(batch_hint=b,
                                                              check_parity=False))
            # the model caught BufferAssigned: the buffer was not even assigned
            retry, warm_up = True, True
        except SpecializationError as e:
            if concrete_batch is not None or not _fixed(shape_env, sym):
                raise
            fixed = e, "makes B a Python int"  # (len(x), int(x.shape[0]), [0] * x.size(0))
        except FxmemError:
            raise
        except Exception as e:  # noqa: BLE001 - turned into one clear TraceError
            if caused_by(e, BufferAssigned):
                retry, warm_up = True, True
            elif caused_by(e, NoReuse):
                retry = True
            elif concrete_batch is None and failed_in_model_code(e, rec):
                fixed = _as_trace_error(e, rec), "runs code that fails with B a symbol"
            else:
                raise _as_trace_error(e, rec) from e
        finally:
            rec.close()
            for h in handles:
                h.remove()
        warm_up = warm_up or rec.assigned is not None
        if fixed is not None:  # traced at concrete batch sizes, the sizes fitted in B
            # (the conditions on B met before it was fixed hold)
            guards = [g.expr.xreplace(rec.subs) for g in shape_env.guards
                      if g.expr.free_symbols <= {sym}]
            return lift(lambda b: again(batch_hint=None, concrete_batch=b),
                        fixed[0], guards, hint=hint, cause=fixed[1])
        if retry:  # the blocks did not behave alike (trace each one), or a buffer is assigned
            # (FSDP2's interior blocks copied with their hooks failed: they run them)
            return again(reuse_blocks="hooks" if reuse_blocks is True and parallel is not None
                         and not warm_up else False)


@contextlib.contextmanager
def _as_rank(model, parallel, rank: int, mode, rec, compile=None):
    """``model`` itself, or with ``parallel``, a copy wrapped as rank ``rank`` runs it
    (:func:`fxmem.trace.parallel.fsdp.sharded`; ``compile``: ``compile=``, its blocks
    compiled in place first), its parameters fakes of ``mode`` already;
    and what saw the wrapper's construction (:class:`fxmem.trace.parallel.ddp.Kept`, or None), with
    DTensor's shape propagation unrecorded (:func:`fxmem.trace.parallel.tp.metadata_unrecorded`)."""
    if parallel is None:
        yield model, None
        return
    if isinstance(parallel, AsWrapped):  # the user's own wrapping (fxmem.trace.parallel.wrapped)
        with parallel.copy(model, rank, mode) as (copied, kept), metadata_unrecorded(rec):
            yield copied, kept
        return
    rec.offload = parallel.offload
    # inductor lowers for its inputs' device
    on = "cuda" if compiled_parts(model) or compile is not None else "cpu"
    with sharded(model, parallel, rank, mode, on, compile) as (copied, kept), \
            metadata_unrecorded(rec), \
            offloaded(rec) if parallel.offload else contextlib.nullcontext(), \
            labelled(rec) if type(parallel) is FSDP else contextlib.nullcontext():
        yield copied, kept


def _fixed(shape_env, sym) -> bool:
    """Did the ShapeEnv fix the batch symbol to a number (not only a named dim)?"""
    val = shape_env.replacements.get(sym)
    rng = shape_env.var_to_range.get(sym)
    return (val is not None and val.is_number) or (rng is not None and rng.lower == rng.upper)


def _run(model, spec: StepSpec, mode, rec: Recorder, sym, batch, hint, handles,
         plan=(), named=None, reuse_blocks=False, warm_up=False, prepared=False, kept=None,
         warm_steps=1, parallel=None) -> Trace:
    """The step run once on fakes of ``mode``, recorded by ``rec``, and its trace: the fakes
    made and named, the module hooks installed (their ``handles`` removed by :func:`trace`),
    the optimizer made, the warm-up steps run unrecorded, the recorded step run, and the
    copied blocks spliced in. ``prepared``: ``model`` is a rank's wrapped model whose own
    parameters are fakes of ``mode`` already (:func:`fxmem.trace.parallel.fsdp.sharded`)."""
    wrapper, model = model, unwrapped(model)  # names, plans and buffers are the user's model's
    if spec.compile is not None and not prepared:  # compile=: torch.compile(model) (a
        wrapper = spec.compile.apply(wrapper)  # rank's blocks are compiled already: sharded)
    # a compiled model is lowered for the device its fakes are on (fxmem.trace.compiled.inductor)
    parts, taken = compiled_parts(wrapper), []
    compiled = is_compiled(wrapper) or bool(parts)
    rec.compiled, rec.compiled_parts = compiled, tuple(path for path, _ in parts)
    rec.cache_layers = cache_layers(model)
    if compiled:
        check_compilable(spec.device)
        rec.streams_on("cuda")  # its fakes, and a rank's shards (sharded), are CUDA's
    if not prepared:  # a rank's wrapped model places its shards itself
        rec.placement = placement(model)
    fakes = _Fakes.of(model, spec, mode, batch, named or {}, prepared, compiled)
    # steady state: the previous step left every gradient allocated (set_to_none=False),
    # and the buffers its forward assigned; an unrecorded step first makes them
    # (zero_grad_at="backward": the previous step's gradients live until the first backward)
    kept_grads = spec.train and (not spec.set_to_none or spec.zero_grad_at == "backward")
    warm = warm_up or prepared or kept_grads
    # FSDP2 keeping nothing across steps: its own initialisation, not a whole step, before
    # the recorded one (fxmem.trace.parallel.fsdp.initialise; BufferAssigned: traced again)
    only_init = prepared and not (warm_up or kept_grads) and kept is None and fully_sharded(wrapper)
    fakes.register(rec, prepared, warm)
    CallHooks(rec, model).install(wrapper, prepared, handles, watch=not warm or only_init)

    def forward(*args):
        if compiled and not parts:  # dynamo captures with no mode on (compiled.inductor)
            with modes_suspended(taken):
                return wrapper(*args)
        return wrapper(*args)

    with mode:
        opt = make_optimizer(spec.optimizer, fakes.param_list, spec.device, spec) \
            if spec.optimizer else None
        if opt is not None and prepared:  # a rank's DTensor shards (fxmem.trace.parallel)
            on_local_shards(opt)
        scaler = make_grad_scaler(spec, "cpu", fake=True)
    for name, t in scaler_tensors(scaler).items():
        rec.register_named(t, "optimizer_state", name)
    phases = _Phases(rec, mode, fakes, opt)
    spec_run = spec if spec.loss is None else _replace_loss(spec, loss_wrapper(rec, spec.loss))
    reusable = (reuse_blocks and not compiled and not warm_up and spec.grad_accum == 1
                and not kept_grads and not needs_closure(opt))
    # found before the plan's forwards are installed on the blocks, installed over them
    # (a rank's warm-up runs later blocks cheaply too: ShardedReuse)
    runs = runs_of(model, prepared) if reusable else []
    inside = _step_contexts(model, spec, mode, rec, fakes, prepared)
    # the plan's parts compiled on their own (the user's paths: not DDP's "module.layers.0"),
    in_plan = {q for e in plan for q in modules_of(e)}  # lowered with the checkpoint (parts)
    ids = {id(m) for p, m in compiled_parts(model) if user_path(p) in in_plan}
    planned = {p: checkpointed_call(m, prepared) for p, m in parts if id(m) in ids}
    with checkpointing(model, plan, region(rec), held(rec), compiled and not parts) \
            as rec.plan, \
            copied(rec, runs, rec.plan, prepared, fakes.params, fakes.buffers,
                   replicated=kept is not None,
                   hookless=reuse_blocks is True and spec.train and _hookless(parallel)) \
            as reuse, \
            _entered(inside), \
            kept.real if kept is not None else contextlib.nullcontext(), \
            inductor_on_fakes(taken, spec.compile, rec) if compiled else \
            contextlib.nullcontext(), \
            parts_lowered(parts, taken, rec, hooked=prepared, planned=planned):
        phases.cached = reuse is None or traced_for_real(runs, reuse.runs) >= CACHED_FROM
        phases.reuse = reuse
        run = functools.partial(run_step, forward, spec_run, fakes.inputs, fakes.targets,
                                fakes.param_list)
        if warm:  # one unrecorded forward and backward, as fxmem.measure's warm-up step
            _warm_up(rec, run, model, wrapper, fakes, kept, kept_grads, prepared, warm_steps,
                     only_init, getattr(reuse, "hookless", ()))
        if needs_closure(opt):
            _closure_warm_up(rec, run, opt, fakes.param_list)
        out = run(opt, phases, micro_steps=min(spec.grad_accum, 2), scaler=scaler)
    end_index = _spliced(rec, reuse)
    del out
    return finish(rec, sym, hint, spec, end_index)


@dataclass
class _Fakes:
    """The fake parameters, buffers, inputs and targets of one trace (names -> fakes, in
    the model's order). A rank's wrapped model (``prepared``) brings its own."""

    params: dict
    buffers: dict
    inputs: list
    targets: list
    by_id: dict  # id of the model's own tensor -> its fake, for the parameter swap

    @property
    def param_list(self) -> list:
        return list(self.params.values())

    @classmethod
    def of(cls, model, spec: StepSpec, mode, batch, named: dict, prepared: bool,
           compiled: bool) -> _Fakes:
        on = "cuda" if compiled else "cpu"
        named_p = list(model.named_parameters())
        named_b = [(n, b) for n, b in model.named_buffers() if b is not None]
        # on CUDA an RNN's weights are views of cuDNN's flat buffer (trace.kernels.flat_weights)
        flat = flat_rnn_params(mode, model) \
            if spec.device == "cuda" and not prepared and not compiled else {}
        params = dict(named_p) if prepared else \
            {n: flat[n] if n in flat else _fake_like(mode, p, param=True, device=on)
             for n, p in named_p}
        buffers = dict(named_b) if prepared else \
            {n: _fake_like(mode, b, device=on) for n, b in named_b}
        n_in = len(spec.inputs)
        inputs = [_fake_like(mode, t, batch, named=named.get(i), batch_dim=spec.batch_dims[i],
                             device=on) for i, t in enumerate(spec.inputs)]
        targets = [_fake_like(mode, t, batch, named=named.get(n_in + i),
                              batch_dim=spec.batch_dims[n_in + i], device=on)
                   for i, t in enumerate(spec.targets)]
        by_id = {id(p): params[n] for n, p in named_p} | {id(b): buffers[n] for n, b in named_b}
        return cls(params, buffers, inputs, targets, by_id)

    def register(self, rec: Recorder, prepared: bool, warm: bool) -> None:
        """Name the storages the step starts with. A rank's wrapped model (``prepared``) is
        registered after the warm-up step, which initialises the wrapping (FSDP2's lazy
        init may move the shards to new storages); after a warm-up (``warm``), the buffers
        it leaves are."""
        for n, p in self.params.items() if not prepared else ():
            rec.register_named(p, "param", user_path(n))
        for n, b in self.buffers.items() if not warm else ():
            rec.register_named(b, "buffer", user_path(n))
        for i, t in enumerate(self.inputs):
            rec.register_named(t, "input", f"inputs[{i}]")
        for i, t in enumerate(self.targets):
            rec.register_named(t, "input", f"targets[{i}]")


class _Phases:
    """What :func:`run_step` calls as each phase of the recorded step begins: the recorder
    told where it is, and before the optimizer's phase, the gradients named and the
    optimizer's state made by one unrecorded step (the step then runs in steady state;
    with blocks copied, over the blocks traced for real, the stand-ins' state copied:
    :mod:`fxmem.trace.blocks.optimizer_state`; ``reuse``, set once the stand-ins are in).
    ``cached``: whether FakeTensorMode's cache is on in forward and backward, set once the
    blocks' reuse is entered (no reuse, or :data:`CACHED_FROM` blocks traced for real)."""

    def __init__(self, rec: Recorder, mode, fakes: _Fakes, opt):
        self.rec, self.mode, self.fakes, self.opt = rec, mode, fakes, opt
        self.cache = mode.cache_enabled
        self.cached = True
        self.reuse = None  # fxmem.trace.blocks.reuse.Reuse, when blocks are copied

    def __call__(self, name: str) -> None:
        rec = self.rec
        # FakeTensorMode's dispatch cache pays when an op repeats with the same sizes many
        # times: Adam's foreach ops, and a stack whose every block is traced. With two
        # blocks traced and the rest reused, a forward or backward op repeats about twice,
        # and with symbolic sizes making and checking an entry costs more than it saves
        # (GPT-2 small, B and L symbolic: 1.19 s with it off there, 1.67 s on;
        # benchmarks/speed.py). A plan that cuts the runs has more blocks traced for real
        # (Llama-3.1-8B's chosen plan over 8 ranks, 9: its trace took 10.4 and 10.8 s with
        # the cache, 12.7 and 15.2 s without; at 4, about even). Views skip it wherever it
        # is on (fxmem.trace.engine.eager_ops._cache_off_for)
        self.mode.cache_enabled = self.cache and (self.cached or name == "optimizer")
        if name == "forward":
            rec.module_stack[:] = [""]
            rec.call_starts.clear()
        if name == "backward":
            rec.module_stack[:] = ["<loss>"]
        if name == "optimizer":
            rec.phase = name  # the unrecorded step below reads as the optimizer's
            self._optimizer_state()
        rec.phase = name

    def _optimizer_state(self) -> None:
        rec, opt = self.rec, self.opt
        for n, p in self.fakes.params.items():
            if p.grad is not None:
                sid = rec.sid(p.grad)
                if sid is not None and rec.storages[sid].created_by >= 0:
                    rec.names[sid] = ("grad", n)
        if opt is None or needs_closure(opt):
            return
        local = local_optimizer(opt)  # ZeRO-1: this rank's partition's
        params = self.fakes.params
        # copied blocks: their state copied from their pattern block's (the stand-ins'
        # parameters are not stepped: fxmem.trace.blocks.optimizer_state)
        pairs = standin_pairs(self.reuse, params) \
            if self.reuse is not None and copies_state(opt, local) else {}
        rec.recording = False  # state: one unrecorded step
        with without_grads([params[n] for n in pairs]):
            opt.step()
        copy_state(local.state, params, pairs)
        rec.recording = True
        state = local.state
        for n, p in self.fakes.params.items():
            for k, t in state.get(p, {}).items():
                if isinstance(t, torch.Tensor):
                    rec.register_named(t, "optimizer_state", f"{n}.{k}")


def _step_contexts(model, spec: StepSpec, mode, rec: Recorder, fakes: _Fakes,
                   prepared: bool) -> list:
    """Everything the step runs inside but the plan, the reuse and the wrapping, in the
    order entered (made now, before the plan is installed): the fake parameters swapped
    in, the RNN router, CUDA's autocast lists and kernels, the fake mode, the recorder, the
    saved-tensor hooks, the known values, storage resizes."""
    # Only models with RNN modules get the router: any active torch-function mode turns off
    # fast paths such as nn.TransformerEncoderLayer's fused inference kernel. On CUDA,
    # fxmem.trace.kernels.cuda.kernels routes the RNNs to what the CUDA build runs instead.
    has_rnn = any(isinstance(m, (torch.nn.RNNBase, torch.nn.RNNCellBase))
                  for m in model.modules())
    router = RNNRouter() if has_rnn and rec.kernels is None else contextlib.nullcontext()
    # The fake parameters stay in place for the whole step, not just the forward: a
    # checkpointed module's forward runs again during backward.
    swap = contextlib.nullcontext() if prepared else \
        _reparametrize_module(model, slots(model, fakes.by_id))
    # CUDA's autocast rules on the fake CPU tensors, for the whole step (a checkpointed
    # module's re-run in backward enters autocast again)
    rules = emulate("cuda") if spec.amp is not None and spec.device == "cuda" else \
        contextlib.nullcontext()
    kernels = rec.kernels if rec.kernels is not None else contextlib.nullcontext()
    hooks = torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.saved_tensors.unpack)
    return [swap, router, rules, kernels, mode, rec, hooks, eager_branches(rec.values),
            storage_resizes(rec)]


@contextlib.contextmanager
def _entered(contexts: list):
    """``contexts`` entered in order and left in reverse, as one ``with`` statement would."""
    with contextlib.ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c)
        yield


def _hookless(parallel) -> bool:
    """FSDP2 as the interior blocks' hooks are copied for (its defaults: resharded
    after forward, no CPU offload, no HSDP, no TP)."""
    return type(parallel) is FSDP and parallel.reshard_after_forward is True and \
        not parallel.offload and parallel.replicate == 1


def _warm_up(rec: Recorder, run, model, wrapper, fakes: _Fakes, kept, kept_grads: bool,
             prepared: bool, steps: int, only_init: bool = False, hookless=()) -> None:
    """``steps`` unrecorded forwards and backwards (DDP: until its buckets are rebuilt;
    ``only_init``: FSDP2's initialisation instead), then the storages they leave named: a
    rank's shards, the gradients the recorded step starts with, the buffers, the wrapper's
    own storages (DDP's gradient buckets)."""
    rec.recording = False
    with kept if kept is not None else contextlib.nullcontext():
        if only_init:
            initialise(wrapper, hookless)
        else:
            for _ in range(steps):
                run(None, lambda name: None, micro_steps=1)
    rec.recording = True
    for n, p in fakes.params.items() if prepared else ():
        rec.register_named(p, "param", user_path(n))
    for n, p in fakes.params.items():
        if p.grad is not None and kept_grads:
            rec.register_named(p.grad, "grad", user_path(n))
        elif kept is not None:  # as the step's zero_grad will (not the wrapper's)
            p.grad = None
    register_buffers(rec, model)
    if kept is not None:
        for i, st in enumerate(kept.left([*fakes.params.values(), *fakes.buffers.values()])):
            rec.register_named(st, "grad", f"<{wrapper_name(wrapper)}>[{i}]")
        kept.close()


def _closure_warm_up(rec: Recorder, run, opt, params: list) -> None:
    """Steady state for an optimizer that evaluates the loss itself (LBFGS): its history is
    full after some steps; they run unrecorded, and its state is named."""
    rec.recording = False
    for _ in range(warmup_steps(opt)):
        run(opt, lambda name: setattr(rec, "phase", name))
    rec.recording = True
    for k, v in opt.state[params[0]].items():
        leaves = [t for t in tree_leaves(v) if isinstance(t, torch.Tensor)]
        for i, t in enumerate(leaves):
            rec.register_named(t, "optimizer_state", f"{k}[{i}]" if len(leaves) > 1 else k)


def _spliced(rec: Recorder, reuse) -> int:
    """Close the recording, copy the reused blocks' ops in (autograd's in-place gradient
    sums applied on the spliced trace) and return the number of ops of the step."""
    if reuse is not None:
        rec.sums.hold = True
    rec.close()
    rec.check_specialized()
    if reuse is not None:
        reuse.finish()
        splice(rec, reuse)
        rec.sums.hold = False
        rec.sums.apply(rec.storages, rec.names)
    return len(rec.ops)


def _replace_optimizer(spec: StepSpec, factory) -> StepSpec:
    from dataclasses import replace

    if factory is spec.optimizer:
        return spec
    return replace(spec, step=replace(spec.step, optimizer=factory))


def _replace_loss(spec: StepSpec, fn) -> StepSpec:
    from dataclasses import replace

    return replace(spec, step=replace(spec.step, loss=fn))
