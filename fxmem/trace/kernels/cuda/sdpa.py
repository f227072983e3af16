"""``scaled_dot_product_attention`` as PyTorch's CUDA build runs it, on CPU fake tensors.

:func:`choose` ports ``select_sdp_backend`` (aten/src/ATen/native/transformers/cuda/
sdp_utils.cpp, with sdp_utils_cpp.h); :func:`cuda_scaled_dot_product_attention` is the body of
``scaled_dot_product_attention`` (aten/src/ATen/native/transformers/attention.cpp) for a CUDA
tensor, calling the aten ops its CUDA branch calls. :mod:`fxmem.trace.kernels.cuda.sdpa_memory` says
what the chosen kernels allocate beyond, or unlike, PyTorch's meta kernels.

Read for torch 2.13.0 (git cf30153c): attention.cpp and sdp_utils.cpp as compiled into the
2.13.0+cu130 wheel (its symbols, constants and strings, checked against stored sources), the
installed sdp_utils_cpp.h and mem_eff_attention/kernel_*.h, and flash_api.cpp,
attention.cu, attention_backward.cu and cudnn/MHA.cpp of the same period. 2.11 and 2.12 lack
the rules gated by :data:`TORCH` below.

>>> import torch
>>> q = torch.empty(2, 8, 128, 64, dtype=torch.bfloat16)
>>> choose(q, q, q, capability=(8, 0)).backend
'flash'
>>> choose(q, q, q, capability=(9, 0)).backend    # cuDNN first on sm90 with cuDNN > 9.15
'cudnn'
>>> q32 = q.float()
>>> c = choose(q32, q32, q32, capability=(8, 0))
>>> c.backend, c.rejected[0]
('efficient', ('flash', 'dtype torch.float32 not in (torch.float16, torch.bfloat16)'))
"""

from __future__ import annotations

import math
import os
from collections import namedtuple
from dataclasses import dataclass

import torch
from torch.fx.experimental.symbolic_shapes import (
    guard_or_false,
    guard_or_true,
    statically_known_true,
)

aten = torch.ops.aten
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])

# The cuDNN the torch wheel on PyPI ships: its METADATA requires nvidia-cudnn-cu13==9.26.0.51
# (2.15), ==9.24.0.43 (2.14), ==9.20.0.48 (2.12, 2.13) or ==9.19.0.56 (2.11); cudnnGetVersion()
# is major*10000 + minor*100 + patch. 2.13's libtorch_cuda.so was also built with CUDNN_VERSION
# 92000 (a constant in the warning of can_use_cudnn_attention); torch.backends.cudnn.version()
# is 92400 under 2.14.1 and 92600 under 2.15 on the fake GPU (tests/test_fake_gpu_sdpa.py).
CUDNN_VERSION = {(2, 11): 91900, (2, 14): 92400, (2, 15): 92600}.get(TORCH, 92000)

# at::SDPBackend: math 0, flash 1, efficient 2, cudnn 3, overrideable 4 (Context's default order)
_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
_DEFAULT_ORDER = [1, 2, 0, 3, 4]
_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class SdpaChoice:
    """The backend CUDA's ``select_sdp_backend`` returns, and (backend, reason) for each one
    tried before it."""

    backend: str
    rejected: tuple = ()


def _int(x):  # SymInt::maybe_as_int
    return x if isinstance(x, int) else x.node.maybe_as_int()


def _sm(cap, lo, hi) -> bool:  # sdp_utils.cpp check_sm_version<lo, hi>
    return lo <= tuple(cap) <= hi


def _grad(*ts) -> bool:  # sdp_utils_cpp.h input_requires_grad (= should_compute_logsumexp)
    return any(t.requires_grad for t in ts) and torch.is_grad_enabled()


def prefer_cudnn(capability, cudnn_version) -> bool:
    """sdp_utils.cpp ``check_prefer_cudnn_attention`` (CUDA >= 13 build): cuDNN > 9.15.0 on
    sm9x/sm10x, unless TORCH_CUDNN_SDPA_DEPRIORITIZED; 2.11 and 2.12 also require minor 0 or 3."""
    if os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED") == "1":  # c10::utils::check_env
        return False
    major, minor = capability
    minor_ok = TORCH >= (2, 13) or minor in (0, 3)
    return cudnn_version > 91500 and major in (9, 10) and minor_ok


def priority_order(capability, cudnn_version) -> list:
    """sdp_utils.cpp ``priority_order``: the global order (``sdpa_kernel(set_priority=True)``
    sets it); at first use the CUDA build overwrites its first four entries with cuDNN, flash,
    efficient, math when :func:`prefer_cudnn`. An order the user changed is kept as is."""
    get = getattr(torch._C, "_get_sdp_priority_order", None)
    order = list(get()) if get else list(_DEFAULT_ORDER)
    if order == _DEFAULT_ORDER and prefer_cudnn(capability, cudnn_version):
        order[:4] = [3, 1, 2, 0]
    return order


# sdp_utils_cpp.h sdp_params, plus the device's compute capability and cuDNN version
_Params = namedtuple("_Params", "q k v mask dropout causal gqa cap cudnn")


# --- filters: None when the backend may run, else why not ---------------------------------------
# sdp_utils_cpp.h (installed) unless sdp_utils.cpp is named. Plain SymInt comparisons guard as
# C++'s operator== does (guard_bool); TORCH_GUARD_OR_* / TORCH_STATICALLY_KNOWN_TRUE as they are.

def _rule(reason, ok):
    """A filter: ``reason`` (formatted with the params) unless ``ok(params)``."""
    return lambda p: None if ok(p) else reason.format(p=p)


def _deterministic():  # ctx.deterministicAlgorithms() && !deterministicAlgorithmsWarnOnly()
    return (torch.are_deterministic_algorithms_enabled()
            and not torch.is_deterministic_algorithms_warn_only_enabled())


def _dtypes(*allowed):  # check_tensor_dtype
    return _rule("dtype {p.q.dtype} not in " + str(allowed),
                 lambda p: p.q.dtype == p.k.dtype == p.v.dtype and p.q.dtype in allowed)


def _flag(name):  # check_runtime_disabled_{flash,mem_efficient,cudnn}
    return _rule(f"{name} attention has been runtime disabled",
                 lambda p: getattr(torch.backends.cuda, f"{name}_sdp_enabled")())


def _hw(lo):  # sdp_utils.cpp check_{flash_attention,mem_efficient,cudnn}_hardware_support
    return _rule(f"needs sm{lo[0]}{lo[1]}..sm121, not {{p.cap}}", lambda p: _sm(p.cap, lo, (12, 1)))


_shapes = _rule("query, key and value must be 4-D",  # check_tensor_shapes
                lambda p: p.q.dim() == p.k.dim() == p.v.dim() == 4)
_nonzero = _rule("zero seq_len_q or seq_len_kv",  # check_nonzero_sequence_lengths_dense
                 lambda p: not (p.q.size(-2) == 0 or p.k.size(-2) == 0))
_no_mask = _rule("flash attention does not support attn_mask",  # check_for_attn_mask
                 lambda p: p.mask is None)
_low_precision = lambda p: (  # sdp_utils.cpp check_dtypes_low_precision
    _dtypes(*_HALF) if p.cap[0] >= 8 else _dtypes(torch.float16))(p)


def _last_stride(ignore_singleton):  # check_last_dim_stride_equals_1_dense<ignore_singleton_dim>
    def ok(p):
        qkv = all(t.stride(-1) == 1 for t in (p.q, p.k, p.v))
        qkv = qkv or (ignore_singleton and p.q.size(-1) == 1)
        return qkv and (p.mask is None or p.mask.stride(-1) == 1)  # CUDA: the mask's too
    return _rule("last dimension of q, k, v (and attn_mask) must have stride 1", ok)


def _eq(a, b):
    """A SymInt ``==`` as the release's sdp_utils_cpp.h writes it: plain (guard_bool) through
    2.14, ``TORCH_GUARD_OR_FALSE(a.sym_eq(b))`` in 2.15 (its installed header)."""
    return guard_or_false(a == b) if TORCH >= (2, 15) else a == b


def _batch_heads(supports_gqa, same_heads, mqa=False):
    """check_batch_size_and_num_heads_dense<gqa, same, mqa> (2.14+ headers have ``mqa``: key and
    value of one head broadcast to the query's heads, without enable_gqa)."""
    def f(p):
        (qb, qh), (kb, kh), (vb, vh) = ((t.size(0), t.size(-3)) for t in (p.q, p.k, p.v))
        if not (_eq(qb, kb) and _eq(qb, vb)):
            return "query, key and value must have the same batch size"
        if p.gqa and supports_gqa:  # check_grouped_query_attention<same_heads>
            if same_heads and not _eq(kh, vh):
                return "key and value must have the same num_heads"
            if not (_eq(qh % kh, 0) and (same_heads or _eq(qh % vh, 0))):
                return "key/value heads must divide query heads"
        elif not (_eq(qh, kh) and _eq(qh, vh)):
            if mqa and TORCH >= (2, 14) and qh > 0 and _eq(kh, 1) and _eq(vh, 1):
                return None
            return "query, key and value must have the same num_heads (no enable_gqa)"
    return f


_flash_head_dim = _rule(  # sdp_utils.cpp check_head_dim_size_flash<false>
    "q, k, v head dims must be equal and <= 256",
    lambda p: p.q.size(-1) == p.k.size(-1) and p.q.size(-1) == p.v.size(-1) and p.q.size(-1) <= 256)


def _flash_train_hd_ok(p):  # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
    d = p.q.size(-1)
    bad = (d > 192 and d <= 224) or (d > 224 and p.dropout > 0.0)
    arch = _sm(p.cap, (8, 6), (8, 9)) or _sm(p.cap, (12, 0), (12, 1))
    return not (_grad(p.q, p.k, p.v) and arch and bad)


_flash_train_hd = _rule("training with head dim in (192, 224], or > 224 with dropout, on "
                        "sm86-89/sm120-121", _flash_train_hd_ok)
_flash_causal = _rule(  # sdp_utils.cpp check_flash_causal_non_square_seqlens
    "is_causal with seqlen_q != seqlen_k",
    lambda p: not (p.causal and p.q.size(-2) != p.k.size(-2)))


def _flash_dtypes(p):  # sdp_utils.cpp check_dtypes_flash_attention (FA3 adds float8_e4m3fn)
    if p.cap[0] >= 9 and getattr(torch._C, "_get_fa3_sdp_enabled", bool)():
        return _dtypes(torch.float8_e4m3fn, *_HALF)(p)
    return _low_precision(p)


def _gemm_alignment(p) -> int:  # sdp_utils.cpp minimum_gemm_alignment
    half = p.q.dtype in _HALF
    mn = 4 if p.cap[0] >= 8 else 1
    tensor_cores = p.cap[0] >= 8 or (p.cap[0] >= 7 and half)
    return max(mn, 8 if half else 4) if tensor_cores else mn  # 128 bits / bits per scalar


def _eff_head_dim(p):  # sdp_utils.cpp check_head_dim_size_mem_efficient
    a, dq, dv = _gemm_alignment(p), p.q.size(-1), p.v.size(-1)
    if not (dq == p.k.size(-1) and dq % a == 0 and dq > 0 and dv % a == 0 and dv > 0):
        return f"last dimension of the inputs must be divisible by {a}"


def _eff_ptr_alignment(p):  # sdp_utils.cpp check_data_ptr_alignment_mem_efficient (2.13)
    if TORCH < (2, 13) or p.cap[0] < 8:
        return None
    nbytes = _gemm_alignment(p) * p.q.element_size()  # caching-allocator bases are 512-aligned
    for t in (p.q, p.k, p.v):
        if not (guard_or_false(t.numel() == 0)
                or guard_or_true(t.storage_offset() * t.element_size() % nbytes == 0)):
            return f"storage offset * element size not a multiple of {nbytes} bytes"


_eff_dtypes = lambda p: (  # sdp_utils.cpp can_use_mem_efficient_attention, last
    _dtypes(torch.float16, torch.float32, torch.bfloat16) if p.cap[0] >= 8
    else _dtypes(torch.float16, torch.float32))(p)
_cudnn_dropout_version = _rule(  # sdp_utils.cpp can_use_cudnn_attention, first
    "cuDNN 9.11-9.13 does not support dropout in SDPA",
    lambda p: not (p.dropout > 0.0 and 91100 < p.cudnn < 91400))
_cudnn_deterministic = _rule("cuDNN SDPA is not deterministic",  # check_cudnn_deterministic
                             lambda p: not _deterministic())
_cudnn_dropout_step = _rule(  # sdp_utils.cpp check_cudnn_dropout (2.12+)
    "cuDNN dropout probability must be a multiple of 1/16",
    lambda p: TORCH < (2, 12) or p.dropout * 16.0 == math.floor(p.dropout * 16.0))


def _mask_shape_ok(p):  # check_attn_mask_shape (2.13: statically known, or a concrete 1)
    m, q = p.mask, p.q
    if m is None:
        return True

    def fits(md, td):
        if TORCH < (2, 13):
            return md == td or md == 1
        if TORCH >= (2, 15):  # dim_compatible: TORCH_GUARD_OR_FALSE (its installed header)
            return guard_or_false(md == td) or _int(md) == 1
        return statically_known_true(md == td) or _int(md) == 1
    return (not m.requires_grad and fits(m.size(-2), q.size(2)) and fits(m.size(-1), p.k.size(2))
            and (m.dim() == 2 or (m.dim() == 4 and fits(m.size(0), q.size(0))
                                  and fits(m.size(1), q.size(1)))))


_mask_shape = _rule("attn_mask must be 2-D (L|1, S|1) or 4-D (B|1, H|1, L|1, S|1)", _mask_shape_ok)


def _cudnn_shapes(p):  # sdp_utils.cpp check_cudnn_tensor_shapes, as compiled in 2.13
    b, h = p.q.size(0), p.q.size(1)
    if TORCH >= (2, 13) and (b > 65535 or h > 65535):
        return "batch size or num_heads > 65535"
    s_q, s_k, d_qk, d_v, v = p.q.size(2), p.k.size(2), p.q.size(3), p.v.size(3), p.cudnn
    if v < 8903 or (v < 8906 and p.dropout != 0.0):
        return "cuDNN too old"
    limit = 256 if v >= 91000 and tuple(p.cap) == (9, 0) else 128  # Hopper: <= 256 from 9.10
    if v >= 91100 and p.cap[0] == 10 and d_qk == 192 and d_v == 128:
        limit = 192  # Blackwell sm10x: DeepSeek's (192, 128)
    if d_qk > limit or d_v > limit:
        return f"head_dim should be no more than {limit}"
    if d_qk % 8 != 0 or d_v % 8 != 0:
        return "head_dim should be a multiple of 8"
    if (v < 8906 and s_k % 64 != 0) or (v < 90000 and (
            s_q < 64 or (p.dropout != 0.0 and (s_q % 64 != 0 or s_k % 64 != 0)))):
        return "sequence lengths unsupported by this cuDNN"
    if s_k == 1:
        return "key/value sequence length 1"
    if s_q == 1 and p.dropout != 0.0:
        return "query sequence length 1 with dropout"


def _cudnn_bprop_head_dims(p):
    """sdp_utils.cpp ``check_cudnn_d256_bprop_head_dim`` (2.14, 2.15): when the inputs need
    grad, on sm90 and sm10x the backward takes head dims (d_qk, d_v) both <= 128, (192, 128) or
    (256, 256) only. 2.14.1 and 2.15: seen on their binaries on the fake GPU (sm90; the warning
    names SM 9.0/10.x), rejecting (136|160|192|200|224|248, same), (128, 192|256), (256, 128|192),
    (192, 64), (64, 256)."""
    if TORCH < (2, 14) or not _grad(p.q, p.k, p.v):
        return None
    if not (tuple(p.cap) == (9, 0) or p.cap[0] == 10):
        return None
    d_qk, d_v = p.q.size(-1), p.v.size(-1)
    if (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256)):
        return None
    return f"cuDNN SDPA on SM 9.0/10.x does not support backward with head dims ({d_qk}, {d_v})"


_flash_grid = _rule(  # sdp_utils.cpp check_flash_attention_grid_size (2.15)
    "flash attention: batch size or num_heads > 65535",
    lambda p: TORCH < (2, 15) or not (p.q.size(0) > 65535 or p.q.size(1) > 65535))


# sdp_utils.cpp can_use_{flash,mem_efficient,cudnn}_attention: the general constraints, then the
# dense ones (check_all_tensors_on_device passes: these model CUDA tensors; no nested inputs).
# 2.14 and 2.15 (seen on their binaries on the fake GPU): every fused kernel takes a key and value
# of one head without enable_gqa (MQA), and efficient attention takes enable_gqa's grouped heads.
_FILTERS = {
    "flash": (_flag("flash"), _shapes, _no_mask, _flash_grid, _flash_head_dim, _hw((8, 0)),
              _flash_train_hd, _flash_causal, _flash_dtypes, _batch_heads(True, True, mqa=True),
              _nonzero, _last_stride(True)),
    "efficient": (_flag("mem_efficient"), _hw((5, 0)), _shapes, _eff_head_dim, _eff_ptr_alignment,
                  _nonzero, _last_stride(False),
                  _batch_heads(TORCH >= (2, 14), True, mqa=True), _eff_dtypes),
    "cudnn": (_cudnn_dropout_version, _flag("cudnn"), _shapes, _cudnn_deterministic,
              _low_precision, _mask_shape, _hw((8, 0)), _cudnn_dropout_step, _nonzero,
              _last_stride(True), _batch_heads(True, False, mqa=True), _cudnn_shapes,
              _cudnn_bprop_head_dims),
}


def choose(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False,
           *, capability=(9, 0), cudnn_version=CUDNN_VERSION) -> SdpaChoice:
    """The backend CUDA's ``select_sdp_backend`` picks for these (fake) tensors on a GPU of
    compute ``capability`` with ``cudnn_version``, under the current ``sdpa_kernel`` flags and
    priority order. Raises ``RuntimeError`` as PyTorch does when no backend is viable."""
    enabled = {n: getattr(torch.backends.cuda, f"{n}_sdp_enabled")()
               for n in ("flash", "mem_efficient", "math", "cudnn")}
    if not any(enabled.values()):
        raise RuntimeError("No viable backend for scaled_dot_product_attention was found. This is "
                           "likely due to turning off both the math kernel and the fused kernels.")
    p = _Params(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa,
                tuple(capability), cudnn_version)
    rejected = []
    for index in priority_order(capability, cudnn_version):
        name = _NAMES[index]
        if name == "math":
            if enabled["math"]:
                return SdpaChoice("math", tuple(rejected))
            rejected.append(("math", "math attention has been runtime disabled"))
        elif name == "overrideable":
            if getattr(torch._C, "_get_overrideable_sdp_enabled", bool)():
                raise RuntimeError("Invalid backend (select_sdp_backend reached the "
                                   f"overrideable backend; rejected: {rejected})")
        else:
            reason = next((r for r in (f(p) for f in _FILTERS[name]) if r), None)
            if reason is None:
                return SdpaChoice(name, tuple(rejected))
            rejected.append((name, reason))
    raise RuntimeError(f"No available kernel. Aborting execution. Rejected: {rejected}")


# --- attention.cpp scaled_dot_product_attention, CUDA branch -----------------------------------

TITLES = {"flash": "flash attention", "efficient": "memory-efficient attention",
          "cudnn": "cuDNN attention", "math": "math (unfused) attention"}


def describe(choice: SdpaChoice, q, attn_mask, dropout_p, is_causal) -> str:
    """A line for a report: the backend and what decided it.

    >>> q = torch.empty(2, 8, 128, 64)
    >>> describe(choose(q, q, q, dropout_p=0.1), q, None, 0.1, False)
    'memory-efficient attention (float32, head dim 64, dropout 0.1)'
    """
    facts = [str(q.dtype).replace("torch.", ""), f"head dim {q.size(-1)}"]
    facts += [f"dropout {dropout_p:g}"] if dropout_p else []
    facts += ["mask"] if attn_mask is not None else []
    facts += ["causal"] if is_causal else []
    return f"{TITLES[choice.backend]} ({', '.join(facts)})"


def _bool_mask_to_additive(mask, dtype):
    """attention.cpp ``convert_boolean_attn_mask`` (2.13): where(mask, 0.0, -inf of dtype)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    neg_inf = aten.scalar_tensor.default(-math.inf, dtype=dtype, device=mask.device)
    return aten.where.ScalarSelf(mask, 0.0, neg_inf)


def _pad_last(t, align, slice_back=False):
    """attention.cpp ``pad_last_dim`` (``pad_bias`` when ``slice_back``, which always pads)."""
    last = t.size(-1)
    if not slice_back and last % align == 0:
        return t
    padded = aten.pad.default(t, [0, align - last % align])  # at::pad_symint -> constant_pad_nd
    return aten.slice.Tensor(padded, -1, 0, last) if slice_back else padded


def _preprocess_mask(mask, q, k):
    """attention.cpp ``preprocess_mask``: pad unless ``aligned_tensor<8>`` (unknown strides count
    as unaligned), then expand to (B, H, L, S)."""
    strides = [_int(mask.stride(i)) for i in range(mask.dim() - 1)]
    if not (all(s is not None and s % 8 == 0 for s in strides) and mask.stride(-1) == 1):
        mask = _pad_last(mask, 8, slice_back=True)
    return aten.expand.default(mask, [q.size(0), q.size(1), q.size(2), k.size(2)])


def _math(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa):
    """attention.cpp ``_scaled_dot_product_attention_math``, written out: on CUDA tensors it adds
    the mask in place (``add_``); on fake tensors (tensor-subclass-like) the C++ body would use
    an out-of-place ``add``, one B·H·L·S buffer more than CUDA allocates."""
    upcast = not torch._C._get_math_sdp_allow_fp16_bf16_reduction()
    qa, ka, va = (t.to(torch.float32) if upcast and t.dtype in _HALF else t for t in (q, k, v))
    negative = scale is not None and scale < 0
    s = abs(scale) if negative else scale
    factor = math.sqrt(s if s is not None else 1.0 / math.sqrt(qa.size(-1)))  # calculate_scale
    query = aten.mul.Scalar(qa, -factor if negative else factor)
    if is_causal:
        if mask is not None:
            raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be "
                               "set when is_causal=True")
        # at::ones(...).tril(): the ones are a temporary, freed as tril returns (not kept to
        # the end of the function: seen on 2.14.1's and 2.15's binaries on the fake GPU)
        mask = _bool_mask_to_additive(aten.tril.default(aten.ones.default(
            [query.size(-2), ka.size(-2)], dtype=torch.bool, device=q.device)), query.dtype)
    if enable_gqa:  # pre_process_group_query_attention_input
        qh, kh, vh = query.size(-3), ka.size(-3), va.size(-3)
        if not (qh == kh and kh == vh):
            if not (qh % kh == 0 and qh % vh == 0):
                raise RuntimeError("Number of heads in key and value must divide the number of "
                                   "heads in query")
            ka = aten.repeat_interleave.self_int(ka, qh // kh, -3)
            va = aten.repeat_interleave.self_int(va, qh // vh, -3)
    attn = aten.matmul.default(query, aten.mul.Scalar(aten.transpose.int(ka, -2, -1), factor))
    if mask is not None:
        attn.add_(mask)
    attn = aten._safe_softmax.default(attn, -1)
    if dropout_p > 0.0:  # Dropout.cpp dropout: native_dropout when is_fused_kernel_acceptable
        fused = dropout_p < 1 and attn.numel() > 0
        attn = aten.native_dropout.default(attn, dropout_p, True)[0] if fused else \
            aten.dropout.default(attn, dropout_p, True)
    weights = attn.to(q.dtype)  # the tuple's 2nd element: GCC evaluates it first
    out = aten.matmul.default(attn, va).to(q.dtype)
    del weights
    return out


def cuda_scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                      is_causal=False, scale=None, enable_gqa=False, *,
                                      capability=(9, 0), cudnn_version=CUDNN_VERSION,
                                      on_choice=None):
    """attention.cpp ``scaled_dot_product_attention`` for a CUDA tensor: ``validate_sdpa_input``,
    the empty-input shortcut, :func:`choose`, then the chosen backend's aten op as the CUDA
    branch calls it (autograd then runs that op's backward formula). ``on_choice``: called
    with the :class:`SdpaChoice` and a one-line description of the call."""
    q, k, v = query, key, value
    if not (q.dtype == k.dtype == v.dtype):  # validate_sdpa_input
        raise RuntimeError("Expected query, key, and value to have the same dtype")
    if not (q.device == k.device == v.device):
        raise RuntimeError("Expected query, key, and value to have the same device type")
    if min(q.dim(), k.dim(), v.dim()) < 2:
        raise RuntimeError("Expected query, key, and value to all be at least 2 dimensional")
    if attn_mask is not None and attn_mask.dtype not in (torch.bool, torch.float32, q.dtype):
        raise RuntimeError("Expected attn_mask dtype to be bool or float or to match query dtype")
    if TORCH >= (2, 12) and any(guard_or_false(t.numel() == 0) for t in (q, k, v)):
        zeros = aten.zeros.default([*q.shape[:-1], v.size(-1)], dtype=q.dtype, device=q.device)
        total = aten.add.Tensor(aten.add.Tensor(q.sum(), k.sum()), v.sum())
        return aten.add.Tensor(zeros, aten.mul.Scalar(total, 0))  # out + (q.sum()+...) * 0
    choice = choose(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa,
                    capability=capability, cudnn_version=cudnn_version)
    backend = choice.backend
    if on_choice is not None:
        on_choice(choice, describe(choice, q, attn_mask, dropout_p, is_causal))
    mask = _bool_mask_to_additive(attn_mask, q.dtype)
    lse = _grad(q, k, v)  # should_compute_logsumexp
    if backend == "cudnn":
        return aten._scaled_dot_product_cudnn_attention.default(
            q, k, v, mask, lse, dropout_p, is_causal, False, scale=scale)[0]
    if backend == "flash":
        og = q.size(-1)
        og_scale = scale if scale is not None else 1.0 / math.sqrt(og)  # scale of the OG head dim
        out = aten._scaled_dot_product_flash_attention.default(
            _pad_last(q, 8), _pad_last(k, 8), _pad_last(v, 8), dropout_p, is_causal, False,
            scale=og_scale)[0]
        return aten.slice.Tensor(out, -1, 0, og) if out.size(-1) != og else out  # post_process
    if backend == "efficient":
        if mask is not None:
            mask = _preprocess_mask(mask, q, k)
        return aten._scaled_dot_product_efficient_attention.default(
            q, k, v, mask, lse, dropout_p, is_causal, scale=scale)[0]
    return _math(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
