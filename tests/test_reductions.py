"""fxmem.trace.kernels.cuda.reductions on the CPU: Reduce.cuh's global-reduce staging for known
cases (read off PyTorch 2.14.1's and 2.15's CUDA builds on the fake GPU, see
tests/test_fake_gpu_reductions.py), and, with a symbolic batch size B, formulas that put no
guard on B and equal the concrete answer at every B tried."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fxmem.trace.kernels.cuda import reductions as red
from fxmem.trace.kernels.cuda import workspaces as cw
from test_cuda_workspaces import Sym  # the batch symbol B, as fxmem.trace makes it

aten = torch.ops.aten
STAGING, SEM = red._STAGING, red._SEMAPHORES


def ws(op, *args, **kw):
    return [n for _, n in red.workspace_bytes(op, args, kw)]


def meta(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


# (op, args, kwargs, bytes): each seen on the fake GPU (2.14.1 and 2.15 alike)
KNOWN = [
    (aten.sum.dim_IntList, (meta(4096, 96), [0]), {}, [786432, 8]),  # the finding's bias grad
    (aten.sum.default, (meta(4096, 96),), {}, [192, 4]),
    (aten.sum.default, (meta(2, 96),), {}, []),
    (aten.sum.dim_IntList, (meta(65536, 96), [0]), {}, [12582912, 8]),
    (aten.mean.default, (meta(65536, 96),), {}, [2112, 4]),
]


@pytest.mark.parametrize("op,args,kw,expected", KNOWN)
def test_known_cases(op, args, kw, expected):
    assert sorted(ws(op, *args, **kw)) == sorted(expected)


def test_more_sms_more_blocks():
    """ctas_per_output follows the SM count (A100: 108, H100: 132)."""
    x = meta(1 << 20, 96)
    a100 = red.workspace_bytes(aten.sum.dim_IntList, (x, [0]), {}, capability=(8, 0))
    h100 = red.workspace_bytes(aten.sum.dim_IntList, (x, [0]), {}, capability=(9, 0))
    assert dict(a100)[STAGING] < dict(h100)[STAGING]


def test_casts_and_copies():
    # a bool sum is read as int64: make_reduction's self.to(int64)
    got = dict(red.workspace_bytes(aten.sum.default, (meta(4096, 96, dtype=torch.bool),), {}))
    assert got["self.to(int64) (make_reduction)"] == 4096 * 96 * 8
    # float16 summed into float32 is read as float16: no copy
    half = red.workspace_bytes(aten.sum.dim_IntList, (meta(4096, 96, dtype=torch.float16),
                                                      None), {"dtype": torch.float32})
    assert not any("to(" in w for w, _ in half)
    # argmax over all dims of a transposed input: reshape(-1) copies it
    t = meta(96, 4096).t()
    got = dict(red.workspace_bytes(aten.argmax.default, (t,), {}))
    assert got["self.reshape(-1) (a copy)"] == 4096 * 96 * 4


BS = [1, 2, 3, 7, 8, 100, 127, 128, 255, 256, 1000, 4096, 4097, 30000, 65536, 200000]

# (op, shape with "B", make, dims / extra args): the batch dim reduced, kept, or both
SYMBOLIC = [
    (aten.sum.dim_IntList, ("B", 96), torch.float32, ([0],)),        # a bias gradient
    (aten.sum.dim_IntList, ("B", 17, 96), torch.float16, ([0, 1],)),  # over B*L rows
    (aten.sum.default, ("B", 96), torch.float32, ()),                 # a loss sum
    (aten.mean.default, ("B", 10), torch.bfloat16, ()),               # a loss mean
    (aten.mean.dim, ("B", 1000), torch.float32, ([1],)),              # per-row means
    (aten.var_mean.correction, ("B", 64), torch.float32, ([0],)),     # batch statistics
    (aten.amax.default, ("B", 50), torch.float16, ([1], True)),
    (aten.max.dim, ("B", 300), torch.float32, (0,)),
    (aten.linalg_vector_norm.default, ("B", 768), torch.float32, (2,)),
    (aten.logsumexp.default, ("B", 1000), torch.float32, ([1],)),
]


@pytest.mark.parametrize("op,shape,dtype,extra", SYMBOLIC,
                         ids=[f"{c[0]}-{c[1]}" for c in SYMBOLIC])
def test_symbolic_b_no_guard_and_exact(op, shape, dtype, extra):
    s = Sym(hint=8)
    with s.mode:
        x = torch.empty([s.B if d == "B" else d for d in shape], dtype=dtype)
    got = red.workspace_bytes(op, (x, *extra), {})
    assert s.untouched(), s.env.guards
    for b in BS:
        concrete = torch.empty([b if d == "B" else d for d in shape], dtype=dtype,
                               device="meta")
        want = red.workspace_bytes(op, (concrete, *extra), {})
        assert sum(s.at(n, b) for _, n in got) == sum(n for _, n in want), (b, got, want)
