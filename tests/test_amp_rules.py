"""CUDA autocast emulated on CPU (fxmem.trace.kernels.amp) and the GradScaler.

The emulation is checked three ways: its table against what the installed PyTorch registers
(dispatcher and header); the machinery against real CPU autocast (emulating the CPU with its
own table must change nothing, to the byte); and fxmem's trace with CUDA's rules against a
real eager CPU step run under the same emulation."""

import copy
import os
import re

import pytest
import torch
import torch.nn.functional as F

import fxmem
from fxmem.trace.kernels import amp
from fxmem.trace.kernels.amp import Policy, emulate
from fxmem.memory.graph import build_graph
from fxmem.memory.liveness import liveness
from fxmem.memory.liveness import parts_of
from fxmem.report.result import Report
from fxmem.trace import trace
from zoo import ZOO


def _dispatcher_ops(key):
    return {n[len("aten::"):] for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(n, key)}


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_table_lists_every_op_the_build_registers(device):
    # a CUDA build also registers cuDNN's RNN cast (cudnn/AutocastRNN.cpp:
    # fxmem.trace.kernels.cuda.rnn)
    ops = _dispatcher_ops(amp.DISPATCH_KEY[device]) - {"_cudnn_rnn"}
    assert len(ops) > 100
    assert set(amp.registered(device)) == ops


def test_cuda_policies_match_the_installed_header():
    header = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")
    if not os.path.exists(header):
        pytest.skip("this PyTorch install has no C++ headers")
    text = open(header).read()

    def macro(name):
        body = re.search(rf"#define {name}\(_\)(.*?)\n\s*\n", text, re.S).group(1)
        return body

    def names(name):
        out = set()
        for op, overload in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", macro(name)):
            out.add(f"{op}.{overload}" if overload else op)
        return out

    cuda = amp.registered("cuda")  # the table spans releases; the build lists its own
    expected = {
        Policy.LOWER: names("AT_FORALL_LOWER_PRECISION_FP"),
        Policy.FP32: names("AT_FORALL_FP32"),
        Policy.FP32_SET_OPT_DTYPE: names("AT_FORALL_FP32_SET_OPT_DTYPE"),
        Policy.PROMOTE: names("AT_FORALL_PROMOTE"),
        Policy.FP32_APPEND_DTYPE: set(re.findall(
            r'"(norm\.\w+)"', macro("AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE"))),
    }
    for policy, ops in expected.items():
        assert len(ops) >= 2
        # registered one by one in autocast_mode.cpp, not through the header's lists: cuDNN's
        # convolutions; linalg_matrix_sqrth (2.15: its meta kernel refuses 16-bit inputs, so
        # fp32 as on the CPU, where a bfloat16 input comes out float32)
        assert ops == {n for n, p in cuda.items() if p is policy} - {
            "cudnn_convolution", "cudnn_convolution_transpose", "linalg_matrix_sqrth"}, policy


def _run_ops(dtype):
    """A few ops of every policy, on float32 inputs and a float32 leaf (a weight)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 6))
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    with torch.autocast("cpu", dtype=dtype):
        h = x @ w                               # lower (mm / matmul)
        outs = dict(
            mm=h, linear=F.linear(x, w), conv=F.conv1d(x[None], w[:, :, None][:, :4]),
            softmax=h.softmax(-1), log_softmax=F.log_softmax(h, -1), sum=h.sum(),
            sum_dim=h.sum(1), cumsum=h.cumsum(0), prod=h.prod(), exp=h.exp(), log=h.abs().log(),
            pow=h.pow(2), layer_norm=F.layer_norm(h, (6,)), group_norm=F.group_norm(h, 2),
            norm=h.norm(), norm_dim=h.norm(2, dim=1), vector_norm=torch.linalg.vector_norm(h),
            mse=F.mse_loss(h, y), nll=F.nll_loss(h.log_softmax(-1), torch.zeros(4).long()),
            cat=torch.cat([h, y]), stack=torch.stack([h, y]), addcmul=torch.addcmul(y, h, h),
            atan2=torch.atan2(h, y), cdist=torch.cdist(h, y), bce_logits=
            F.binary_cross_entropy_with_logits(h, y.sigmoid()),
            same_weight_twice=(x @ w) + (y @ w),
        )
    return outs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulating_the_cpu_changes_nothing(dtype):
    real = _run_ops(dtype)
    with emulate("cpu"):
        emulated = _run_ops(dtype)
    for k in real:
        assert emulated[k].dtype == real[k].dtype, k
        assert torch.equal(emulated[k], real[k]), k


def test_cuda_rules_differ_from_the_cpu_where_the_lists_do():
    with emulate("cuda"):
        cuda = _run_ops(torch.float16)
    cpu = _run_ops(torch.float16)
    f16, f32 = torch.float16, torch.float32
    assert {k: v.dtype for k, v in cuda.items()} == {
        "mm": f16, "linear": f16, "conv": f16, "softmax": f32, "log_softmax": f32, "sum": f32,
        "sum_dim": f32, "cumsum": f32, "prod": f32, "exp": f32, "log": f32, "pow": f32,
        "layer_norm": f32, "group_norm": f32, "norm": f32, "norm_dim": f32,
        "vector_norm": f32, "mse": f32, "nll": f32, "cat": f32, "stack": f32,
        "addcmul": f32, "atan2": f32, "cdist": f32, "bce_logits": f32,
        "same_weight_twice": f16}
    assert cpu["softmax"].dtype == f16 and cpu["layer_norm"].dtype == f16  # not CPU-listed


def test_cuda_bans_binary_cross_entropy():
    p, y = torch.rand(4, requires_grad=True), torch.rand(4)
    with emulate("cuda"), torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, y)


def test_weight_cast_cache_lives_for_the_autocast_region():
    w = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(2, 8)
    original = torch.clear_autocast_cache
    with emulate("cuda"):
        with torch.autocast("cpu", dtype=torch.float16):
            a = x @ w
            assert len(amp._cache) == 1
            with torch.autocast("cpu", enabled=False):  # a nested region does not clear it
                pass
            assert len(amp._cache) == 1
            a.grad_fn.next_functions  # the cast is an autograd op (ToCopyBackward0)
            assert "ToCopy" in type(a.grad_fn.next_functions[1][0]).__name__
        assert not amp._cache  # the outermost exit cleared it
        assert torch.clear_autocast_cache is not original
    assert torch.clear_autocast_cache is original


def test_emulate_restores_kernels_after_an_error():
    with pytest.raises(ZeroDivisionError):
        with emulate("cuda"):
            1 / 0
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.randn(2, 2).softmax(-1).dtype == torch.float32  # not listed on CPU
        h = torch.randn(2, 2) @ torch.randn(2, 2)
        assert h.softmax(-1).dtype == torch.float16
    assert not amp._cache
    with emulate("cuda"):  # the lock was released
        pass
    with pytest.raises(fxmem.InputError, match="no autocast rules"):
        with emulate("tpu"):
            pass


def _cpu_report(t):
    lv = liveness(build_graph(t), "cpu")
    return Report(lv, parts_of(lv), t.guards)


def _cuda_check(name, dtype, train, optimizer=None, batches=(2, 13), **extra):
    """fxmem with CUDA's rules (device="cuda"), its live bytes without the allocator's
    rounding, against a real CPU step under the same emulated autocast lists. The trace keeps
    the CPU's kernels (kernel_semantics=False), which a CPU step runs; what CUDA's kernels
    allocate instead (fxmem.trace.kernels.cuda.kernels) is checked in test_kernels.py and
    test_sdpa.py."""
    model, x, y, loss = ZOO[name]()
    opt = optimizer or (lambda p: torch.optim.Adam(p, foreach=True))
    kw = dict(loss=loss, optimizer=opt, **extra) if train else dict(train=False)
    yy = y if train else ()
    r = _cpu_report(trace(model, x, yy, **kw, device="cuda", amp=dtype,
                          kernel_semantics=False))
    for b in batches:
        with emulate("cuda"):
            m = fxmem.measure(model, x, yy, **kw, B=b, amp=dtype)
        assert r.peak_bytes(b) == m.peak_bytes, (name, b)
    return r


@pytest.mark.parametrize("name", ["mlp", "seed_cnn", "resnet", "transformer_train_mode", "unet",
                                  "tied_reuse", "keeps_locals"])
@pytest.mark.parametrize("dtype,train", [(torch.float16, True), (torch.bfloat16, False)])
def test_cuda_rules_trace_equals_eager(name, dtype, train):
    _cuda_check(name, dtype, train)


@pytest.mark.parametrize("dtype,train", [(torch.bfloat16, True), (torch.float16, False)])
def test_cuda_rules_other_dtype(dtype, train):
    _cuda_check("transformer_train_mode", dtype, train)


def test_cuda_rules_differ_from_cpu_rules_in_the_analysis():
    # the lists differ (CUDA: layer_norm and softmax in float32, the CPU: in bfloat16), and so
    # do the activations: LayerNorm saves a float32 copy of its input, softmax its float32 result
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32),
                                torch.nn.Softmax(-1))
    kw = dict(loss=lambda o: o.float().sum(), optimizer=lambda p: torch.optim.Adam(p, foreach=True))
    x = torch.randn(4, 16)
    cuda = _cpu_report(trace(model, x, **kw, device="cuda", amp=torch.bfloat16))
    cpu = fxmem.analyze(model, x, **kw, device="cpu", amp=torch.bfloat16)
    slope = lambda r: r.parts["activations"].coeff(fxmem.B)  # noqa: E731
    # saved per sample: the linear's bf16 copy of its input (16 values, 32 B) on both; then
    # CUDA: LayerNorm's fp32 copy of its input 128 B (32 values), fp32 mean and rstd 8 B,
    # softmax's fp32 result 128 B; the CPU: LayerNorm's bf16 input 64 B, bf16 statistics 4 B,
    # softmax's bf16 result 64 B
    assert (slope(cuda), slope(cpu)) == (32 + 128 + 8 + 128, 32 + 64 + 4 + 64)


def test_checkpoint_plan_under_cuda_rules():
    from fxmem.checkpoint.plans import derive

    model, x, y, loss = ZOO["resnet"]()
    kw = dict(loss=loss, optimizer=lambda p: torch.optim.Adam(p, foreach=True))
    plan = ["layer1.0", "layer1.1"]
    t = trace(model, x, y, **kw, device="cuda", amp=torch.float16, kernel_semantics=False)
    derived = _cpu_report(derive(t, plan))  # the re-run repeats the weight casts
    wrapped = fxmem.apply_checkpoints(copy.deepcopy(model), plan)
    retraced = _cpu_report(trace(wrapped, x, y, **kw, device="cuda", amp=torch.float16,
                                 kernel_semantics=False))
    for b in (2, 13):
        with emulate("cuda"):
            m = fxmem.measure(wrapped, x, y, **kw, B=b, amp=torch.float16)
        assert retraced.peak_bytes(b) == m.peak_bytes  # the re-run's casts die at its exit
        assert derived.peak_bytes(b) == m.peak_bytes


# GradScaler ---------------------------------------------------------------------------

def test_float16_training_uses_a_grad_scaler_by_default():
    model, x, y, loss = ZOO["mlp"]()
    kw = dict(loss=loss, optimizer=torch.optim.Adam, device="cpu")
    with_scaler = fxmem.analyze(model, x, y, **kw, amp=torch.float16)
    without = fxmem.analyze(model, x, y, **kw, amp=torch.float16, grad_scaler=False)
    names = {s.name for s in with_scaler.trace.storages if s.category == "optimizer_state"}
    assert {"grad_scaler.scale", "grad_scaler.growth_tracker"} <= names
    assert with_scaler.parts["optimizer_state"] == without.parts["optimizer_state"] + 8
    for b in (2, 13):
        assert without.peak_bytes(b) == fxmem.measure(
            model, x, y, loss=loss, optimizer=torch.optim.Adam, B=b, amp=torch.float16,
            grad_scaler=False).peak_bytes


@pytest.mark.parametrize("optimizer", [
    lambda p: torch.optim.Adam(p, fused=True),     # the scaler hands its scale to the kernel
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=False),
    lambda p: torch.optim.AdamW(p, foreach=True),
], ids=["adam_fused", "sgd_loop", "adamw_foreach"])
def test_grad_scaler_with_optimizers(optimizer):
    model, x, y, loss = ZOO["seed_cnn"]()
    kw = dict(loss=loss, optimizer=optimizer, device="cpu", amp=torch.float16)
    r = fxmem.analyze(model, x, y, **kw)
    for b in (2, 13):
        assert r.peak_bytes(b) == fxmem.measure(model, x, y, **kw, B=b).peak_bytes


def test_grad_scaler_with_accumulation_and_cuda_rules():
    _cuda_check("mlp", torch.float16, True, grad_accum=3)


def test_grad_scaler_arguments_are_checked():
    model, x, y, loss = ZOO["mlp"]()
    with pytest.raises(fxmem.InputError, match="grad_scaler=True needs"):
        fxmem.analyze(model, x, y, loss=loss, device="cpu", amp=torch.float16,
                      grad_scaler=True)
    with pytest.raises(fxmem.InputError, match="grad_scaler must be"):
        fxmem.analyze(model, x, y, loss=loss, optimizer=torch.optim.SGD, device="cpu",
                      grad_scaler="yes")
