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
from typing import Callable, Iterator

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ....errors import InputError
from ..compat import TORCH, register
from . import cudnn as cuda_cudnn
from . import rnn as cuda_rnn
from . import sdpa_memory
from . import workspaces as cuda_workspaces
from .call_order import EMBEDDING_INDEX_COPY
from .sizing import _contiguous

aten = torch.ops.aten

from .norms import _cudnn_batch_norm
from .table import BOTH, CHECKED_ON, FAKE_GPU, RULES, SDPA_CHECKED_ON, KernelRule  # noqa: F401

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
    it runs (a workspace, :mod:`fxmem.trace.kernels.cuda.workspaces`) and autograd saves the input
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


def _linear(input, weight, bias=None):
    """aten/src/ATen/native/Linear.cpp ``linear``: ``addmm`` for a 2-D input with a bias, the
    input flattened to 2-D for ``addmm`` when it is contiguous (``_flatten_nd_linear``);
    otherwise ``matmul`` and the bias added **in place** (``output.add_(bias)``), except when
    the bias is tensor-subclass-like, which fake tensors always are: there C++ adds out of
    place, a second output-sized block that a CUDA step never makes (seen on 2.14.1's binary
    on the fake GPU: ``nn.MultiheadAttention``'s packed in-projection of a batch-first
    input)."""
    if input.dim() == 0 or weight.dim() == 0:
        raise RuntimeError("both arguments to linear need to be at least 1D")
    if bias is not None:
        if input.dim() == 2:
            return aten.addmm.default(bias, input, aten.t.default(weight))
        if input.is_contiguous() and (input.dim() == 3 or bias.dim() == 1):
            sizes = input.shape
            flat = math.prod(sizes[:-1])
            out = aten.addmm.default(bias, input.reshape(flat, sizes[-1]), aten.t.default(weight))
            return out.view(*sizes[:-1], out.shape[1])
    out = aten.matmul.default(input, aten.t.default(weight))
    return out if bias is None else out.add_(bias)


def _routes(capability, cudnn_version, on_choice) -> dict[str, Callable]:
    """aten op name -> the Python kernel that replaces its CompositeImplicitAutograd one."""
    from functools import partial

    from . import sdpa

    return {
        **cuda_rnn.routes(capability),
        "dropout": _dropout,
        "linear": _linear,
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
    (argument ``x_at``) memory format
    (:func:`fxmem.trace.kernels.cuda.workspaces.nhwc_group_norm`)."""
    def fix(args, out):
        from .norms import nhwc_group_norm

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
    ``host_outputs(func, args, kwargs)``: positions of outputs that the CUDA kernel keeps in
    host memory (they count 0 device bytes); ``workspaces(func, args, kwargs, out)``:
    ``(what, nbytes)`` of the temporaries the CUDA kernel allocates while it runs;
    ``choices``: what the routed kernels chose, ``(op, description)`` in the order first
    seen (e.g. the attention backend)."""

    def __init__(self, capability=(9, 0), cudnn_version: int | None = None):
        from . import sdpa

        self.capability = check_capability(capability)
        self.cudnn_version = sdpa.CUDNN_VERSION if cudnn_version is None else cudnn_version
        self._host = dict(sdpa_memory.HOST_OUTPUTS)
        self._stack = contextlib.ExitStack()
        self._choices: dict = {}
        # the ops whose Meta kernel is replaced while tracing (fxmem.trace.kernels.cuda.rnn.META)
        self.meta_ops = frozenset(getattr(aten, n).default for n in cuda_rnn.META)

    @property
    def choices(self) -> tuple:
        return tuple(self._choices)

    def _on_attention(self, choice, what) -> None:
        self._choices.setdefault(("aten.scaled_dot_product_attention", what), None)

    def __enter__(self):
        kernels = {"CompositeImplicitAutograd": _routes(self.capability, self.cudnn_version,
                                                        self._on_attention),
                   "CPU": {name: _stub(name) for name in STUBS},
                   "Meta": cuda_rnn.META, "AutocastCPU": cuda_rnn.autocast_routes()}
        self._stack.enter_context(_installed(kernels, cuda_rnn.forget_cached))
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)

    def outputs(self, func, args, kwargs, out):
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
        return (sdpa_memory.workspace_bytes(func, args, out, kwargs,
                                             capability=self.capability)
                + cuda_rnn.workspace_bytes(func, args, kwargs, out)
                + cuda_workspaces.workspace_bytes(func, args, kwargs, out,
                                                  capability=self.capability)
                + cuda_cudnn.workspace_bytes(func, args, kwargs, out)
                + _cum_cast(func, args, kwargs, out)
                + _embedding_index_copy(func, args))

    def unmodelled(self, func, args, kwargs, out) -> str | None:
        """What the CUDA kernel of ``func`` allocates that no formula sizes, or None."""
        rule = UNMODELLED.get(func)
        what = None if rule is None else rule(args, kwargs, out)
        return (what or cuda_rnn.unmodelled(func, args, kwargs, out)
                or cuda_workspaces.unmodelled(func, args, kwargs, out,
                                              capability=self.capability))


CUM_OPS = frozenset({aten.cumsum.default, aten.cumsum.out, aten.cumsum_.default,
                     aten.cumprod.default, aten.cumprod.out, aten.cumprod_.default})


def _cum_cast(func, args, kwargs, out) -> list:
    """ReduceOps.cpp ``impl_func_cum_ops`` (``cumsum``, ``cumprod``): the scan reads
    ``self.to(result.scalar_type())``, a copy when the result's dtype differs (a bool or int32
    input, whose result is int64), made after the result and freed when the kernel returns
    (seen on 2.14.1's binary on the fake GPU: transformers' ``(position_diff != 1).cumsum(-1)``
    allocates its int64 result, then the copy)."""
    if func not in CUM_OPS or not args:
        return []
    x = args[0]
    res = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(x, torch.Tensor) or not isinstance(res, torch.Tensor):
        return []
    if x.dtype == res.dtype or x.dim() == 0 or guard_or_false(x.numel() == 0):
        return []
    return [(f"{func.name().split('::')[-1]}: input cast to {str(res.dtype)[6:]}",
             x.numel() * res.element_size())]


def _embedding_index_copy(func, args) -> list:
    """Embedding.cpp ``embedding_symint`` (``CompositeExplicitAutograd``: the trace sees the
    op whole): indices of more than one dim run ``weight.index_select(0,
    indices.reshape(-1)).view(...)``, and the reshape copies indices that cannot be viewed
    flat (an expanded ``token_type_ids``: strides 0), before the output, freed as the op
    returns (seen on 2.14.1's binary on the fake GPU: BERT's token-type embedding, 16,384 B
    at B=4, L=512)."""
    if func is not aten.embedding.default or len(args) < 2:
        return []
    idx = args[1]
    if idx.dim() <= 1 or _contiguous(idx):
        return []
    return [(EMBEDDING_INDEX_COPY, idx.numel() * idx.element_size())]


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
    :func:`fxmem.trace.kernels.amp.emulate`), so not re-entrant."""
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
