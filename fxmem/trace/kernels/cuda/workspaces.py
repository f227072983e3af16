"""Temporaries that PyTorch's CUDA kernels allocate and free inside one op (beyond SDPA).

:func:`workspace_bytes` gives, for the ops in :data:`OPS`, the ``(what, nbytes)`` the CUDA
kernel has alive together at its peak (allocated through the caching allocator, freed before
it returns): their sum is the op's peak extra bytes. ``nbytes`` is an int or a SymInt in the
op's symbolic sizes; a size-dependent branch of the kernel becomes ``torch.sym_ite``, never a
guard. :func:`unmodelled` names what the formulas leave out.

Read for torch 2.13.0 (git cf30153c), whose cu130 libtorch_cuda.so has the fused embedding
kernel (``compute_grad_weight_atomic_accumulate``), no NHWC GroupNorm, and CCCL 3.0.1. Sources
(not stored at that commit): copies of recent main's EmbeddingBackwardKernel.cu, Embedding.cu,
Indexing.cu, TensorAdvancedIndexing.cpp, layer_norm_kernel.cu, group_norm_kernel.cu and
SoftMax.cu (its calls also read off the 2.11 and 2.14 cu130 binaries: softmax backward's product
``at::_ops::mul_Tensor``, host_softmax's ``contiguous``); the installed ATen/cuda/cub.cuh, cub.h,
cub-RadixSortPairs.cuh; CCCL 3.0.1's cub/device/dispatch.
:func:`radix_sort_temp_bytes` equals what CCCL 3.0.1's host code returns (run without a GPU)
for n up to 3e8, 4- and 8-byte keys, 8 to 64 bits, sm75 to sm120.

>>> import torch
>>> aten = torch.ops.aten
>>> grad, ids = torch.empty(4096, 768), torch.zeros(4096, dtype=torch.long)
>>> ws = dict(workspace_bytes(aten.embedding_dense_backward.default,
...                           (grad, ids, 50257, -1, False), {}, None))
>>> ws["grad_weight_per_segment (two-pass path)"] == (4096 // 10 + 4096) * 768 * 4
True
>>> workspace_bytes(aten.embedding_dense_backward.default,  # n <= 3072: no temporaries
...                 (grad[:3072], ids[:3072], 50257, -1, False), {}, None)
[]
"""

from __future__ import annotations

import contextlib
import math
from fractions import Fraction

import torch
from torch._prims_common import compute_elementwise_output_strides
from torch.fx.experimental.symbolic_shapes import statically_known_true as _known

from .norms import (
    _batch_norm_backward,
    _group_norm,
    _group_norm_backward,
    _large_m,
    _layer_norm,
    _made_contiguous,
    _norm_backward,
)
from .sdpa_memory import _DEFAULT_SMS, _by_name
from .sizing import (  # noqa: F401
    _acc,
    _and,
    _cdiv,
    _clean,
    _contiguous,
    _decide,
    _deterministic,
    _ite,
    _masked,
    _peak,
    _r256,
)

aten = torch.ops.aten
_HALF = (torch.float16, torch.bfloat16)


# --- CUB radix sort (CCCL 3.0.1, as in the 2.13.0+cu130 wheel) -----------------------------------

# tuning_radix_sort.cuh for key = value = int32 / int64 and the unsigned long long offsets that
# DeviceRadixSort::SortPairs takes for an int64 num_items: OnesweepPolicy threads x items after
# RegBoundScaling (items * 4 / sizeof(key); threads capped by 48 KiB of shared memory):
# Policy700 <256, 46 | 23>, Policy800 <384, 17 | 21>, Policy900/1000 (OnesweepLargeKeyPolicy)
# <384, 17 | 24>. The policy is the one of the wheel's cubin for the device (sm75, 80, 86, 90,
# 100, 120): 700 below sm80, 800 for sm8x, 900 from sm90 (Policy1000's tiles are the same).
_ONESWEEP_TILE = {700: {4: 256 * 46, 8: 256 * 11}, 800: {4: 384 * 17, 8: 384 * 10},
                  900: {4: 384 * 17, 8: 384 * 12}}


def _tile(capability, key_size):
    cap = tuple(capability)
    return _ONESWEEP_TILE[700 if cap < (8, 0) else 800 if cap < (9, 0) else 900][key_size]


def radix_sort_temp_bytes(n, key_size, passes, capability=(9, 0), n_lo=0):
    """``temp_storage_bytes`` of ``cub::DeviceRadixSort::SortPairs`` (keys and values of
    ``key_size`` bytes, not overwritable; ``passes`` = ceil(bits / 8)) that
    at::cuda::cub::radix_sort_pairs allocates (cub.cuh CUB_WRAPPER); ``n_lo``: known n >= n_lo.
    dispatch_radix_sort.cuh ``Invoke``: 1 byte when n fits one SingleTilePolicy tile (256
    threads x 19 * 4 / key_size items); else ``InvokeOnesweep``: bins, lookback, the alternate
    keys and values (when passes > 1), counters, each 256-aligned, plus 255."""
    tile = _tile(capability, key_size)
    portion = ((1 << 28) - 1) // tile * tile
    portions, blocks = _cdiv(n, portion), _cdiv(torch.sym_min(n, portion), tile)
    alternate = 2 * _r256(n * key_size)  # only when passes > 1; passes >= 1, and a
    # Min(1, passes - 1) factor keeps sympy from folding Piecewise into Piecewise
    onesweep = (_r256(portions * passes * 256 * 8) + _r256(blocks * 256 * 4)
                + (alternate * torch.sym_min(1, passes - 1) if isinstance(passes, torch.SymInt)
                   else alternate if passes > 1 else 0)
                + _r256(portions * passes * 4) + 255)
    single = 256 * (19 * 4 // key_size)
    return onesweep if n_lo > single else _ite(n > single, onesweep, 1)


# --- 1. embedding_dense_backward ---------------------------------------------------------------

def _embedding_dense_backward(a, cap, sms):
    """Embedding.cu ``embedding_dense_backward_cuda``, EmbeddingBackwardKernel.cu
    ``embedding_backward_cuda_kernel``. n = indices.numel(), s = sizeof(index), m = min(n, V),
    P = n // 10 + m. Path A (n <= 3072, no scale_grad_by_freq): nothing. Path B, alive
    together in each phase: sort: sorted/orig indices, range, CUB's sort storage;
    unique_by_key: sorted/orig, [count], segment_offsets, num_of_segments, keys_out (n);
    segments: sorted/orig, [count], segment_offsets, num_of_segments, partials_per_segment
    and its offsets (m each), num_of_partial_segments, partial_segment_offset (P), then the
    fused atomic path's partial_to_segment_idx (P) and fp32 grad_weight_acc (V*D, fp16/bf16)
    or the two-pass path's grad_weight_per_segment (P*D*opmath)."""
    return _sorted_backward(a["grad_output"], a["indices"], a["num_weights"],
                            a["scale_grad_by_freq"], cap, sms)


def _embedding_bag_dense_backward(a, cap, sms, promoted=False):
    """EmbeddingBag.cu ``_embedding_bag_dense_backward_cuda``: ``grad.contiguous()``; sum and
    mean: ``embedding_bag_backward_cuda_sum_avg`` always sorts (path B of
    :func:`_embedding_dense_backward`, whatever n), then ``embedding_backward_cuda_kernel``
    with ``offset2bag``, which never takes the fused atomic path (``!offset2bag.defined()``);
    max: ``embedding_bag_backward_cuda_max`` (atomics, no temporaries). ``promoted``: the
    indices it sorts are a contiguous int64 copy of ``a["indices"]``."""
    if a["mode"] == 2:  # MODE_MAX
        g = a["grad"]
        return [] if _contiguous(g) else [("grad.contiguous()", g.numel() * g.element_size())]
    return _sorted_backward(a["grad"], a["indices"], a["num_weights"], a["scale_grad_by_freq"],
                            cap, sms, bag=True, promoted=promoted)


def _embedding_bag_backward(a, cap, sms):
    """EmbeddingBag.cpp ``_embedding_bag_backward_symint`` (a CUDA kernel, not a composite,
    since 2.11): ``promoteIndicesAndOffsets`` converts int32 indices to int64 when the offsets
    are int64 (a copy alive until the op returns), then, unless ``sparse``,
    ``_embedding_bag_dense_backward`` (:func:`_embedding_bag_dense_backward`)."""
    if a["sparse"]:
        return []
    idx, off = a["indices"], a["offsets"]
    if idx.dtype == off.dtype:
        return _embedding_bag_dense_backward(a, cap, sms)
    copy = [("indices.to(offsets' dtype) (promoteIndicesAndOffsets)", idx.numel() * 8)]
    return copy + _embedding_bag_dense_backward(a, cap, sms, promoted=True)


def _sorted_backward(g, idx, V, scale, cap, sms, bag=False, promoted=False):
    """The temporaries of embedding backward's sort-based kernel (see
    :func:`_embedding_dense_backward`); ``bag``: EmbeddingBag's, which always sorts and never
    takes the fused atomic path; ``promoted``: it sorts a contiguous int64 copy of ``idx``."""
    n, D, s = idx.numel(), g.size(-1), 8 if promoted else idx.element_size()
    ws = [] if promoted or _contiguous(idx) else [("indices.contiguous()", n * s)]
    if not _contiguous(g):  # grad_.contiguous() (.view({n, D}))
        ws.append(("grad.contiguous()", g.numel() * g.element_size()))
    # bags: none without indices (all bags empty), else always
    path_b = _decide(n > 0 if bag else True if scale else n > 3072)
    if path_b is False:
        return ws
    lo = 1 if scale or bag else 3073  # the least n of path B
    m = torch.sym_min(n, V)
    P = n // 10 + m  # max_partial_segment (NROWS_PER_THREAD = 10)
    common = [("sorted_indices", n * s), ("orig_indices", n * s)]
    segs = ([("count (scale_grad_by_freq)", n * s)] if scale else []) + [
        ("segment_offsets", n * s), ("num_of_segments", 8)]
    warped = _cdiv(D, 32) * 32  # stride_warped
    block = torch.sym_min(warped, 1024)  # SortingCommon.cuh MAX_BLOCK_SIZE (CUDA)
    grid = _cdiv(m * warped, block)  # sum_scatter_grid: non-decreasing in n
    fused = not (bag or _deterministic() or _known(_cdiv(torch.sym_min(lo, V) * warped, block)
                                            >= sms * 4)) and _and(grid < sms * 4, P > grid * 4)
    opmath = 8 if g.dtype == torch.float64 else 4
    phases = {
        "sort": common + [("range = arange(n), until the sort ends", n * s),
                          ("CUB radix-sort temp storage",
                           radix_sort_temp_bytes(n, s, s, cap, lo))],  # all 8*s key bits
        "segments": common + segs + [
            ("partials_per_segment", m * s), ("partials_per_segment_offset", m * s),
            ("num_of_partial_segments", 8), ("partial_segment_offset", P * s),
            ("partial_to_segment_idx (fused atomic path)", _ite(fused, P * s, 0)),
            ("grad_weight_acc fp32 (fused atomic path)",
             _ite(fused, V * D * 4, 0) if g.dtype in _HALF else 0),
            ("grad_weight_per_segment (two-pass path)", _ite(fused, 0, P * D * opmath))]}
    if lo <= 256 * (19 * 4 // s):  # else sort (>= 3*n*s + 2 KiB) > unique_by_key (<= 3*n*s + 8)
        phases["unique_by_key"] = common + segs + [("unique_by_key keys_out", n * s)]
    # sort - segments <= n*(2s + 1024/tile + 2052s/portion - (s + D*opmath)/10) + 2052s + 2044
    # (the CUB storage's terms bounded, P >= n/10): if <= 0 for n >= lo, segments peaks
    tile = _tile(cap, s)
    c = (Fraction(s + D * opmath, 10) - 2 * s - Fraction(1024, tile)
         - Fraction(2052 * s, ((1 << 28) - 1) // tile * tile))
    if fused is False and isinstance(D, int) and c > 0 and lo * c >= 2052 * s + 2044:
        del phases["sort"]
    return ws + _clean([(w, _ite(path_b, x, 0)) for w, x in _peak(phases)])


# --- 2. index_put's sort kernel (accumulate or deterministic); deterministic index_add_ ----------

def _bshape(shapes):
    """The broadcast shape, without guards (sizes are equal or 1)."""
    rank, out = max(len(s) for s in shapes), []
    for i in range(rank):
        sizes = [s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0]
        big = [x for x in sizes if not _known(x == 1)] or sizes[:1]
        out.append(big[0] if all(_known(x == big[0]) for x in big) else torch.sym_max(*big[:2]))
    return out


def _expand_masks(indices) -> tuple:
    """IndexingUtils.h ``expandTensors``: each boolean (or uint8) mask becomes ``nonzero()``'s
    columns, one int64 index per mask dim, as long as its number of True values (the fake
    ``nonzero``'s unbacked symbol, memoized on the mask: fxmem.trace.kernels.datadep bounds it by
    the mask's elements). Returns the indices as (shape, dtype, numel) or None per dim, and the
    ``nonzero`` outputs, Nonzero.cu ``nonzero_cuda_out_impl``'s {ndim, n} int64 (plus a copy
    of a non-contiguous mask), alive until the indices are dropped."""
    meta, made = [], []
    for t in indices:
        if t is None or t.dtype not in (torch.bool, torch.uint8):
            meta.append(None if t is None else (t.shape, t.dtype, t.numel()))
            continue
        n = t.nonzero().shape[0]
        meta += [((n,), torch.int64, n)] * t.dim()
        made.append((f"nonzero(mask): {t.dim()} int64 columns of the True values",
                     t.dim() * n * 8))
        if not _contiguous(t):
            made.append(("mask.contiguous() for nonzero", t.numel() * t.element_size()))
    return meta, made


def _sort_kernel(self_t, indices, value_shape, value_contig, value_size, cap, fresh=False,
                 masks=()):
    """Indexing.cu ``index_put_with_sort_kernel``, makeLinearIndex, computeLinearIndex,
    wrapIndexOnce; ``indices``: None or (shape, dtype, numel) per dim, K: broadcast numel.
    Throughout: self.contiguous(), the transposed self's contiguous() (non-adjacent indices).
    Phase makeLinearIndex: int32 indices .to(kLong), remainder() and * stride (K*8 each)
    beside linearIndex. Phase sort: linearIndex, sorted/orig indices, range (K*8 each, four
    storages),
    value.expand(vals_shape).contiguous(), CUB's sort storage (nbits = bit length of
    largestIndex(self) / sliceSize). The range check's 0-dim min/max (unsafe=False) is left out.
    ``masks``: the ``nonzero`` outputs of expanded masks (:func:`_expand_masks`), which
    makeLinearIndex's own ``expandTensors`` holds until it returns, not into the sort."""
    dims = [i for i, t in enumerate(indices) if t is not None]
    if not dims:
        return []
    shape, e = list(self_t.shape) or [1], self_t.element_size()
    numel = math.prod(shape)
    ws = [] if fresh or _contiguous(self_t) else [("self.contiguous()", numel * e)]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))  # hasContiguousSubspace
    front = dims[0] if adjacent else 0
    rest = shape[dims[-1] + 1:] if adjacent else [x for i, x in enumerate(shape) if i not in dims]
    slice_size, kshape = math.prod(rest), _bshape([list(indices[i][0]) for i in dims])
    K = math.prod(kshape)
    if not adjacent:  # transposeToFrontAndInvPerm; src_ = src.contiguous() when permuted
        perm = dims + [i for i in range(len(shape)) if i not in dims]
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        if not _contiguous([shape[i] for i in perm], [strides[i] for i in perm]):
            ws.append(("transposed self .contiguous() (src_)", numel * e))
    longs = [("int32 index .to(kLong)", indices[i][2] * 8) for i in dims
             if indices[i][1] == torch.int32]
    vals_shape = shape[:front] + kshape + list(rest)
    copy_v = not (value_contig and len(value_shape) == len(vals_shape)
                  and all(_known(x == y) for x, y in zip(value_shape, vals_shape)))
    run = _and(K > 0, slice_size > 0)
    big = 0 if _known(slice_size == 0) else (numel - 1) // slice_size  # largestIndex/sliceSize
    # 1 + the j in 1..7 with big >= 256**j, each as Min(1, big // 256**j) (big >= 0): the same
    # integer, which sympy folds in milliseconds where seven nested Piecewise took seconds
    passes = (1 + sum(torch.sym_min(1, big // 2 ** (8 * j)) for j in range(1, 8))
              if isinstance(big, torch.SymInt) else max(1, _cdiv(big.bit_length(), 8)))
    # four int64 tensors of K, each a block of its own (seen on 2.14.1 and 2.15: one storage
    # for the four was 1,536 B under at K = 2)
    phases = {"sort": [("linearIndex", _ite(run, K * 8, 0))] + (
        [("value.expand(vals_shape).contiguous()", math.prod(vals_shape) * value_size)]
        if copy_v else []) + [(what, _ite(run, K * 8, 0)) for what in _SORTED] + [
        ("CUB radix-sort temp storage", _ite(run, radix_sort_temp_bytes(K, 8, passes, cap), 0))]}
    if masks or not (len(longs) + (3 if len(dims) > 1 else 2) <= 4 and _known(K > 0)):
        phases["makeLinearIndex"] = list(masks) + longs + [  # else <= 4*K*8 < the sort's
            ("linearIndex, remainder(), * stride", (3 if len(dims) > 1 else 2) * K * 8)]
    return _clean(ws + _peak(phases))


_SORTED = ("sorted_indices", "orig_indices", "range")


def _index_put(a, cap, sms):  # TensorAdvancedIndexing.cpp _index_put_impl_, its CUDA branch
    v, masked = a["values"], _masked(a["indices"])
    sort = a["accumulate"] or (_deterministic() and not _known(v.numel() <= 1))
    if not (sort or masked):
        return []
    if masked and _fills(a):
        return []
    meta, made = _expand_masks(a["indices"]) if masked else (
        [None if t is None else (t.shape, t.dtype, t.numel()) for t in a["indices"]], [])
    if not sort:  # make_info's expanded indices, alive while index_put_stub runs
        return _clean(made)
    return _sort_kernel(a["self"], meta, list(v.shape), _contiguous(v), v.element_size(), cap,
                        masks=made)


def _fills(a) -> bool:
    """TensorAdvancedIndexingUtils.h ``canDispatchToMaskedFill``: without accumulate, one
    mask and a one-element value on the CPU, which is what ``x[mask] = 0.0`` makes of the
    number on CUDA (python_variable_indexing.cpp THPVariable_setitem): ``masked_fill_``, no
    ``nonzero()``. A 0-dim value stands for that number here."""
    return (not a["accumulate"] and a["values"].dim() == 0
            and sum(t is not None for t in a["indices"]) == 1)


def _index(a, cap, sms):  # TensorAdvancedIndexing.cpp index (meta: make_info), x[mask]
    return _clean(_expand_masks(a["indices"])[1]) if _masked(a["indices"]) else []


def _index_add(a, cap, sms, fresh=False):
    """Indexing.cu ``index_add_cuda_impl``, deterministic mode only: index.to(kLong), source *
    alpha (a copy, alpha == 1 too), then ``result.index_put_(indices, .., true)``; ``fresh``:
    result is the out-of-place op's new, contiguous output."""
    if not _deterministic():
        return []
    result = a["out"] if a.get("out") is not None else a["self"]
    index, src = a["index"], a["source"]
    ws = [("source * alpha", src.numel() * src.element_size())]
    if index.dtype != torch.int64:
        ws.append(("index.to(kLong)", index.numel() * 8))
    meta = [None] * (a["dim"] % max(result.dim(), 1)) + [(index.shape, torch.int64,
                                                         index.numel())]
    return ws + _sort_kernel(result, meta, list(src.shape), True, src.element_size(), cap,
                             fresh=fresh)


# --- 5. im2col / col2im (F.unfold / F.fold; cuda/Im2Col.cu, cuda/Col2Im.cu) -------------------

def _blocks(sizes, a):
    """The number of sliding blocks: the product over (H, W) of
    (size + 2 pad - dilation (kernel - 1) - 1) // stride + 1."""
    return math.prod((n + 2 * p - d * (k - 1) - 1) // st + 1 for n, k, d, p, st in zip(
        sizes, a["kernel_size"], a["dilation"], a["padding"], a["stride"]))


def _im2col(a, cap, sms, col2im=False):
    """``im2col_cuda`` / ``col2im_cuda``: ``output = empty_like(input)``, then the template's
    ``input_.contiguous()`` and ``output.resize_(...)``; an output larger than the input gets a
    new block, into which Resize.cpp ``resize_bytes_cuda`` copies the old one before freeing
    it. Alive with the output then: that first block (the input's bytes), and the copy of a
    non-contiguous input. (A smaller output keeps the first block: the output's storage, see
    fxmem.trace.kernels.rules.STORAGE_AT_LEAST_INPUT_OPS.)"""
    x = a["self"]
    n_in, k = x.numel(), math.prod(a["kernel_size"])
    if col2im:  # (N, C k_h k_w, L) -> (N, C, H, W)
        n_out = n_in // (k * x.size(-1)) * math.prod(a["output_size"])
    else:  # (N, C, H, W) -> (N, C k_h k_w, L)
        n_out = n_in // (x.size(-1) * x.size(-2)) * k * _blocks(x.shape[-2:], a)
    e = x.element_size()
    ws = [("empty_like(input), replaced by resize_'s larger block",
           _ite(n_out > n_in, n_in * e, 0))]
    ws += [] if _contiguous(x) else [("input.contiguous()", n_in * e)]
    return _clean(ws)


# --- 6. softmax, log_softmax (cuda/SoftMax.cu) -----------------------------------------------

def _product_contiguous(grad, out) -> bool:
    """Is ``grad * output`` contiguous? So when grad_output is (TensorIterator's dims are
    ordered by its strides first); else as compute_elementwise_output_strides lays it out,
    asked without guards (a layout decided at the size hints, e.g. a symbolic B taken > 1)."""
    if _contiguous(grad):
        return True
    syms = [x for t in (grad, out) for x in (*t.shape, *t.stride())
            if isinstance(x, torch.SymInt)]
    quiet = syms[0].node.shape_env.suppress_guards() if syms else contextlib.nullcontext()
    with quiet:
        return _contiguous(grad.shape, compute_elementwise_output_strides(grad, out))


def _softmax_backward(a, cap, sms, log=False):
    """``softmax_backward_cuda_out``: ``Tensor tmp = grad * output``, a TensorIterator
    product (its dtype the two's result type, float32 in the half_to_float backward; laid out
    as TensorIterator lays out a product, which torch._prims_common's
    ``compute_elementwise_output_strides`` follows), alive until the op returns; then
    ``host_softmax_backward``'s ``grad.contiguous()`` of it and ``output.contiguous()``: copies
    of what is not contiguous. ``log_softmax_backward_cuda_out`` has no product: copies of
    grad_output and output when not contiguous. The CPU kernel (SoftMax.cpp
    ``softmax_backward_cpu_out``) computes without the product."""
    grad, out = a["grad_output"], a["output"]
    if log:
        return _clean(_made_contiguous(a, ("grad_output", "output")))
    size = torch.promote_types(grad.dtype, out.dtype).itemsize
    tmp = [("tmp = grad_output * output", grad.numel() * size)]
    if not _product_contiguous(grad, out):
        tmp.append(("tmp.contiguous()", grad.numel() * size))
    return _clean(tmp + _made_contiguous(a, ("output",)))


# --- 7. split_with_sizes_copy.out (cuda/TensorShape.cu; FSDP2's all-gather copy-out) --------

def _split_with_sizes_copy(a, cap, sms):
    """``split_with_sizes_copy_out_cuda``: when the input and every output are dense and of one
    dtype, the fast path packs five int64 vectors into one tensor moved to the device
    (``detail::pack_vecs``), alive while its kernel is launched: the outputs' and the splits'
    addresses and the splits' chunk bytes (one each per split), the split of each block and
    the blocks' cumulative sums (one per split, and one). A split of ``c`` chunk bytes takes
    ``ceil(c / (128 * 16 * iters_per_chunk))`` blocks; ``iters_per_chunk`` grows past one
    only when the first pass's blocks times the chunks exceed twice the SMs' threads over 128.
    FSDP2's ``fsdp.split_with_sizes_copy`` calls it on the all-gather output (seen on 2.14.1's
    and 2.15's binaries on the fake GPU: 88 and 112 bytes for two parameters' shards,
    ``tests/test_fake_gpu_parallel.py``). Sizes that depend on B: not sized (none here)."""
    x = a.get("self", a.get("all_gather_output"))
    sizes = a.get("split_sizes", a.get("all_gather_input_split_sizes"))
    outs = a.get("out") or ()
    if x is None or sizes is None or x.dim() == 0:
        return []
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    dims = [*x.shape, *x.stride(), *sizes, *(d for o in outs for d in (*o.shape, *o.stride()))]
    if not all(is_concrete_int(d) for d in dims):
        return []
    if not _contiguous(x) or any(not _contiguous(o) or o.dtype != x.dtype for o in outs):
        return []  # (dense but permuted operands also take the fast path: not sized)
    dim = int(a.get("dim", 0)) % x.dim()
    chunk = [int(n) * int(x.stride(dim)) * x.element_size() for n in sizes]
    num_chunks = x.numel() // max(1, math.prod(int(n) for n in x.shape[dim:]))
    per_block = 128 * 16  # BLOCK_SIZE threads, BYTES_PER_THREAD each
    first = sum(_cdiv(c, per_block) for c in chunk)
    threads_per_sm = 2048 if tuple(cap)[:1] in ((8,), (9,), (10,)) and tuple(cap) not in (
        (8, 6), (8, 7), (8, 9)) else 1536
    max_blocks = int(sms * threads_per_sm / 128 * 2.0)
    iter_factor = _cdiv(first * num_chunks, max_blocks)
    per_block_chunks = min(math.ceil(math.sqrt(iter_factor)), num_chunks) or 1
    iters = _cdiv(iter_factor, per_block_chunks)
    blocks = sum(_cdiv(c, per_block * iters) for c in chunk)
    return [("pack_vecs: addresses, chunk sizes, block map", (4 * len(chunk) + 1 + blocks) * 8)]


# --- 8. _chunk_cat.out (cuda/TensorShape.cu; FSDP2's reduce-scatter copy-in) ----------------

def _chunk_cat(a, cap, sms):
    """``_chunk_cat_out_cuda``: when every input is dense and of the output's dtype (or
    bfloat16 into float32), ``get_chunk_cat_metadata`` packs seven int64 vectors into one
    tensor moved to the device (``detail::pack_vecs``): per input its address, bytes, padded
    chunk bytes and blocks; its first block and first byte (one per input, and one); and
    the input of each block. An input of ``d`` rows (along ``dim``, padded to a multiple of
    ``num_chunks``) of ``t`` elements each has chunks of ``ceil(d / num_chunks) * t`` output
    elements, and takes ``ceil(chunk bytes / 2048)`` blocks. The packed tensor is gone when
    the metadata function returns, before the kernel is launched. FSDP2's
    ``fsdp.chunk_cat`` calls it on each block's gradients (seen on 2.14.1's binary on the
    fake GPU: 4,320 bytes for a block's four parameters over two ranks, 144 for the head's
    two, ``tests/test_fake_gpu_parallel.py``). Sizes that depend on B: not sized (none
    here)."""
    tensors, out = a.get("tensors") or (), a.get("out")
    if not tensors or out is None or tensors[0].dim() == 0:
        return []
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    if not all(is_concrete_int(d) for t in tensors for d in (*t.shape, *t.stride())):
        return []
    src = tensors[0].dtype
    if not all(_contiguous(t) for t in tensors) or not (
            out.dtype == src or (src, out.dtype) == (torch.bfloat16, torch.float32)):
        return []
    dim, chunks = int(a.get("dim", 0)) % tensors[0].dim(), int(a["num_chunks"])
    blocks = 0
    for t in tensors:
        rows = _cdiv(int(t.shape[dim]), chunks)
        blocks += _cdiv(rows * math.prod(int(n) for n in t.shape[dim + 1:])
                        * out.element_size(), 128 * 16)  # TILE_SIZE bytes a block
    return [("pack_vecs: addresses, sizes, block map", (6 * len(tensors) + 2 + blocks) * 8)]


# --- the table -----------------------------------------------------------------------------------

_RULES = {
    aten.embedding_dense_backward.default: _embedding_dense_backward,
    aten._embedding_bag_dense_backward.default: _embedding_bag_dense_backward,
    aten._embedding_bag_backward.default: _embedding_bag_backward,
    aten._index_put_impl_.default: _index_put,
    aten.index_put.default: _index_put,  # what IndexBackward calls on (fake) tensor subclasses
    aten.index_put_.default: _index_put,
    aten.index.Tensor: _index,
    aten.index_add_.default: _index_add,
    aten.index_add.default: lambda a, c, s: _index_add(a, c, s, fresh=True),
    aten.index_add.out: _index_add,
    aten.native_group_norm.default: _group_norm,
    aten.native_group_norm_backward.default: _group_norm_backward,
    aten.native_batch_norm_backward.default: _batch_norm_backward,
    aten.native_layer_norm.default: _layer_norm,
    aten.native_layer_norm_backward.default: lambda a, c, s: _norm_backward(a, c, s, False),
    aten._fused_rms_norm_backward.default: lambda a, c, s: _norm_backward(a, c, s, True),
    aten.im2col.default: _im2col,  # F.unfold, and F.fold's backward
    aten.col2im.default: lambda a, c, s: _im2col(a, c, s, col2im=True),  # F.fold, unfold's bwd
    # host_softmax: input.contiguous()
    aten._softmax.default: lambda a, c, s: _clean(_made_contiguous(a, ("self",))),
    aten._log_softmax.default: lambda a, c, s: _clean(_made_contiguous(a, ("self",))),
    aten._softmax_backward_data.default: _softmax_backward,
    aten._log_softmax_backward_data.default: lambda a, c, s: _softmax_backward(a, c, s, True),
    aten.split_with_sizes_copy.out: _split_with_sizes_copy,
    aten._chunk_cat.out: _chunk_cat,
}
# ops of libraries registered on import, by name (FSDP2's custom ops)
_NAMED_RULES = {"fsdp.split_with_sizes_copy.default": _split_with_sizes_copy,
                "fsdp.chunk_cat.default": _chunk_cat}

OPS: frozenset = frozenset(_RULES)


def _sms(capability, num_sms):
    """The SM count, and whether it was guessed (an unlisted capability: an H100's)."""
    sms = num_sms or _DEFAULT_SMS.get(tuple(capability))
    return (sms, False) if sms else (_DEFAULT_SMS[(9, 0)], True)


_NAMED: dict = {}  # op -> its rule in _NAMED_RULES, or None: read by name once


def workspace_bytes(func, args, kwargs, out, *, capability=(9, 0), num_sms=None) -> list:
    """``[(what, nbytes)]``: the temporaries the CUDA kernel of ``func`` has alive together at
    its peak (their sum is its peak extra bytes); ``[]`` for ops not in :data:`OPS`.
    ``num_sms`` defaults to the usual part of ``capability`` (A100, H100, B200)."""
    rule = _RULES.get(func)
    if rule is None:
        rule = _NAMED.get(func, False)
        if rule is False:  # (an op's name made once: str() of an op costs per call)
            rule = _NAMED[func] = _NAMED_RULES.get(str(func))
        if rule is None:
            return []
    return rule(_by_name(func, args, kwargs), tuple(capability), _sms(capability, num_sms)[0])


def unmodelled(func, args, kwargs, out, *, capability=(9, 0), num_sms=None) -> str | None:
    """What the CUDA kernel of ``func`` allocates that :func:`workspace_bytes` does not size
    (one line), or None."""
    if func is torch.ops.aten._grouped_mm.default:
        return _grouped_mm_unmodelled(args, kwargs, capability)
    if func not in _RULES:
        return None
    a, (sms, guessed) = _by_name(func, args, kwargs), _sms(capability, num_sms)
    note = f"; SM count of sm{capability[0]}{capability[1]} assumed {sms}" if guessed else ""
    bags = (aten._embedding_bag_dense_backward.default, aten._embedding_bag_backward.default)
    if func in bags:
        if (a["mode"] == 2 or a.get("sparse")
                or _decide(a["indices"].numel() > 0) is False):
            return None
    if func in (aten.embedding_dense_backward.default, *bags):
        n, scale = a["indices"].numel(), a["scale_grad_by_freq"]
        bag = func in bags
        if not (scale or bag) and _decide(n > 3072) is False:
            return None
        scans = "unique_by_key, exclusive_sum" + (
            ", inclusive_sum_by_key, inclusive_scan_by_key" if scale else "")
        return (f"CUB look-back scan storage of {scans} over the "
                f"{n if isinstance(n, int) else 'n'} indices (per-architecture tuning; "
                f"1.0-1.3 KB + up to 0.05 B per index, each){note}")
    if func in (aten._index_put_impl_.default, aten.index_put.default, aten.index_put_.default,
                aten.index.Tensor):
        if not _masked(a["indices"]) or func is not aten.index.Tensor and _fills(a):
            return None
        return ("CUB's reduce and select storage of nonzero() over a boolean mask (a few "
                "bytes per tile of its elements)")
    if func in (aten.native_layer_norm_backward.default, aten._fused_rms_norm_backward.default):
        if _decide(_large_m(a, sms, func is aten._fused_rms_norm_backward.default)[2]) is False:
            return None
        return ("Reduce.cuh global-reduce staging of dgamma_blocks.sum(0) for M > 65536 "
                f"(depends on the launch configuration; small){note}")
    return None


def _grouped_mm_unmodelled(args, kwargs, capability) -> str | None:
    """aten/src/ATen/native/cuda/GroupedBlas.cpp ``_grouped_mm_cuda``: bfloat16 inputs and
    output on sm90 or sm100 take CUTLASS's grouped GEMM (cuda/GroupMM.cu
    ``bf16bf16_grouped_gemm_impl_sm90_sm100``), which allocates an argument buffer and
    CUTLASS's workspace for the op; any other call loops over the groups with ``mm_out``
    into the output (GroupedMMUtils.h ``_grouped_mm_fallback``), allocating nothing more on
    the device (the offsets are copied to the host)."""
    a = _by_name(torch.ops.aten._grouped_mm.default, args, kwargs)
    out_dtype = a.get("out_dtype") or torch.bfloat16
    if not (a["self"].dtype == a["mat2"].dtype == out_dtype == torch.bfloat16
            and capability[0] in (9, 10)):
        return None
    return ("CUTLASS grouped GEMM (bfloat16 on sm90/sm100): an argument buffer of 60 B "
            "a group and CUTLASS's workspace, while the op runs (sized inside CUTLASS)")
