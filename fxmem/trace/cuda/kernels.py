"""CUDA kernel semantics on CPU fake tensors: ``device="cuda"`` follows what the CUDA build's
kernels allocate, not what the CPU build's do.

The step is traced on fake CPU tensors (fake CUDA tensors crash the autograd engine on a CPU
build), so every composite op that branches on the device would take its CPU branch, and every
meta kernel says what the CPU kernel allocates. This module is the one place where fxmem
deliberately does what PyTorch's CUDA build does instead. Its rules are of three kinds, all
listed in :data:`RULES` with the PyTorch source they follow and the releases they were
checked on:

- **route**: the ``CompositeImplicitAutograd`` kernel of an aten op is replaced, while the
  step is traced, by a Python body that takes the CUDA branch of the C++ one (``dropout``
  calls ``native_dropout``, whose mask is bool; ``scaled_dot_product_attention`` chooses
  CUDA's backend and calls its kernel). The ops the body calls are dispatched as usual, so
  autograd saves what it saves on CUDA and the recorder sees each op.
- **outputs**: a CUDA kernel allocates outputs of another dtype than the meta kernel says
  (LayerNorm's statistics in the accumulate type), or keeps an output in host memory
  (the philox seed of a fused attention kernel): applied by the recorder to the op's outputs.
- **workspace**: a CUDA kernel allocates temporaries through the caching allocator while it
  runs; they are recorded as storages the op creates and frees when it ends.
- **unmodelled**: a CUDA kernel allocates memory whose size only the library knows (cuDNN's
  reserve spaces): named in ``Report.unmodelled``, never hidden.

Some CUDA kernels have no CPU kernel at all (``_fused_rms_norm``): while tracing, a *stub*
CPU kernel is registered for them, so that the composite above them and autograd treat the
fake CPU tensors as CUDA ones would; the fake tensor mode computes their outputs from their
meta kernels and never calls the stub.

:func:`cuda_kernels` is the context the tracer enters for ``device="cuda"``; it restores every
replaced kernel on exit. ``tests/test_kernels.py`` checks each rule against PyTorch's meta
kernels or a derivation from the source.

>>> import torch
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> with FakeTensorMode():
...     x = torch.randn(4, 8, requires_grad=True)
...     cpu = torch.nn.functional.dropout(x, 0.1)        # CPU: a float mask, bernoulli_
...     with cuda_kernels():
...         cuda = torch.nn.functional.dropout(x, 0.1)   # CUDA: native_dropout
>>> type(cpu.grad_fn).__name__, type(cuda.grad_fn).__name__
('MulBackward0', 'NativeDropoutBackward0')
>>> cuda.grad_fn._saved_result1.dtype                   # the mask autograd keeps
torch.bool
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from ...errors import InputError
from ..compat import TORCH, register

aten = torch.ops.aten

# PyTorch releases each rule was read on: 2.13's sources and binary for every rule; the SDPA
# rules also against 2.11's and 2.12's binaries (fxmem.trace.cuda.sdpa gates what differs); most
# others also against 2.11.0's (BOTH); the rest are consistent with 2.11's binary, not
# re-derived
CHECKED_ON = ("2.13",)
SDPA_CHECKED_ON = ("2.11", "2.12", "2.13")
# rules also confirmed in 2.11.0's CUDA wheel (its Python, its binary, fake CUDA tensors)
BOTH = ("2.11", "2.13")
# the CUDA builds CI runs on the fake GPU (2.15's C++ sources were not at hand to read: what
# changed in 2.15 was found, and is checked, on its binary)
FAKE_GPU = ("2.14", "2.15")


@dataclass(frozen=True)
class KernelRule:
    """One place where ``device="cuda"`` follows the CUDA build instead of the CPU one.

    ``op``: the aten op; ``kind``: ``"route"``, ``"outputs"`` or ``"workspace"`` (see the
    module docstring); ``cuda``: what the CUDA build does, in a sentence; ``follows``: the
    PyTorch source (file and function) the rule transcribes; ``checked``: the releases whose
    sources (or binary's symbols and strings) it was read on (every rule on 2.13, the one CI
    runs). ``ran``: the releases whose own CUDA build, run on the fake GPU
    (:mod:`fxmem.validate.fakegpu`), allocated exactly what fxmem predicts for ``cases``: the
    models of ``tests/fakegpu_targets.py``'s ``RULES`` or the tests of
    ``tests/test_fake_gpu*.py`` that show it, re-run by CI on those releases."""

    op: str
    kind: str
    cuda: str
    follows: str
    checked: tuple = CHECKED_ON
    ran: tuple = ()
    cases: tuple = ()


# --- routes: composite kernels that take their CUDA branch ------------------------------------

def _dropout(input, p, train):
    """aten/src/ATen/native/Dropout.cpp ``dropout``: when ``is_fused_kernel_acceptable``
    (a CUDA tensor, 0 < p < 1, numel > 0) and training, ``native_dropout``, whose mask is
    ``bool`` (1 byte an element); otherwise ``_dropout_impl``, written out below as it is
    for those cases (the same on every device)."""
    if not 0 <= p <= 1:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
    if train and 0 < p < 1 and input.numel() != 0:
        return aten.native_dropout.default(input, p, train)[0]
    if p == 0 or not train or input.numel() == 0:
        return input
    return input.mul(torch.zeros((), dtype=input.dtype, device=input.device))  # p == 1


def _softmax(fn):
    """aten/src/ATen/native/SoftMax.cpp ``softmax`` / ``log_softmax``: a CUDA float16 input
    asked for float32 runs ``_softmax(input, dim, half_to_float=True)`` (no float32 copy of
    the input first, and a float16 gradient in backward); otherwise the input is converted
    to ``dtype`` first, as on every device."""
    def kernel(input, dim, dtype=None):
        if input.dtype == torch.float16 and dtype == torch.float32:
            return fn(input, dim, True)
        converted = input.to(dtype) if dtype is not None else input
        return fn(converted, dim, False)
    return kernel


def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    """aten/src/ATen/native/group_norm.cpp ``group_norm``: the input is checked, then,
    up to 2.13, on every device but the CPU, made contiguous in the default memory format
    before ``native_group_norm``, which autograd saves: a channels_last input is copied, and
    the copy kept for backward (the CPU keeps the input's suggested format, no copy). From
    2.14 the input goes to ``native_group_norm`` as it is, which makes the copy itself while
    it runs (a workspace, :mod:`fxmem.trace.cuda.workspaces`) and autograd saves the input
    (2.14.1 and 2.15.0: their composite on fake CUDA tensors, and their binaries on the fake
    GPU, ``tests/test_fake_gpu.py``)."""
    n, c = input.shape[0], input.shape[1]
    if num_groups <= 0:
        raise RuntimeError(f"Expected num groups to be greater than 0, got {num_groups}")
    if c % num_groups != 0:
        raise RuntimeError("Expected number of channels in input to be divisible by "
                           f"num_groups, but got input of shape {list(input.shape)} and "
                           f"num_groups={num_groups}")
    hxw = math.prod(input.shape[2:])
    x = input.contiguous() if TORCH < (2, 14) else input
    return aten.native_group_norm.default(x, weight, bias, n, c, hxw, num_groups, eps)[0]


def _routes(capability, cudnn_version, on_choice) -> dict[str, Callable]:
    """aten op name -> the Python kernel that replaces its CompositeImplicitAutograd one."""
    from functools import partial

    from . import rnn as cuda_rnn
    from . import sdpa

    return {
        **cuda_rnn.routes(capability),
        "dropout": _dropout,
        "group_norm": _group_norm,
        "softmax.int": _softmax(aten._softmax.default),
        "log_softmax.int": _softmax(aten._log_softmax.default),
        "scaled_dot_product_attention": partial(
            sdpa.cuda_scaled_dot_product_attention, capability=capability,
            cudnn_version=cudnn_version, on_choice=on_choice),
    }


# --- outputs: what the CUDA kernel allocates when the meta kernel says otherwise -------------

def _acc_type(dtype: torch.dtype) -> torch.dtype:
    """``at::toAccumulateType(t, /*is_cuda=*/true)`` for floating types
    (c10/util/AccumulateType.h): float for half and bfloat16, double for double."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _stats_in_acc_type(positions: tuple) -> Callable:
    """Outputs at ``positions`` re-made in the accumulate type of input 0, same shape."""
    def fix(args, out):
        acc = _acc_type(args[0].dtype)
        if all(out[i].dtype == acc for i in positions):
            return out
        out = list(out)
        for i in positions:
            out[i] = torch.empty(out[i].shape, dtype=acc, device=out[i].device)
        return tuple(out)
    return fix


def _cudnn_batch_norm(args) -> bool:
    """Normalization.cpp ``_select_batch_norm_backend``: cuDNN runs a batch norm of a >= 3-d
    input that is not bfloat16 (float16 only with float32 weights), with weight and bias, and
    running statistics (or none, in training), while ``torch.backends.cudnn.enabled``; past
    880,801 samples in training (65,535 in eval) the native kernel runs instead, which
    allocates the same but for cuDNN's reserve space and workspaces."""
    x, weight, bias, mean, var = args[:5]
    training = args[5]
    return (torch.backends.cudnn.enabled and x.dim() >= 3 and weight is not None
            and bias is not None and torch.bfloat16 not in (x.dtype, weight.dtype)
            and (x.dtype != torch.float16 or weight.dtype == torch.float32)
            and ((mean is not None and var is not None)
                 or (mean is None and var is None and training)))


def _batch_norm_stats(args, out):
    """cuda/Normalization.cu ``batch_norm_cuda``: save_mean and save_invstd are ``{C}`` in
    the accumulate type, in training and in eval (the CPU kernel, and the meta kernel, keep
    the input's dtype, and ``{0}`` in eval). cudnn/BatchNorm.cpp ``cudnn_batch_norm``: ``{C}``
    in the weight's dtype in training (float32 whenever cuDNN is chosen), ``{0}`` in eval."""
    x = args[0]
    if not args[5] and _cudnn_batch_norm(args):
        return out  # cuDNN in eval: empty statistics, as the meta kernel says
    acc = _acc_type(x.dtype)
    c = x.shape[1] if x.dim() > 1 else 1
    want = ((c,), acc)
    if all((tuple(out[i].shape), out[i].dtype) == want for i in (1, 2)):
        return out
    return (out[0], *(torch.empty(want[0], dtype=acc) for _ in (1, 2)), *out[3:])


def _first_contiguous(args, out):
    """Output 0 in the default memory format, where the fake kernel gives it an input's
    strides (a later ``.contiguous()`` would then copy it on fake tensors only).
    cuda/layer_norm_kernel.cu ``layer_norm_backward_cuda``: ``dX`` is
    ``at::native::empty_like(*X, ..., MemoryFormat::Contiguous)``. group_norm.cpp
    ``native_group_norm(_backward)``: ``Y`` and ``dX`` are ``empty_like(X.contiguous())``
    on CUDA (the CPU, and the meta kernel, keep X's suggested memory format)."""
    dx = out[0]
    if dx is None or dx.is_contiguous():
        return out
    return (torch.empty(dx.shape, dtype=dx.dtype), *out[1:])


def _group_norm_outputs(x_at: int) -> Callable:
    """:func:`_first_contiguous`, but for 2.15's channels-last GroupNorm, which keeps X's
    (argument ``x_at``) memory format (:func:`fxmem.trace.cuda.workspaces.nhwc_group_norm`)."""
    def fix(args, out):
        from .workspaces import nhwc_group_norm

        return out if nhwc_group_norm(args[x_at]) else _first_contiguous(args, out)
    return fix


def _no_buffer(args, out):
    """cuda/Activation.cpp ``log_sigmoid_forward_cuda``: the buffer "is only used by CPU
    dispatch", so CUDA returns ``empty({0})``; the CPU a full-size one that backward keeps."""
    if out[1].numel() == 0:
        return out
    return (out[0], torch.empty((0,), dtype=out[1].dtype))


def _embedding_bag_aux(args, out):
    """cuda/EmbeddingBag.cu ``_embedding_bag_cuda``: ``offset2bag`` is always ``{n}`` and
    ``bag_size`` ``offsets.sizes()`` (the CPU kernel: ``{0}`` on the fast sum path, and
    ``{num_bags}``), ``max_indices`` ``{num_bags, D}`` in max mode and ``{0}`` otherwise, all
    in the indices' dtype after ``promoteIndicesAndOffsets``. PyTorch's meta kernel has this
    branch (``device_hint``), but takes the CPU one on fake CPU tensors."""
    weight, indices, offsets = args[:3]
    mode = args[4] if len(args) > 4 else 0
    num_bags = out[0].shape[0]
    dtype = torch.promote_types(indices.dtype, offsets.dtype)
    shapes = ((indices.shape[0],), tuple(offsets.shape),
              (num_bags, weight.shape[1]) if mode == 2 else (0,))
    if all(tuple(o.shape) == sh and o.dtype == dtype for o, sh in zip(out[1:], shapes)):
        return out
    return (out[0], *(torch.empty(sh, dtype=dtype) for sh in shapes))


# op -> function(args, out) -> out
OUTPUT_RULES: dict = {
    aten._embedding_bag.default: _embedding_bag_aux,
    aten._embedding_bag_forward_only.default: _embedding_bag_aux,
    # layer_norm_kernel.cu layer_norm_cuda: mean and rstd are
    # at::empty({M}, X->options().dtype(acc_type)), viewed to the stat shape
    aten.native_layer_norm.default: _stats_in_acc_type((1, 2)),
    aten.native_batch_norm.default: _batch_norm_stats,
    aten.log_sigmoid_forward.default: _no_buffer,
    aten.native_layer_norm_backward.default: _first_contiguous,
    aten.native_group_norm.default: _group_norm_outputs(0),
    aten.native_group_norm_backward.default: _group_norm_outputs(1),
}


def _cudnn_batch_norm_reserve(args, kwargs, out) -> str | None:
    """cudnn/BatchNorm.cpp ``cudnn_batch_norm``: in training, a reserve space kept for
    backward and forward and backward workspaces, all sized by cuDNN
    (``cudnnGetBatchNormalizationTrainingExReserveSpaceSize`` and the workspace queries)."""
    if not (args[5] and _cudnn_batch_norm(args)):
        return None
    return ("cuDNN batch-norm reserve space (kept until backward) and forward/backward "
            "workspaces (sized inside cuDNN)")


# op -> function(args, kwargs, out) -> what the CUDA kernel allocates that no formula sizes
def _cufft_work_area(args, kwargs, out) -> str | None:
    """cuda/SpectralOps.cpp ``_exec_fft``: each cuFFT call allocates the plan's work area
    (``at::empty({config->workspace_size()}, kByte)``, sized by cuFFT), and a contiguous copy
    of the input when the plan cannot read its layout (``should_clone_input``); both are
    freed when the op returns."""
    return ("cuFFT work area (sized inside cuFFT) and, when the plan cannot read the input's "
            "layout, a contiguous copy of the input; freed when the op returns")


UNMODELLED: dict = {
    aten.native_batch_norm.default: _cudnn_batch_norm_reserve,
    aten._fft_r2c.default: _cufft_work_area,
    aten._fft_c2c.default: _cufft_work_area,
    aten._fft_c2r.default: _cufft_work_area,
}

# CUDA-only ops given a stub CPU kernel while tracing (see the module docstring):
# layer_norm.cpp rms_norm_symint calls _fused_rms_norm (unless the weight's dtype differs,
# the input is channels_last or complex), whose only kernels are CUDA's (and MPS, XPU): on
# the CPU its CompositeImplicitAutograd decomposition runs above autograd, which then saves
# a float32 copy and the normalised input; CUDA's FusedRmsNormBackward0 saves the input,
# the weight and a float32 rstd.
STUBS: tuple = ("_fused_rms_norm",)


class CudaKernels:
    """What the tracer consults for ``device="cuda"`` (enter it around the step).

    ``outputs(func, args, kwargs, out)``: the op's outputs as the CUDA kernel allocates them;
    ``host_outputs(func, args, kwargs)``: positions of outputs that the CUDA kernel keeps in host memory
    (they count 0 device bytes); ``workspaces(func, args, kwargs, out)``: ``(what, nbytes)``
    of the temporaries the CUDA kernel allocates while it runs; ``choices``: what the routed
    kernels chose, ``(op, description)`` in the order first seen (e.g. the attention
    backend)."""

    def __init__(self, capability=(9, 0), cudnn_version: int | None = None):
        from . import rnn as cuda_rnn
        from . import sdpa, sdpa_memory

        self.capability = check_capability(capability)
        self.cudnn_version = sdpa.CUDNN_VERSION if cudnn_version is None else cudnn_version
        self._host = dict(sdpa_memory.HOST_OUTPUTS)
        self._stack = contextlib.ExitStack()
        self._choices: dict = {}
        # the ops whose Meta kernel is replaced while tracing (fxmem.trace.cuda.rnn.META)
        self.meta_ops = frozenset(getattr(aten, n).default for n in cuda_rnn.META)

    @property
    def choices(self) -> tuple:
        return tuple(self._choices)

    def _on_attention(self, choice, what) -> None:
        self._choices.setdefault(("aten.scaled_dot_product_attention", what), None)

    def __enter__(self):
        from . import rnn as cuda_rnn

        kernels = {"CompositeImplicitAutograd": _routes(self.capability, self.cudnn_version,
                                                        self._on_attention),
                   "CPU": {name: _stub(name) for name in STUBS},
                   "Meta": cuda_rnn.META, "AutocastCPU": cuda_rnn.autocast_routes()}
        self._stack.enter_context(_installed(kernels, cuda_rnn.forget_cached))
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)

    def outputs(self, func, args, kwargs, out):
        from . import rnn as cuda_rnn
        from . import sdpa_memory

        rule = OUTPUT_RULES.get(func)
        if rule is not None:
            out = rule(args, out)
        out = cuda_rnn.outputs(func, args, kwargs, out)
        real = sdpa_memory.cuda_outputs(func, args, out, kwargs)
        if real is not None:  # what the CUDA kernel allocates, where its meta kernel differs
            out = tuple(o if r is None else torch.empty(r[0], dtype=r[1])
                        for o, r in zip(out, real))
        return out

    def host_outputs(self, func, args=(), kwargs=None) -> tuple:
        positions = self._host.get(func, ())
        if positions and not sdpa_host_seed(func, args, kwargs):
            return ()
        return positions

    def workspaces(self, func, args, kwargs, out) -> list:
        from . import cudnn as cuda_cudnn
        from . import rnn as cuda_rnn
        from . import sdpa_memory
        from . import workspaces as cuda_workspaces

        return (sdpa_memory.workspace_bytes(func, args, out, kwargs,
                                             capability=self.capability)
                + cuda_rnn.workspace_bytes(func, args, kwargs, out)
                + cuda_workspaces.workspace_bytes(func, args, kwargs, out,
                                                  capability=self.capability)
                + cuda_cudnn.workspace_bytes(func, args, kwargs, out))

    def unmodelled(self, func, args, kwargs, out) -> str | None:
        """What the CUDA kernel of ``func`` allocates that no formula sizes, or None."""
        from . import rnn as cuda_rnn
        from . import workspaces as cuda_workspaces

        rule = UNMODELLED.get(func)
        what = None if rule is None else rule(args, kwargs, out)
        return (what or cuda_rnn.unmodelled(func, args, kwargs, out)
                or cuda_workspaces.unmodelled(func, args, kwargs, out,
                                              capability=self.capability))


def sdpa_host_seed(func, args, kwargs) -> bool:
    """attention.cu ``_efficient_attention_forward``: the philox seed and offset are host
    tensors when dropout is used (outside CUDA-graph capture); at dropout 0 they are two
    empty CUDA tensors (a 512-byte block each: seen on 2.14.1's and 2.15's binaries on the
    fake GPU, ``tests/test_fake_gpu_sdpa.py``)."""
    from .sdpa_memory import _by_name

    if not args:
        return True
    return _by_name(func, args, kwargs).get("dropout_p", 0) > 0


def cuda_kernels(capability=(9, 0), cudnn_version: int | None = None) -> CudaKernels:
    """The CUDA semantics for a traced step on a GPU of compute capability ``capability``
    (``(major, minor)``; backend choices depend on it). Use as a context manager."""
    return CudaKernels(capability, cudnn_version)


def check_capability(capability) -> tuple:
    """``(major, minor)`` as ints, or :class:`fxmem.InputError`."""
    if isinstance(capability, (int, float)) and not isinstance(capability, bool):
        major, _, minor = f"{capability:.1f}".partition(".")
        capability = (int(major), int(minor))
    if (not isinstance(capability, tuple) or len(capability) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in capability)
            or not 3 <= capability[0] <= 20 or not 0 <= capability[1] <= 9):
        raise InputError(f"compute_capability is (major, minor), e.g. (9, 0) for an H100 or "
                         f"(8, 0) for an A100; got {capability!r}")
    return capability


_lock = threading.Lock()


def _stub(name):
    def kernel(*args, **kwargs):
        raise RuntimeError(f"fxmem: aten::{name} has no CPU kernel; fxmem registers this stub "
                           "only while it traces a CUDA step on fake tensors")
    return kernel


@contextlib.contextmanager
def _installed(kernels: dict, forget: Callable = lambda: None) -> Iterator[None]:
    """Register ``kernels`` (dispatch key -> {aten op name: kernel}): routes replace
    CompositeImplicitAutograd kernels, stubs give CUDA-only ops a CPU kernel, meta kernels
    and CUDA's autocast kernels fill in; restore everything on exit, then ``forget`` what
    the fake tensor mode cached from them. Process-wide while active (like
    :func:`fxmem.trace.amp.emulate`), so not re-entrant."""
    if not _lock.acquire(blocking=False):
        raise InputError("fxmem's CUDA kernel semantics are already active (not re-entrant)")
    lib = None
    try:
        lib = torch.library.Library("aten", "IMPL")
        register(lib, kernels)
        yield
    finally:
        if lib is not None:
            lib._destroy()
            forget()
        _lock.release()


# --- the table: every rule, with the source it follows ----------------------------------------

RULES: tuple = (
    KernelRule("dropout", "route",
               "training with 0 < p < 1 runs native_dropout: the mask autograd keeps is bool "
               "(1 byte an element), not a copy of the input's dtype filled by bernoulli_",
               "aten/src/ATen/native/Dropout.cpp: dropout, is_fused_kernel_acceptable; "
               "aten/src/ATen/native/cuda/Dropout.cu: native_dropout_cuda",
               checked=BOTH,
               ran=FAKE_GPU, cases=("dropout",)),
    KernelRule("scaled_dot_product_attention", "route",
               "CUDA's backend choice (flash, memory-efficient, cuDNN, math) for the installed "
               "release and the target's compute capability, then that backend's kernel: no "
               "B·H·L² probabilities or dropout mask for the fused ones",
               "aten/src/ATen/native/transformers/attention.cpp: scaled_dot_product_attention; "
               "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: select_sdp_backend "
               "(fxmem/trace/cuda/sdpa.py)",
               checked=SDPA_CHECKED_ON,
               ran=FAKE_GPU, cases=("test_every_case_picks_the_backend_pytorch_picks", "test_attention_step_memory_is_exact")),
    KernelRule("softmax.int, log_softmax.int", "route",
               "a float16 input asked for float32 runs _softmax(half_to_float=True): no float32 "
               "copy of the input first, a float16 gradient (CUDA autocast asks this of every "
               "float16 softmax)",
               "aten/src/ATen/native/SoftMax.cpp: softmax, log_softmax",
               checked=BOTH,
               ran=FAKE_GPU, cases=("softmax fp16 to fp32", "log_softmax fp32")),
    KernelRule("_fused_rms_norm", "stub",
               "rms_norm runs CUDA's fused kernel, which saves the input, the weight and a "
               "float32 rstd per row; the CPU decomposes it above autograd (float32 copies saved)",
               "aten/src/ATen/native/layer_norm.cpp: rms_norm_symint; "
               "aten/src/ATen/native/cuda/layer_norm_kernel.cu: _fused_rms_norm_cuda",
               checked=BOTH,
               ran=FAKE_GPU, cases=("rms_norm", "rms_norm bf16")),
    KernelRule("native_batch_norm", "outputs",
               "save_mean and save_invstd {C} in the accumulate type, in eval too (native "
               "kernel); cuDNN's are float32 in training and empty in eval",
               "aten/src/ATen/native/cuda/Normalization.cu: batch_norm_cuda; "
               "aten/src/ATen/native/cudnn/BatchNorm.cpp: cudnn_batch_norm",
               checked=BOTH,
               ran=FAKE_GPU, cases=("batch_norm 2-d (native kernel)", "batch_norm bf16 (native kernel)", "batch_norm 2-d eval-mode grads", "test_cnn_is_exact")),
    KernelRule("native_batch_norm", "unmodelled",
               "cuDNN's reserve space (kept for backward) and workspaces, when cuDNN runs",
               "aten/src/ATen/native/Normalization.cpp: _select_batch_norm_backend"),
    KernelRule("log_sigmoid_forward", "outputs",
               "the buffer is empty on CUDA (only the CPU kernel uses it)",
               "aten/src/ATen/native/cuda/Activation.cpp: log_sigmoid_forward_cuda",
               checked=BOTH,
               ran=FAKE_GPU, cases=("log_sigmoid",)),
    KernelRule("lstm, gru, rnn_tanh, rnn_relu (.input, .data); lstm_cell, gru_cell", "route",
               "cuDNN's _cudnn_rnn when use_cudnn (else matmul and the fused cells per step); "
               "the cells: _thnn_fused_lstm_cell / _thnn_fused_gru_cell (fxmem/trace/cuda/rnn.py)",
               "aten/src/ATen/native/RNN.cpp: use_cudnn, _cudnn_impl, LSTMCell, GRUCell; "
               "aten/src/ATen/native/cudnn/RNN.cpp: _cudnn_rnn",
               checked=BOTH,
               ran=FAKE_GPU, cases=("test_lstm_is_exact",)),
    KernelRule("_cudnn_rnn, _cudnn_rnn_backward", "workspace",
               "the batch_first input made time-major, backward's copies of the input and the "
               "gradients (fxmem.trace.cuda.rnn.workspace_bytes)",
               "aten/src/ATen/native/cudnn/RNN.cpp: _cudnn_rnn, _cudnn_rnn_backward_input"),
    KernelRule("_fft_r2c", "unmodelled",
               "_fft_r2c, _fft_c2c, _fft_c2r (torch.fft, stft, istft): cuFFT's work area and, "
               "when the plan cannot read the input's layout, a contiguous copy of the input, "
               "for the duration of the op: sized inside cuFFT",
               "aten/src/ATen/native/cuda/SpectralOps.cpp: _exec_fft"),
    KernelRule("_cudnn_rnn", "unmodelled",
               "the training reserve space (kept for backward), workspaces and the dropout "
               "state: sized inside cuDNN",
               "aten/src/ATen/native/cudnn/RNN.cpp: _cudnn_rnn, get_dropout_state"),
    KernelRule("_grouped_mm", "unmodelled",
               "bfloat16 on sm90/sm100: CUTLASS's grouped GEMM, with an argument buffer and "
               "CUTLASS's workspace while it runs; otherwise a loop of mm_out into the output "
               "(the output itself as on the CPU: fxmem.trace.rules.grouped_mm_meta)",
               "aten/src/ATen/native/cuda/GroupedBlas.cpp: _grouped_mm_cuda; "
               "aten/src/ATen/native/cuda/GroupMM.cu: bf16bf16_grouped_gemm_impl_sm90_sm100"),
    KernelRule("embedding_dense_backward", "workspace",
               "above 3,072 indices (or with scale_grad_by_freq): the sorted and original "
               "indices, CUB's radix-sort storage, segment offsets and the per-segment "
               "partial sums (P×D in the accumulate type, or the fused path's V×D float32 for "
               "16-bit gradients) while the kernel runs (fxmem/trace/cuda/workspaces.py)",
               "aten/src/ATen/native/cuda/Embedding.cu: embedding_dense_backward_cuda; "
               "EmbeddingBackwardKernel.cu: embedding_backward_cuda_kernel",
               checked=BOTH,
               ran=FAKE_GPU, cases=("test_embedding_backward_sorts_on_pytorchs_own_build",)),
    KernelRule("_embedding_bag, _embedding_bag_forward_only", "outputs",
               "offset2bag is {n} and bag_size offsets' size, max_indices {num_bags, D} in "
               "max mode else {0}, in the indices' dtype (the CPU's fast sum path keeps "
               "offset2bag {0})",
               "aten/src/ATen/native/cuda/EmbeddingBag.cu: _embedding_bag_cuda",
               checked=BOTH,
               ran=FAKE_GPU, cases=("embedding_bag sum", "embedding_bag max")),
    KernelRule("_embedding_bag_backward, _embedding_bag_dense_backward", "workspace",
               "sum and mean always sort the indices: embedding backward's sort-based "
               "temporaries, never its fused atomic path (int32 indices with int64 offsets "
               "promoted first); max mode has none",
               "aten/src/ATen/native/EmbeddingBag.cpp: _embedding_bag_backward_symint; "
               "aten/src/ATen/native/cuda/EmbeddingBag.cu: "
               "embedding_bag_backward_cuda_sum_avg; EmbeddingBackwardKernel.cu: "
               "embedding_backward_cuda_kernel",
               ran=FAKE_GPU, cases=("embedding_bag sum", "embedding_bag max")),
    KernelRule("index_put (accumulate), index_add_ (deterministic)", "workspace",
               "the sort-based kernel: linear indices, sorted and original indices, the "
               "expanded values, CUB's radix-sort storage (fxmem/trace/cuda/workspaces.py)",
               "aten/src/ATen/native/cuda/Indexing.cu: index_put_with_sort_kernel"),
    KernelRule("index, index_put with a boolean mask", "workspace",
               "nonzero() makes the mask int64 indices, a column per mask dim as long as its "
               "True values, held while the kernel runs (none for x[mask] = a number: "
               "masked_fill_); the count is data, taken at the mask's elements",
               "aten/src/ATen/native/IndexingUtils.h: expandTensors; TensorAdvancedIndexing"
               ".cpp: _index_put_impl_; cuda/Nonzero.cu: nonzero_cuda_out_impl"),
    KernelRule("group_norm", "route",
               "up to 2.13 the input is made contiguous before native_group_norm, which "
               "saves it: a channels_last input is copied and the copy kept for backward "
               "(the CPU keeps channels_last, no copy); from 2.14 the input is passed as it "
               "is (native_group_norm's own copy is its workspace, the input saved)",
               "aten/src/ATen/native/group_norm.cpp: group_norm",
               checked=("2.11", "2.13", "2.15"),
               ran=FAKE_GPU, cases=("group_norm channels_last",)),
    KernelRule("native_group_norm, native_group_norm_backward", "outputs",
               "Y and dX are contiguous (the meta kernel keeps X's memory format); 2.15's "
               "channels-last kernels keep a channels_last X's format",
               "aten/src/ATen/native/group_norm.cpp: native_group_norm, "
               "native_group_norm_backward",
               ran=FAKE_GPU, cases=("group_norm", "group_norm channels_last", "group_norm channels_last bf16")),
    KernelRule("native_group_norm, native_group_norm_backward", "workspace",
               "{N, C} and {N, G} temporaries in the accumulate type; copies of a "
               "non-contiguous X and dY (2.15, a channels_last X: none of X, dY made "
               "channels_last, no {N, G, D} c1)",
               "aten/src/ATen/native/cuda/group_norm_kernel.cu; "
               "aten/src/ATen/native/group_norm.cpp",
               ran=FAKE_GPU, cases=("group_norm", "group_norm channels_last", "group_norm channels_last, no affine", "group_norm channels_last, a contiguous gradient")),
    KernelRule("_softmax_backward_data", "workspace",
               "tmp = grad_output * output, the size of the gradient (float32 in the "
               "half_to_float backward), while the kernel runs; copies of non-contiguous "
               "inputs in _softmax, _log_softmax and their backward (fxmem/trace/cuda/"
               "workspaces.py)",
               "aten/src/ATen/native/cuda/SoftMax.cu: softmax_backward_cuda_out, host_softmax, "
               "host_softmax_backward (the calls also read off the 2.11 and 2.14 cu130 "
               "binaries)",
               checked=("2.11", "2.13", "2.14"),
               ran=FAKE_GPU, cases=("softmax of a transpose", "log_softmax fp32", "softmax fp16 to fp32")),
    KernelRule("native_layer_norm_backward, _fused_rms_norm_backward", "workspace",
               "above 65,536 rows with few columns, per-block partial sums for the weight "
               "gradients; dY made contiguous",
               "aten/src/ATen/native/cuda/layer_norm_kernel.cu: "
               "LaunchGammaBetaBackwardCUDAKernel",
               checked=BOTH,
               ran=FAKE_GPU, cases=("layer_norm many rows", "rms_norm many rows")),
    KernelRule("native_layer_norm_backward", "outputs",
               "dX is contiguous (the fake kernel gives it dY's strides)",
               "aten/src/ATen/native/cuda/layer_norm_kernel.cu: layer_norm_backward_cuda",
               ran=FAKE_GPU, cases=("layer_norm fp16", "layer_norm many rows")),
    KernelRule("native_layer_norm", "outputs",
               "mean and rstd in the accumulate type (float32 for float16 and bfloat16 "
               "inputs); the CPU kernel keeps the input's dtype",
               "aten/src/ATen/native/cuda/layer_norm_kernel.cu: layer_norm_cuda",
               checked=BOTH,
               ran=FAKE_GPU, cases=("layer_norm fp16",)),
    KernelRule("_scaled_dot_product_efficient_attention", "host",
               "with dropout, the philox seed and offset (outputs 2 and 3) are host tensors "
               "outside CUDA-graph capture: no device memory (fxmem.trace.cuda.sdpa_memory."
               "HOST_OUTPUTS); at dropout 0, two empty CUDA tensors; "
               "flash's "
               "rng_state and cuDNN's seed and offset are CUDA tensors",
               "aten/src/ATen/native/transformers/cuda/attention.cu: "
               "_efficient_attention_forward (Note [Seed and Offset Device])",
               checked=SDPA_CHECKED_ON,
               ran=FAKE_GPU, cases=("test_attention_step_memory_is_exact",)),
    KernelRule("_scaled_dot_product_flash_attention, _scaled_dot_product_cudnn_attention",
               "outputs",
               "flash's rng_state (2 uint64) and its unused scalar, cuDNN's seed and offset are "
               "CUDA tensors; cuDNN's logsumexp exists only when it is needed for backward "
               "(the meta kernels say otherwise: fxmem.trace.cuda.sdpa_memory.META_CORRECTIONS)",
               "aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp: mha_fwd; "
               "attention.cu: _cudnn_attention_forward",
               checked=SDPA_CHECKED_ON),
    KernelRule("_scaled_dot_product_flash_attention(_backward), "
               "_scaled_dot_product_efficient_attention(_backward), "
               "_scaled_dot_product_cudnn_attention_backward", "workspace",
               "temporaries the fused attention kernels allocate through the caching "
               "allocator while they run: flash backward's softmax_d and dq_accum, efficient "
               "backward's delta and kernel workspace, ... "
               "(fxmem.trace.cuda.sdpa_memory.WORKSPACES, "
               "workspace_bytes); cuDNN's own graph workspace is sized inside cuDNN",
               "aten/src/ATen/native/transformers/cuda/attention_backward.cu; "
               "flash_api.cpp: mha_bwd; mem_eff_attention/kernel_backward.h: workspace_size",
               checked=SDPA_CHECKED_ON,
               ran=FAKE_GPU, cases=("test_attention_step_memory_is_exact",)),
    KernelRule("native_batch_norm_backward", "workspace",
               "the native kernel on the channels-last layout (a 2-d {N, C} input, a "
               "channels_last one), or without the input's gradient: sum_dy and sum_dy_xmu, "
               "{C} in the accumulate type, while it runs (fxmem/trace/cuda/workspaces.py)",
               "aten/src/ATen/native/cuda/Normalization.cu: batch_norm_backward_cuda, "
               "batch_norm_backward_reduce_cuda; Normalization.cuh: "
               "batch_norm_use_channels_last_kernels (read from memory of the source, "
               "confirmed on the binaries)", checked=(),
               ran=FAKE_GPU, cases=("batch_norm 2-d (native kernel)",
                                    "batch_norm 2-d eval-mode grads",
                                    "batch_norm bf16 channels_last (native kernel)",
                                    "batch_norm 3-d {N, C, 1} (native kernel)")),
    KernelRule("mm, addmm, bmm, baddbmm, addbmm, mv, addmv, dot, vdot, _addmm_activation",
               "workspace",
               "up to 2.14 one cuBLAS workspace per thread, kept from its first matmul "
               "(cuBLASLt shares it); from 2.15 every call takes its own and frees it: "
               "32 MiB (sm90) through cuBLAS, CUBLASLT_WORKSPACE_SIZE KiB (1 MiB) through "
               "cuBLASLt, which addmm with a {N} bias (nn.Linear) runs "
               "(fxmem/trace/cuda/blas.py, fxmem/device/allocator.py)",
               "aten/src/ATen/cuda/CublasHandlePool.cpp: parseChosenWorkspaceSize, "
               "getCurrentCUDABlasHandle; aten/src/ATen/native/cuda/Blas.cpp: "
               "addmm_out_cuda_impl (2.15's choice seen on its binary)",
               ran=FAKE_GPU, cases=("test_every_matmul_takes_the_workspace_fxmem_says",
                                    "test_mlp_is_exact_on_the_fake_gpu")),
)
