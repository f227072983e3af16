"""fxmem.trace.kernels.cuda.rnn: PyTorch's CUDA RNN kernels on CPU fake tensors (batch size
symbolic), each
expectation derived from the PyTorch source named in the test (torch 2.13)."""

import contextlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, statically_known_true
from torch.utils._python_dispatch import TorchDispatchMode

from fxmem.trace.kernels.cuda import rnn as cuda_rnn
from fxmem.trace.kernels.amp import emulate
from fxmem.trace.kernels.flat_weights import flat_rnn_params

aten = torch.ops.aten
T, BV, I, H, P = 7, 5, 4, 6, 3  # BV: the value behind the symbolic batch size
TOUCHED = (*cuda_rnn.routes(), *cuda_rnn.META, *cuda_rnn.autocast_routes(), *cuda_rnn.STUBS)


def _dumps():
    return tuple(torch._C._dispatch_dump(f"aten::{n}") for n in TOUCHED)


@pytest.fixture(autouse=True)
def _state_unchanged():
    before = (_dumps(), torch.backends.cudnn.enabled)
    yield
    assert (_dumps(), torch.backends.cudnn.enabled) == before


class Calls(TorchDispatchMode):
    """Records each op below autograd and applies cuda_rnn.outputs to it, as fxmem's tracer
    applies its CUDA output rules."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = cuda_rnn.outputs(func, args, kwargs or {}, func(*args, **(kwargs or {})))
        self.calls.append((func, args, kwargs or {}, out))
        return out

    def of(self, func):
        return [c for c in self.calls if c[0] is func]

    def names(self, skip=("detach", "zeros")):
        return [c[0].__name__.split(".")[0] for c in self.calls
                if c[0].namespace == "aten" and c[0].__name__.split(".")[0] not in skip]


@contextlib.contextmanager
def cuda(cudnn=True, capability=(9, 0)):
    """CUDA kernels installed, fake tensors, batch size symbolic (as fxmem's tracer makes it)."""
    from torch._dynamo.source import ConstantSource

    env = ShapeEnv(specialize_zero_one=False, duck_shape=False)
    mode = FakeTensorMode(shape_env=env)
    sym = env.create_symbol(BV, source=ConstantSource("B"), dynamic_dim=DimDynamic.DYNAMIC)
    env.constrain_symbol_range(sym, compiler_min=1, compiler_max=1 << 20)
    mode.B = env.create_symintnode(sym, hint=BV)
    with torch.backends.cudnn.flags(enabled=cudnn), cuda_rnn.installed(capability), mode:
        yield mode


def sym(mode, *shape, batch_dim, dtype=torch.float32):
    """A fake leaf whose dimension ``batch_dim`` is the symbolic batch size."""
    shape = [mode.B if i == batch_dim else n for i, n in enumerate(shape)]
    return torch.randn(*shape, dtype=dtype).requires_grad_()


def flattened(mode, m):
    """``m`` with its weights views of one flat buffer, as ``model.cuda()``'s
    ``flatten_parameters`` leaves them and fxmem's tracer fakes them for CUDA."""
    for name, p in flat_rnn_params(mode, m).items():
        setattr(m, name, p)
    return m


def same_storage(a, b):
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def known(cond):
    return statically_known_true(cond)


def cudnn_args(calls):
    (func, args, kwargs, out), = calls.of(aten._cudnn_rnn.default)
    return cuda_rnn._named(func, args, kwargs), out


# --- the routes and their registration ------------------------------------------------------------

def test_routes_replace_the_composites_nn_modules_call():
    """nn/modules/rnn.py calls _VF.lstm/gru/rnn_tanh/rnn_relu (input overload; data overload for
    a PackedSequence) and _VF.lstm_cell/gru_cell; all are CompositeImplicitAutograd kernels."""
    names = set(cuda_rnn.routes())
    assert names == {f"{n}.{o}" for n in ("lstm", "gru", "rnn_tanh", "rnn_relu")
                     for o in ("input", "data")} | {"lstm_cell", "gru_cell"}
    for n in names:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{n}",
                                                              "CompositeImplicitAutograd")
    # RNN.cpp SimpleCell has no device branch: rnn_tanh_cell/rnn_relu_cell are left alone


def test_no_stub_is_needed_and_registrations_are_removed_on_exit():
    """_cudnn_rnn, _cudnn_rnn_backward and the fused cells have an Autograd kernel and no CPU
    one; with META they trace on fake CPU tensors. Leaving installed() restores the dispatcher,
    even on error: the GRU cell has no meta kernel again."""
    assert cuda_rnn.STUBS == ()
    for n in ("_cudnn_rnn", "_cudnn_rnn_backward", "_thnn_fused_gru_cell"):
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{n}", "CPU")
    before = _dumps()
    with pytest.raises(KeyError), cuda_rnn.installed():
        assert _dumps() != before
        raise KeyError
    def gru_cell():
        with FakeTensorMode():
            g = torch.randn(2, 3 * H)
            return aten._thnn_fused_gru_cell(g, g, torch.randn(2, H))

    with cuda_rnn.installed():
        gru_cell()  # FakeTensorMode caches the answer process-wide: installed() drops it
    assert _dumps() == before
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_thnn_fused_gru_cell", "Meta"):
        return  # 2.15 has its own meta kernel for the GRU cell (fxmem's replaces it meanwhile)
    with pytest.raises(NotImplementedError):
        gru_cell()


# --- cuDNN ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("layers,bidir,batch_first,proj,dtype", [
    (1, False, False, 0, torch.float32), (2, True, True, 0, torch.float32),
    (2, False, True, P, torch.float16), (1, True, False, P, torch.float64)])
def test_cudnn_lstm_calls_cudnn_rnn_as_cudnn_impl_does(layers, bidir, batch_first, proj, dtype):
    """RNN.cpp lstm -> use_cudnn -> cudnn/RNN.cpp _cudnn_impl: weight_stride0 4 (+1 with
    projections), mode CUDNN_LSTM = 2, hidden_size cx.size(2), proj_size hx.size(2), the flat
    weight buffer that flatten_parameters made (an alias of the weights, no allocation), no
    batch sizes. Shapes: _output_size, _hidden_size, _cell_size."""
    dirs, out_size = 2 if bidir else 1, proj or H
    with cuda() as mode:
        m = flattened(mode, torch.nn.LSTM(I, H, num_layers=layers, bidirectional=bidir,
                                          batch_first=batch_first, proj_size=proj, dtype=dtype))
        x = sym(mode, *((BV, T, I) if batch_first else (T, BV, I)),
                batch_dim=0 if batch_first else 1, dtype=dtype)
        B = x.shape[0 if batch_first else 1]
        with Calls() as calls:
            y, (h, c) = m(x)
        a, _ = cudnn_args(calls)
        assert (a["weight_stride0"], a["mode"], a["hidden_size"], a["proj_size"]) == (
            4 + (proj > 0), 2, H, proj)
        assert (a["num_layers"], a["batch_first"], a["bidirectional"], a["train"]) == (
            layers, batch_first, bidir, True)
        assert a["batch_sizes"] == [] and a["dropout_state"] is None
        assert all(w is p for w, p in zip(a["weight"], m._flat_weights, strict=True))
        assert same_storage(a["weight_buf"], m.weight_ih_l0)
        assert isinstance(B, torch.SymInt)
        D = dirs * out_size
        assert tuple(y.shape) == ((B, T, D) if batch_first else (T, B, D))
        assert tuple(h.shape) == (layers * dirs, B, out_size)
        assert tuple(c.shape) == (layers * dirs, B, H)
        assert y.dtype == h.dtype == c.dtype == dtype
        if batch_first:  # allocated [T, B, ...] and transposed back
            assert known(y.stride(1) == B * dirs * out_size) and y.stride(0) == dirs * out_size
        g = y.grad_fn  # derivatives.yaml _cudnn_rnn: keeps input, weight, hx, cx, result0/3/4
        assert type(g).__name__ == "CudnnRnnBackward0" and g._saved_input is x
        assert same_storage(g._saved_result4, m.weight_ih_l0)
        ws = cuda_rnn.workspace_bytes(*calls.of(aten._cudnn_rnn.default)[0])
        s = torch.empty(0, dtype=dtype).element_size()
        assert [n for _, n in ws] == ([B * T * I * s] if batch_first else [])  # x.contiguous()

        with Calls() as back:
            y.sum().backward()
        (func, args, kwargs, (dx, dhx, dcx, dw)), = back.of(aten._cudnn_rnn_backward.default)
        assert tuple(dx.shape) == tuple(x.shape)
        params = list(m.parameters())
        assert all(p.grad.shape == p.shape for p in params)
        for w in dw:  # the weight grads are views of one dw = zeros(weight_buf.sizes())
            assert same_storage(w, dw[0])
        assert dw[0].untyped_storage().nbytes() == sum(p.numel() for p in params) * s
        ws = [n for _, n in cuda_rnn.workspace_bytes(func, args, kwargs, None)]
        # grad_hy, grad_cy undefined -> zeros_like(hx), zeros_like(cx); the grad of y.sum() is
        # an expanded tensor -> dy = grad_output.contiguous() copies, freed before dw (an
        # output) is made: what it adds beyond dw; x copies if batch_first
        dw = sum(p.numel() for p in params) * s
        expect = sorted([layers * dirs * B * out_size * s, layers * dirs * B * H * s,
                         torch.sym_max(B * T * dirs * out_size * s - dw, 0)]
                        + ([B * T * I * s] if batch_first else []), key=str)
        assert sorted(ws, key=str) == expect


def test_a_time_major_view_is_copied_by_cudnn_rnn():
    """_cudnn_rnn: x = input.contiguous(), a copy for a non-contiguous input."""
    with cuda() as mode:
        m = torch.nn.LSTM(I, H)
        x = sym(mode, BV, T, I, batch_dim=0)
        with Calls() as calls:
            m(x.transpose(0, 1))
        assert [n for _, n in cuda_rnn.workspace_bytes(*calls.of(aten._cudnn_rnn.default)[0])] == [
            x.shape[0] * T * I * 4]


@pytest.mark.parametrize("bias", [True, False])
def test_unflattened_weights_get_a_weight_buffer_per_call(bias):
    """cudnn/RNN.cpp: try_get_weight_buf fails for weights that are not one flat buffer (here a
    recomputed weight), so _cudnn_rnn allocates at::empty(num_weights), returns and keeps it
    (result4). num_weights is cuDNN's weight space: Descriptors.h CUDNN_RNN_DOUBLE_BIAS, so two
    4H biases per layer even without bias. Without biases the weight grads are copied out of
    dw (weight_stride0 2 != 4), so dw is a temporary."""
    with cuda() as mode:
        m = torch.nn.LSTM(I, H, bias=bias)
        x = sym(mode, T, BV, I, batch_dim=1)
        params = [w * 1 if i == 1 else w for i, w in enumerate(m._flat_weights)]
        h0 = torch.zeros(1, x.shape[1], H)
        with Calls() as calls:
            y, _, _ = torch._VF.lstm(x, (h0, h0), params, bias, 1, 0.0, True, False, False)
        a, out = cudnn_args(calls)
        n = 4 * H * I + 4 * H * H + 2 * 4 * H
        assert a["weight_buf"] is None
        assert out[4].shape == (n,) and y.grad_fn._saved_result4.shape == (n,)
        with Calls() as back:
            y.sum().backward()
        call, = back.of(aten._cudnn_rnn_backward.default)
        ws = cuda_rnn.workspace_bytes(*call)
        # dw, or the input pass's dy copy beyond the grads (outputs made before it) if more
        dy, grads = T * x.shape[1] * H * 4, sum(p.numel() for p in m.parameters()) * 4
        got = [n for what, n in ws if what.startswith("cuDNN RNN weight-gradient buffer dw")]
        assert [str(n) for n in got] == ([] if bias else [str(torch.sym_max(n * 4, dy - grads))])
        dw = call[3][3]
        assert same_storage(dw[0], dw[1]) == bias
        assert all(p.grad.shape == p.shape for p in m.parameters())


@pytest.mark.parametrize("capability,cudnn", [((8, 0), True), ((7, 5), False)])
def test_bfloat16_uses_cudnn_from_sm80_and_is_never_flattened(capability, cudnn):
    """RNN.cpp use_cudnn: bf16 when supportsBFloat16RNNWithCuDNN (CUDAHooks.cpp: cuDNN >= 9.13
    and compute capability >= 8.0). rnn.py flatten_parameters needs
    torch.backends.cudnn.is_acceptable, which has no bf16, so the buffer is made per call."""
    with cuda(capability=capability) as mode:
        m = torch.nn.LSTM(I, H, dtype=torch.bfloat16)
        x = sym(mode, T, BV, I, batch_dim=1, dtype=torch.bfloat16)
        with Calls() as calls:
            y, _ = m(x)
        assert bool(calls.of(aten._cudnn_rnn.default)) == cudnn
        assert bool(calls.of(aten._thnn_fused_lstm_cell.default)) != cudnn
        if cudnn:
            assert y.grad_fn._saved_result4.dtype == torch.bfloat16
            assert y.grad_fn._saved_result4.numel() == sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("cls,mode_id", [(torch.nn.GRU, 3), (torch.nn.RNN, 1)])
def test_gru_and_rnn_take_cudnn_without_cx(cls, mode_id):
    """cudnn/RNN.cpp ONE_HIDDEN_RNN: mode CUDNN_GRU = 3 / CUDNN_RNN_TANH = 1, cx undefined."""
    with cuda() as mode:
        m = cls(I, H, num_layers=2)
        x = sym(mode, T, BV, I, batch_dim=1)
        with Calls() as calls:
            y, h = m(x)
        a, _ = cudnn_args(calls)
        assert (a["mode"], a["cx"], a["weight_stride0"]) == (mode_id, None, 4)
        assert tuple(h.shape) == (2, x.shape[1], H)
        y.sum().backward()
        assert all(p.grad.shape == p.shape for p in m.parameters())


def test_unmodelled_names_cudnns_own_allocations():
    """_cudnn_rnn sizes its reserve (training; kept for backward) and workspace with
    cudnnGetRNNTempSpaceSizes; get_dropout_state caches a cuDNN dropout state per device."""
    with cuda() as mode:
        m = torch.nn.LSTM(I, H, num_layers=2, dropout=0.3)
        x = sym(mode, T, BV, I, batch_dim=1)
        with Calls() as calls:
            y, _ = m(x)
            m.eval()
            m(x)
        train, infer = calls.of(aten._cudnn_rnn.default)
        assert cuda_rnn._named(*train[:3])["dropout"] == 0.3
        trained, inferred = cuda_rnn.unmodelled(*train), cuda_rnn.unmodelled(*infer)
        assert "reserve" in trained and "dropout state" in trained
        assert "reserve" not in inferred and "dropout" not in inferred
        with Calls() as back:
            y.sum().backward()
        assert "backward" in cuda_rnn.unmodelled(*back.of(aten._cudnn_rnn_backward.default)[0])
        assert cuda_rnn.unmodelled(aten.mm.default, (), {}, None) is None


# --- cuDNN disabled: the native CUDA path ---------------------------------------------------------

def test_native_lstm_runs_matmul_and_the_fused_cell_per_step():
    """RNN.cpp FullLayer (non-CPU): unbind(0), per step LSTMCell's CUDA branch
    (matmul_ih, matmul_hh, _thnn_fused_lstm_cell, matmul_hr), stack; _lstm_impl stacks hy, cy;
    apply_layer_stack: dropout between layers only."""
    with cuda(cudnn=False) as mode:
        m = torch.nn.LSTM(I, H, num_layers=2, dropout=0.3, proj_size=P)
        x = sym(mode, T, BV, I, batch_dim=1)
        with Calls() as calls:
            y, (h, c) = m(x)
        step = ["t", "mm", "t", "mm", "_thnn_fused_lstm_cell", "t", "mm"]
        names = calls.names(skip=("detach", "zeros", "empty_like", "bernoulli_", "div_", "mul"))
        layer = ["unbind"] + step * T + ["stack"]
        assert names == ["unbind", "unbind"] + layer + layer + ["stack", "stack"]
        assert calls.names().count("bernoulli_") == 1  # CPU dropout body; one between 2 layers
        assert tuple(y.shape) == (T, x.shape[1], P) and tuple(c.shape) == (2, x.shape[1], H)
        y.sum().backward()
        assert all(p.grad.shape == p.shape for p in m.parameters())


def test_native_rnn_tanh_computes_linear_ih_per_step():
    """RNN.cpp SimpleCell: linear_hh(h).add_(linear_ih(x)) then tanh, per step on CUDA (the CPU
    FullLayer precomputes linear_ih for the whole sequence)."""
    with cuda(cudnn=False) as mode:
        m = torch.nn.RNN(I, H)
        x = sym(mode, T, BV, I, batch_dim=1)
        with Calls() as calls:
            m(x)
        assert calls.names().count("addmm") == 2 * T and calls.names().count("tanh") == T


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell_is_the_fused_cell_and_saves_its_workspace(bias):
    """RNN.cpp lstm_cell -> LSTMCell (CUDA): mm, mm, _thnn_fused_lstm_cell; derivatives.yaml
    keeps input_gates, hidden_gates, cx, the biases, cy and the workspace (RNN.cu:
    empty_like(input_gates), [B, 4H])."""
    with cuda() as mode:
        m = torch.nn.LSTMCell(I, H, bias=bias)
        x = sym(mode, BV, I, batch_dim=0)
        with Calls() as calls:
            hy, cy = m(x)
        assert calls.names() == ["t", "mm", "t", "mm", "_thnn_fused_lstm_cell"]
        g = hy.grad_fn
        assert type(g).__name__ == "ThnnFusedLstmCellBackward0"
        for t in (g._saved_result2, g._saved_input_gates, g._saved_hidden_gates):
            assert tuple(t.shape) == (x.shape[0], 4 * H)
        assert (g._saved_input_bias is None) == (not bias)
        (hy.sum() + cy.sum()).backward()
        assert all(p.grad.shape == p.shape for p in m.parameters())


def test_fused_lstm_cell_traces_under_autocast():
    """CUDA autocast lists lstm_cell (lower precision): an fp16 fused cell, whose backward
    (RNN.cu: grad_bias = grad_gates.sum(0)) gives fp16 gate and bias grads."""
    with cuda() as mode, emulate("cuda"):
        m = torch.nn.LSTMCell(I, H)
        x = sym(mode, BV, I, batch_dim=0)
        with torch.autocast("cpu", dtype=torch.float16):
            hy, _ = m(x)
        assert hy.dtype == torch.float16
        with Calls() as back:
            hy.float().sum().backward()
        (_, _, _, (gates, _, bias)), = back.of(aten._thnn_fused_lstm_cell_backward_impl.default)
        assert tuple(gates.shape) == (x.shape[0], 4 * H) and tuple(bias.shape) == (4 * H,)
        assert gates.dtype == bias.dtype == torch.float16


def test_gru_cell_is_the_fused_cell_with_a_5h_workspace():
    """RNN.cpp gru_cell -> GRUCell (CUDA): _thnn_fused_gru_cell; RNN.cu: workspace
    [B, 5H] (GRU_WORKSPACE_MULTIPLIER), kept for backward (_thnn_fused_gru_cell_backward:
    gate grads [B, 3H])."""
    with cuda() as mode:
        m = torch.nn.GRUCell(I, H)
        x = sym(mode, BV, I, batch_dim=0)
        with Calls() as calls:
            hy = m(x)
        assert calls.names() == ["t", "mm", "t", "mm", "_thnn_fused_gru_cell"]
        assert tuple(hy.grad_fn._saved_result1.shape) == (x.shape[0], 5 * H)
        with Calls() as back:
            hy.sum().backward()
        (_, _, _, out), = back.of(aten._thnn_fused_gru_cell_backward.default)
        assert [tuple(t.shape) for t in out] == [(x.shape[0], 3 * H)] * 2 + [
            (x.shape[0], H), (3 * H,), (3 * H,)]
        assert all(p.grad.shape == p.shape for p in m.parameters())


def test_lstm_cell_meta_matches_pytorchs_where_pytorchs_runs():
    """With biases, META's _thnn_fused_lstm_cell agrees with _meta_registrations.py's."""
    g, cx, b = (torch.empty(3, 4 * H, device="meta"), torch.empty(3, H, device="meta"),
                torch.empty(4 * H, device="meta"))
    ours = cuda_rnn.META["_thnn_fused_lstm_cell"](g, g, cx, b, b)
    theirs = aten._thnn_fused_lstm_cell(g, g, cx, b, b)
    assert [(t.shape, t.dtype, t.stride()) for t in ours] == [
        (t.shape, t.dtype, t.stride()) for t in theirs]


# --- packed sequences -----------------------------------------------------------------------------

def test_packed_sequences_need_known_batch_sizes():
    """RNN.cpp lstm (data overload) -> lstm_packed_cudnn: _cudnn_rnn with batch_sizes, output
    [sum(batch_sizes), H]. The values are data: a fake batch_sizes cannot be emulated, nor can
    the native PackedLayer."""
    sizes = torch.tensor([3, 3, 2, 1])
    with cuda() as mode:
        m = torch.nn.LSTM(I, H)
        data, h0 = torch.randn(9, I), torch.zeros(1, 3, H)
        args = ((h0, h0), m._flat_weights, True, 1, 0.0, True, False)
        with Calls() as calls:
            y, hy, cy = torch._VF.lstm(data, sizes, *args)
        a, _ = cudnn_args(calls)
        assert a["batch_sizes"] == [3, 3, 2, 1] and tuple(y.shape) == (9, H)
        with pytest.raises(NotImplementedError, match="packed sequences"):
            torch._VF.lstm(data, mode.from_tensor(sizes), *args)
        with torch.backends.cudnn.flags(enabled=False):
            with pytest.raises(NotImplementedError, match="packed sequences"):
                torch._VF.lstm(data, sizes, *args)


# --- autocast -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_autocast_makes_an_fp16_flat_weight_copy_per_call(dtype, bias):
    """cudnn/AutocastRNN.cpp _cudnn_rnn_cast_reflatten: fp32 weights are copied into
    at::zeros(num_weights, kHalf) (views [numel, 1], autograd-visible copy_), which is passed as
    weight_buf and kept for backward; input, hx, cx are cast to kHalf even under bf16."""
    with cuda() as mode, emulate("cuda"):
        m = torch.nn.LSTM(I, H, bias=bias)
        x = sym(mode, T, BV, I, batch_dim=1)
        with Calls() as calls, torch.autocast("cpu", dtype=dtype):
            y, _ = m(x)
        a, _ = cudnn_args(calls)
        n = 4 * H * I + 4 * H * H + 2 * 4 * H
        assert a["input"].dtype == a["hx"].dtype == a["cx"].dtype == y.dtype == torch.float16
        assert a["weight_buf"].dtype == torch.float16 and a["weight_buf"].shape == (n,)
        assert [tuple(w.shape) for w in a["weight"]] == [(p.numel(), 1) for p in m._flat_weights]
        assert all(type(w.grad_fn).__name__ == "CopyBackwards" for w in a["weight"])
        assert all(same_storage(w, a["weight_buf"]) for w in a["weight"])
        assert y.grad_fn._saved_result4 is a["weight_buf"]
        y.float().sum().backward()
        assert all(p.grad.shape == p.shape and p.grad.dtype == torch.float32
                   for p in m.parameters())


def test_autocast_keeps_fp16_weights_as_they_are():
    """_cudnn_rnn_cast_reflatten: no new buffer when the weights are already fp16."""
    with cuda() as mode, emulate("cuda"):
        m = flattened(mode, torch.nn.LSTM(I, H, dtype=torch.float16))
        x = sym(mode, T, BV, I, batch_dim=1)
        with Calls() as calls, torch.autocast("cpu", dtype=torch.float16):
            m(x)
        a, _ = cudnn_args(calls)
        assert same_storage(a["weight_buf"], m.weight_ih_l0)
        assert [c[1][0] for c in calls.of(aten.zeros.default)] == [[1, x.shape[1], H]] * 2  # h0, c0
