"""Autocast on a device this machine does not have: CUDA's op lists, emulated on CPU tensors.

A CPU build cannot run CUDA autocast (fake CUDA tensors with autograd fail), so to analyse a
CUDA AMP step fxmem runs ``torch.autocast("cpu", dtype)`` with the CPU autocast kernels
replaced, for the duration of the step, by Python kernels that follow another device's
rules: :data:`RULES` ``["cuda"]``, one table transcribed from ``aten/src/ATen/autocast_mode.h``
(the ``AT_FORALL_*`` lists) and ``autocast_mode.cpp`` (``TORCH_LIBRARY_IMPL(aten, Autocast)``).

The kernels do what ``autocast_mode.h``'s ``WrapFunction_`` does for each :class:`Policy`,
with autocast's own key excluded while the op runs, so the casts are ordinary autograd ops
(a lower-precision copy is what backward saves). ``cached_cast``'s cache of lower-precision
copies of float32 leaves that require grad (the weights) is reproduced too: it lives until
the outermost ``torch.autocast`` exits, like PyTorch's, which clears it through
``torch.clear_autocast_cache``.

Which ops are listed comes from the installed PyTorch: only the table's ops that this build
registers for the emulated device's autocast key are replaced (the lists change between
releases; ``tests/test_amp_rules.py`` checks the table against the installed header and the
dispatcher). CPU ops that the emulated device does not list fall through, as CUDA's do.

``RULES["cpu"]`` is the CPU's own table: emulating the CPU with it must change nothing, which
is how the machinery is tested against real CPU autocast.

>>> import torch
>>> from fxmem.trace.kernels.amp import emulate
>>> lin, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
>>> with emulate("cuda"), torch.autocast("cpu", dtype=torch.float16):
...     y = lin(x)
...     s = y.softmax(-1)        # CUDA: softmax in float32 (fp32_set_opt_dtype)
>>> y.dtype, s.dtype
(torch.float16, torch.float32)
>>> with torch.autocast("cpu", dtype=torch.float16):   # CPU rules: softmax not listed
...     lin(x).softmax(-1).dtype
torch.float16
"""

from __future__ import annotations

import contextlib
import enum
import threading
import warnings
import weakref
from typing import Iterator

import torch
from torch._C import DispatchKey, DispatchKeySet, _ExcludeDispatchKeyGuard

from ...errors import InputError


class Policy(enum.Enum):
    """``at::autocast::CastPolicy``, plus the ops autocast refuses."""

    LOWER = "lower_precision_fp"  # cast floating inputs to the autocast dtype
    FP32 = "fp32"  # cast floating inputs to float32
    FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"  # dtype=None becomes float32 (softmax, sum)
    FP32_APPEND_DTYPE = "fp32_append_dtype"  # redispatch to the overload taking a dtype
    PROMOTE = "promote"  # cast to the widest floating dtype among the inputs
    BANNED = "banned"  # autocast raises (binary_cross_entropy on CUDA)


def _table(**lists: str) -> dict[str, Policy]:
    out = {}
    for policy, names in lists.items():
        for name in names.split():
            out[name] = Policy[policy]
    return out


# aten overload names ("conv_transpose2d.input"; no suffix: the default overload)
RULES: dict[str, dict[str, Policy]] = {
    # TORCH_LIBRARY_IMPL(aten, Autocast, m): AT_FORALL_LOWER_PRECISION_FP, cudnn_convolution
    # and cudnn_convolution_transpose; AT_FORALL_FP32; AT_FORALL_FP32_SET_OPT_DTYPE;
    # AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE (norm); AT_FORALL_PROMOTE; banned BCE.
    "cuda": _table(
        LOWER="""_convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc
            conv_transpose1d conv_transpose2d.input conv_transpose3d.input convolution prelu
            addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm
            chain_matmul linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell
            gru_cell rnn_tanh_cell rnn_relu_cell _scaled_dot_product_flash_attention
            scaled_dot_product_attention cudnn_convolution cudnn_convolution_transpose""",
        FP32="""acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan
            pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm
            native_layer_norm rms_norm group_norm frobenius_norm.dim nuclear_norm
            nuclear_norm.dim cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss
            nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss
            margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss
            multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm
            logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d
            _upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d
            upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa
            upsample_trilinear3d upsample_bicubic2d _upsample_bicubic2d_aa
            linalg_matrix_sqrth""",  # 2.15, registered outside the header's lists: fp32, as
        # on the CPU (bf16 in, fp32 out), and on 2.15's CUDA build on the fake GPU
        # (tests/test_fake_gpu.py: the kernel receives float32 under bfloat16 autocast)
        FP32_SET_OPT_DTYPE="""prod prod.dim_int softmax.int log_softmax.int cumprod cumsum
            linalg_vector_norm linalg_matrix_norm linalg_matrix_norm.str_ord sum
            sum.dim_IntList prod.dim_Dimname softmax.Dimname log_softmax.Dimname
            cumprod.dimname cumsum.dimname sum.dim_DimnameList""",  # Dimname ones: 2.11
        FP32_APPEND_DTYPE="norm.Scalar norm.ScalarOpt_dim norm.names_ScalarOpt_dim",
        PROMOTE="""addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put
            tensordot scatter_add""",
        BANNED="binary_cross_entropy",
    ),
    # TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)
    "cpu": _table(
        LOWER="""conv1d conv1d.padding conv2d conv2d.padding conv3d conv3d.padding bmm mm
            linalg_vecdot baddbmm addmm _addmm_activation addbmm linear _convolution.deprecated
            matmul conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d.input
            conv_transpose3d.input prelu scaled_dot_product_attention
            _native_multi_head_attention""",
        FP32="""avg_pool3d binary_cross_entropy grid_sampler polar prod prod.dim_int
            prod.dim_Dimname quantile quantile.scalar nanquantile nanquantile.scalar stft
            stft.center cdist grid_sampler_2d _grid_sampler_2d_cpu_fallback grid_sampler_3d
            trace view_as_complex cholesky cholesky_inverse cholesky_solve inverse lu_solve
            orgqr ormqr pinverse max_pool3d max_unpool2d max_unpool3d adaptive_avg_pool3d
            reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d
            replication_pad3d mse_loss cosine_embedding_loss nll_loss nll_loss2d
            hinge_embedding_loss poisson_nll_loss smooth_l1_loss cross_entropy_loss l1_loss
            huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss
            multi_margin_loss ctc_loss.IntList ctc_loss.Tensor kl_div multilabel_margin_loss
            binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn
            fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft
            fft_ihfft linalg_cond linalg_cond.p_str linalg_matrix_rank
            linalg_matrix_rank.tol_tensor linalg_matrix_rank.atol_rtol_tensor
            linalg_matrix_rank.atol_rtol_float linalg_solve linalg_cholesky linalg_svdvals
            linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product
            linalg_tensorinv linalg_tensorsolve fake_quantize_per_tensor_affine geqrf
            _lu_with_info qr svd triangular_solve fractional_max_pool2d fractional_max_pool3d
            adaptive_max_pool3d multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex
            linalg_svd linalg_eig linalg_eigh linalg_lstsq linalg_inv_ex
            linalg_matrix_sqrth""",  # linalg_matrix_sqrth: 2.15 (bfloat16 in, float32 out)
        PROMOTE="stack cat index_copy index_copy.dimname",
    ),
}
# Where the table is not what the emulated device registers, the dispatcher says so.
DISPATCH_KEY = {"cuda": "AutocastCUDA", "cpu": "AutocastCPU"}
# norm's fp32_append_dtype overloads redispatch to these (autocast_mode.h)
_APPEND_DTYPE_TARGET = {"norm.Scalar": "norm.ScalarOpt_dtype",
                        "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
                        "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype"}
_BANNED_MESSAGE = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
        "autocast on CUDA; use binary_cross_entropy_with_logits or BCEWithLogitsLoss"),
}


def registered(device: str) -> dict[str, Policy]:
    """The table's ops that this PyTorch build lists for ``device``'s autocast, with their
    policy (the lists differ between releases; the build's dispatcher knows its own)."""
    key = DISPATCH_KEY[device]
    return {name: policy for name, policy in RULES[device].items() if _has_kernel(name, key)}


def _has_kernel(name: str, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, key)
    except RuntimeError:  # no such overload in this build (e.g. Dimname ones)
        return False


def _overload(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


# The emulated cast cache: source TensorImpl (by id, checked through a weakref) -> its
# lower-precision copy. Cleared with PyTorch's, when the outermost autocast exits.
_cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
_EXCLUDE_CPU = DispatchKeySet(DispatchKey.AutocastCPU)


@contextlib.contextmanager
def autocast_cache_off():
    """Autocast's cast cache off until the block exits (each cast of a parameter made
    again, PyTorch's and the emulated one's), then as it was."""
    before = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(before)


def _eligible(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _cached_cast(to: torch.dtype, arg, lower: torch.dtype):
    """``at::autocast::cached_cast``: tensors, optional tensors and tensor lists."""
    if isinstance(arg, (list, tuple)):
        return type(arg)(_cached_cast(to, a, lower) for a in arg)
    if not _eligible(arg) or arg.dtype == to:
        return arg
    if (to == lower and arg.dtype == torch.float32 and arg.requires_grad and arg.is_leaf
            and not arg._is_view() and torch.is_autocast_cache_enabled()):
        hit = _cache.get(id(arg))
        if hit is not None and hit[0]() is arg:
            return hit[1]
        cast = arg.to(to)
        _cache[id(arg)] = (weakref.ref(arg), cast)
        return cast
    return arg.to(to)


def _promote_type(lower: torch.dtype, values) -> torch.dtype:
    """``at::autocast::promote_type``: float32 wins over the lower precision; float64
    inputs are ignored."""
    current = lower
    for v in values:
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                continue
            if t.dtype == torch.float64:
                continue
            if current == torch.float32 or t.dtype == torch.float32:
                current = torch.float32
            elif not (current == lower and t.dtype == lower):
                raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return current


def _cast_all(to: torch.dtype, args, kwargs: dict, lower: torch.dtype,
              position: dict) -> tuple[list, dict]:
    """``(*F)(cached_cast(to, args, device_type)...)``: ``args`` and ``kwargs``, each cast.
    The casts are made last argument first: C++ leaves the order in which a call's arguments
    are evaluated unspecified, and GCC (which builds the Linux wheels) evaluates them right
    to left; so a convolution casts its bias, then its weight, then its input (seen on the
    fake GPU, 2.14.1 and 2.15), and the casts' autograd nodes, and so their backward, come
    in that order."""
    cast_kwargs = {}
    for k in sorted(kwargs, key=lambda k: position.get(k, len(position)), reverse=True):
        cast_kwargs[k] = _cached_cast(to, kwargs[k], lower)
    return [_cached_cast(to, a, lower) for a in reversed(args)][::-1], cast_kwargs


def _kernel(name: str, policy: Policy):
    op = _overload(name)
    arguments = op._schema.arguments
    position = {a.name: i for i, a in enumerate(arguments)}

    def call(*args, **kwargs):
        lower = torch.get_autocast_dtype("cpu")
        with _ExcludeDispatchKeyGuard(_EXCLUDE_CPU):
            if policy in (Policy.LOWER, Policy.FP32, Policy.PROMOTE):
                to = (lower if policy is Policy.LOWER else torch.float32
                      if policy is Policy.FP32 else
                      _promote_type(lower, [*args, *kwargs.values()]))
                cast, cast_kwargs = _cast_all(to, args, kwargs, lower, position)
                return op(*cast, **cast_kwargs)
            if policy is Policy.FP32_SET_OPT_DTYPE:
                if not _eligible(args[0]):
                    return op(*args, **kwargs)
                index = next(i for i, a in enumerate(arguments) if a.name == "dtype")
                if index < len(args):
                    args = (*args[:index], args[index] if args[index] is not None
                            else torch.float32, *args[index + 1:])
                elif kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
            if policy is Policy.FP32_APPEND_DTYPE:
                full = list(args) + [kwargs.get(a.name, a.default_value)
                                     for a in arguments[len(args):]]
                out = torch.float32 if _eligible(args[0]) else args[0].dtype
                return _overload(_APPEND_DTYPE_TARGET[name])(*full, dtype=out)
            raise RuntimeError(_BANNED_MESSAGE.get(name.split(".")[0], f"{name} is banned "
                                                    "under autocast"))

    call.__name__ = f"fxmem_autocast_{name.replace('.', '_')}"
    return call


_lock = threading.Lock()


@contextlib.contextmanager
def emulate(device: str = "cuda") -> Iterator[None]:
    """While active, ``torch.autocast("cpu", dtype)`` follows ``device``'s autocast rules.

    The replaced kernels are restored on exit, and so is ``torch.clear_autocast_cache``
    (wrapped to clear the emulated cache too). Not re-entrant; holds a lock, since the
    kernels are process-wide.
    """
    if device not in RULES:
        raise InputError(f"no autocast rules for device {device!r}; known: {sorted(RULES)}")
    if not _lock.acquire(blocking=False):
        raise InputError("fxmem.trace.kernels.amp.emulate is already active (it is not re-entrant)")
    lib = None
    original_clear = torch.clear_autocast_cache
    try:
        rules = registered(device)
        cpu_listed = [n for n in RULES["cpu"] if n not in rules]
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            for name, policy in rules.items():
                lib.impl(name, _kernel(name, policy), "AutocastCPU")
            for name in cpu_listed:  # CPU-only entries: not autocast on the emulated device
                if _has_kernel(name, "AutocastCPU"):
                    lib.impl(name, torch.library.fallthrough_kernel, "AutocastCPU")

        def clear_autocast_cache():
            _cache.clear()
            original_clear()

        torch.clear_autocast_cache = clear_autocast_cache
        yield
    finally:
        torch.clear_autocast_cache = original_clear
        _cache.clear()
        if lib is not None:
            lib._destroy()
        _lock.release()
