"""CUDA kernel semantics (fxmem.trace.kernels.cuda.kernels): each rule against PyTorch's meta kernel
for the CUDA op or a derivation from the source, and a whole transformer layer against the published
formula of Korthikanti et al. 2022."""

from pathlib import Path

import fakegpu_targets
import pytest
import sympy
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import fxmem
from fxmem.trace.kernels.compat import TORCH
from fxmem.trace.kernels.cuda import kernels
from fxmem.formula.symbols import B, L
from fxmem.trace import trace
from fxmem.validate.zoo import MegatronStack

aten = torch.ops.aten


def _ops(t, phase=None):
    return [o.op for o in t.ops if phase is None or o.phase == phase]


def _created(t, op):
    """(dtype, shape, bytes) of the storages each call of ``op`` created, in order."""
    out = []
    for o in t.ops:
        if o.op == op:
            out.append([(t.storages[s].dtype, t.storages[s].shape, t.storages[s].size.expr)
                        for s in o.new_sids])
    return out


# --- rules table ------------------------------------------------------------------------------

HERE = Path(__file__).resolve().parent
FAKE_GPU_TESTS = ("test_fake_gpu.py", "test_fake_gpu_blas.py", "test_fake_gpu_sdpa.py",
                  "test_fake_gpu_cudnn.py", "test_fake_gpu_causes.py")

def test_every_rule_names_its_source_and_releases():
    assert kernels.RULES
    for r in kernels.RULES:
        assert r.kind in ("route", "outputs", "workspace", "host", "unmodelled", "stub"), r
        assert ".c" in r.follows or ".py" in r.follows or ".h" in r.follows, r
        # read on 2.13's sources (the release CI installs), or run on the fake GPU
        assert "2.13" in r.checked or set(r.ran) >= {"2.14", "2.15"}, r
        assert bool(r.ran) == bool(r.cases), r
        for case in r.cases:  # each names a model or a test that CI runs on the fake GPU
            assert case in fakegpu_targets.RULES or any(
                f"def {case}(" in (HERE / f).read_text() for f in FAKE_GPU_TESTS), (r.op, case)
        if "attention" in r.op:
            # fxmem.trace.kernels.cuda.sdpa gates 2.11's rules
            assert set(r.checked) >= {"2.11", "2.13"}, r
        assert r.cuda, r


def test_routes_are_restored_on_exit_and_not_reentrant():
    before = {n: torch._C._dispatch_dump(f"aten::{n}") for n in ("dropout",
                                                                 "scaled_dot_product_attention")}
    with kernels.cuda_kernels():
        assert torch._C._dispatch_dump("aten::dropout") != before["dropout"]
        with pytest.raises(fxmem.InputError, match="not re-entrant"):
            with kernels.cuda_kernels():
                pass
    assert {n: torch._C._dispatch_dump(f"aten::{n}") for n in before} == before


@pytest.mark.parametrize("bad", [(9,), "9.0", (9, 0, 1), (True, 0), (2, 0), (9, 10)])
def test_compute_capability_is_checked_before_any_work(bad):
    with pytest.raises(fxmem.InputError, match="compute_capability"):
        fxmem.analyze(torch.nn.Linear(2, 2), torch.randn(2, 2), loss=lambda o: o.sum(),
                      compute_capability=bad)


def test_compute_capability_accepts_a_number():
    assert kernels.check_capability(8.6) == (8, 6)
    assert kernels.check_capability((9, 0)) == (9, 0)


# --- dropout ----------------------------------------------------------------------------------

def test_dropout_on_cuda_is_native_dropout_with_a_bool_mask():
    """Dropout.cpp dropout(): a CUDA tensor with 0 < p < 1 takes native_dropout; its mask is
    what PyTorch's meta kernel for native_dropout says (bool, the input's shape), made before
    the output (Dropout.cu dropout_cuda; fxmem.trace.kernels.cuda.call_order)."""
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.1))
    cpu = trace(m, torch.randn(4, 16), loss=lambda o: o.sum(), device="cpu")
    cuda = trace(m, torch.randn(4, 16), loss=lambda o: o.sum(), device="cuda")
    assert "aten.bernoulli_.float" in _ops(cpu, "forward")
    assert "aten.native_dropout.default" not in _ops(cpu)
    assert "aten.bernoulli_.float" not in _ops(cuda)
    assert _ops(cuda, "backward").count("aten.native_dropout_backward.default") == 1
    out, mask = aten.native_dropout.default(torch.empty(7, 32, device="meta"), 0.1, True)
    (made,) = _created(cuda, "aten.native_dropout.default")
    assert [(d, sh) for d, sh, _ in made] == [(mask.dtype, (B, 32)), (out.dtype, (B, 32))]
    assert mask.dtype == torch.bool and [n for *_, n in made] == [32 * B, 128 * B]
    saved = [s for s in cuda.storages if s.saved and s.dtype == torch.bool]
    assert [s.size.expr for s in saved] == [32 * B]


@pytest.mark.parametrize("p,train", [(0.0, True), (1.0, True), (0.3, False)])
def test_dropout_without_the_fused_kernel_is_the_composite(p, train):
    """p == 0, p == 1 or eval: _dropout_impl, the same on both devices."""
    x = torch.randn(4, 8)
    with kernels.cuda_kernels():
        got = F.dropout(x, p, train)
    want = F.dropout(x, p, train)
    assert torch.equal(got, want)
    assert (got is x) == (want is x)


def test_dropout_probability_is_checked():
    with kernels.cuda_kernels(), pytest.raises(RuntimeError, match="between 0 and 1"):
        torch.dropout(torch.randn(2), 1.5, True)


# --- layer norm -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,acc", [(torch.float16, torch.float32),
                                       (torch.bfloat16, torch.float32),
                                       (torch.float32, torch.float32),
                                       (torch.float64, torch.float64)])
def test_layer_norm_statistics_are_in_the_accumulate_type(dtype, acc):
    """layer_norm_kernel.cu layer_norm_cuda: mean and rstd in acc_type (fp32 for 16-bit
    inputs), in the meta kernel's shape; the CPU keeps the input's dtype."""
    m = torch.nn.LayerNorm(24).to(dtype)
    x = torch.randn(3, 5, 24, dtype=dtype)
    with FakeTensorMode():
        meta = aten.native_layer_norm.default(torch.empty(7, 5, 24, dtype=dtype), [24],
                                              None, None, 1e-5)
    for device, want in (("cpu", meta[1].dtype), ("cuda", acc)):
        t = trace(m, x, loss=lambda o: o.float().sum(), device=device)
        (made,) = _created(t, "aten.native_layer_norm.default")
        size = torch.empty((), dtype=want).element_size()
        assert made[1:] == [(want, (B, 5, 1), 5 * size * B)] * 2, device
    assert meta[1].dtype == dtype  # what the CPU build (and its meta kernel) allocates


# --- a whole layer: Korthikanti et al. 2022 ----------------------------------------------------

H, HEADS = 64, 4


def _saved_by_layer(t, i):
    """Bytes a layer's forward saves for backward: every storage saved by it or a submodule,
    parameters (and their autocast copies' sources) aside."""
    inside = f"layers.{i}"
    return sympy.expand(sum((s.size.expr for s in t.storages if s.saved and s.category != "param"
                             and any(p == inside or p.startswith(inside + ".")
                                     for p in s.saved_by)), sympy.Integer(0)))


def _megatron(device, dtype=torch.float16, amp=None):
    m = MegatronStack(3, H, HEADS)
    if amp is None:
        m = m.to(dtype)
    return trace(m, torch.randn(2, 16, H, dtype=dtype if amp is None else torch.float32),
                 loss=lambda o: o.float().pow(2).mean(), device=device, amp=amp,
                 dims={"L": [(0, 1)]})


# s, b, h, a as the paper writes them: sequence, batch, hidden, heads
s_, b_, h_, a_ = L, B, H, HEADS
PAPER = s_ * b_ * h_ * (34 + sympy.Rational(5 * a_) * s_ / h_)  # eq. 1, 16-bit, 1-byte masks


def test_megatron_layer_is_the_papers_formula_plus_fp32_layernorm_statistics_on_cuda():
    """fp16 weights and activations: eq. 1 of the paper to the byte, plus what the paper
    leaves out, LayerNorm's mean and rstd, 2 per token per LayerNorm in float32 (16·s·b)."""
    t = _megatron("cuda")
    for i in range(3):
        assert sympy.expand(_saved_by_layer(t, i) - PAPER - 16 * s_ * b_) == 0


def test_megatron_layer_on_cpu_keeps_cpu_kernels():
    """device="cpu" (checked against fxmem.measure elsewhere): dropout masks in the input's
    dtype (2 bytes: +a·s²·b for the attention mask, +2·s·b·h for the two others) and
    LayerNorm statistics in fp16 (8·s·b)."""
    t = _megatron("cpu")
    assert sympy.expand(_saved_by_layer(t, 1) - PAPER
                        - (a_ * s_**2 * b_ + 2 * s_ * b_ * h_ + 8 * s_ * b_)) == 0


@pytest.mark.parametrize("amp", [torch.float16, torch.bfloat16])
def test_megatron_layer_under_cuda_autocast(amp):
    """fp32 weights under CUDA autocast (fxmem.trace.kernels.amp): layer_norm is on the fp32 list,
    so both LayerNorms save their fp32 input (+2·s·b·h each) and return fp32 statistics (16·s·b);
    softmax is on the fp32_set_opt_dtype list, so the probabilities are fp32 (+2·a·s²·b) and
    dropout's output is fp32 too, its fp16 copy for bmm being the paper's 2·a·s²·b; the rest is
    16-bit as the paper counts it. bf16 and fp16 follow the same lists. The linears also
    save the 16-bit copies of their weights that autocast's cache makes (2·12·h² bytes)."""
    t = _megatron("cuda", amp=amp)
    derived = (PAPER + 4 * s_ * b_ * h_ + 2 * a_ * s_**2 * b_ + 16 * s_ * b_
               + 2 * 12 * h_**2)
    assert sympy.expand(_saved_by_layer(t, 1) - derived) == 0


def test_megatron_layer_in_fp32_on_cuda():
    """fp32 everything: twice the paper's 16-bit tensors, the three masks still 1 byte
    (2·eq.1 - a·s²·b - 2·s·b·h), plus the statistics."""
    t = _megatron("cuda", dtype=torch.float32)
    derived = 2 * PAPER - a_ * s_**2 * b_ - 2 * s_ * b_ * h_ + 16 * s_ * b_
    assert sympy.expand(_saved_by_layer(t, 1) - derived) == 0


# --- softmax, RMSNorm, batch norm, log_sigmoid -------------------------------------------------

def test_float16_softmax_asked_for_float32_is_half_to_float_on_cuda():
    """SoftMax.cpp softmax(): a CUDA half input with dtype=float runs
    _softmax(half_to_float=True), whose meta kernel returns float32; no float32 copy of the
    input is made first (the CPU's branch converts it, then runs _softmax in float32)."""
    m = torch.nn.Linear(8, 16).half()
    loss = lambda o: F.softmax(o, -1, dtype=torch.float32).sum()  # noqa: E731
    x = torch.randn(4, 8, dtype=torch.float16)
    meta = aten._softmax.default(torch.empty(7, 16, dtype=torch.float16, device="meta"), -1, True)
    cuda = trace(m, x, loss=loss, device="cuda")
    cpu = trace(m, x, loss=loss, device="cpu")
    (made,) = _created(cuda, "aten._softmax.default")
    assert made == [(meta.dtype, (B, 16), 64 * B)] and meta.dtype == torch.float32
    fwd = [o for o in cuda.ops if o.phase == "forward"]
    assert "aten._to_copy.default" not in [o.op for o in fwd]
    assert "aten._to_copy.default" in _ops(cpu, "forward")  # x.to(float32) first
    (grad,) = _created(cuda, "aten._softmax_backward_data.default")
    assert grad[0][0] == torch.float16  # input_dtype: the gradient comes back in float16


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_is_cudas_fused_kernel(dtype):
    """layer_norm.cpp rms_norm_symint calls _fused_rms_norm; CUDA's kernel saves the input,
    the weight and a float32 rstd per row (derivatives.yaml), while the CPU decomposes it
    above autograd and saves float32 copies of the activations."""
    m = torch.nn.RMSNorm(32).to(dtype)
    x = torch.randn(4, 6, 32, dtype=dtype)
    cuda = trace(m, x, loss=lambda o: o.float().sum(), device="cuda")
    assert "aten._fused_rms_norm.default" in _ops(cuda, "forward")
    assert "aten._fused_rms_norm_backward.default" in _ops(cuda, "backward")
    saved = sorted((str(s.dtype), s.shape) for s in cuda.storages
                   if s.saved and s.category not in ("param", "input"))
    assert saved == [("torch.float32", (B, 6, 1))]  # rstd; the input and weight are not new
    cpu = trace(m, x, loss=lambda o: o.float().sum(), device="cpu")
    assert "aten._fused_rms_norm.default" not in _ops(cpu)
    assert any(s.saved and s.shape == (B, 6, 32) and s.dtype == torch.float32
               for s in cpu.storages if s.category == "activation")


@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_statistics_on_cuda(train):
    """cuda/Normalization.cu batch_norm_cuda: save_mean and save_invstd {C} in the accumulate
    type, in eval too; fp16 weights rule out cuDNN (Normalization.cpp
    _select_batch_norm_backend), so the native kernel runs. The CPU keeps float16, {0} in
    eval."""
    m = torch.nn.BatchNorm2d(8).half()
    if not train:
        m.eval()
    x = torch.randn(2, 8, 5, 5, dtype=torch.float16)
    kw = dict(loss=lambda o: o.float().sum()) if train else dict(train=False)
    (cuda,) = _created(trace(m, x, **kw, device="cuda"), "aten.native_batch_norm.default")
    (cpu,) = _created(trace(m, x, **kw, device="cpu"), "aten.native_batch_norm.default")
    assert cuda[1:3] == [(torch.float32, (8,), 32)] * 2
    assert cpu[1:3] == ([(torch.float16, (8,), 16)] * 2 if train else
                        [(torch.float16, (0,), 0)] * 2)


def test_cudnn_batch_norm_reserve_is_listed_not_hidden():
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    x = torch.randn(2, 3, 8, 8)
    r = fxmem.analyze(m, x, loss=lambda o: o.sum())
    assert [(op, mod) for op, mod, _ in r.unmodelled] == [("aten.native_batch_norm.default", "1")]
    assert "reserve space" in r.unmodelled[0][2]
    cpu = fxmem.analyze(m, x, loss=lambda o: o.sum(), device="cpu")
    assert cpu.unmodelled == ()
    bf16 = fxmem.analyze(m.to(torch.bfloat16), x.to(torch.bfloat16), loss=lambda o: o.sum())
    assert bf16.unmodelled == ()  # bfloat16 batch norm: the native kernel, no cuDNN


def test_log_sigmoid_keeps_no_buffer_on_cuda():
    """cuda/Activation.cpp log_sigmoid_forward_cuda: the buffer is empty on CUDA; the CPU
    returns a full-size one, which backward keeps."""
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LogSigmoid())
    x = torch.randn(4, 8)
    (cuda,) = _created(trace(m, x, loss=lambda o: o.sum(), device="cuda"),
                       "aten.log_sigmoid_forward.default")
    (cpu,) = _created(trace(m, x, loss=lambda o: o.sum(), device="cpu"),
                      "aten.log_sigmoid_forward.default")
    assert cuda[1][2] == 0 and cpu[1][2] == 64 * B


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("index", [torch.int32, torch.int64])
def test_embedding_bag_outputs_are_the_cuda_meta_kernels(mode, last, index):
    """PyTorch's meta kernel of _embedding_bag has CUDA's branch (device_hint): run on fake
    CUDA tensors (no autograd needed), it is what the rule must give for fake CPU ones."""
    def outputs(device, offsets=index):
        with FakeTensorMode(allow_non_fake_inputs=True):
            w = torch.empty(100, 16, device=device)
            idx = torch.zeros(40, dtype=index, device=device)
            off = torch.zeros(9, dtype=offsets, device=device)
            args = (w, idx, off, False, mode, False, None, last)
            return args, aten._embedding_bag.default(*args)

    args, cpu = outputs("cpu")
    _, cuda = outputs("cuda")
    got = kernels.OUTPUT_RULES[aten._embedding_bag.default](args, cpu)
    assert [(tuple(o.shape), o.dtype) for o in got] == [(tuple(o.shape), o.dtype) for o in cuda]
    if mode == 0 or last:  # the CPU's fast sum path; include_last_offset's bag_size
        assert [o.shape for o in cpu] != [o.shape for o in cuda]
    # int32 indices, int64 offsets: _embedding_bag_cuda promotes both to int64 first
    # (promoteIndicesAndOffsets); the meta kernel keeps the indices' int32 there
    args, cpu = outputs("cpu", offsets=torch.int64)
    got = kernels.OUTPUT_RULES[aten._embedding_bag.default](args, cpu)
    assert [o.dtype for o in got[1:]] == [torch.int64] * 3


def test_embedding_bag_on_cuda_keeps_n_offsets_and_sorts_in_backward():
    m = torch.nn.EmbeddingBag(1000, 16, mode="sum")
    x = torch.randint(0, 1000, (4, 20))
    cuda, cpu = (trace(m, x, loss=lambda o: o.sum(), device=d) for d in ("cuda", "cpu"))
    (fwd,) = _created(cuda, "aten._embedding_bag.default")
    assert fwd[1][1:] == ((20 * B,), 160 * B)  # offset2bag: n indices
    assert _created(cpu, "aten._embedding_bag.default")[0][1][1] == (0,)  # CPU fast sum path
    # backward: a CUDA kernel since 2.11, which sorts the 20·B indices
    # (fxmem.trace.kernels.cuda.workspaces)
    (bwd,) = _created(cuda, "aten._embedding_bag_backward.default")
    workspaces = [n for dtype, _, n in bwd if dtype is None]
    assert workspaces.count(160 * B) >= 2  # sorted_indices, orig_indices (int64, n each)
    assert len(_created(cpu, "aten._embedding_bag_backward.default")[0]) == 1


def test_group_norm_copies_a_channels_last_input_on_cuda():
    """group_norm.cpp group_norm: off the CPU the input is made contiguous before
    native_group_norm (as the C++ composite does for fake CUDA tensors below), and autograd
    keeps that copy; the CPU keeps channels_last."""
    def composite(device):
        ops = []

        class Log(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                ops.append(str(func))
                return func(*args, **(kwargs or {}))

        with FakeTensorMode(allow_non_fake_inputs=True):
            x = torch.empty(2, 8, 4, 4, device=device).to(memory_format=torch.channels_last)
            w = torch.empty(8, device=device)
            with Log():
                F.group_norm(x, 2, w, w)
        return [o for o in ops if o.startswith("aten.")]

    # PyTorch's own composite on fake CUDA tensors (a CUDA build): up to 2.13 it copies
    # first, from 2.14 native_group_norm gets the input as it is (fxmem.trace.kernels.compat)
    copies = ["aten.clone.default"] if TORCH < (2, 14) else []
    assert composite("cuda") == [*copies, "aten.native_group_norm.default"]
    assert composite("cpu") == ["aten.native_group_norm.default"]
    with FakeTensorMode():
        x = torch.randn(2, 8, 4, 4).to(memory_format=torch.channels_last).requires_grad_()
        with kernels.cuda_kernels():
            y = F.group_norm(x, 2)
        saved = y.grad_fn._saved_input
    if TORCH < (2, 14):  # the copy is what autograd keeps
        assert y.is_contiguous() and saved.is_contiguous() and saved is not x
    else:  # the input itself; native_group_norm's copy lives while it runs (its Y is
        assert saved is x  # made contiguous by the recorder: the "outputs" rule)
    with pytest.raises(RuntimeError, match="divisible by num_groups"):
        with FakeTensorMode(), kernels.cuda_kernels():
            F.group_norm(torch.randn(2, 6, 4), 4)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_ctc_loss_is_refused_by_name_on_both_devices(device):
    """_ctc_loss's log_alpha is [B, T, 2·max(target_lengths)+1]: sized by the lengths' values,
    so neither device's kernel (native or cuDNN) can be traced on fake tensors."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 20)

        def forward(self, x):
            b, t = x.shape[:2]
            lp = self.proj(x).log_softmax(2).transpose(0, 1)
            return F.ctc_loss(lp, torch.ones(b, 5, dtype=torch.long), torch.full((b,), t),
                              torch.full((b,), 5))

    with pytest.raises(fxmem.TraceError, match=r"aten\._ctc_loss\.Tensor.*module \(root\)"):
        fxmem.analyze(M(), torch.randn(4, 30, 8), device=device)
