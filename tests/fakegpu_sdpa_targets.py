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
