"""PyTorch's CUDA RNNs (LSTM, GRU, RNN and their cells) on CPU fake tensors, for ``device="cuda"``.

The composites ``aten::lstm``/``gru``/``rnn_*`` branch on the device: on CUDA they call cuDNN
(``_cudnn_rnn``) or, with cuDNN off, ``matmul`` and a fused cell per time step; the CPU branch
(oneDNN, unfused math) allocates otherwise. :func:`routes` are the CUDA branches, to replace the
``CompositeImplicitAutograd`` kernels while tracing; :data:`META` are meta kernels PyTorch lacks
(or gets wrong) for the CUDA ops they call; :func:`outputs`, :func:`workspace_bytes` and
:func:`unmodelled` say what the CUDA kernels allocate beyond those; :func:`autocast_routes` is
``_cudnn_rnn``'s CUDA autocast kernel. :func:`installed` registers all of it.

Read for torch 2.13.0 (cf30153c): aten/src/ATen/native/RNN.cpp (``use_cudnn``, checked in the
installed libtorch_cpu.so), native/cudnn/RNN.cpp, native/cuda/RNN.cu, cudnn/AutocastRNN.cpp,
cudnn/Descriptors.h, cuda/detail/CUDAHooks.cpp, nn/modules/rnn.py, derivatives.yaml.

>>> import torch
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> with FakeTensorMode(), installed():
...     lstm = torch.nn.LSTM(8, 16)
...     y, (h, c) = lstm(torch.randn(5, 3, 8))
...     with torch.backends.cudnn.flags(enabled=False):
...         y2, _ = lstm(torch.randn(5, 3, 8))
>>> type(y.grad_fn).__name__, type(y2.grad_fn).__name__, tuple(y.shape)
('CudnnRnnBackward0', 'StackBackward0', (5, 3, 16))
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Callable, Iterator

import torch
from torch._C import DispatchKey, DispatchKeySet, _ExcludeDispatchKeyGuard
from torch.fx.experimental.symbolic_shapes import guard_or_false

aten = torch.ops.aten
MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}  # cudnnRNNMode_t
_GATES = {0: 1, 1: 1, 2: 4, 3: 3}  # cudnn/RNN.cpp _num_linear_layers / 2
_CUDNN_DTYPES = (torch.float16, torch.float32, torch.float64)
# The CUDA ops the routes call all have an Autograd kernel, and a meta kernel with META: fake
# CPU tensors need no stub CPU kernel (tests/test_cuda_rnn.py).
STUBS: tuple = ()


def use_cudnn(t: torch.Tensor, capability=(9, 0)) -> bool:
    """RNN.cpp ``use_cudnn``: ``cudnn_is_acceptable`` (TensorProperties.cpp: cuDNN enabled,
    numel != 0; no dtype test in 2.13), fp16/fp32/fp64, or bf16 if ``supportsBFloat16RNNWithCuDNN``
    (CUDAHooks.cpp: built with cuDNN >= 9.13, as 2.13 is with 9.20, and capability >= 8.0)."""
    if not torch._C._get_cudnn_enabled() or guard_or_false(t.numel() == 0):
        return False
    return t.dtype in _CUDNN_DTYPES or (t.dtype == torch.bfloat16 and tuple(capability) >= (8, 0))


def num_weights(weight, stride0, mode, hidden, proj, layers, bidirectional) -> int:
    """cudnn/RNN.cpp ``get_num_weights``: Descriptors.h sets CUDNN_RNN_DOUBLE_BIAS, so cuDNN's
    weight space has the two biases of each layer and direction even without ``bias``."""
    biased = stride0 == 4 + (proj > 0)
    extra = 0 if biased else layers * (2 if bidirectional else 1) * 2 * _GATES[mode] * hidden
    return sum(w.numel() for w in weight) + extra


def _flat_weight_buf(params):
    """cudnn/RNN.cpp ``try_get_weight_buf``: the flat buffer rnn.py ``flatten_parameters`` made
    at ``.cuda()`` if the weights share a dtype that ``torch.backends.cudnn.is_acceptable``
    takes (fp16/fp32/fp64, not bf16): the module's leaves, views of one storage, as the tracer
    fakes them (:mod:`fxmem.trace.kernels.flat_weights`). A 1-D alias of the first fake weight
    stands
    for it (no allocation, as in CUDA); None: not flattened."""
    p0 = params[0]
    if (p0.dtype in _CUDNN_DTYPES and all(p.dtype == p0.dtype and p.is_leaf for p in params)
            and len({p.untyped_storage()._cdata for p in params}) == 1
            and all(_dense(p.shape, p.stride()) for p in params)):
        return p0.detach().view(-1)
    return None


def _cudnn(mode, input, hx, cx, params, has_biases, num_layers, dropout, train, bidirectional,
           batch_first, batch_sizes=()):
    """cudnn/RNN.cpp ``_cudnn_impl``: projections when cx and hx sizes differ; weight_stride0
    4 with biases else 2, +1 with projections. The per-device dropout state is left out
    (:func:`unmodelled`)."""
    hidden, proj = hx.size(2), 0
    if cx is not None and cx.size(2) != hx.size(2):
        hidden, proj = cx.size(2), hx.size(2)
    stride0 = (4 if has_biases else 2) + (1 if proj else 0)
    return aten._cudnn_rnn.default(input, params, stride0, _flat_weight_buf(params), hx, cx, mode,
                                   hidden, proj, num_layers, batch_first, dropout, train,
                                   bidirectional, list(batch_sizes), None)


# --- cuDNN off: RNN.cpp's cells and layers, their CUDA branches ---------------------------------

def _gather(params, has_biases, proj):
    """RNN.cpp ``gather_params``: (w_ih, w_hh, b_ih, b_hh, w_hr) per layer and direction."""
    n, out = (4 if has_biases else 2) + (1 if proj else 0), []
    for i in range(0, len(params), n):
        g = list(params[i:i + n])
        w_hr = g.pop() if proj else None
        out.append((*g, w_hr) if has_biases else (*g, None, None, w_hr))
    return out


def _lstm_step(x, hidden, p):
    """RNN.cpp ``LSTMCell`` (CUDA): matmul_ih, matmul_hh, ``_thnn_fused_lstm_cell``,
    matmul_hr with projections."""
    w_ih, w_hh, b_ih, b_hh, w_hr = p
    hy, cy, _ = aten._thnn_fused_lstm_cell.default(
        torch.matmul(x, w_ih.t()), torch.matmul(hidden[0], w_hh.t()), hidden[1], b_ih, b_hh)
    return (hy if w_hr is None else torch.matmul(hy, w_hr.t())), cy


def _gru_step(x, h, p):
    """RNN.cpp ``GRUCell`` (CUDA): matmul_ih, matmul_hh, ``_thnn_fused_gru_cell``."""
    w_ih, w_hh, b_ih, b_hh, _ = p
    return aten._thnn_fused_gru_cell.default(torch.matmul(x, w_ih.t()), torch.matmul(h, w_hh.t()),
                                             h, b_ih, b_hh)[0]


def _simple_step(nonlinearity):
    """RNN.cpp ``SimpleCell``: linear_hh(h).add_(linear_ih(x)), tanh or relu (FullLayer
    precomputes linear_ih for the sequence on CPU only)."""
    def step(x, h, p):
        linear = torch.nn.functional.linear
        return nonlinearity(linear(h, p[1], p[3]).add_(linear(x, p[0], p[2])))
    return step


def _layers(step, x, hiddens, params, num_layers, p, train, bidirectional):
    """RNN.cpp ``apply_layer_stack`` of ``FullLayer``/``FullBidirectionalLayer`` (non-CPU):
    per layer ``unbind(0)``, a cell per step and direction, ``stack``, ``cat`` of directions;
    ``dropout`` (train) between layers."""
    dirs = 2 if bidirectional else 1
    finals, layer_input = [], x
    for layer in range(num_layers):
        steps, outs = layer_input.unbind(0), []
        for d in range(dirs):
            h, ys = hiddens[layer * dirs + d], []
            for s in (steps[::-1] if d else steps):
                h = step(s, h, params[layer * dirs + d])
                ys.append(h[0] if isinstance(h, tuple) else h)
            outs.append(torch.stack(ys[::-1] if d else ys, 0))
            finals.append(h)
        layer_input = outs[0] if dirs == 1 else torch.cat(outs, outs[0].dim() - 1)
        if p != 0 and train and layer < num_layers - 1:
            layer_input = aten.dropout.default(layer_input, p, True)
    return layer_input, finals


def _packed_values(batch_sizes, data, capability) -> list:
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(batch_sizes, FakeTensor) or not use_cudnn(data, capability):
        raise NotImplementedError(
            "fxmem: packed sequences (aten::lstm.data, gru.data, rnn_tanh.data, rnn_relu.data) "
            "on device='cuda' need cuDNN (RNN.cpp's PackedLayer is not emulated) and a real "
            "batch_sizes tensor (a fake one has no values)")
    with torch._C._DisableTorchDispatch():
        return [int(v) for v in batch_sizes.tolist()]


def routes(capability=(9, 0)) -> dict[str, Callable]:
    """aten op -> the CUDA branch of its composite (RNN.cpp ``lstm``, ONE_HIDDEN_RNN ``gru``/
    ``rnn_tanh``/``rnn_relu``, ``lstm_cell``, ``gru_cell``) on a GPU of compute capability
    ``capability``. ``rnn_tanh_cell``/``rnn_relu_cell`` have no device branch: not routed."""
    def rnn(name, step):
        mode, lstm = MODES[name], name == "lstm"

        def input_(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                   batch_first):
            h, c = (hx[0], hx[1]) if lstm else (hx, None)
            if use_cudnn(input, capability):
                return tuple(_cudnn(mode, input, h, c, params, has_biases, num_layers, dropout,
                                    train, bidirectional, batch_first)[:3 if lstm else 2])
            x = input.transpose(0, 1) if batch_first else input
            hiddens = list(zip(h.unbind(0), c.unbind(0)) if lstm else h.unbind(0))
            y, finals = _layers(step, x, hiddens,
                                _gather(params, has_biases, lstm and h.size(2) != c.size(2)),
                                num_layers, dropout, train, bidirectional)
            if lstm:  # _lstm_impl: stack hy, then cy
                return ((y.transpose(0, 1) if batch_first else y),
                        torch.stack([f[0] for f in finals]), torch.stack([f[1] for f in finals]))
            hy = torch.stack(finals, 0)  # _rnn_impl_with_concat
            return (y.transpose_(0, 1) if batch_first else y), hy

        def data_(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train,
                  bidirectional):  # the packed cuDNN stubs: _cudnn_impl with batch_sizes
            sizes = _packed_values(batch_sizes, data, capability)
            h, c = (hx[0], hx[1]) if lstm else (hx, None)
            return tuple(_cudnn(mode, data, h, c, params, has_biases, num_layers, dropout, train,
                                bidirectional, False, sizes)[:3 if lstm else 2])
        return {f"{name}.input": input_, f"{name}.data": data_}

    def lstm_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
        return _lstm_step(input, (hx[0], hx[1]), (w_ih, w_hh, b_ih, b_hh, None))

    def gru_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
        return _gru_step(input, hx, (w_ih, w_hh, b_ih, b_hh, None))

    return {**rnn("lstm", _lstm_step), **rnn("gru", _gru_step),
            **rnn("rnn_tanh", _simple_step(torch.tanh)),
            **rnn("rnn_relu", _simple_step(torch.relu)), "lstm_cell": lstm_cell,
            "gru_cell": gru_cell}


# --- meta kernels for the CUDA ops (the Meta key, while tracing) -------------------------------

def _lstm_cell_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """RNN.cu ``_thnn_fused_lstm_cell_cuda``: hy, cy like cx; workspace like the gates.
    (PyTorch's meta fails on the undefined biases of ``bias=False``.)"""
    c = torch.contiguous_format
    return (torch.empty_like(cx, memory_format=c), torch.empty_like(cx, memory_format=c),
            torch.empty_like(input_gates, memory_format=c))


def _lstm_cell_backward_meta(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """RNN.cu ``_thnn_fused_lstm_cell_backward_cuda``: grad_gates like the workspace, grad_cx
    like cx, grad_bias ``grad_gates.sum(0)`` (PyTorch's meta runs that sum, which fails on
    fp16 fake tensors)."""
    if grad_hy is None and grad_cy is None:
        return None, None, None
    g = torch.empty_like(workspace, memory_format=torch.contiguous_format)
    return (g, torch.empty_like(cx, memory_format=torch.contiguous_format),
            g.new_empty(g.size(1)) if has_bias else None)


def _gru_cell_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """RNN.cu ``_thnn_fused_gru_cell_cuda``: hy like hx; workspace [B, 5H]."""
    return (torch.empty_like(hx, memory_format=torch.contiguous_format),
            hx.new_empty((hx.size(0), hx.size(1) * 5)))


def _gru_cell_backward_meta(grad_hy, workspace, has_bias):
    """RNN.cu ``_thnn_fused_gru_cell_backward_cuda``: gate grads [B, 3H], grad_hx, bias sums."""
    gates = (workspace.size(0), workspace.size(1) // 5 * 3)
    bias = [workspace.new_empty(gates[1]) if has_bias else None for _ in range(2)]
    return (workspace.new_empty(gates), workspace.new_empty(gates),
            torch.empty_like(grad_hy, memory_format=torch.contiguous_format), *bias)


def _cudnn_rnn_backward_meta(*args):
    """cudnn/RNN.cpp ``_cudnn_rnn_backward``: dx (time-major, transposed back if batch_first),
    dhx, dcx; for output_mask[3] ``dw = zeros(weight_buf.sizes())``, whose views are the weight
    grads when get_parameters' per-layer count is weight_stride0 (with biases), else grads
    copied out of it (dw then a temporary: :func:`workspace_bytes`)."""
    a = _named(aten._cudnn_rnn_backward.default, args, {})
    x, weight, stride0, buf = a["input"], a["weight"], a["weight_stride0"], a["weight_buf"]
    if a["grad_output"] is None and a["grad_hy"] is None and a["grad_cy"] is None:
        return None, None, None, [None] * len(weight)
    if a["batch_first"] and len(a["batch_sizes"]) == 0:
        b, t, i = x.shape
        dx = x.new_empty_strided((b, t, i), (i, b * i, 1))
    else:
        dx = x.new_empty(x.shape)
    grads, dtype = [], weight[0].dtype if buf is None else buf.dtype
    if a["output_mask"][3] and stride0 == 4 + (a["proj_size"] > 0):
        dw = x.new_empty(num_weights(weight, stride0, a["mode"], a["hidden_size"], a["proj_size"],
                                     a["num_layers"], a["bidirectional"]), dtype=dtype)
        for w in weight:
            grads.append(dw.narrow(0, sum(g.numel() for g in grads), w.numel()).view(w.shape))
    elif a["output_mask"][3]:
        grads = [w.new_empty(w.shape, dtype=dtype) for w in weight]
    hx, cx = a["hx"], a["cx"]
    return dx, hx.new_empty(hx.shape), None if cx is None else cx.new_empty(cx.shape), grads


META: dict[str, Callable] = {
    "_thnn_fused_lstm_cell": _lstm_cell_meta,
    "_thnn_fused_lstm_cell_backward_impl": _lstm_cell_backward_meta,
    "_thnn_fused_gru_cell": _gru_cell_meta,
    "_thnn_fused_gru_cell_backward": _gru_cell_backward_meta,
    "_cudnn_rnn_backward": _cudnn_rnn_backward_meta,
}


# --- what the CUDA kernels allocate beyond their meta kernels -----------------------------------

def _named(func, args, kwargs) -> dict:
    a = {x.name: x.default_value for x in func._schema.arguments if x.has_default_value()}
    a.update(zip((x.name for x in func._schema.arguments), args))
    return {**a, **(kwargs or {})}


def _nbytes(t):
    return t.numel() * t.element_size()


def _dense(sizes, strides, time_major=False) -> bool:
    """``is_contiguous()`` (of ``transpose(0, 1)`` if ``time_major``), False unless provable:
    no guard on the symbolic batch size, and no op run."""
    sizes, strides = list(sizes), list(strides)
    if time_major:
        sizes[:2], strides[:2] = sizes[1::-1], strides[1::-1]
    expected = 1
    for n, st in zip(reversed(sizes), reversed(strides)):
        if not guard_or_false(n == 1):
            if not guard_or_false(st == expected):
                return False
            expected = expected * n
    return True


def outputs(func, args, kwargs, out):
    """cudnn/RNN.cpp ``_cudnn_rnn`` where its meta differs: without weight_buf (weights not
    flattened) it allocates ``at::empty(num_weights)``, returns it and autograd keeps it for
    backward (the meta returns the argument); with batch_first the output is allocated
    time-major and transposed back. The reserve stays 0 bytes (:func:`unmodelled`)."""
    if func is not aten._cudnn_rnn.default:
        return out
    a, out = _named(func, args, kwargs), list(out)
    if a["batch_first"] and len(a["batch_sizes"]) == 0:
        b, t, h = out[0].shape
        out[0] = torch.empty_strided((b, t, h), (h, b * h, 1), dtype=out[0].dtype)
    if a["weight_buf"] is None:
        out[4] = torch.empty(num_weights(a["weight"], a["weight_stride0"], a["mode"],
                                         a["hidden_size"], a["proj_size"], a["num_layers"],
                                         a["bidirectional"]), dtype=a["input"].dtype)
    return tuple(out)


def workspace_bytes(func, args, kwargs, out) -> list:
    """(what, nbytes) of what cudnn/RNN.cpp allocates and frees within ``_cudnn_rnn`` and
    ``_cudnn_rnn_backward``: ``contiguous()`` copies, ``zeros_like`` for undefined grads, dw
    when the grads are copied out.

    ``_cudnn_rnn_backward`` makes the ``zeros_like`` for undefined grads first and keeps them
    to its end; ``_cudnn_rnn_backward_input`` then copies x and the grads contiguous, makes
    dx, dhx, dcx and frees its copies when it returns; ``_cudnn_rnn_backward_weight`` copies x
    again and makes ``dw = zeros(weight_buf)`` (seen on 2.14.1's and 2.15's binaries on the
    fake GPU, ``tests/test_fake_gpu_cudnn.py``). The op's outputs (dw among them when the
    grads are its views) come before its temporaries here, all held until it ends, so the
    input pass's grad copies are listed as what they add beyond what the weight pass holds
    (dw, and grads copied out of it): the op peaks as PyTorch's does, at
    ``max(copies, weight pass)`` over what both passes hold."""
    if func not in (aten._cudnn_rnn.default, aten._cudnn_rnn_backward.default):
        return []
    a = _named(func, args, kwargs)
    tm = a["batch_first"] and len(a["batch_sizes"]) == 0  # made time-major first
    x = a["input"]
    ws = [] if _dense(x.shape, x.stride(), tm) else [("cuDNN RNN input.contiguous()", _nbytes(x))]
    grads = (("grad_output", "output", tm), ("grad_hy", "hx", False), ("grad_cy", "cx", False))
    if func is aten._cudnn_rnn.default or all(a[g] is None for g, _, _ in grads):
        return ws if func is aten._cudnn_rnn.default else []
    copies = []  # the input pass's, freed before the weight pass
    for g, like, time_major in grads:  # dy, dhy, dcy = grad.contiguous()
        t = a[g]
        if t is None and a[like] is not None:  # undefined: zeros_like(like), contiguous
            ws.append((f"cuDNN RNN backward zeros_like({like})", _nbytes(a[like])))
            if time_major:
                copies.append((g, _nbytes(a[like])))
        elif t is not None and not _dense(t.shape, t.stride(), time_major):
            copies.append((g, _nbytes(t)))
    copied = sum(n for _, n in copies)
    names = ", ".join(f"{g}.contiguous()" for g, _ in copies)
    if not a["output_mask"][3]:
        ws += [(f"cuDNN RNN backward {g}.contiguous()", n) for g, n in copies]
        return ws
    n = num_weights(a["weight"], a["weight_stride0"], a["mode"], a["hidden_size"],
                    a["proj_size"], a["num_layers"], a["bidirectional"])
    buf = a["weight_buf"]
    size = (a["weight"][0] if buf is None else buf).element_size()
    if a["weight_stride0"] == 4 + (a["proj_size"] > 0):  # dw is an output: the grads' views
        if copies:
            ws.append((f"cuDNN RNN backward {names} beyond dw (freed before dw is made)",
                       _max(copied - n * size, 0)))
        return ws
    # the grads (outputs) are copied out of dw, a temporary of the weight pass
    held = sum(w.numel() for w in a["weight"]) * size
    what = "cuDNN RNN weight-gradient buffer dw"
    if copies:
        what += f" (or the input pass's {names} beyond the grads, freed before dw is made)"
    ws.append((what, _max(n * size, copied - held) if copies else n * size))
    return ws


def _max(a, b):
    """max without a guard on a symbolic size."""
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return torch.sym_max(a, b)
    return max(a, b)


def unmodelled(func, args, kwargs, out) -> str | None:
    """What cudnn/RNN.cpp allocates in sizes only cuDNN knows, or None."""
    if func is aten._cudnn_rnn_backward.default:
        return "cuDNN RNN backward workspaces (cudnnGetRNNTempSpaceSizes)"
    if func is not aten._cudnn_rnn.default:
        return None
    a = _named(func, args, kwargs)
    what = ("cuDNN RNN reserve space (kept until backward) and workspace" if a["train"]
            else "cuDNN RNN inference workspace") + " (cudnnGetRNNTempSpaceSizes)"
    if a["train"] and a["dropout"] > 0:  # get_dropout_state
        what += ("; cuDNN dropout state (cudnnDropoutGetStatesSize, about 2 MB, made once per "
                 "device and kept)")
    return what


# --- autocast ------------------------------------------------------------------------------------

def _cudnn_rnn_cast_reflatten(*args):
    """cudnn/AutocastRNN.cpp ``_cudnn_rnn_cast_reflatten``: unless the weights are fp16, a new
    fp16 flat buffer per call (``copy_weights_to_flat_buf_views``: ``at::zeros(num_weights)``,
    [numel, 1] views made with ``set_`` and filled by autograd-visible ``copy_``), passed as
    weight_buf and so kept for backward; input, hx, cx cast to fp16 whatever autocast's dtype."""
    from ..amp import _cached_cast, _eligible

    a, half = _named(aten._cudnn_rnn.default, args, {}), torch.float16
    weight, buf = a["weight"], a["weight_buf"]
    with _ExcludeDispatchKeyGuard(DispatchKeySet(DispatchKey.AutocastCPU)):
        if any(w.dtype != weight[0].dtype for w in weight):
            raise RuntimeError("Weight scalar types do not match.")
        ref = buf if buf is not None else weight[0]
        if _eligible(ref) and ref.dtype != half:
            a["weight_buf"] = buf = torch.zeros(num_weights(
                weight, a["weight_stride0"], a["mode"], a["hidden_size"], a["proj_size"],
                a["num_layers"], a["bidirectional"]), dtype=half)
            a["weight"] = []
            for w in weight:  # detach(): a view autograd does not track, as set_ makes
                v = buf.narrow(0, sum(u.numel() for u in a["weight"]), w.numel())
                v = v.view(w.numel(), 1).detach()
                a["weight"].append(v.copy_(w.view_as(v)))
        for name in ("input", "hx", "cx"):
            a[name] = _cached_cast(half, a[name], torch.get_autocast_dtype("cpu"))
        return aten._cudnn_rnn.default(*a.values())


def autocast_routes() -> dict[str, Callable]:
    """aten op -> its CUDA autocast kernel, for the ``AutocastCPU`` key (fxmem.trace.kernels.amp
    emulates
    CUDA autocast with CPU autocast)."""
    return {"_cudnn_rnn": _cudnn_rnn_cast_reflatten}


@contextlib.contextmanager
def installed(capability=(9, 0)) -> Iterator[None]:
    """Register :func:`routes` (CompositeImplicitAutograd), :data:`META` (Meta) and
    :func:`autocast_routes` (AutocastCPU) (:data:`STUBS` is empty); removed on exit."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
            for key, kernels in (("CompositeImplicitAutograd", routes(capability)),
                                 ("Meta", META), ("AutocastCPU", autocast_routes())):
                for name, kernel in kernels.items():
                    lib.impl(name, kernel, key, allow_override=True)  # 2.11: False
        yield
    finally:
        lib._destroy()
        forget_cached()


def forget_cached() -> None:
    """Drop FakeTensorMode's process-wide cached answers for the :data:`META` ops: they came
    from kernels registered only while tracing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = {getattr(aten, name).default for name in META}
    for key in [k for k in FakeTensorMode.cache if k.key[0] in ops]:
        del FakeTensorMode.cache[key]
