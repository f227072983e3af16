"""SDPA on the fake GPU (tests/test_fake_gpu_sdpa.py): the backend PyTorch's CUDA build picks
(``torch._fused_sdp_choice``, its ``select_sdp_backend``) for a grid of cases, and one-attention
training steps forced onto each backend, for ``max_memory_allocated``.

A case is a dict (JSON, so the fake-GPU child gets it as is): ``dtype``; ``B, H, Lq, Lk, E, Ev``
and ``Hkv`` (key/value heads); ``mask`` None or ``[dtype, shape]``; ``dropout``; ``causal``;
``gqa`` (enable_gqa); ``grad`` (requires_grad on q, k, v); ``layout`` ("bhld" contiguous,
"blhd" a (B, L, H, E) tensor transposed, "lastdim" stride(-1) != 1, "offset" storage offset one
element); ``kernels`` (None, or the ``sdpa_kernel`` backends by name), ``priority``
(``set_priority=True``); ``deterministic`` (None, "on", "warn"); ``no_grad``.
:func:`build` makes the tensors on a device, so the fake GPU and fxmem's ``choose`` (on CPU
tensors) see the same shapes, strides and dtypes."""

import contextlib

import torch
from torch import nn

BACKENDS = {"math": 0, "flash": 1, "efficient": 2, "cudnn": 3, "overrideable": 4}

DEFAULT = dict(dtype="bfloat16", B=2, H=8, Lq=128, Lk=None, E=64, Ev=None, Hkv=None, mask=None,
               dropout=0.0, causal=False, gqa=False, grad=False, layout="bhld", kernels=None,
               priority=False, deterministic=None, no_grad=False)


def case(**kw):
    """A case: only what differs from :data:`DEFAULT` (the child's argv stays short)."""
    bad = set(kw) - set(DEFAULT)
    assert not bad, bad
    return {k: v for k, v in kw.items() if v != DEFAULT[k]}


def _grid():
    cases = []
    for dt in ("float16", "bfloat16", "float32"):
        for e in (8, 16, 32, 60, 64, 72, 80, 96, 128, 160, 192, 224, 256, 320, 512):
            for grad in (False, True):
                cases.append(case(dtype=dt, E=e, grad=grad))
                cases.append(case(dtype=dt, E=e, grad=grad, dropout=0.125))
                cases.append(case(dtype=dt, E=e, grad=grad, dropout=0.1, causal=True))
        for m in (["bool", "LS"], ["float32", "LS"], [dt, "LS"], ["bool", "BHLS"],
                  [dt, "B1LS"], [dt, "11LS"], [dt, "1S"], [dt, "L1"], [dt, "11"],
                  [dt, "BH1S"], ["bool", "S"], [dt, "HLS"]):
            for grad in (False, True):
                cases.append(case(dtype=dt, mask=m, grad=grad))
        cases.append(case(dtype=dt, mask=[dt, "LS"], dropout=0.25, grad=True))
        cases.append(case(dtype=dt, mask=[dt, "LSgrad"], grad=True))
        for lq, lk in ((128, 64), (64, 128), (1, 128), (128, 1), (1, 1), (7, 13), (33, 257)):
            for causal in (False, True):
                cases.append(case(dtype=dt, Lq=lq, Lk=lk, causal=causal, grad=True))
            cases.append(case(dtype=dt, Lq=lq, Lk=lk, dropout=0.125, grad=True))
        for e, ev in ((64, 128), (128, 64), (192, 128), (64, 32), (96, 64)):
            cases.append(case(dtype=dt, E=e, Ev=ev, grad=True))
            cases.append(case(dtype=dt, E=e, Ev=ev))
        for hkv, gqa in ((2, True), (4, True), (2, False), (3, True), (8, True), (1, False),
                         (1, True)):
            cases.append(case(dtype=dt, Hkv=hkv, gqa=gqa, grad=True))
            cases.append(case(dtype=dt, Hkv=hkv, gqa=gqa, Lq=1, Lk=64))
            for ks in (["flash"], ["efficient"], ["cudnn"]):
                cases.append(case(dtype=dt, Hkv=hkv, gqa=gqa, grad=True, kernels=ks))
        for layout in ("blhd", "lastdim", "offset"):
            for grad in (False, True):
                cases.append(case(dtype=dt, layout=layout, grad=grad))
                cases.append(case(dtype=dt, layout=layout, grad=grad, E=96))
        for det in ("on", "warn"):
            cases.append(case(dtype=dt, deterministic=det, grad=True))
            cases.append(case(dtype=dt, deterministic=det))
            cases.append(case(dtype=dt, deterministic=det, dropout=0.125, grad=True))
        cases.append(case(dtype=dt, grad=True, no_grad=True))
        for ks in (["flash"], ["efficient"], ["math"], ["cudnn"], ["flash", "efficient"],
                   ["cudnn", "math"], ["efficient", "math"]):
            cases.append(case(dtype=dt, kernels=ks, grad=True))
            cases.append(case(dtype=dt, kernels=ks, E=256))
        cases.append(case(dtype=dt, kernels=["efficient", "flash", "cudnn", "math"],
                          priority=True))
        cases.append(case(dtype=dt, kernels=["math", "cudnn", "flash", "efficient"],
                          priority=True))
        cases.append(case(dtype=dt, B=70000, H=1, Lq=16, E=64))
        cases.append(case(dtype=dt, B=1, H=70000, Lq=16, E=64))
        for b, h, l in ((1, 1, 8), (4, 16, 2048), (1, 32, 4096), (64, 4, 512)):
            cases.append(case(dtype=dt, B=b, H=h, Lq=l, grad=True))
            cases.append(case(dtype=dt, B=b, H=h, Lq=l, dropout=0.0625))
    return cases


CASES = _grid()


def build(c, device):
    """``(q, k, v, mask)`` of case ``c`` on ``device``."""
    c = {**DEFAULT, **c}
    dtype = getattr(torch, c["dtype"])
    b, h, lq, e = c["B"], c["H"], c["Lq"], c["E"]
    lk, ev, hk = c["Lk"] or lq, c["Ev"] or e, c["Hkv"] or h
    layout = c["layout"]

    def t(heads, length, dim):
        if layout == "blhd":
            x = torch.zeros(b, length, heads, dim, dtype=dtype, device=device).transpose(1, 2)
        elif layout == "lastdim":
            x = torch.zeros(b, heads, dim, length, dtype=dtype, device=device).transpose(2, 3)
        elif layout == "offset":
            n = b * heads * length * dim
            x = torch.zeros(n + 1, dtype=dtype, device=device)[1:].view(b, heads, length, dim)
        else:
            x = torch.zeros(b, heads, length, dim, dtype=dtype, device=device)
        return x.requires_grad_(c["grad"])

    q, k, v = t(h, lq, e), t(hk, lk, e), t(hk, lk, ev)
    mask = None
    if c["mask"] is not None:
        mdt, spec = c["mask"]
        sizes = {"B": b, "H": h, "L": lq, "S": lk, "1": 1}
        shape = [sizes[ch] for ch in spec.replace("grad", "")]
        mask = torch.zeros(shape, dtype=getattr(torch, mdt), device=device)
        if spec.endswith("grad"):
            mask.requires_grad_(True)
    return q, k, v, mask


@contextlib.contextmanager
def context(c):
    """The case's ``sdpa_kernel`` restriction, determinism and grad mode."""
    c = {**DEFAULT, **c}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    with contextlib.ExitStack() as stack:
        if c["kernels"] is not None:
            ks = [names[n] for n in c["kernels"]]
            stack.enter_context(sdpa_kernel(ks, set_priority=True) if c["priority"]
                                else sdpa_kernel(ks))
        if c["no_grad"]:
            stack.enter_context(torch.no_grad())
        before = (torch.are_deterministic_algorithms_enabled(),
                  torch.is_deterministic_algorithms_warn_only_enabled())
        if c["deterministic"]:
            torch.use_deterministic_algorithms(True, warn_only=c["deterministic"] == "warn")
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def choices(cases):
    """On the fake GPU: ``{"cudnn": torch.backends.cudnn.version(), "enum": {name: value},
    "choices": [backend name, or "error: ..." per case]}``."""
    from torch.nn.attention import SDPBackend

    names = {v: k for k, v in BACKENDS.items()}
    enum = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    out = []
    for c in cases:
        q, k, v, mask = build(c, "cuda")
        c = {**DEFAULT, **c}
        try:
            with context(c):
                r = torch._fused_sdp_choice(q, k, v, mask, c["dropout"], c["causal"],
                                            scale=None, enable_gqa=c["gqa"])
            out.append(names[r])
        except Exception as exc:  # noqa: BLE001 (IndexError for a 1-D mask)
            out.append(f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        del q, k, v, mask
    return {"cudnn": torch.backends.cudnn.version(), "torch": torch.__version__,
            "enum": {n: int(e.value) for n, e in enum.items()},
            "sm": list(torch.cuda.get_device_capability()), "choices": out}


# --- training steps of one attention, forced onto a backend (memory) ---------------------------

class Attention(nn.Module):
    """``sdpa(x * wq, x * wk, x * wv)`` under ``sdpa_kernel([backend])``: q, k, v are products
    with sample-shaped parameters (no matmul: on 2.15 every cuBLAS call takes a transient
    workspace), so the step's memory is the attention kernels' own."""

    def __init__(self, backend, H, L, E, Hkv, dropout, causal, dtype):
        super().__init__()
        self.backend, self.dropout, self.causal = backend, dropout, causal
        self.wq = nn.Parameter(torch.ones(H, L, E, dtype=dtype))
        self.wk = nn.Parameter(torch.ones(Hkv, L, E, dtype=dtype))
        self.wv = nn.Parameter(torch.ones(Hkv, L, E, dtype=dtype))

    def forward(self, x):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kind = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION}[self.backend]
        hkv = self.wk.shape[0]
        kx = x[:, :hkv]
        with sdpa_kernel([kind]):
            return nn.functional.scaled_dot_product_attention(
                x * self.wq, kx * self.wk, kx * self.wv, dropout_p=self.dropout,
                is_causal=self.causal, enable_gqa=hkv != self.wq.shape[0])


def _sum(out):
    return out.float().sum()


def attention(B=2, backend="flash", dtype="float16", H=4, L=128, E=64, Hkv=None, dropout=0.0,
              causal=False, seed=0):
    """A training step (no optimizer) of :class:`Attention`: ``(model, x, None, loss, None)``."""
    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    model = Attention(backend, H, L, E, Hkv or H, dropout, causal, dt)
    return model, torch.randn(B, H, L, E).to(dt), None, _sum, None


def steps(cases):
    """On the fake GPU: ``max_memory_allocated`` of one measured step of :func:`attention` per
    case (a dict of its keyword arguments), as fxmem.validate.fakegpu's child measures a step
    (one warm-up step, gradients dropped, synchronize, gc, empty_cache, reset_peak), all in one
    process; an exception's text where the step fails."""
    import gc

    out = []
    for kw in cases:
        try:
            model, x, _, loss_fn, _ = attention(**kw)
            model, x = model.cuda(), x.cuda()
            params = list(model.parameters())

            def step():
                for p in params:
                    p.grad = None
                loss = loss_fn(model(x))
                loss.backward()
                del loss

            step()
            for p in params:
                p.grad = None
            torch.cuda.synchronize()
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            out.append(torch.cuda.max_memory_allocated())
        except Exception as exc:  # noqa: BLE001
            out.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        finally:
            model = x = params = step = None
            gc.collect()
            torch.cuda.empty_cache()
    return out


def _memory_cases():
    cases = {}
    for backend, dtypes in (("flash", ("float16", "bfloat16")),
                            ("efficient", ("float16", "bfloat16", "float32")),
                            ("math", ("float16", "bfloat16", "float32")),
                            ("cudnn", ("float16", "bfloat16"))):
        for dt in dtypes:
            for dropout in (0.0, 0.125):
                for causal in (False, True):
                    name = f"{backend} {dt} dropout {dropout} causal {causal}"
                    cases[name] = dict(backend=backend, dtype=dt, dropout=dropout, causal=causal)
    cases.update({
        "efficient float32 GQA (Hkv 2)": dict(backend="efficient", dtype="float32", Hkv=2),
        "efficient float16 one kv head, dropout": dict(backend="efficient", dtype="float16",
                                                       Hkv=1, dropout=0.125),
        "efficient bfloat16 GQA dropout causal": dict(backend="efficient", dtype="bfloat16",
                                                      Hkv=2, dropout=0.125, causal=True),
        "flash bfloat16 GQA (Hkv 2)": dict(backend="flash", dtype="bfloat16", Hkv=2),
        "flash float16 head dim 60 (padded)": dict(backend="flash", dtype="float16", E=60),
        "flash bfloat16 head dim 256": dict(backend="flash", dtype="bfloat16", E=256),
        "efficient float16 head dim 160, dropout": dict(backend="efficient", dtype="float16",
                                                        E=160, dropout=0.125),
        "efficient float32 head dim 96, L 200": dict(backend="efficient", dtype="float32", E=96,
                                                     L=200),
        "cudnn float16 GQA (Hkv 2)": dict(backend="cudnn", dtype="float16", Hkv=2),
        "cudnn bfloat16 head dim 128, L 200, dropout": dict(backend="cudnn", dtype="bfloat16",
                                                            E=128, L=200, dropout=0.125),
    })
    return cases


MEMORY = _memory_cases()
MEMORY_B = (2, 5)
