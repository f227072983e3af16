"""Sizes of CUDA kernels' temporaries as exact expressions of the symbolic sizes: decided
without guards when the ShapeEnv can, else ``torch.sym_ite`` / exact integer arithmetic.
Shared by :mod:`fxmem.trace.kernels.cuda.workspaces`, :mod:`~fxmem.trace.kernels.cuda.norms` and
:mod:`~fxmem.trace.kernels.cuda.reductions`.

>>> _cdiv(10, 4), _r256(300), _clean([("a", 0), ("b", 8)])
(3, 512, [('b', 8)])
"""

from __future__ import annotations

import math
import operator
from functools import reduce

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true as _known

_HALF = (torch.float16, torch.bfloat16)


# --- symbolic helpers: decided without guards when the ShapeEnv can, else exact expressions -------

_cdiv = lambda a, b: (a + b - 1) // b  # ceil_div, SymInt-friendly
_r256 = lambda x: _cdiv(x, 256) * 256  # cub/util_temporary_storage.cuh AliasTemporaries slots
_masked = lambda indices: any(t is not None and t.dtype in (torch.bool, torch.uint8)
                              for t in indices)
_acc = lambda t: 4 if t.dtype in _HALF else t.element_size()  # acc type: fp32 for fp16/bf16


def _decide(c):
    if isinstance(c, torch.SymBool):
        return True if _known(c) else False if _known(torch.sym_not(c)) else c
    return c


def _and(*conds):
    conds = [c for c in map(_decide, conds) if c is not True]
    return False if any(c is False for c in conds) else reduce(operator.and_, conds, True)


def _ite(cond, a, b):
    cond = _decide(cond)
    if isinstance(cond, bool):
        return a if cond else b
    wrap = lambda x: x if isinstance(x, torch.SymInt) else torch.SymInt(cond.node.wrap_int(x))
    return torch.sym_ite(cond, wrap(a), wrap(b))


def _peak(phases: dict) -> list:
    """The temporaries of the phase with the largest sum; when that depends on the symbols,
    the phase largest at the size hints plus ``Max(0, the others' sum - its sum)``."""
    totals = {k: sum(n for _, n in v) for k, v in phases.items()}
    main = max(totals, key=lambda k: (totals[k] if isinstance(totals[k], int)
                                      else totals[k].node.hint) or 0)
    rest = [k for k in totals if k != main and not _known(totals[k] <= totals[main])]
    other = reduce(torch.sym_max, [totals[k] for k in rest], 0)
    return phases[main] + ([(f"kernel's {'/'.join(rest)} phase peak above this set",
                             torch.sym_max(0, other - totals[main]))] if rest else [])


def _contiguous(sizes, strides=None) -> bool:
    """Contiguous for all values of the symbols; False when not provable, and no guards
    (torch._prims_common.is_contiguous_or_false guards backed symbols)."""
    if strides is None:
        sizes, strides = sizes.shape, sizes.stride()
    if _known(math.prod(sizes) < 2):
        return True
    expected = 1
    for size, stride in reversed(list(zip(sizes, strides))):
        if not _known(size == 1):
            if not _known(stride == expected):
                return False
            expected = expected * size
    return True


# at::globalContext().deterministicAlgorithms(), true with warn_only too
_deterministic = torch.are_deterministic_algorithms_enabled
_clean = lambda ws: [(w, n) for w, n in ws if not _known(n == 0)]
