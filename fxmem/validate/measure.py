"""Ground truth: run the real step eagerly and measure its peak memory.

On CPU, live bytes are tracked at storage level with
:class:`fxmem.trace.ledger.tracking.StorageTracker` (every storage's ``nbytes`` from its creation
until eager PyTorch frees it). On CUDA, the figure is ``torch.cuda.max_memory_allocated`` after
warm-up and a reset of the peak stats.

Two steps run: the first creates optimizer state; the second, in steady state (gradients
set to None, optimizer state present), is measured. The user's model is never modified: the
step runs on a deep copy.

>>> import torch, fxmem
>>> m = torch.nn.Linear(4, 2)
>>> r = fxmem.measure(m, torch.randn(3, 4), loss=lambda o: o.sum(), B=5)
>>> r.peak_bytes >= 5 * 4 * 4   # at least the input batch
True
"""

from __future__ import annotations

import contextlib
import copy
import gc
import time
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from ..errors import InputError
from ..trace.engine import (
    PHASES,
    UNSET,
    Step,
    make_grad_scaler,
    make_optimizer,
    make_spec,
    run_step,
    scaler_tensors,
    warmup_steps,
)
from ..trace.ledger import StorageTracker, frozen_gc, storage_resizes
from ..trace.parallel import (
    check_parallel,
    host_storages,
    local_optimizer,
    offloaded,
    refuse_wrapped,
)
from .fakegpu.remote import on_fake_gpu


@dataclass(frozen=True)
class Measurement:
    """Measured memory of one steady-state step, in bytes.

    ``peak_bytes``: most bytes live at once during the step (CPU: live storage bytes;
    CUDA: ``max_memory_allocated``). ``baseline_bytes``: live before the step (params,
    buffers, optimizer state, batch). ``end_bytes``: live after it. ``phase_peak_bytes``:
    the peak within each phase. CUDA only: ``peak_reserved_bytes`` (``max_memory_reserved``),
    its peak within each phase, and ``baseline_reserved_bytes``; with ``record_history``,
    ``allocations``: ``(bytes requested, innermost Python frame)`` of every allocation the
    step made, in order (:mod:`fxmem.validate.divergence`).
    """

    peak_bytes: int
    baseline_bytes: int
    end_bytes: int
    B: int
    device: str
    phase_peak_bytes: dict
    peak_reserved_bytes: int | None = None
    phase_peak_reserved_bytes: dict | None = None
    baseline_reserved_bytes: int | None = None
    allocations: tuple = ()
    torch_version: str | None = None  # the release that measured it (the fake GPU's Python's)


def batch_of(t: torch.Tensor, b: int, device, dim: int | None = 0) -> torch.Tensor:
    """A real tensor like ``t`` with dim ``dim`` (where B is) equal to ``b``: ``t`` tiled
    along it, so that values stay valid (class labels, token ids); zeros if ``t`` holds no
    data (meta). ``dim=None``: a tensor with no batch dim, its size kept.

    >>> batch_of(torch.tensor([[1, 2], [3, 4]]), 3, "cpu", dim=1)
    tensor([[1, 2, 1],
            [3, 4, 3]])
    """
    shape = list(t.shape)
    if dim is not None:
        shape[dim] = b
    if t.is_meta:
        return torch.zeros(shape, dtype=t.dtype, device=device)
    if dim is None:
        return t.to(device).contiguous()
    idx = torch.arange(b, device=t.device) % t.shape[dim]
    return t.index_select(dim, idx).to(device).contiguous()


def _tensors(obj) -> list:
    """The tensors inside nested dicts, lists and tuples (e.g. optimizer state)."""
    return [x for x in tree_leaves(obj) if isinstance(x, torch.Tensor)]


def _steady_grads(spec, params) -> None:
    """Gradients as the previous step leaves them: gone, unless ``set_to_none=False`` or
    the step zeroes them late (``zero_grad_at="backward"``)."""
    if spec.set_to_none and spec.zero_grad_at == "start":
        for p in params:
            p.grad = None


MAX_WARMUP_STEPS = 64


def _warm_up(model, spec, ins, tgs, params, opt, scaler, steps: int = 1) -> None:
    """Steps until the state is steady: ``steps`` (LBFGS: until its history is full), and
    with a GradScaler, until one is not skipped (the scale starts at 2**16 and halves at
    each step whose gradients overflow)."""
    for _ in range(max(warmup_steps(opt), steps) - 1):
        out = run_step(model, spec, ins, tgs, params, opt, lambda phase: None, scaler=scaler)
        del out
    for _ in range(MAX_WARMUP_STEPS):
        scale = _scale(scaler)
        out = run_step(model, spec, ins, tgs, params, opt, lambda phase: None, scaler=scaler)
        del out
        if scale is None or scaler.get_scale() >= scale:
            return
    raise InputError(f"the GradScaler skipped all {MAX_WARMUP_STEPS} warm-up steps: the "
                     "gradients are inf or nan at every scale")


def _scale(scaler) -> float | None:
    """The GradScaler's scale, to tell a skipped step; None without one, or with one whose
    steps are never skipped (on the fake GPU, where the scale is not computed)."""
    if scaler is None or getattr(scaler, "finite_steps", False):
        return None
    return scaler.get_scale()


def _check_not_skipped(scaler, scale) -> None:
    if scale is not None and scaler.get_scale() < scale:
        raise InputError("the measured step's gradients overflowed and the GradScaler skipped "
                         "its optimizer step; measure again")


class _Tracker(StorageTracker):
    # in a rank's process (fxmem.validate.distributed): after each collective op, and after
    # each wait on one (a functional collective's ``wait_tensor``: tensor parallelism's
    # all-reduces), the communication thread is given this long to let go of its tensors
    settle_seconds = 0.0

    def run_op(self, func, args, kwargs):
        out = func(*args, **kwargs)
        if self.settle_seconds and func.namespace in ("c10d", "_c10d_functional"):
            time.sleep(self.settle_seconds)
        return out

    def __init__(self):
        super().__init__()
        self.phase = "start"
        self.deltas = []  # (op_index, phase) for each alloc, to attribute phase peaks

    def on_op(self, index, func, args, kwargs, out, out_sids, new_sids):
        if new_sids:
            self.deltas.append((index, self.phase))

    def on_resize(self, index, st, sid):
        self.deltas.append((index, self.phase))


def measure(model, inputs, targets=(), loss=UNSET, optimizer=UNSET, train=UNSET, *, B: int,
            device=UNSET, step: Step | None = None, record_history: bool = False,
            batch_dim=0, parallel=None, fake_gpu=None, **options) -> Measurement:
    """Peak memory of one real steady-state step at batch size ``B``. The step is ``step``
    with the options given here (``loss``, ``optimizer``, ``train``, ``device`` and any
    other :class:`fxmem.Step` field as a keyword: ``set_to_none``, ``grad_accum``,
    ``inference_mode``, ``amp``, ``grad_scaler``), as for :func:`fxmem.analyze`; the device
    is the CPU unless ``device`` or ``step`` says otherwise. To run a CPU step with CUDA's
    autocast rules, call this inside :func:`fxmem.trace.kernels.amp.emulate`. ``batch_dim``: where
    B is in the inputs and targets, as for :func:`fxmem.analyze`: each is tiled to ``B``
    along it (a tensor with no batch dim is used as it is).
    ``record_history=True`` (CUDA): the measured step's allocations are kept too, from
    ``torch.cuda.memory._snapshot()``.

    ``parallel`` (:class:`fxmem.FSDP`, :class:`fxmem.DDP`, :class:`fxmem.TP`,
    :class:`fxmem.Parallel`): the step of each rank of a real parallel run on the CPU,
    ``world_size`` processes over gloo on this machine
    (:mod:`fxmem.validate.distributed`); returns a tuple of one :class:`Measurement` per
    rank, rank 0 first, ``B`` each rank's batch.

    ``fake_gpu`` (the path of a Python with a CUDA build of PyTorch and fxmem's
    requirements): a ``device="cuda"`` step measured there on the fake GPU, on a machine
    with no GPU (:mod:`fxmem.validate.fakegpu.remote`; the model's class, the loss and the
    optimizer factory must be importable there: defined at a module's top level)."""
    if device is UNSET and step is None:
        device = "cpu"
    step = Step.of(step, loss=loss, optimizer=optimizer, train=train, device=device, **options)
    spec = make_spec(model, inputs, targets, step, batch_dim)
    device = step.device
    if not isinstance(B, int) or B < 1:
        raise InputError(f"B must be a positive int, got {B!r}")
    check_parallel(parallel)
    refuse_wrapped(model, parallel, "measure")  # its processes wrap their own copies
    if any(p.is_meta for p in model.parameters()):
        raise InputError("measure needs a model with real weights (this one is on meta)")
    if fake_gpu is not None:
        return _measure_on_fake_gpu(fake_gpu, model, inputs, targets, step, B, batch_dim,
                                    record_history, parallel)
    if device == "cuda" and torch.cuda.is_initialized():
        _fresh_allocator()
    if parallel is not None and (device != "cpu" or record_history):
        raise InputError(f"a {parallel.name} step is measured on the CPU (gloo), not on "
                         f"{device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("measuring a CUDA step needs a CUDA build of PyTorch with a device: "
                         "a GPU, or the fake GPU (fake_gpu='/path/to/cuda-venv/bin/python')")
    if spec.compile is not None:
        from ..trace.compiled import check_compilable

        check_compilable(device)
    model = copy.deepcopy(model).to(device)
    n_in = len(spec.inputs)
    ins = [batch_of(t, B, device, d) for t, d in zip(spec.inputs, spec.batch_dims)]
    tgs = [batch_of(t, B, device, d) for t, d in zip(spec.targets, spec.batch_dims[n_in:])]
    if parallel is not None:
        from .distributed import SETTLE_SECONDS, measure_ranks

        def one_rank(wrapped, params, kept=None):  # in each rank's process, wrapped
            _Tracker.settle_seconds = SETTLE_SECONDS  # this process's own class (fork)
            factory = parallel.optimizer(spec.optimizer)  # ZeRO-1's over the user's
            opt = make_optimizer(factory, params, device, spec) if factory else None
            with frozen_gc():
                return _measure_cpu(wrapped, spec, ins, tgs, params, opt, B, device,
                                    make_grad_scaler(spec, device), kept=kept,
                                    warm_steps=parallel.warmup_steps,
                                    offload=parallel.offload)

        return measure_ranks(model, spec, parallel, B, one_rank)
    params = [p for p in model.parameters()]
    opt = make_optimizer(spec.optimizer, params, device, spec) if spec.optimizer else None
    # on the fake GPU the GradScaler's inf check reads memory no kernel wrote: its steps are
    # taken as the finite ones a real GPU's steady state makes (see make_grad_scaler)
    scaler = make_grad_scaler(spec, device, fake=device == "cuda" and on_fake_gpu())
    if device == "cuda" and spec.compile is not None:
        return _measure_compiled(model, spec, ins, tgs, params, opt, B, scaler, record_history)
    if device == "cuda":
        return _measure_cuda(model, spec, ins, tgs, params, opt, B, scaler, record_history)
    if record_history:
        raise InputError("record_history reads the CUDA allocator's snapshot: device='cuda'")
    # On CPU only the storages the step makes count, so the collection before it need only
    # look at objects made here: the collector's objects from before are frozen meanwhile
    # (a full pass over torch and a test session's models costs more than a small step).
    with frozen_gc():
        return _measure_cpu(model, spec, ins, tgs, params, opt, B, device, scaler)


def _measure_cpu(model, spec, ins, tgs, params, opt, B, device, scaler, kept=None,
                 warm_steps: int = 1, offload: bool = False) -> Measurement:
    """CPU protocol: warm up, collect, then the live bytes of the storages the next step
    makes, replayed from the tracker's events. ``kept`` (:class:`fxmem.trace.parallel.ddp.Kept`,
    which saw a wrapper's construction): active in the warm-up too, and the storages it
    saw made and still alive count as live before the step (DDP's gradient buckets, which
    only its C++ Reducer refers to); ``warm_steps``: the wrapper's warm-up steps.
    ``offload``: an FSDP2 rank with CPU offload, its host-device copies made as on a GPU
    and its host storages left out (:mod:`fxmem.trace.parallel.offload`)."""
    with kept if kept is not None else contextlib.nullcontext(), \
            offloaded(None) if offload else contextlib.nullcontext():
        _warm_up(model, spec, ins, tgs, params, opt, scaler, warm_steps)
    _steady_grads(spec, params)
    gc.collect()
    tracker = _Tracker()
    state = local_optimizer(opt).state if opt is not None else {}  # ZeRO-1: local state
    grads = [p.grad for p in params if p.grad is not None]
    for t in [*params, *model.buffers(), *_tensors(state), *grads, *ins, *tgs,
              *scaler_tensors(scaler).values()]:
        tracker.register(t)
    if offload:  # the shards, their gradients and optimizer state: host memory
        tracker.host |= {tracker.register(t)[0] for t in [*params, *_tensors(state), *grads]}
    del grads, t  # a late zero_grad (zero_grad_at="backward") frees the gradients mid-step
    if kept is not None:
        for st in kept.left([*params, *model.buffers()]):
            tracker.register(st)
        kept.close()
    baseline = sum(int(s.nbytes) for s in tracker.storages if s.sid not in tracker.host)

    def on_phase(name):
        tracker.phase = name

    scale = _scale(scaler)
    with tracker, storage_resizes(tracker), \
            offloaded(tracker) if offload else contextlib.nullcontext():
        out = run_step(model, spec, ins, tgs, params, opt, on_phase, scaler=scaler)
    tracker.close()
    del out
    _check_not_skipped(scaler, scale)

    # replay the events: live bytes after each op's allocations, before later frees
    live, peak = baseline, baseline
    phase_peaks = {}
    phase_of = dict(tracker.deltas)
    host = host_storages({}, {ev.sid: phase_of.get(ev.op_index, "start")
                              for ev in tracker.events if ev.kind == "alloc"},
                         tracker.host) if offload else set()
    for ev in tracker.events:
        n = int(tracker.storages[ev.sid].nbytes) if ev.sid not in host else 0
        live += n if ev.kind == "alloc" else -n
        if ev.kind == "alloc":
            peak = max(peak, live)
            ph = phase_of.get(ev.op_index, "start")
            phase_peaks[ph] = max(phase_peaks.get(ph, 0), live)
    return Measurement(peak, baseline, live, B, device,
                       {p: phase_peaks[p] for p in PHASES if p in phase_peaks})


def _measure_compiled(model, spec, ins, tgs, params, opt, B, scaler,  # noqa: N803
                      record_history) -> Measurement:
    """``compile=``: the model compiled with ``torch.compile`` (and the partitioner's budget
    while it compiles), first run at the example's batch size with the batch dims dynamic,
    as fxmem's trace compiles it (inductor decides some things by that size, and the code
    it writes then serves every B), then measured at ``B`` by the CUDA protocol."""
    run = spec.compile.apply(model)
    with spec.compile.settings():
        _compile_at_example(run, spec, params, opt, scaler)
        return _measure_cuda(run, spec, ins, tgs, params, opt, B, scaler, record_history)


def _compile_at_example(run, spec, params, opt, scaler) -> None:
    """One step of ``run`` at the example's batch size, the batch dims marked dynamic: it
    compiles there; its batch is let go on return."""
    n_in, at = len(spec.inputs), spec.batch_size
    first = [batch_of(t, at, "cuda", d) for t, d in zip(spec.inputs, spec.batch_dims)]
    first_t = [batch_of(t, at, "cuda", d)
               for t, d in zip(spec.targets, spec.batch_dims[n_in:])]
    for i, d in enumerate(spec.batch_dims[:n_in]):
        if d is not None:
            torch._dynamo.mark_dynamic(first[i], d)
    run_step(run, spec, first, first_t, params, opt, lambda phase: None, scaler=scaler)


def _clear_cublas_workspaces() -> None:
    """Let go of the cuBLAS workspaces this process's earlier steps kept (up to torch 2.14
    one per thread)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _fresh_allocator() -> None:
    """Start as a fresh process does, which fxmem replays: the cuBLAS workspaces earlier
    steps kept (up to torch 2.14 one per thread) let go, then every cached segment. Else
    the segments an earlier measurement left would take this one's model, batch and
    warm-up, and the workspaces' two, freed only when the step starts, its warm-up."""
    _clear_cublas_workspaces()
    gc.collect()
    torch.cuda.empty_cache()


def _measure_cuda(model, spec, ins, tgs, params, opt, B, scaler,
                  record_history=False) -> Measurement:
    """CUDA protocol: warm up, collect, empty cache, reset peaks, measure the next step, the
    peaks of ``memory_allocated`` and ``memory_reserved`` read at the end of each phase
    (and reset at its start). First the cuBLAS workspaces earlier steps of this process
    left (up to torch 2.14 one is kept per thread) are let go, so that the warm-up makes
    them as in a fresh process, the start fxmem predicts."""
    _clear_cublas_workspaces()
    _warm_up(model, spec, ins, tgs, params, opt, scaler)
    _steady_grads(spec, params)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    baseline, baseline_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    allocated, reserved, current = {}, {}, ["start"]

    def on_phase(name):
        torch.cuda.synchronize()
        ph = current[0]
        allocated[ph] = max(allocated.get(ph, 0), torch.cuda.max_memory_allocated())
        reserved[ph] = max(reserved.get(ph, 0), torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()
        current[0] = name

    scale = _scale(scaler)
    if record_history:
        torch.cuda.memory._record_memory_history(max_entries=10**7)
    try:
        out = run_step(model, spec, ins, tgs, params, opt, on_phase, scaler=scaler)
        del out
        on_phase("end")
        snapshot = torch.cuda.memory._snapshot() if record_history else {}
    finally:
        if record_history:
            torch.cuda.memory._record_memory_history(enabled=None)
    from .divergence import snapshot_allocations

    allocations = snapshot_allocations(snapshot, torch.cuda.current_device())
    _check_not_skipped(scaler, scale)
    allocated.pop("start", None)
    reserved.pop("start", None)
    return Measurement(max(allocated.values(), default=baseline), baseline,
                       torch.cuda.memory_allocated(), B, "cuda",
                       {p: allocated[p] for p in PHASES if p in allocated},
                       max(reserved.values(), default=baseline_reserved),
                       {p: reserved[p] for p in PHASES if p in reserved}, baseline_reserved,
                       tuple(allocations))


def _measure_on_fake_gpu(python_exe, model, inputs, targets, step, B, batch_dim,  # noqa: N803
                         record_history, parallel) -> Measurement:
    if step.device != "cuda":
        raise InputError(f"fake_gpu measures a CUDA step: device='cuda', not {step.device!r}")
    if parallel is not None:
        raise InputError(f"fake_gpu measures one process's step, not a {parallel.name} step")
    from .fakegpu.remote import send

    got = send(python_exe, "fxmem.validate.measure:_measure_sent",
               {"model": model, "inputs": inputs, "targets": targets, "step": step, "B": B,
                "batch_dim": batch_dim, "record_history": record_history})
    got["allocations"] = tuple(tuple(a) for a in got["allocations"])
    return Measurement(**got)


def _measure_sent(path: str) -> dict:
    """On the fake GPU (the child of :func:`fxmem.validate.fakegpu.remote.send`): the step
    sent in ``path`` measured on ``"cuda"``, as JSON."""
    import dataclasses
    import pickle

    from ..errors import FxmemError

    with open(path, "rb") as f:
        w = pickle.load(f)
    try:
        m = measure(w["model"], w["inputs"], w["targets"], step=w["step"], B=w["B"],
                    batch_dim=w["batch_dim"], record_history=w["record_history"])
    except FxmemError as e:
        return {"error": [type(e).__name__, str(e)]}
    out = dataclasses.asdict(m)
    out["allocations"] = [list(a) for a in m.allocations]
    out["torch_version"] = torch.__version__
    return out
