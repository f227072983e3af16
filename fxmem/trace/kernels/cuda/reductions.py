"""Not in the formula: the trace does not record these temporaries as storages (the
staging's size is a piecewise function of B whose branches sympy leaves unsimplified, which
made every CUDA report's peak formula unreadable); the allocator replay applies them at its
concrete B (:mod:`fxmem.trace.kernels.cuda.reduce_replay`). Checked against the binaries (below).

The global-memory staging that ATen's CUDA reductions allocate (``gpu_reduce_kernel``).

When ``setReduceConfig`` (aten/src/ATen/native/cuda/Reduce.cuh) splits one output's reduction
across thread blocks (``config.should_global_reduce()``), ``gpu_reduce_kernel`` takes from the
caching allocator a staging buffer of ``config.global_memory_size()`` bytes and a semaphore
array of ``config.semaphore_size()`` bytes, and frees both when the launch returns. That
happens when each output has many inputs and the outputs are few: bias gradients (a sum over
B*L rows), loss means, norms, statistics. :data:`RULES` maps the reduction ops a step meets to
rules of the form ``rule(a, capability, num_sms) -> [(what, nbytes)]`` (``a``: the op's
arguments by name), the temporaries alive together at the op's peak, which
:mod:`fxmem.trace.kernels.cuda.workspaces` serves.

The port follows, in the order the CUDA build runs them:

- the op's host code (ReduceOps.cpp, TensorCompare.cpp, LinearAlgebra.cpp): the dtype the
  kernel reads (``make_reduction``: a float16/bfloat16 input with a float32 result is read as
  it is; any other dtype mismatch makes ``self.to(in_dtype)``, a temporary copy), argmax's
  ``reshape(-1)`` over all dims, the shortcuts that launch nothing;
- TensorIterator's reduce layout: the output made contiguous then viewed with stride 0 on the
  reduced dims (``review_reduce_result``), ``reorder_dimensions`` (reduced dims first, then by
  strides, output strides first) and ``coalesce_dimensions``;
- ``setReduceConfig<arg_t, scalar_t, vt0, input_vec_size>``: vectorisation along the input
  (reducing the fastest-moving dim, >= 128 of it, one reduced dim) or along the output
  (``get_output_vec_size``), ``set_block_dimension`` (512 threads, a warp of 32), the split
  across warps and across blocks (``ctas_per_output``: clamp of ceil(SMs * blocks per SM /
  grid.x) between ceil(vpt/256) and ceil(vpt/16), with ``maxThreadsPerMultiProcessor`` 2048).

The kernels' template arguments (``sizeof(arg_t)``, ``vt0``, ``input_vec_size``) were read off
the 2.14.1 and 2.15 cu130/cu132 ``libtorch_cuda.so`` symbol tables (``reduce_kernel<...,
ReduceOp<scalar_t, ops_t, unsigned, out_t, vt0, input_vec_size>>``): sum and mean of
float16/bfloat16 read 8 values a vector (others 4), Welford (var, std) vt0 = input_vec_size =
2, max.dim/min.dim/argmax/argmin accumulate (value, int64 index) pairs (16 bytes), amax/amin
in the input's dtype, any/all in bool, sums and norms in float32 for 16-bit inputs. The host
code of Reduce.cuh is the same in both releases (the installed headers differ only in ROCm
code and the jiterator's lock).

Checked on the fake GPU (tests/test_fake_gpu_reductions.py): 3214 cases, every one exact on
2.14.1 and on 2.15 (prod not run there: the fake GPU's child crashes in it).

Sizes may be SymInts: value-dependent branches of the config become ``torch.sym_ite`` (through
:func:`fxmem.trace.kernels.cuda.workspaces._ite`), never a guard. The iterator's dim order (a choice
by strides) is taken at the size hints when the ShapeEnv cannot decide it, with guards suppressed.
An input of 2**31 bytes or more is split into 32-bit-indexable sub-iterators
(``with_32bit_indexing``); that split is followed for concrete sizes only: an iterator whose
32-bit indexability depends on the symbols is taken to be indexable (the formula holds while
the reduced input stays under 2 GiB).

>>> import torch
>>> aten = torch.ops.aten
>>> g = torch.empty(4096, 96)          # a Linear's bias gradient: the sum over dim 0
>>> workspace_bytes(aten.sum.dim_IntList, (g, [0]), {})
[('Reduce.cuh global reduce staging (cta_buf)', 786432), ('Reduce.cuh semaphores', 8)]
>>> workspace_bytes(aten.sum.dim_IntList, (g[:64], [0]), {})   # 64 rows: one block each
[]
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true as _known

aten = torch.ops.aten
_LOWP = (torch.float16, torch.bfloat16)
_INT32_MAX = 2**31 - 1
MAX_THREADS_PER_SM = 2048  # cudaDeviceProp.maxThreadsPerMultiProcessor: sm80, sm90, sm100
_SEMAPHORES, _STAGING = "Reduce.cuh semaphores", "Reduce.cuh global reduce staging (cta_buf)"

from .reduce_config import _can_use_32bit, _config_bytes, _iterator, _split_32bit  # noqa: F401

# --- the ops ------------------------------------------------------------------------------

class _Kernel:
    """One gpu_reduce_kernel launch: ``arg`` = sizeof(arg_t), the kernel's input dtype,
    ``vt0``/``ivs`` its template arguments, ``outs`` the outputs' dtypes, ``can_acc``:
    ReduceOp's can_accumulate_in_output (else an AccumulationBuffer for split launches)."""

    def __init__(self, arg, in_dtype, outs, vt0=4, ivs=4, can_acc=True):
        self.arg, self.in_dtype, self.outs = arg, in_dtype, outs
        self.vt0, self.ivs, self.can_acc = vt0, ivs, can_acc


def _acc(dtype):  # at::opmath / acc_type on CUDA
    return 4 if dtype in _LOWP else dtype.itemsize


def _reduced(x, dim):
    n = x.dim()
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return set(range(n))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return {d % n if n else 0 for d in dims}


def reduce_bytes(x, dim, kernel: _Kernel, sms: int, x_strides=None, x_offset=None) -> list:
    """``[(what, nbytes)]`` that gpu_reduce_kernel allocates reducing ``x`` (a tensor, or its
    (shape, strides) given) over ``dim`` (None: all) with ``kernel``: the staging buffer and
    semaphores when it reduces across blocks (plus, for an input past 32-bit indexing, the
    AccumulationBuffer)."""
    shape = list(x.shape)
    strides = list(x.stride()) if x_strides is None else list(x_strides)
    offset = x.storage_offset() if x_offset is None else x_offset
    if _known(math.prod(shape) == 0):
        return []
    red = _reduced(x, dim)
    in_size = kernel.in_dtype.itemsize
    it = _iterator(shape, strides, offset, red, [d.itemsize for d in kernel.outs], in_size)
    use32 = _can_use_32bit(it)
    if use32 is not False:
        g, s = _config_bytes(it, kernel.arg, in_size, kernel.vt0, kernel.ivs, sms)
        return [(w, n) for w, n in ((_STAGING, g), (_SEMAPHORES, s)) if not _known(n == 0)]
    ws = []
    if not kernel.can_acc:
        out0 = kernel.outs[0].itemsize
        size = max([out0] + [n * s for n, s in zip(it.shape, it.strides[0])]) // out0
        ws.append(("Reduce.cuh AccumulationBuffer (input past 32-bit indexing)",
                   size * kernel.arg))
    best = (0, 0)
    for sub in _split_32bit(it):
        g, s = _config_bytes(sub, kernel.arg, in_size, kernel.vt0, kernel.ivs, sms)
        if g + s > sum(best):
            best = (g, s)
    return ws + [(w, n) for w, n in ((_STAGING, best[0]), (_SEMAPHORES, best[1])) if n]


def _cast(x, in_dtype) -> list:
    """make_reduction's ``self.to(in_dtype)`` when the kernel reads another dtype."""
    if x.dtype == in_dtype:
        return []
    return [(f"self.to({str(in_dtype).replace('torch.', '')}) (make_reduction)",
             x.numel() * in_dtype.itemsize)]


def _cast_strides(x):
    """The copy's strides: ``to`` keeps a dense layout (preserve_format), else contiguous."""
    if _dense(x):
        return list(x.stride()), 0
    return _contig_strides(x.shape), 0


def _contig_strides(shape):
    out, acc = [], 1
    for n in reversed(list(shape)):
        out.append(acc)
        acc = acc * n
    return list(reversed(out))


def _dense(x) -> bool:
    """Non-overlapping and dense, for all values of the symbols (else False)."""
    dims = sorted((i for i in range(x.dim()) if not _known(x.shape[i] == 1)),
                  key=lambda i: (x.stride()[i] if isinstance(x.stride()[i], int)
                                 else x.stride()[i].node.hint))
    expected = 1
    for i in dims:
        if not _known(x.stride()[i] == expected):
            return False
        expected = expected * x.shape[i]
    return True


def _with_cast(x, dim, k, sms, extra=None):
    cast = _cast(x, k.in_dtype)
    if cast:
        strides, off = _cast_strides(x)
        return cast + reduce_bytes(x, dim, k, sms, strides, off)
    return reduce_bytes(x, dim, k, sms)


def _int_like(dt):
    return not (dt.is_floating_point or dt.is_complex)


def _sum(a, cap, sms, mean=False, prod=False):
    x, dt = a["self"], a.get("dtype")
    if x.is_complex():
        return []
    out = dt or (torch.int64 if _int_like(x.dtype) and not mean else x.dtype)
    lowp_f32 = x.dtype in _LOWP and out == torch.float32
    k_in = x.dtype if lowp_f32 else out
    ivs = 8 if (k_in in _LOWP and not prod) else 4
    k = _Kernel(_acc(k_in), k_in, [out], 4, ivs, can_acc=not (k_in == out and k_in in _LOWP))
    return _with_cast(x, a.get("dim"), k, sms)


def _minmax_values(a, cap, sms, all_=False):
    """amax, amin (MaxNanFunctor<scalar_t>: arg_t the input's dtype); max(), min()
    (``max_all``/``min_all``) reduce ``self.contiguous()`` (a copy when it is not contiguous:
    seen for channels-last inputs on the 2.14.1 and 2.15 binaries)."""
    x = a["self"]
    k = _Kernel(x.dtype.itemsize, x.dtype, [x.dtype], can_acc=x.dtype not in _LOWP)
    if all_:
        from .sizing import _contiguous
        if not _contiguous(x):
            return ([("self.contiguous() (max_all / min_all)", x.numel() * x.element_size())]
                    + reduce_bytes(_Shape(list(x.shape), _contig_strides(x.shape), 0), None,
                                   k, sms))
    return reduce_bytes(x, a.get("dim"), k, sms)


def _minmax_dim(a, cap, sms):  # max.dim, min.dim: MaxOps (value, int64 index) pairs
    x, d = a["self"], a["dim"]
    if _known(x.numel() == 1) and x.dim() == 0:
        return []
    k = _Kernel(16, x.dtype, [x.dtype, torch.int64], can_acc=False)
    return reduce_bytes(x, d, k, sms)


def _arg(a, cap, sms):  # argmax, argmin (TensorCompare.cpp argmax_argmin_impl)
    x, d = a["self"], a["dim"]
    k = _Kernel(16, x.dtype, [torch.int64], can_acc=False)
    if d is not None:
        if x.dim() and _known(x.shape[d % x.dim()] == 1):
            return []
        return reduce_bytes(x, d, k, sms)
    n = x.numel()
    view = _flat_view(x)
    if view is None:  # reshape(-1) copies: a contiguous one
        return ([("self.reshape(-1) (a copy)", n * x.element_size())]
                + reduce_bytes(_Shape([n], [1], 0), None, k, sms))
    return reduce_bytes(_Shape([n], [view[0]], view[1]), None, k, sms)


class _Shape:
    def __init__(self, shape, stride, offset):
        self.shape, self._stride, self._offset = shape, stride, offset

    def stride(self):
        return self._stride

    def storage_offset(self):
        return self._offset

    def dim(self):
        return len(self.shape)


def _flat_view(x):
    """(stride, offset) of ``x.view(-1)`` when it is a view (computeStride), else None."""
    dims = [i for i in range(x.dim()) if not _known(x.shape[i] == 1)]
    if not dims:
        return 1, x.storage_offset()
    for i, j in zip(dims, dims[1:]):
        if not _known(x.stride()[i] == x.stride()[j] * x.shape[j]):
            return None
    return x.stride()[dims[-1]], x.storage_offset()


def _var(a, cap, sms, two=False):  # std_var_kernel_cuda: WelfordOps, vt0 = 2
    x = a["self"]
    if x.is_complex():
        return []
    arg = 32 if x.dtype == torch.float64 else 16  # WelfordData<acc, int32>
    k = _Kernel(arg, x.dtype, [x.dtype] * (2 if two else 1), 2, 2, can_acc=False)
    return reduce_bytes(x, a.get("dim"), k, sms)


def _norm(a, cap, sms, ord_key="ord"):
    x = a["self"]
    if x.is_complex():
        return []
    dim, p = a.get("dim"), a.get(ord_key, 2)
    p = 2 if p is None else p
    red = _reduced(x, dim)
    if all(_known(x.shape[d] == 1) for d in red) and x.dim() > 0:
        return []  # is_reduce_over_1D_vector: abs / ne, no reduction
    out = a.get("dtype") or x.dtype
    k_in = x.dtype if (x.dtype in _LOWP and out == torch.float32) else out
    k = _Kernel(_acc(k_in), k_in, [out], can_acc=not (k_in == out and k_in in _LOWP))
    return _with_cast(x, dim, k, sms)


def _allany(a, cap, sms):  # and/or_kernel_cuda: func_wrapper<bool>, arg_t bool; no cast
    x = a["self"]
    if _known(x.numel() == 1):
        return []  # result.fill_(self.item())
    dim = a.get("dim")
    return reduce_bytes(x, dim, _Kernel(1, x.dtype, [torch.bool]), sms)


def _logsumexp(a, cap, sms):
    """ReduceOps.cpp ``logsumexp_out_impl``: ``maxes = at::amax(self, dims, true)`` (alive to
    the end), ``maxes_squeezed.masked_fill_(maxes_squeezed.abs() == INFINITY, 0)`` (the abs
    and the comparison alive together), ``at::sum_out(result, (self - maxes).exp_(), dims,
    keepdim)`` (the difference, exponentiated in place, alive during the sum), then
    ``log_``/``add_`` in place (seen on the 2.14.1 and 2.15 binaries: one input-sized
    temporary). An integral input is first ``to`` the default dtype."""
    from .sizing import _peak

    x, dims = a["self"], a["dim"]
    if _known(x.numel() == 0):
        return []
    red = _reduced(x, dims)
    m = math.prod([n for i, n in enumerate(x.shape) if i not in red])
    es = x.element_size()
    maxes = ("maxes = amax(self, dims, keepdim=True)", m * es)
    amax = _minmax_values({"self": x, "dim": sorted(red)}, cap, sms)
    diff = _diff_layout(x, red)
    exp_k = _Kernel(_acc(x.dtype), x.dtype, [x.dtype], 4, 8 if x.dtype in _LOWP else 4,
                    can_acc=x.dtype not in _LOWP)
    s = reduce_bytes(_Shape(list(x.shape), diff, 0), sorted(red), exp_k, sms)
    phases = {"amax": amax,
              "masked_fill": [("maxes.abs()", m * es), ("maxes.abs() == INFINITY", m)],
              "sum": [("(self - maxes).exp_()", x.numel() * es)] + s}
    return [maxes] + _peak(phases)


def _diff_layout(x, red):
    """Strides of ``self - maxes``: TensorIterator lays a binary op out as its first input
    when that is dense (maxes' broadcast dims have stride 0 and no say), else contiguous."""
    return list(x.stride()) if _dense(x) else _contig_strides(x.shape)


def _loss_mean(a, cap, sms, temp=False):
    """mse_loss / smooth_l1_loss / huber_loss (Loss.cpp): the unreduced loss of a
    TensorIterator binary op (a temporary), then ``at::mean_out`` / ``at::sum_out`` over all
    of it. ``temp``: name that temporary here; for mse_loss and smooth_l1_loss the recorder
    already gives the op's output the unreduced loss's storage
    (fxmem.trace.kernels.rules.UNREDUCED_STORAGE_LOSSES, which follows the CPU kernels: on CUDA the
    output is one element and the unreduced loss is freed when the op returns)."""
    x, t, red = a["self"], a["target"], a.get("reduction", 1)
    if red == 0:
        return []
    from torch._prims_common import compute_elementwise_output_strides

    syms = [v for v in (*x.shape, *x.stride()) if isinstance(v, torch.SymInt)]
    quiet = syms[0].node.shape_env.suppress_guards() if syms else contextlib.nullcontext()
    with quiet:
        shape = torch.broadcast_shapes(x.shape, t.shape)
        xs = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        ts = torch.empty_strided(t.shape, t.stride(), dtype=x.dtype, device="meta")
        strides = list(compute_elementwise_output_strides(xs.expand(shape), ts.expand(shape)))
    k = _Kernel(_acc(x.dtype), x.dtype, [x.dtype], 4, 8 if x.dtype in _LOWP else 4,
                can_acc=x.dtype not in _LOWP)
    if red == 2:  # sum
        k.ivs = 8 if x.dtype in _LOWP else 4
    ws = reduce_bytes(_Shape(list(shape), strides, 0), None, k, sms)
    if temp:
        ws = [("unreduced loss", math.prod(shape) * x.element_size())] + ws
    return ws


RULES = {
    aten.sum.default: _sum,
    aten.sum.dim_IntList: _sum,
    aten.mean.default: lambda a, c, s: _sum(a, c, s, mean=True),
    aten.mean.dim: lambda a, c, s: _sum(a, c, s, mean=True),
    # prod: not checked on the fake GPU (its child crashes in prod on 2.14.1); same config code
    aten.prod.default: lambda a, c, s: _sum(a, c, s, prod=True),
    aten.prod.dim_int: lambda a, c, s: _sum(a, c, s, prod=True),
    aten.amax.default: _minmax_values,
    aten.amin.default: _minmax_values,
    aten.max.default: lambda a, c, s: _minmax_values(a, c, s, all_=True),
    aten.min.default: lambda a, c, s: _minmax_values(a, c, s, all_=True),
    aten.max.dim: _minmax_dim,
    aten.min.dim: _minmax_dim,
    aten.argmax.default: _arg,
    aten.argmin.default: _arg,
    aten.var.correction: _var,
    aten.std.correction: _var,
    aten.var_mean.correction: lambda a, c, s: _var(a, c, s, two=True),
    aten.std_mean.correction: lambda a, c, s: _var(a, c, s, two=True),
    aten.linalg_vector_norm.default: _norm,
    aten.norm.ScalarOpt_dim: lambda a, c, s: _norm(a, c, s, "p"),
    aten.norm.Scalar: lambda a, c, s: _norm(a, c, s, "p"),
    aten.any.default: _allany,
    aten.any.dim: _allany,
    aten.any.dims: _allany,
    aten.all.default: _allany,
    aten.all.dim: _allany,
    aten.all.dims: _allany,
    aten.logsumexp.default: _logsumexp,
    aten.mse_loss.default: _loss_mean,
    aten.smooth_l1_loss.default: _loss_mean,
    aten.huber_loss.default: lambda a, c, s: _loss_mean(a, c, s, temp=True),
}


def workspace_bytes(func, args, kwargs=None, out=None, *, capability=(9, 0), num_sms=None):
    """``[(what, nbytes)]`` of :data:`RULES`' op ``func`` on a GPU of ``capability``."""
    from .sdpa_memory import _by_name
    from .workspaces import _sms

    rule = RULES.get(func)
    if rule is None:
        return []
    return rule(_by_name(func, args, kwargs), tuple(capability), _sms(capability, num_sms)[0])
