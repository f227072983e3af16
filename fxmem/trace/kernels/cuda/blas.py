"""Which BLAS library a CUDA matmul runs through, and the workspace it takes.

Up to torch 2.14, each cuBLAS handle (one per thread and stream) gets its workspace at its
first matmul and keeps it; cuBLASLt shares it (``TORCH_CUBLASLT_UNIFIED_WORKSPACE``): 32 MiB
per thread on compute capability 9.x, 10.x and 12.x
(:func:`fxmem.device.allocator.cublas_workspace_bytes`), allocated once and never freed.

From 2.15 (:data:`PER_CALL`) every call allocates its workspace through the caching allocator,
after its output, and frees it when it returns: a cuBLAS call the same size as before
(``CUBLAS_WORKSPACE_CONFIG`` still sets it), a cuBLASLt call ``CUBLASLT_WORKSPACE_SIZE`` KiB
(default 1,024; :func:`lt_workspace_bytes`); ``TORCH_CUBLASLT_UNIFIED_WORKSPACE`` no longer
changes either. So on 2.15 which library an op calls matters: :func:`library` says, for the
ops in :data:`OPS`, following what the 2.15.0+cu132 binary chose on the fake GPU
(:mod:`fxmem.validate.fakegpu`; the workspace each call took, 32 MiB or 1 MiB, tells them
apart). PyTorch 2.15's C++ sources were not at hand to read: this is the binary's behaviour on
the grid of ``tests/fakegpu_blas_targets.py``, which ``tests/test_fake_gpu_blas.py`` re-checks
on every run on the CUDA builds.

Seen on 2.15 (``aten/src/ATen/native/cuda/Blas.cpp``'s ``addmm_out_cuda_impl`` decides):

- ``addmm`` and ``_addmm_activation`` run cuBLASLt when ``mat2`` is at least 2 x 2, the dtype
  is float32, float16, bfloat16 or float64, and either the bias is a contiguous ``{N}`` or
  ``{1, N}`` with ``beta == 1`` (the epilogue adds it), or the bias is a contiguous ``{M, N}``
  with ``beta != 0`` in float16 or bfloat16 (or any of the four with ``_addmm_activation``);
  every other case (a broadcast or transposed bias, ``beta != 1`` with a vector bias,
  ``mat2`` with a size-1 dim, complex) runs cuBLAS. ``nn.Linear`` with a bias on a 2-D
  input, or a contiguous 3-D one, is ``addmm`` with a ``{N}`` bias: cuBLASLt.
- ``mm``, ``bmm``, ``baddbmm``, ``addbmm``, ``mv``, ``addmv``, ``dot``, ``vdot`` run cuBLAS.
- Under ``torch.backends.cuda.preferred_blas_library("cublaslt")``: every matmul-like op
  runs cuBLASLt (float64 and complex64 included), ``mv`` and ``addmv`` only in float16 and
  bfloat16, ``dot`` and ``vdot`` never.

>>> import torch
>>> x, w, b = torch.empty(64, 32), torch.empty(32, 48), torch.empty(48)
>>> aten = torch.ops.aten
>>> library(aten.addmm.default, (b, x, w), {}), library(aten.mm.default, (x, w), {})
('cublaslt', 'cublas')
>>> library(aten.addmm.default, (b, x, w), {"beta": 2})
'cublas'
>>> library(aten.relu.default, (b,), {}) is None
True
"""

from __future__ import annotations

import os

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..compat import TORCH

aten = torch.ops.aten

#: every call allocates its workspace and frees it after (2.15); before, one kept per thread
PER_CALL = TORCH >= (2, 15)

# ops that run through cuBLAS or cuBLASLt, and their out= forms (a compiled graph's library
# calls: extern_kernels.mm(a, b, out=buf), fxmem.trace.compiled.inductor)
_FUNCTIONAL = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
               aten.addbmm.default, aten.mv.default, aten.addmv.default, aten.dot.default,
               aten.vdot.default, aten._addmm_activation.default)
OPS = frozenset((*_FUNCTIONAL, *(op.overloadpacket.out for op in _FUNCTIONAL
                                 if "out" in op.overloadpacket.overloads())))
OP_NAMES = frozenset(str(op) for op in OPS)

_LT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_HALF = (torch.float16, torch.bfloat16)


def lt_workspace_bytes(env: str | None = None) -> int:
    """A cuBLASLt call's workspace on 2.15: ``CUBLASLT_WORKSPACE_SIZE`` KiB (``env``, default
    the environment's), else 1,024 KiB (seen on the fake GPU: 2048 gives 2 MiB).

    >>> lt_workspace_bytes(), lt_workspace_bytes("2048")
    (1048576, 2097152)
    """
    env = os.environ.get("CUBLASLT_WORKSPACE_SIZE") if env is None else env
    try:
        kib = int(env) if env else 1024
    except ValueError:
        kib = 1024
    return max(kib, 0) * 1024


def prefer_lt() -> bool:
    """``torch.backends.cuda.preferred_blas_library()`` is cuBLASLt (``TORCH_BLAS_PREFER_CUBLASLT``
    or the call); readable on the CPU build too."""
    try:
        return torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublaslt
    except (AttributeError, RuntimeError):
        return False


def _is(cond) -> bool:
    return bool(statically_known_true(cond))


def _addmm_lt(args, kwargs, activation: bool) -> bool:
    bias, m1, m2 = args[:3]
    beta = kwargs.get("beta", 1)
    if m2.dim() != 2 or m1.dim() != 2 or bias.dtype not in _LT_DTYPES:
        return False
    k, n = m2.shape
    if not (_is(k > 1) and _is(n > 1)) or not _is(bias.is_contiguous()):
        return False
    if bias.dim() == 1 or (bias.dim() == 2 and _is(bias.shape[0] == 1)):
        return _is(bias.shape[-1] == n) and beta == 1
    if bias.dim() == 2 and _is(bias.shape[0] == m1.shape[0]) and _is(bias.shape[1] == n):
        return beta != 0 and (bias.dtype in _HALF or activation)
    return False


def library(func, args, kwargs) -> str | None:
    """``"cublas"`` or ``"cublaslt"`` for an op of :data:`OPS` on 2.15's CUDA build (see the
    module docstring), None for any other op."""
    if func not in OPS:
        return None
    func = func.overloadpacket.default
    if prefer_lt():
        if func in (aten.dot.default, aten.vdot.default):
            return "cublas"
        if func in (aten.mv.default, aten.addmv.default):
            return "cublaslt" if args[1].dtype in _HALF else "cublas"
        return "cublaslt"
    if func in (aten.addmm.default, aten._addmm_activation.default):
        lt = _addmm_lt(args, kwargs, func is aten._addmm_activation.default)
        return "cublaslt" if lt else "cublas"
    return "cublas"
