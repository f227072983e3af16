"""What PyTorch's CUDA attention kernels allocate beyond, or unlike, their meta kernels: the
memory side of :mod:`fxmem.trace.kernels.cuda.sdpa`, which chooses the kernel.

:data:`HOST_OUTPUTS` (outputs kept in host memory), :data:`WORKSPACES` and
:func:`workspace_bytes` (temporaries the kernels allocate through the caching allocator while
they run), :data:`META_CORRECTIONS` and :func:`cuda_outputs` (outputs the meta kernels get
wrong). Read for torch 2.13.0 (git cf30153c), as :mod:`fxmem.trace.kernels.cuda.sdpa` says.

>>> import torch
>>> q = torch.empty(2, 8, 128, 64, dtype=torch.float16)
>>> out = torch.empty(2, 8, 128, 64, dtype=torch.float16)
>>> aten = torch.ops.aten
>>> ws = dict(workspace_bytes(aten._scaled_dot_product_flash_attention_backward.default,
...                           (out, q, q, q, out, torch.empty(2, 8, 128), None, None, 128, 128,
...                            0.0, False, torch.empty(2), torch.empty(()))))
>>> ws["flash backward softmax_d"] == 4 * 2 * 8 * 128     # 4·B·H·r(Lq, 128)
True
"""

from __future__ import annotations

import math

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .sdpa import _HALF, TORCH, _deterministic

aten = torch.ops.aten


# --- what the CUDA kernels allocate that the meta kernels don't say ----------------------------

# Output positions the CUDA kernel returns as host tensors outside CUDA-graph capture
# (attention.cu _efficient_attention_forward, Note [Seed and Offset Device]: seed/offset are
# at::scalar_tensor(...) or at::empty({}, kCPU)). Flash's rng_state/_unused (flash_api.cpp mha_fwd)
# and cuDNN's seed/offset (attention.cu _cudnn_attention_forward) are CUDA tensors, always.
HOST_OUTPUTS = {
    aten._scaled_dot_product_efficient_attention.default: (2, 3),
    aten._efficient_attention_forward.default: (2, 3),
}

# op -> [(temporary, bytes, source)] the CUDA kernels allocate and free while they run. B, H,
# Hk, Lq, Lk; D, Dv head dims (flash: padded to 8); e element size; r(x, m) x rounded up to m;
# Dr = r(D, 32 if D <= 128 else 64); "unknown" where the size is not in PyTorch's source.
WORKSPACES = {
    "_scaled_dot_product_flash_attention": [
        ("softmax_lse_accum + out_accum, split-KV (dropout 0, n splits > 1)",
         "4·n·B·H·Lq·(1 + Dr), n = num_splits_heuristic(B·H·⌈Lq/64⌉, 2·SMs, ⌈Lk/block_n⌉, 128)",
         "flash_api.cpp set_params_splitkv"),
        ("rng_state's first allocation, replaced under dropout", "16", "flash_api.cpp mha_fwd")],
    "_scaled_dot_product_flash_attention_backward": [
        ("grad_out.contiguous(), out.contiguous() of their (B, L, H, D) views", "B·Lq·H·D·e each, "
         "if not contiguous", "attention_backward.cu _flash_attention_backward"),
        ("softmax_d", "4·B·H·r(Lq, 128)", "flash_api.cpp mha_bwd"),
        ("dq_accum", "4·B·r(Lq, 128)·H·Dr (deterministic: ·⌈SMs/(B·H)⌉, zeroed)", "mha_bwd"),
        ("dk_expanded, dv_expanded (GQA)", "2·B·Lk·H·D·e", "mha_bwd")],
    "_scaled_dot_product_efficient_attention": [
        ("output_accum (fp16/bf16, max(D, Dv) > 128: the gmem kernel)", "4·B·Lq·H·Dv",
         "attention.cu _efficient_attention_forward")],
    "_scaled_dot_product_efficient_attention_backward": [
        ("grad_out.contiguous() of its (B, L, H, D) view, before the gradients",
         "B·Lq·H·Dv·e if not contiguous",
         "attention_backward.cu _efficient_attention_backward"),
        ("delta; fp32: grad_out*out and its sum first (freed once delta is made)",
         "4·B·H·Lq; + 4·B·Lq·H·Dv + 4·B·Lq·H", "_efficient_attention_backward"),
        ("dk_expanded, dv_expanded (GQA, 2.14+)", "B·H·Lk·(D + Dv)·e",
         "seen on the 2.14.1 and 2.15 binaries on the fake GPU"),
        ("workspace: gQ (+ gK/gV staging when !kOutputInRF)", "4·B·H·r(gk + gv + "
         "⌈Lq/I⌉·⌈D/J⌉·(4 + I·J), 4), gk = nsk·J·r(D, I), gv = nsk·J·r(Dv, I); (I, J) the "
         "cutlassB.h kernel", "kernel_backward.h workspace_size")],
    "_safe_softmax": [
        ("input == -inf (bool), its all() over dim, a 0-dim zero", "numel + numel/size(dim) + "
         "e of the output", "SoftMax.cpp _safe_softmax; seen on 2.14.1 and 2.15 on the fake GPU")],
    "bmm, baddbmm": [
        ("an operand cloned contiguous for cuBLAS (e.g. expanded: strides 0)", "its numel·e",
         "Blas.cpp prepare_batch_matrix_for_cublas; seen on 2.14.1 and 2.15 on the fake GPU")],
    "_scaled_dot_product_cudnn_attention": [
        ("cuDNN workspace", "unknown (mha_graph.get_workspace_size())", "cudnn/MHA.cpp")],
    "_scaled_dot_product_cudnn_attention_backward": [
        ("cuDNN workspace: cudnn_frontend's dQ accumulator and softmax_sum, + the plan's",
         "4·B·H·Lq·(D + 1) + unknown (the plan's)", "cudnn/MHA.cpp run_cudnn_SDP_bprop; "
         "cudnn_frontend SDPA backward node; seen on 2.14.1 and 2.15 on the fake GPU"),
        ("dO re-laid out when dO.stride(-1) != 1", "B·H·Lq·Dv·e", "permute_to_matching_layout")],
}

_DEFAULT_SMS = {(8, 0): 108, (9, 0): 132, (10, 0): 148}  # A100, H100 SXM, B200


_cdiv = lambda a, b: (a + b - 1) // b  # ceil_div, SymInt-friendly
_rup = lambda a, m: _cdiv(a, m) * m  # round_multiple / align_up


def _ite(conds, a, b):
    """``a if all(conds) else b`` for possibly symbolic conditions."""
    if any(c is False for c in conds):
        return b
    sym = [c for c in conds if c is not True]
    if not sym:
        return a
    cond = sym[0] if len(sym) == 1 else sym[0] & sym[1]
    wrap = lambda x: x if isinstance(x, torch.SymInt) else torch.SymInt(cond.node.wrap_int(x))
    return torch.sym_ite(cond, wrap(a), wrap(b))


def _splits_heuristic(bnm, sms, n_blocks, max_splits):
    """flash_api.cpp ``num_splits_heuristic`` (plain ints)."""
    if bnm >= 0.8 * sms:
        return 1
    max_splits = min(max_splits, sms, n_blocks)
    eligible = lambda n: n == 1 or _cdiv(n_blocks, n) != _cdiv(n_blocks, n - 1)
    eff = [(bnm * n / sms) / math.ceil(bnm * n / sms) if eligible(n) else 0.0
           for n in range(1, max_splits + 1)]
    best = max(eff)
    good = (n for n in range(1, max_splits + 1) if eligible(n) and eff[n - 1] >= 0.85 * best)
    return next(good, 1)


def _copy_if_strided(what, t):
    """``t.transpose(1, 2).contiguous()`` in the kernel's (B, L, H, D) layout: a copy unless
    already contiguous."""
    if t.transpose(1, 2).is_contiguous():
        return []
    return [(what, t.numel() * t.element_size())]


# attention_backward.cu launchKernel over cutlassB.h dispatch_cutlassB_{f16,bf16,f32}_sm80
# (cc 80..121; seq-aligned twins have the same tile): (dropout, I, J, kMaxK, only on cc)
_BWD = {
    True: ((False, 64, 64, 32, None), (False, 64, 64, 64, None), (False, 128, 64, 96, (86, 89)),
           (False, 128, 128, 128, None), (False, 64, 64, 128, None), (False, 128, 64, 65536, None),
           (False, 64, 64, 65536, None), (True, 64, 64, 32, None), (True, 64, 64, 64, None),
           (True, 128, 128, 128, None), (True, 64, 64, 128, None), (True, 128, 64, 65536, None),
           (True, 64, 64, 65536, None)),
    False: tuple((d, i, j, m, None) for d in (False, True)
                 for i, j, m in ((64, 64, 32), (64, 64, 64), (128, 64, 128), (64, 64, 128),
                                 (128, 64, 65536), (64, 64, 65536))),
}


def _eff_bwd_kernel(half, max_k, dropout, cap):
    """The first kernel that fits. Shared memory is not modeled, except that 128x128 tiles are
    taken not to fit the <= 100 KB-a-block GPUs (sm86/87/89/120/121), as the sm86/89-only
    128x64 k96 kernel in cutlassB.h implies."""
    cc = 120 if cap == (12, 1) else cap[0] * 10 + cap[1]
    small = cc in (86, 87, 89, 120)
    for drop, i, j, kmax, only in _BWD[half]:
        if not ((only and cc not in only) or kmax < max_k or (dropout and not drop)
                or (small and i == j == 128)):
            return i, j, kmax
    return None


def _efficient_bwd_workspace(q, k, v, dropout, cap):
    b, h, m, n, dq, dv = q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)
    half = q.dtype in _HALF
    kernel = _eff_bwd_kernel(half, max(dq, dv), dropout, cap) if cap >= (8, 0) else None
    if kernel is None:
        return []
    i, j, kmax = kernel
    staged = half and not kmax <= i  # kNeedsAccumGradK/V = !kOutputInRF (fp32: never)
    nsk = _cdiv(n, j)  # num_splits_key heuristic
    nsk = _ite((b * h >= 256, n <= 2 * j), 1, nsk)
    if staged:
        nsk = torch.sym_min(nsk, 200 // (b * h))
    nsk = 1 if _deterministic() else torch.sym_max(nsk, 1)
    gk = nsk * j * _rup(dq, i) if staged else 0
    gv = nsk * j * _rup(dv, i) if staged else 0
    gq = _cdiv(m, i) * _cdiv(dq, j) * (4 + i * j)  # sizeof(GradQTempStorage) / 4, I·J floats
    return [("efficient backward workspace", b * h * _rup(gk + gv + gq, 4) * 4)]


def _by_name(op, args, kwargs=None) -> dict:
    """The op's arguments by schema name, defaults filled in."""
    kw = dict(kwargs or {})
    return {a.name: args[i] if i < len(args) else kw.get(a.name, a.default_value if
                                                           a.has_default_value() else None)
            for i, a in enumerate(op._schema.arguments)}


def _ws_flash(a, cap, sms):  # flash_api.cpp mha_fwd, set_params_splitkv
    q, k, drop = a["query"], a["key"], a["dropout_p"]
    b, h, hk, sq, sk, d = q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)
    out = [("flash rng_state, first allocation", 16)] if drop > 0 else []
    if sq == 1 and h > hk and drop == 0:  # seqlenq_ngroups_swapped
        sq, h = h // hk, hk
    if drop == 0 and sms and all(isinstance(x, int) for x in (b, h, sq, sk)):
        bn = 256 if d <= 64 else (128 if d <= 128 else 64)
        n = _splits_heuristic(b * h * _cdiv(sq, 64), 2 * sms, _cdiv(sk, bn), 128)
        dr = _rup(d, 32 if d <= 128 else 64)
        if n > 1:
            out.append(("flash split-KV lse_accum, out_accum", 4 * n * b * h * sq * (1 + dr)))
    return out


def _ws_flash_bwd(a, cap, sms):  # attention_backward.cu _flash_attention_backward, mha_bwd
    q, k = a["query"], a["key"]
    b, h, hk, sq, sk, d = q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)
    out = _copy_if_strided("flash backward grad_out.contiguous()", a["grad_out"])
    out += _copy_if_strided("flash backward out.contiguous()", a["out"])
    splits = _cdiv(sms, b * h) if _deterministic() and sms else 1
    sq_r, dr = _rup(sq, 128), _rup(d, 32 if d <= 128 else 64)
    out += [("flash backward softmax_d", 4 * b * h * sq_r),
            ("flash backward dq_accum", 4 * splits * b * sq_r * h * dr)]
    if hk != h:
        out.append(("flash backward dk_expanded, dv_expanded",
                    2 * b * sk * h * d * q.element_size()))
    return out


def _ws_efficient(a, cap, sms):  # attention.cu _efficient_attention_forward: the gmem kernel
    q, v = a["query"], a["value"]
    if q.dtype in _HALF and max(q.size(3), a["key"].size(3), v.size(3)) > 128:
        return [("efficient output_accum", 4 * q.size(0) * q.size(2) * q.size(1) * v.size(3))]
    return []


# the efficient backward's temporaries by name (fxmem.trace.kernels.cuda.call_order orders them)
EFF_GRAD_OUT_COPY = "efficient backward grad_out.contiguous()"
EFF_PRODUCT = "efficient backward grad_out*out (float32)"
EFF_SUM = "efficient backward its sum over the head dim"
EFF_DELTA = "efficient backward delta"


def _ws_efficient_bwd(a, cap, sms):
    """attention_backward.cu ``_efficient_attention_backward``, in the order it allocates:
    ``grad_out_.contiguous()`` (a copy when the (B, L, H, D) view is strided) before the
    gradients; after them, from 2.14 with fewer key/value heads than query heads, the key and
    value gradients at the query's heads (reduced into the outputs after the kernel); then
    ``delta``: for fp16/bf16 (``kKernelComputesDelta``) an empty (B, H, Lq) float32, for
    fp32 ``(grad_out * out).sum(-1).transpose(-2, -1).contiguous()``, whose product and sum
    are freed as the statement ends (:func:`fxmem.trace.kernels.cuda.call_order.steps`); then the
    kernel's workspace. Seen on 2.14.1's and 2.15's binaries on the fake GPU (fp32 B=2 H=4
    L=128 D=64: the 262,144-byte copy, the three gradients, 262,144, 4,096 and 4,096 bytes,
    the product and the sum freed, the 262,400-byte workspace; GPT-2 small at seq 512, B=4:
    6,291,456, 98,304, 98,304, then 6,297,600)."""
    q, k, v = a["query"], a["key"], a["value"]
    b, h, m, dv = q.size(0), q.size(1), q.size(2), v.size(3)
    out = _copy_if_strided(EFF_GRAD_OUT_COPY, a["grad_out_"])
    if TORCH >= (2, 14) and k.size(1) != h:  # GQA / one kv head (2.14+: sdpa.choose)
        # 2.14.1 and 2.15 on the fake GPU: the backward computes the key and value gradients
        # at the query's heads, then reduces them (fp16 B=2 H=4 Hkv=1 L=128 D=64: 262,144 B
        # more than the step without; fp32 B=3 Hkv=2: 786,432 B)
        e, n = q.element_size(), k.size(2)
        out += [("efficient backward dk_expanded (GQA)", b * h * n * k.size(3) * e),
                ("efficient backward dv_expanded (GQA)", b * h * n * dv * e)]
    if q.dtype in _HALF:  # kKernelComputesDelta: at::empty({B, nH, M}, float)
        out.append((EFF_DELTA, 4 * b * h * m))
    else:  # (B, Lq, H, Dv) product, its (B, Lq, H) sum, then that transposed contiguous
        out += [(EFF_PRODUCT, 4 * b * m * h * dv)]
        if statically_known_true(m == 1) or statically_known_true(h == 1):
            out.append((EFF_DELTA, 4 * b * m * h))  # the transposed sum is contiguous
        else:
            out += [(EFF_SUM, 4 * b * m * h), (EFF_DELTA, 4 * b * h * m)]
    return out + _efficient_bwd_workspace(q, k, v, a["dropout_p"] != 0, tuple(cap))


def _ws_cudnn_bwd(a, cap, sms):
    """MHA.cpp run_cudnn_SDP_bprop: dO re-laid out (permute_to_matching_layout(o, dO)) when its
    last stride is not 1; then one workspace of ``mha_graph.get_workspace_size()``: the
    execution plan's (cuDNN's choice: not modelled, 0 here) plus cudnn_frontend's own tensors
    in it, the fp32 dQ accumulator (B, Hq, Lq, Dqk) and softmax_sum (B, Hq, Lq) (the SDPA
    backward node's dQ_accum and softmax_sum; GQA does not change them). Seen on 2.14.1's and
    2.15's binaries on the fake GPU (its cuDNN stub: plan workspace FAKEGPU_CUDNN_WORKSPACE):
    fp16 B=2 H=4 L=128 D=64 266,240 bytes (with Hkv 2 too), bf16 B=3 L=200 D=128 with dropout
    and causal 1,238,400; with a 1,000-byte plan workspace, 267,240 in one block."""
    g, q = a["grad_out"], a["query"]
    out = [] if g.stride(-1) == 1 else [("cuDNN backward dO re-laid out",
                                         g.numel() * g.element_size())]
    b, h, lq, d = q.size(0), q.size(1), q.size(2), q.size(3)
    return out + [("cuDNN backward workspace: cudnn_frontend's dQ accumulator and softmax_sum "
                   "(fp32; + the plan's own workspace, not modelled)", 4 * b * h * lq * (d + 1))]


def _ws_safe_softmax(a, cap, sms):
    """SoftMax.cpp ``_safe_softmax`` (the math attention's softmax): after the softmax's output,
    the rows that are all -inf are found and zeroed: a bool of the input's size (the -inf test),
    its ``all`` over ``dim`` (keepdim) and a 0-dim zero of the output's dtype, freed as it
    returns; no other output (seen on 2.14.1's and 2.15's binaries on the fake GPU: fp32
    (2, 4, 128, 128) input: 131,072, 1,024 and 4 bytes after the 524,288-byte output)."""
    x, dim, dtype = a["self"], a["dim"], a["dtype"]
    dim = dim % max(x.dim(), 1)
    e = (dtype or x.dtype).itemsize
    rows = math.prod(n for i, n in enumerate(x.shape) if i != dim)
    return [("_safe_softmax: input == -inf (bool)", x.numel()),
            ("_safe_softmax: its all() over the softmax dim (bool)", rows),
            ("_safe_softmax: the 0-dim zero", e)]


def _cublas_batch_copy(t, transpose_result, m, n) -> bool:
    """Blas.cpp ``prepare_batch_matrix_for_cublas``: whether ``t`` (3-D) is cloned contiguous
    because neither of its last two dims has stride 1 with a leading stride cuBLAS takes
    (e.g. an expanded tensor, strides 0), unless it is contiguous with nonzero strides."""
    st = t.stride()
    fast, lead = (2, 1) if transpose_result else (1, 2)
    if st[fast] == 1 and st[lead] >= max(1, m):
        return False
    if st[lead] == 1 and st[fast] >= max(1, n):
        return False
    return not (st[1] != 0 and st[2] != 0 and t.is_contiguous())


def _ws_bmm(a, cap, sms):
    """Blas.cpp ``baddbmm_out_cuda_impl`` (bmm and baddbmm): an operand cuBLAS cannot take as
    it is laid out is cloned contiguous (``prepare_batch_matrix_for_cublas``), after the
    output, and freed as the call returns (2.15: after the call's cuBLAS workspace). The math
    attention's backward meets it: ``out.sum()``'s gradient is a scalar expanded (strides 0)
    into both backward bmm's (seen on 2.14.1's and 2.15's binaries on the fake GPU: fp32
    (8, 128, 64) gradient, a 262,144-byte clone in each; and bmm/baddbmm alone: an expanded
    first, second or both operands (the second's clone first), N = 1; a batch-broadcast or
    transposed operand is not copied). The result (fresh, contiguous) is used as it is."""
    b1, b2 = (a["batch1"], a["batch2"]) if "batch1" in a else (a["self"], a["mat2"])
    if b1 is None or b2 is None or b1.dim() != 3 or b2.dim() != 3:
        return []
    bs, m_, k_, n_ = b1.size(0), b1.size(1), b1.size(2), b2.size(2)
    if statically_known_true(bs * m_ * n_ == 0) or statically_known_true(k_ == 0):
        return []
    if TORCH == (2, 14) and "batch1" not in a and _is_outer_product(b1, b2):
        return []  # torch/_native's override of bmm (2.14) runs it as a Triton kernel
    # the result (bs, m_, n_) contiguous: cuBLAS writes it transposed unless n_ == 1
    transpose_result = not (n_ == 1)
    m, n = (n_, m_) if transpose_result else (m_, n_)
    k = k_
    names = ("batch1", "batch2") if "batch1" in a else ("self", "mat2")
    first, second = ((b2, names[1]), (b1, names[0])) if transpose_result else \
        ((b1, names[0]), (b2, names[1]))
    out = []
    for (t, what), mm, nn in ((first, m, k), (second, k, n)):
        if _cublas_batch_copy(t, transpose_result, mm, nn):
            out.append((f"bmm: {what} cloned contiguous for cuBLAS "
                        f"(prepare_batch_matrix_for_cublas)", t.numel() * t.element_size()))
    return out


def _is_outer_product(b1, b2) -> bool:  # torch/_native/ops/bmm_outer_product (2.14)
    return b1.size(2) == 1 and b2.size(1) == 1 and b1.numel() > 0 and b2.numel() > 0 \
        and not b1.is_complex()


_WS = {aten._scaled_dot_product_flash_attention.default: _ws_flash,
       aten.bmm.default: _ws_bmm,
       aten.baddbmm.default: _ws_bmm,
       aten._safe_softmax.default: _ws_safe_softmax,
       aten._scaled_dot_product_flash_attention_backward.default: _ws_flash_bwd,
       aten._scaled_dot_product_efficient_attention.default: _ws_efficient,
       aten._scaled_dot_product_efficient_attention_backward.default: _ws_efficient_bwd,
       aten._scaled_dot_product_cudnn_attention_backward.default: _ws_cudnn_bwd}


def workspace_bytes(op, args, outputs=None, kwargs=None, *, capability=(9, 0), num_sms=None):
    """``[(what, nbytes)]`` the CUDA kernel of ``op`` allocates and frees while it runs, for the
    temporaries of :data:`WORKSPACES` whose size the source gives; ``[]`` for other ops.
    ``nbytes`` may be a SymInt expression. ``num_sms`` (flash's split-KV and deterministic
    heuristics) defaults to the usual part of ``capability`` (A100, H100, B200)."""
    handler = _WS.get(op)
    if handler is None:
        return []
    sms = num_sms or _DEFAULT_SMS.get(tuple(capability))
    return handler(_by_name(op, args, kwargs), capability, sms)


# --- meta kernel vs CUDA kernel outputs ---------------------------------------------------------

def _flash_outputs(a, outputs):
    # flash_api.cpp mha_fwd: rng_state = at::empty({2}, uint64, CUDA), _unused = at::empty({},
    # uint64, CUDA), always (meta: on the meta device). The debug mask would differ only with
    # return_debug_mask (CUDA: (B, H, r(Lq, 128), r(Lk, 128))), which attention.cpp never asks.
    real = [None] * len(outputs)
    real[6], real[7] = ((2,), torch.uint64, "cuda"), ((), torch.uint64, "cuda")
    return tuple(real)


def _cudnn_outputs(a, outputs):
    # attention.cu _cudnn_attention_forward, MHA.cpp run_cudnn_SDP_fprop: the logsumexp exists only
    # when compute_log_sumexp (meta: always (B, H, Lq, 1) float32); seed, offset are
    # at::empty({}, int64, CUDA) (meta: on the meta device)
    real = [None] * len(outputs)
    if not a["compute_log_sumexp"]:
        real[1] = ((0,), torch.float32, "cuda")
    real[6] = real[7] = ((), torch.int64, "cuda")
    return tuple(real)


# op -> f(args_by_name, outputs) -> per output None (meta is right) or (shape, dtype, device)
# of what the CUDA kernel allocates; ops absent here match their meta kernels (the efficient
# kernels' logsumexp is padded to a multiple of 32 in both; their seed/offset: HOST_OUTPUTS).
META_CORRECTIONS = {
    aten._scaled_dot_product_flash_attention.default: _flash_outputs,
    aten._scaled_dot_product_cudnn_attention.default: _cudnn_outputs,
}


def cuda_outputs(op, args, outputs, kwargs=None):
    """Per output of ``op``: ``None`` where its meta kernel allocates what the CUDA kernel does,
    else the CUDA kernel's ``(shape, dtype, device)``; ``None`` for ops the meta gets right.

    >>> op = aten._scaled_dot_product_cudnn_attention.default   # compute_log_sumexp=False:
    >>> cuda_outputs(op, (None, None, None, None, False), [None] * 9)[1]
    ((0,), torch.float32, 'cuda')
    """
    fix = META_CORRECTIONS.get(op)
    return None if fix is None else fix(_by_name(op, args, kwargs), outputs)
