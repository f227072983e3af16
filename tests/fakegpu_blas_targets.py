"""Matmul cases for tests/test_fake_gpu_blas.py: which library (cuBLAS or cuBLASLt) PyTorch's
CUDA build calls, told apart on the fake GPU by the workspace each call takes (torch 2.15).

Each case is ``(name, op, dtype, spec, kwargs, prefer_lt)``; :func:`build` makes its arguments
on a device, so the fake GPU and fxmem's rule (:func:`fxmem.trace.kernels.cuda.blas.library`, on CPU
tensors) see the same shapes, strides and dtypes."""

import torch

M, K, N = 64, 32, 48

# spec: how the bias (first argument) and the matrices are made
CASES = []
for dt in ("float32", "float16", "bfloat16", "float64"):
    for spec, kw in (("b1d", {}), ("b(1,n)", {}), ("b(m,n)", {}), ("b(m,n) expanded", {}),
                     ("b(m,1)", {}), ("b(m,n) transposed", {}), ("b1d strided", {}),
                     ("b1d", {"beta": 2}), ("b1d", {"beta": 0}), ("b1d", {"alpha": 2}),
                     ("b(m,n)", {"beta": 2}), ("b(m,n)", {"beta": 0}), ("b(1,n)", {"beta": 2}),
                     ("b1d m=1", {}), ("b1d k=1", {}), ("b1d n=1", {}), ("b1d mat1^T", {}),
                     ("b1d mat2^T", {}), ("b(m,n) k=1", {}), ("b(1)", {})):
        CASES.append((f"addmm {dt} {spec} {kw}", "addmm", dt, spec, kw, False))
    for spec, kw in (("b1d", {}), ("b(m,n)", {}), ("b1d", {"beta": 2})):
        CASES.append((f"_addmm_activation {dt} {spec} {kw}", "_addmm_activation", dt, spec, kw,
                      False))
    for op in ("mm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot"):
        CASES.append((f"{op} {dt}", op, dt, "", {}, False))
        CASES.append((f"{op} {dt} preferred cuBLASLt", op, dt, "", {}, True))
    CASES.append((f"addmm {dt} b(m,n) preferred cuBLASLt", "addmm", dt, "b(m,n)", {}, True))
CASES.append(("mm complex64 preferred cuBLASLt", "mm", "complex64", "", {}, True))
CASES.append(("addmm complex64 b1d", "addmm", "complex64", "b1d", {}, False))


def build(case, device):
    """``(op, args, kwargs)`` of ``case`` with tensors on ``device``."""
    _, op, dt, spec, kw, _ = case
    dtype = getattr(torch, dt)

    def t(*shape):
        return torch.zeros(*shape, dtype=dtype, device=device)

    m = 1 if "m=1" in spec else M
    k = 1 if "k=1" in spec else K
    n = 1 if "n=1" in spec else N
    mat1 = t(k, m).t() if "mat1^T" in spec else t(m, k)
    mat2 = t(n, k).t() if "mat2^T" in spec else t(k, n)
    bias = {"b1d": lambda: t(n), "b(1,n)": lambda: t(1, n), "b(m,n)": lambda: t(m, n),
            "b(m,n) expanded": lambda: t(n).expand(m, n), "b(m,1)": lambda: t(m, 1),
            "b(m,n) transposed": lambda: t(n, m).t(), "b1d strided": lambda: t(2 * n)[::2],
            "b(1)": lambda: t(1)}
    aten = torch.ops.aten
    if op in ("addmm", "_addmm_activation"):
        b = bias[spec.split(" ")[0] if spec.split(" ")[0] in bias else spec]()
        return getattr(aten, op).default, (b, mat1, mat2), dict(kw)
    if op == "mm":
        return aten.mm.default, (mat1, mat2), {}
    if op == "bmm":
        return aten.bmm.default, (mat1[None], mat2[None]), {}
    if op == "baddbmm":
        return aten.baddbmm.default, (t(1, m, n), mat1[None], mat2[None]), {}
    if op == "addbmm":
        return aten.addbmm.default, (t(m, n), mat1[None], mat2[None]), {}
    if op == "mv":
        return aten.mv.default, (mat1, t(k)), {}
    if op == "addmv":
        return aten.addmv.default, (t(m), mat1, t(k)), {}
    if op == "dot":
        return aten.dot.default, (t(k), t(k)), {}
    raise ValueError(op)


def transients():
    """Per case: bytes the call allocated beyond what it returned (its workspace), after one
    warm-up call of the same case; and the release's workspace settings."""
    out = {}
    for case in CASES:
        prefer = case[5]
        torch.backends.cuda.preferred_blas_library("cublaslt" if prefer else "cublas")
        op, args, kwargs = build(case, "cuda")
        op(*args, **kwargs)  # warm-up: a handle's first use
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        y = op(*args, **kwargs)
        torch.cuda.synchronize()
        out[case[0]] = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
        del y
    torch.backends.cuda.preferred_blas_library("cublas")
    return out
