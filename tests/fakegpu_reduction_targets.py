"""Reduction cases for tests/test_fake_gpu_reductions.py: what ATen's CUDA reductions
(``gpu_reduce_kernel``, Reduce.cuh) allocate and free inside one call, on PyTorch's own CUDA
build on the fake GPU, against fxmem.trace.kernels.cuda.reductions.

A case is ``(op, layout, dtype, dims, keepdim)``; :func:`build` makes the op's arguments on a
device ("cuda" on the fake GPU, "meta" for fxmem's rule: the same shapes, strides, offsets and
dtypes). :func:`transients` runs every case once and returns, per case, the sizes (bytes asked
of the caching allocator) of the blocks the call allocated and freed before it returned, and
the most of them alive at once."""

import torch

aten = torch.ops.aten

# layout -> (shape, how): "c" contiguous, "t" transposed view of the reversed shape, "s" every
# second column of a twice-wider tensor, "o" a view at storage offset 1 (rows [1:]), "cl"
# channels_last
LAYOUTS = {
    "2x96": ((2, 96), "c"), "4096x96": ((4096, 96), "c"), "65536x96": ((65536, 96), "c"),
    "96x65536": ((96, 65536), "c"), "30000x1000": ((30000, 1000), "c"),
    "100000x30": ((100000, 30), "c"), "4096x96 t": ((4096, 96), "t"),
    "8192x96 s": ((8192, 96), "s"), "1001x1000 o": ((1000, 1000), "o"),
    "3x7 big": ((3, 7_000_000), "c"),
    "32x64x28x28": ((32, 64, 28, 28), "c"), "32x64x28x28 cl": ((32, 64, 28, 28), "cl"),
    "2x3x5x7": ((2, 3, 5, 7), "c"), "256x512x7x7 cl": ((256, 512, 7, 7), "cl"),
}
DIMS_2D = [((0,), False), ((1,), False), (None, False), ((0,), True)]
DIMS_4D = [((0, 2, 3), False), ((1,), False), ((3,), False), (None, False), ((0, 2, 3), True)]
FLOATS = ("float32", "float16", "bfloat16")
MULTI = ("sum", "mean", "amax", "amin", "var", "std", "var_mean", "std_mean", "norm2", "norm1",
         "norminf", "any", "all", "logsumexp")  # prod: the fake GPU crashes in it
SINGLE = ("max.dim", "min.dim", "argmax", "argmin")

CASES = []
for lay, (shape, _) in LAYOUTS.items():
    dimsets = DIMS_2D if len(shape) == 2 else DIMS_4D
    for dt in FLOATS:
        for dims, keep in dimsets:
            for op in MULTI:
                if op == "logsumexp" and dims is None or op == "prod" and dims and len(dims) > 1:
                    continue
                CASES.append((op, lay, dt, dims, keep))
            if dims is not None and len(dims) == 1:
                for op in SINGLE:
                    CASES.append((op, lay, dt, dims, keep))
        for op in ("argmax", "max", "sum_f32", "mse_loss", "huber_loss", "smooth_l1_loss"):
            CASES.append((op, lay, dt, None, False))
    CASES.append(("sum", lay, "bool", None, False))
    CASES.append(("any", lay, "bool", (0,), False))


def name(case):
    op, lay, dt, dims, keep = case
    return f"{op} {lay} {dt} dims={dims}{' keepdim' if keep else ''}"


def make(lay, dt, device):
    shape, how = LAYOUTS[lay]
    dtype = getattr(torch, dt)
    if how == "t":
        return torch.zeros(tuple(reversed(shape)), dtype=dtype, device=device).t()
    if how == "s":
        return torch.zeros(shape[0], shape[1] * 2, dtype=dtype, device=device)[:, ::2]
    if how == "o":
        return torch.zeros(shape[0] + 1, shape[1], dtype=dtype, device=device)[1:]
    if how == "cl":
        return torch.zeros(shape, dtype=dtype, device=device).to(
            memory_format=torch.channels_last)
    return torch.zeros(shape, dtype=dtype, device=device)


def build(case, x):
    """``(op, args, kwargs)`` of ``case`` on the input ``x`` (made by :func:`make`)."""
    op, lay, dt, dims, keep = case
    d = list(dims) if dims is not None else None
    if op == "sum":
        return (aten.sum.default, (x,), {}) if d is None else (aten.sum.dim_IntList, (x, d, keep), {})
    if op == "sum_f32":
        return aten.sum.dim_IntList, (x, None, False), {"dtype": torch.float32}
    if op == "mean":
        return (aten.mean.default, (x,), {}) if d is None else (aten.mean.dim, (x, d, keep), {})
    if op in ("amax", "amin"):
        return getattr(aten, op).default, (x, d or [], keep), {}
    if op in ("var", "std", "var_mean", "std_mean"):
        return getattr(aten, op).correction, (x, d), {"keepdim": keep}
    if op.startswith("norm"):
        p = {"norm2": 2, "norm1": 1, "norminf": float("inf")}[op]
        return aten.linalg_vector_norm.default, (x, p, d, keep), {}
    if op == "prod":
        if d is None:
            return aten.prod.default, (x,), {}
        return aten.prod.dim_int, (x, d[0], keep), {}
    if op in ("any", "all"):
        if d is None:
            return getattr(aten, op).default, (x,), {}
        return getattr(aten, op).dims, (x, d, keep), {}
    if op == "logsumexp":
        return aten.logsumexp.default, (x, d, keep), {}
    if op in ("max.dim", "min.dim"):
        return getattr(aten, op.split(".")[0]).dim, (x, d[0], keep), {}
    if op in ("argmax", "argmin"):
        return getattr(aten, op).default, (x, None if d is None else d[0], keep), {}
    if op == "max":
        return aten.max.default, (x,), {}
    if op in ("mse_loss", "huber_loss", "smooth_l1_loss"):
        return getattr(aten, op).default, (x, x.detach().clone().contiguous()
                                           if x.device.type != "meta" else
                                           torch.empty(x.shape, dtype=x.dtype, device="meta"), 1), {}
    raise ValueError(op)


def transients(only=None):
    """Per case name: ``{"transients": sizes of the blocks the call allocated and freed
    before returning (in allocation order), "peak": the most of those bytes alive at once}``,
    or an error string."""
    out = {}
    cache = {}
    for case in CASES:
        if only is not None and name(case) not in only:
            continue
        key = (case[1], case[2])
        if key not in cache:
            cache.clear()
            torch.cuda.empty_cache()
            cache[key] = make(case[1], case[2], "cuda")
        x = cache[key]
        op, args, kwargs = build(case, x)
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=100000, context="alloc",
                                                 stacks="python")
        try:
            r = op(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            torch.cuda.memory._record_memory_history(enabled=None)
            out[name(case)] = f"error: {type(e).__name__}: {e}"[:200]
            continue
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
        del r
        live, sizes, now, peak = {}, [], 0, 0
        for e in trace:
            if e["action"] == "alloc":
                live[e["addr"]] = len(sizes)
                sizes.append([e["size"], False])
            elif e["action"] == "free_requested" and e["addr"] in live:
                sizes[live.pop(e["addr"])][1] = True
        for e in trace:  # the most transient bytes alive at once
            i = live.get(e["addr"], None)
            if i is not None:
                continue  # the result (never freed in the call)
            if e["action"] == "alloc":
                now += e["size"]
                peak = max(peak, now)
            elif e["action"] == "free_requested":
                now -= e["size"]
        out[name(case)] = {"transients": [s for s, freed in sizes if freed], "peak": peak}
    return out
