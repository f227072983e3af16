"""fxmem.trace.kernels.cuda.sdpa: CUDA's SDPA backend choice and kernels on CPU fake tensors.

Expected backends are derived in the comments from the rules of torch 2.13's
sdp_utils.cpp / sdp_utils_cpp.h (priority order, per-backend filters); op sequences are
compared with PyTorch's own kernels (its meta kernels, and the C++ math composite run on
fake CUDA tensors); workspace sizes are re-derived from the kernels' formulas by hand.
"""

import contextlib
import math

import pytest
import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from fxmem.trace.kernels.cuda import sdpa, sdpa_memory
from fxmem.trace.kernels.compat import tracing_shims

aten = torch.ops.aten
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
MODERN = sdpa.TORCH >= (2, 13)
FAKE = FakeTensorMode(allow_non_fake_inputs=True)  # one mode: fakes made in it can meet again


def _sdp_state():
    return (tuple(getattr(torch.backends.cuda, f"{n}_sdp_enabled")()
                  for n in ("flash", "mem_efficient", "math", "cudnn")),
            torch._C._get_overrideable_sdp_enabled(), tuple(torch._C._get_sdp_priority_order()),
            torch.are_deterministic_algorithms_enabled())


@pytest.fixture(autouse=True)
def _sdp_flags_restored():
    before = _sdp_state()
    yield
    assert _sdp_state() == before, "sdpa flags, priority order or determinism not restored"


def qkv(b=2, h=8, l=128, d=64, dtype=BF16, lk=None, hk=None, dv=None, grad=False):
    """Fake (B, H, L, D) query, key, value."""
    with FAKE:
        q = torch.empty(b, h, l, d, dtype=dtype, requires_grad=grad)
        k = torch.empty(b, hk or h, lk or l, d, dtype=dtype, requires_grad=grad)
        v = torch.empty(b, hk or h, lk or l, dv or d, dtype=dtype, requires_grad=grad)
    return q, k, v


def pick(*args, cap=(9, 0), cudnn=sdpa.CUDNN_VERSION, **kw):
    return sdpa.choose(*args, capability=cap, cudnn_version=cudnn, **kw).backend


# --- (a) the backend choice --------------------------------------------------------------------

# (case, tensors, choose kwargs, capability, expected, why)
CASES = [
    ("fp32 sm90", dict(dtype=F32), {}, (9, 0), "efficient",
     "cuDNN and flash take fp16/bf16 only; efficient takes fp32, 64 % 4 == 0"),
    ("fp16 sm80", dict(dtype=F16), {}, (8, 0), "flash",
     "no cuDNN preference off sm9x/sm10x: flash first"),
    ("bf16 sm90", {}, {}, (9, 0), "cudnn", "cuDNN 9.20 > 9.15 on sm90: cuDNN first"),
    ("bf16 sm100", dict(d=128), {}, (10, 0), "cudnn", "sm10x prefers cuDNN too"),
    ("bf16 sm86", {}, {}, (8, 6), "flash", "cuDNN preferred on sm9x/sm10x only"),
    ("hd 96 sm90", dict(d=96), {}, (9, 0), "cudnn", "96 <= 128, 96 % 8 == 0"),
    ("hd 256 sm90", dict(d=256), {}, (9, 0), "cudnn", "Hopper: head dim <= 256 from cuDNN 9.10"),
    ("hd 256 sm100", dict(d=256), {}, (10, 0), "flash", "sm100: cuDNN <= 128; flash <= 256"),
    ("hd 192/128 sm100", dict(d=192, dv=128), {}, (10, 0), "cudnn",
     "DeepSeek dims allowed on sm10x; flash needs equal q/k/v head dims"),
    ("hd 512 sm90", dict(d=512), {}, (9, 0), "efficient", "flash and cuDNN <= 256"),
    ("hd 60 sm90", dict(d=60), {}, (9, 0), "flash", "cuDNN needs head dim % 8; flash pads"),
    ("hd 62 fp32", dict(d=62, dtype=F32), {}, (8, 0), "math", "efficient needs 62 % 4 == 0"),
    ("3-D inputs", dict(b=None), {}, (9, 0), "math", "fused kernels need 4-D inputs"),
    ("causal Lq != Lk", dict(dtype=F16, l=64, lk=128), dict(is_causal=True), (8, 0), "efficient",
     "flash rejects non-square causal"),
    # cuDNN takes only multiples of 1/16 from 2.12 on (check_cudnn_dropout; 2.11 has no check)
    ("dropout 0.1 sm90", {}, dict(dropout_p=0.1), (9, 0),
     "flash" if sdpa.TORCH >= (2, 12) else "cudnn", "0.1 not a multiple of 1/16"),
    ("dropout 1/8 sm90", {}, dict(dropout_p=0.125), (9, 0), "cudnn", "a multiple of 1/16"),
    ("gqa bf16 sm80", dict(hk=2), dict(enable_gqa=True), (8, 0), "flash", "flash supports GQA"),
    ("gqa bf16 sm90", dict(hk=2), dict(enable_gqa=True), (9, 0), "cudnn", "cuDNN supports GQA"),
    ("gqa fp32", dict(hk=2, dtype=F32), dict(enable_gqa=True), (8, 0),
     "efficient" if sdpa.TORCH >= (2, 14) else "math",
     "efficient: GQA from 2.14 (check_batch_size_and_num_heads_dense<true>; 2.13: <false>)"),
    ("heads differ, no gqa", dict(hk=2), {}, (8, 0), "math", "equal heads needed without GQA"),
    ("one kv head, no gqa", dict(hk=1), {}, (8, 0), "flash" if sdpa.TORCH >= (2, 14) else "math",
     "2.14+: fused kernels broadcast a single key/value head (supports_mqa)"),
    ("train hd 160 sm90", dict(d=160, grad=True), {}, (9, 0),
     "flash" if sdpa.TORCH >= (2, 14) else "cudnn",
     "2.14+: cuDNN backward takes head dims <= 128, (192, 128) or (256, 256) on sm90"),
    ("train hd 256 sm90", dict(d=256, grad=True), {}, (9, 0), "cudnn", "(256, 256) is allowed"),
    ("batch 70000 sm90", dict(b=70000, l=16), {}, (9, 0),
     "efficient" if sdpa.TORCH >= (2, 15) else "flash" if MODERN else "cudnn",
     "cuDNN (2.13+) and flash (2.15) take batch and heads <= 65535"),
    ("fp16 sm75", dict(dtype=F16), {}, (7, 5), "efficient", "flash and cuDNN need sm80+"),
    ("bf16 sm75", {}, {}, (7, 5), "math", "efficient takes fp16/fp32 below sm80"),
    ("sm70 fp32", dict(dtype=F32), {}, (7, 0), "efficient", "efficient runs on sm50..sm121"),
    ("sm130", {}, {}, (13, 0), "math", "every fused kernel stops at sm121"),
]


@pytest.mark.parametrize("case,shape,kw,cap,expected,why", CASES, ids=[c[0] for c in CASES])
def test_choice(case, shape, kw, cap, expected, why):
    if shape.get("b", 1) is None:
        with FAKE:
            q = k = v = torch.empty(8, 128, 64, dtype=BF16)
    else:
        q, k, v = qkv(**shape)
    assert pick(q, k, v, cap=cap, **kw) == expected, why


def test_attention_masks():
    q, k, v = qkv(dtype=F16)
    with FAKE:
        fmask, bmask2 = torch.empty(128, 128, dtype=F16), torch.empty(128, 128, dtype=torch.bool)
        bmask3 = torch.empty(2, 128, 128, dtype=torch.bool)
    assert pick(q, k, v, fmask, cap=(8, 0)) == "efficient"  # flash rejects any attn_mask
    assert pick(q, k, v, bmask2, cap=(9, 0)) == "cudnn"  # 2-D (L, S): a cuDNN mask shape
    assert pick(q, k, v, bmask3, cap=(9, 0)) == "efficient"  # 3-D: cuDNN rejects, flash too
    c = sdpa.choose(q, k, v, bmask3, capability=(9, 0))
    assert [n for n, _ in c.rejected] == ["cudnn", "flash"]


def test_training_head_dims_on_sm86():
    # (192, 224] cannot be trained with flash on sm86-89; > 224 only without dropout
    q, k, v = qkv(d=200, dtype=F16, grad=True)
    assert pick(q, k, v, cap=(8, 6)) == "efficient"
    assert pick(q, k, v, cap=(8, 0)) == "flash"
    with torch.no_grad():
        assert pick(q, k, v, cap=(8, 6)) == "flash"
    q, k, v = qkv(d=256, dtype=F16, grad=True)
    assert pick(q, k, v, cap=(8, 9)) == "flash"
    assert pick(q, k, v, cap=(8, 9), dropout_p=0.1) == "efficient"


def test_last_dim_stride_and_pointer_alignment():
    with FAKE:
        base = torch.empty(2, 8, 64, 128, dtype=F32)
        q = base.transpose(-1, -2)  # stride(-1) == 64
        shifted = torch.empty(2 * 8 * 128 * 64 + 1, dtype=F32)[1:].view(2, 8, 128, 64)
    assert pick(q, q, q, cap=(8, 0)) == "math"  # fused kernels need stride(-1) == 1
    # storage offset 1 float = 4 bytes, not a multiple of 16: efficient rejects it on sm80+
    assert pick(shifted, shifted, shifted, cap=(8, 0)) == ("math" if MODERN else "efficient")
    assert pick(shifted, shifted, shifted, cap=(7, 5)) == "efficient"  # only checked from sm80


def test_cudnn_version_rules(monkeypatch):
    q, k, v = qkv()
    assert pick(q, k, v, cudnn=91500) == "flash"  # cuDNN preferred above 9.15.0 only
    assert pick(q, k, v, cudnn=91200, dropout_p=0.125) == "flash"  # no dropout in 9.11-9.13
    q2, k2, v2 = qkv(d=256)
    assert pick(q2, k2, v2, cudnn=90900) == "flash"  # Hopper's 256 needs cuDNN 9.10
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    assert pick(q, k, v) == "flash"


def test_cudnn_batch_limit():
    q, k, v = qkv(b=70000, l=16)
    # cuDNN: batch <= 65535 (2.13); flash too from 2.15 (check_flash_attention_grid_size)
    assert pick(q, k, v) == ("efficient" if sdpa.TORCH >= (2, 15) else
                             "flash" if MODERN else "cudnn")


def test_sdpa_kernel_flags_and_priority():
    q, k, v = qkv()
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        c = sdpa.choose(q, k, v, capability=(9, 0))
        assert c.backend == "efficient"
        assert [n for n, _ in c.rejected] == ["cudnn", "flash"]
    with sdpa_kernel([SDPBackend.MATH]):
        assert pick(q, k, v) == "math"
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        with pytest.raises(RuntimeError, match="No available kernel"):
            pick(*qkv(dtype=F32))
    # a user's priority order is kept: efficient before flash on sm80
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION],
                     set_priority=True):
        assert pick(q, k, v, cap=(8, 0)) == "efficient"
    assert pick(q, k, v, cap=(8, 0)) == "flash"
    flags = ("flash", "mem_efficient", "math", "cudnn")
    try:
        for n in flags:
            getattr(torch.backends.cuda, f"enable_{n}_sdp")(False)
        with pytest.raises(RuntimeError, match="No viable backend"):
            pick(q, k, v)
    finally:
        for n in flags:
            getattr(torch.backends.cuda, f"enable_{n}_sdp")(True)


def test_deterministic_mode_rejects_cudnn():
    q, k, v = qkv()
    torch.use_deterministic_algorithms(True)
    try:
        assert pick(q, k, v) == "flash"
    finally:
        torch.use_deterministic_algorithms(False)


# --- (b) the ops of the CUDA branch, forward and backward --------------------------------------

class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # as fxmem.trace.engine.recorder.Recorder.fake_kernel runs it
        with enable_python_dispatcher():
            out = func(*args, **(kwargs or {}))
        if func is not torch.ops.prim.device.default:
            self.calls.append((func, args, kwargs or {}, out))
        return out

    def find(self, op):
        return [c for c in self.calls if c[0] is op]


def run(q, k, v, mask=None, cap=(9, 0), **kw):
    """Forward and backward of the CUDA branch on fake tensors, recording every op."""
    with FAKE:
        with Ops() as ops:
            out = sdpa.cuda_scaled_dot_product_attention(q, k, v, mask, capability=cap, **kw)
            out.sum().backward()
    return out, ops


def _meta(fn, args, kwargs):
    with FAKE:
        return fn(*args, **kwargs)


def same_meta(a, b):
    a = [x for x in (a if isinstance(a, (tuple, list)) else (a,)) if isinstance(x, torch.Tensor)]
    b = [x for x in (b if isinstance(b, (tuple, list)) else (b,)) if isinstance(x, torch.Tensor)]
    key = lambda ts: [(x.shape, x.dtype, x.stride()) for x in ts]
    return key(a) == key(b)


@pytest.mark.parametrize("backend,cap,dtype", [("flash", (8, 0), BF16), ("cudnn", (9, 0), BF16),
                                               ("efficient", (8, 0), F32)])
def test_fused_forward_backward_match_meta(backend, cap, dtype):
    from torch import _meta_registrations as m
    fwd, bwd, meta_f, meta_b = {
        "flash": (aten._scaled_dot_product_flash_attention.default,
                  aten._scaled_dot_product_flash_attention_backward.default,
                  m.meta__scaled_dot_product_flash_attention,
                  m.meta__scaled_dot_product_flash_backward),
        "cudnn": (aten._scaled_dot_product_cudnn_attention.default,
                  aten._scaled_dot_product_cudnn_attention_backward.default,
                  m.meta__scaled_dot_product_cudnn_attention,
                  m.meta__scaled_dot_product_cudnn_backward),
        "efficient": (aten._scaled_dot_product_efficient_attention.default,
                      aten._scaled_dot_product_efficient_attention_backward.default,
                      m.meta__scaled_dot_product_efficient_attention,
                      m.meta__scaled_dot_product_efficient_backward),
    }[backend]
    q, k, v = qkv(dtype=dtype, grad=True)
    out, ops = run(q, k, v, cap=cap)
    (f,), (b,) = ops.find(fwd), ops.find(bwd)
    assert out.shape == q.shape and out.dtype == dtype
    assert same_meta(f[3], _meta(meta_f, f[1], f[2])) and same_meta(b[3], _meta(meta_b, b[1], b[2]))
    if backend in ("cudnn", "efficient"):
        assert f[1][4] is True  # should_compute_logsumexp: inputs require grad
    names = {c[0].__name__ for c in ops.calls}
    assert not names & {"_safe_softmax.default", "native_dropout.default", "bmm.default"}


def test_flash_pads_head_dim_and_slices_back():
    q, k, v = qkv(d=60, grad=True)
    out, ops = run(q, k, v, cap=(8, 0))
    (f,) = ops.find(aten._scaled_dot_product_flash_attention.default)
    assert [a.shape[-1] for a in f[1][:3]] == [64, 64, 64]  # pad_last_dim<8>
    assert f[2]["scale"] == pytest.approx(1 / math.sqrt(60))  # the scale of the OG head dim
    assert out.shape[-1] == 60 and len(ops.find(aten.constant_pad_nd.default)) >= 3


def test_efficient_mask_is_padded_and_expanded():
    q, k, v = qkv(dtype=F32, l=13, grad=True)
    with FAKE:
        mask = torch.empty(13, 13, dtype=torch.bool)  # stride 13: not aligned to 8
    _, ops = run(q, k, v, mask, cap=(8, 0))
    (f,) = ops.find(aten._scaled_dot_product_efficient_attention.default)
    bias = f[1][3]
    assert bias.shape == (2, 8, 13, 13) and bias.dtype == F32  # where(mask, 0, -inf), expanded
    assert bias.stride()[:2] == (0, 0) and bias.stride(2) == 16  # padded to 16 columns
    assert ops.find(aten.where.self)


def test_math_matches_pytorch_composite_on_cuda_fakes():
    """The 2.13 C++ composite takes its math branch for fake CUDA tensors on this CPU build
    (no CUDA backend chooser): the op sequences must agree, but for add_ vs add (the C++ body
    adds out of place for tensor subclasses; CUDA tensors add in place, as fxmem does)."""
    def ops_of(dev, fn, causal, gqa, mask):
        with FakeTensorMode():
            q = torch.empty(2, 4, 16, 64, dtype=F16, device=dev)
            k = v = torch.empty(2, 2 if gqa else 4, 16, 64, dtype=F16, device=dev)
            m = torch.ones(16, 16, dtype=torch.bool, device=dev) if mask else None
            with Ops() as ops:
                fn(q, k, v, m, 0.1 if causal else 0.0, causal, enable_gqa=gqa)
        return [(c[0].__name__.replace("add_.", "add."), tuple(getattr(c[3], "shape", ())))
                for c in ops.calls]

    for causal, gqa, mask in ((False, False, False), (True, False, False), (False, True, True)):
        ref = ops_of("cuda", torch.nn.functional.scaled_dot_product_attention, causal, gqa, mask)
        with sdpa_kernel([SDPBackend.MATH]):
            mine = ops_of("cpu", sdpa.cuda_scaled_dot_product_attention, causal, gqa, mask)
        assert mine == ref


def test_math_backward_runs_with_gqa():
    q, k, v = qkv(dtype=F16, hk=2, grad=True)
    # sm75: no flash, no cuDNN; efficient takes GQA from 2.14 on
    with sdpa_kernel([SDPBackend.MATH]) if sdpa.TORCH >= (2, 14) else contextlib.nullcontext():
        assert pick(q, k, v, cap=(7, 5), enable_gqa=True) == "math"
        out, ops = run(q, k, v, cap=(7, 5), enable_gqa=True)
    assert out.shape == q.shape and q.grad.shape == q.shape and k.grad.shape == k.shape
    assert ops.find(aten._softmax_backward_data.default)


# --- host outputs, workspaces, meta corrections ------------------------------------------------

def test_host_outputs_are_the_efficient_seed_and_offset():
    eff = aten._scaled_dot_product_efficient_attention.default
    # attention.cu: seed/offset are CPU scalars outside graph capture (outputs 2 and 3)
    assert sdpa_memory.HOST_OUTPUTS[eff] == (2, 3) and len(eff._schema.returns) == 4
    # flash_api.cpp's rng_state and cuDNN's seed/offset are CUDA tensors: not host outputs
    assert aten._scaled_dot_product_flash_attention.default not in sdpa_memory.HOST_OUTPUTS
    assert aten._scaled_dot_product_cudnn_attention.default not in sdpa_memory.HOST_OUTPUTS


def test_flash_backward_workspaces():
    b, h, l, d = 2, 8, 200, 64
    q, k, v = qkv(b=b, h=h, l=l, d=d, grad=True)
    _, ops = run(q, k, v, cap=(8, 0))
    (c,) = ops.find(aten._scaled_dot_product_flash_attention_backward.default)
    ws = dict(sdpa_memory.workspace_bytes(c[0], c[1], c[3], c[2], capability=(8, 0)))
    lr = 256  # 200 rounded up to 128
    assert ws["flash backward softmax_d"] == 4 * b * h * lr
    assert ws["flash backward dq_accum"] == 4 * b * lr * h * 64  # 64 = round(64, 32)
    # the grad of out.sum() is an expanded tensor: _flash_attention_backward copies it
    assert ws["flash backward grad_out.contiguous()"] == b * l * h * d * 2
    # out has the strides of q (empty_like(q.transpose(1, 2)) in mha_fwd): for a (B, H, L, D)-
    # contiguous q, out.transpose(1, 2).contiguous() in _flash_attention_backward copies it
    assert ws["flash backward out.contiguous()"] == b * l * h * d * 2
    with FAKE:  # q, k, v viewed from (B, L, H, D) projections, the usual layout: no copy
        q2, k2, v2 = (torch.empty(b, l, h, d, dtype=BF16).transpose(1, 2).requires_grad_()
                      for _ in range(3))
    _, ops2 = run(q2, k2, v2, cap=(8, 0))
    (c2,) = ops2.find(aten._scaled_dot_product_flash_attention_backward.default)
    assert "flash backward out.contiguous()" not in dict(sdpa_memory.workspace_bytes(c2[0], c2[1], c2[3]))
    with FAKE:  # a (B, L, H, D)-contiguous grad: no copy
        g = torch.empty(b, l, h, d, dtype=BF16).transpose(1, 2)
    args = (g,) + tuple(c[1][1:])
    assert "flash backward grad_out.contiguous()" not in dict(
        sdpa_memory.workspace_bytes(c[0], args, c[3], c[2]))


def test_efficient_backward_workspace_fp32():
    b, h, l, d = 2, 4, 16, 64
    q, k, v = qkv(b=b, h=h, l=l, d=d, dtype=F32, grad=True)
    _, ops = run(q, k, v, cap=(8, 0))
    (c,) = ops.find(aten._scaled_dot_product_efficient_attention_backward.default)
    ws = dict(sdpa_memory.workspace_bytes(c[0], c[1], c[3], c[2], capability=(8, 0)))
    # fp32 sm80, max head dim 64: the 64x64 k64 kernel; gQ only (fp32 never stages gK/gV):
    # ceil(16/64) * ceil(64/64) * (4 + 64*64) floats per (batch, head), 4-aligned, 4 bytes each
    ((_, size),) = sdpa_memory._efficient_bwd_workspace(q, k, v, False, (8, 0))
    assert size == b * h * 4100 * 4
    # fp32's delta: (grad_out * out).sum(-1).transpose(-2, -1).contiguous(), in that order,
    # then the workspace (fxmem.trace.kernels.cuda.call_order frees the product and the sum first)
    got = sdpa_memory.workspace_bytes(c[0], c[1], c[3], c[2], capability=(8, 0))
    assert got[-4:] == [(sdpa_memory.EFF_PRODUCT, 4 * b * l * h * d),
                        (sdpa_memory.EFF_SUM, 4 * b * l * h),
                        (sdpa_memory.EFF_DELTA, 4 * b * h * l),
                        ("efficient backward workspace", size)]
    assert ws["efficient backward delta"] == 4 * b * h * l


def test_efficient_forward_output_accumulator():
    q, k, v = qkv(d=160, dtype=F16)  # > 128: the gmem kernel, an fp32 accumulator
    with FAKE:
        out = aten._scaled_dot_product_efficient_attention.default(q, k, v, None, False)
    op = aten._scaled_dot_product_efficient_attention.default
    assert sdpa_memory.workspace_bytes(op, (q, k, v, None, False), out) == [
        ("efficient output_accum", 4 * 2 * 128 * 8 * 160)]
    q, k, v = qkv(d=128, dtype=F16)
    assert sdpa_memory.workspace_bytes(op, (q, k, v, None, False), out) == []


def test_safe_softmax_temporaries():
    """SoftMax.cpp _safe_softmax: a bool of the input, its all() over dim, a 0-dim zero."""
    op = aten._safe_softmax.default
    with FAKE:
        x = torch.empty(2, 4, 128, 96)
    assert sdpa_memory.workspace_bytes(op, (x, -1), None) == [
        ("_safe_softmax: input == -inf (bool)", 2 * 4 * 128 * 96),
        ("_safe_softmax: its all() over the softmax dim (bool)", 2 * 4 * 128),
        ("_safe_softmax: the 0-dim zero", 4)]
    assert sdpa_memory.workspace_bytes(op, (x, 1), None)[1][1] == 2 * 128 * 96
    assert sdpa_memory.workspace_bytes(op, (x, -1), None, {"dtype": F16})[2][1] == 2


def test_bmm_clones_an_operand_cublas_cannot_take():
    """Blas.cpp prepare_batch_matrix_for_cublas: an expanded operand (strides 0) is cloned;
    contiguous and transposed ones are used as they are."""
    op = aten.bmm.default
    with FAKE:
        a = torch.empty(8, 128, 128)
        g = torch.empty(()).expand(8, 128, 64)  # out.sum()'s gradient, viewed
        v = torch.empty(8, 128, 64)
    assert sdpa_memory.workspace_bytes(op, (a.transpose(1, 2), g), None) == [
        ("bmm: mat2 cloned contiguous for cuBLAS (prepare_batch_matrix_for_cublas)",
         8 * 128 * 64 * 4)]
    assert [n for _, n in sdpa_memory.workspace_bytes(op, (g, v.transpose(1, 2)), None)] == [
        8 * 128 * 64 * 4]
    both = sdpa_memory.workspace_bytes(op, (g, g.transpose(1, 2)), None)  # mat2's first
    assert [w.split()[1] for w, _ in both] == ["mat2", "self"]
    assert sdpa_memory.workspace_bytes(op, (a, v), None) == []
    assert sdpa_memory.workspace_bytes(op, (a.transpose(1, 2), v), None) == []
    assert sdpa_memory.workspace_bytes(op, (v, v.transpose(1, 2)), None) == []


def test_cudnn_backward_workspace_is_the_frontends_part():
    """cudnn_frontend's fp32 dQ accumulator and softmax_sum, in the backward's workspace."""
    b, h, l, d = 2, 8, 128, 64
    q, k, v = qkv(b=b, h=h, l=l, d=d, grad=True)
    _, ops = run(q, k, v, cap=(9, 0))
    (c,) = ops.find(aten._scaled_dot_product_cudnn_attention_backward.default)
    ws = sdpa_memory.workspace_bytes(c[0], c[1], c[3], c[2], capability=(9, 0))
    # out.sum()'s gradient is expanded (last stride 0): dO is re-laid out first
    assert [n for _, n in ws] == [b * h * l * d * 2, 4 * b * h * l * (d + 1)]


def test_cudnn_meta_corrections():
    op = aten._scaled_dot_product_cudnn_attention.default
    q, k, v = qkv()
    with FAKE:
        out = op(q, k, v, None, False)
    real = sdpa_memory.cuda_outputs(op, (q, k, v, None, False), out)
    assert out[1].shape == (2, 8, 128, 1) and real[1][0] == (0,)  # no logsumexp allocated
    assert real[6] == real[7] == ((), torch.int64, "cuda")
    assert sdpa_memory.cuda_outputs(aten.mm.default, (), ()) is None


# --- (c) symbolic B and L ----------------------------------------------------------------------

def _symbolic_env():
    env = ShapeEnv(specialize_zero_one=False, duck_shape=False)
    syms = {}
    for name, hint in (("B", 8), ("L", 128)):
        s = env.create_symbol(hint, source=ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        env.constrain_symbol_range(s, compiler_min=1, compiler_max=2**62)
        syms[s] = env.create_symintnode(s, hint=hint)
    return env, syms


@pytest.mark.parametrize("dtype,cap,mask,expected", [
    (BF16, (8, 0), False, "flash"), (F32, (8, 0), False, "efficient"),
    (BF16, (9, 0), False, "cudnn"), (F32, (8, 0), True, "efficient"),
    (BF16, (7, 5), False, "math")])
def test_symbolic_sizes_are_not_specialized(dtype, cap, mask, expected):
    env, syms = _symbolic_env()
    bsym, lsym = list(syms)
    b, l = syms[bsym], syms[lsym]
    with FakeTensorMode(shape_env=env):
        q, k, v = (torch.empty(b, 8, l, 64, dtype=dtype, requires_grad=True) for _ in range(3))
        m = torch.ones(l, l, dtype=torch.bool) if mask else None
        assert sdpa.choose(q, k, v, m, is_causal=False, capability=cap).backend == expected
        with tracing_shims(), Ops() as ops:  # torch 2.11's C++ matmul: fxmem.trace.kernels.compat
            out = sdpa.cuda_scaled_dot_product_attention(q, k, v, m, capability=cap)
            out.sum().backward()
        guards = len(env.guards)
        ws = [w for c in ops.calls for w in sdpa_memory.workspace_bytes(c[0], c[1], c[3], c[2],
                                                                         capability=cap)]
    sizes = [n for _, n in ws]
    assert len(env.guards) == guards  # workspaces are formulas: they decide nothing
    assert sizes  # math: _safe_softmax's temporaries only (its bmm's operands need no copy)
    assert (expected == "math") == all(w.startswith("_safe_softmax") for w, _ in ws)
    for n in sizes:  # in B and L only
        assert isinstance(n, int) or n.node.expr.free_symbols <= {bsym, lsym}
    for g in env.guards:  # no guard pins B or L to a value
        assert not (g.expr.is_Equality and g.expr.free_symbols & {bsym, lsym}), g.expr
    assert not set(env.replacements) & {bsym, lsym}
    assert {bsym, lsym} <= out.shape[0].node.expr.free_symbols | out.shape[2].node.expr.free_symbols
