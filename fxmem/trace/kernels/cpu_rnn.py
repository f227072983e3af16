"""PyTorch's CPU RNNs (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) as eager runs them, for
``device="cpu"``.

``aten::lstm``/``gru``/``rnn_tanh``/``rnn_relu`` are C++ composites. On fake tensors with a
symbolic batch they cannot run as eager does: ``lstm`` refuses oneDNN for symbolic sizes, and
the Python dispatcher swaps all four for ``torch._decomp``'s decompositions, which call other
ops and keep other tensors. :func:`route` gives, for each, a Python transcription of the C++
that eager CPU runs (same aten ops, same order, the same locals alive until the same point),
so every op it calls reaches autograd and the recorder as in eager:

- **LSTM through oneDNN** (:func:`onednn_lstm`) when RNN.cpp's ``use_mkldnn`` holds and there are
  no projections (:func:`uses_onednn`): ``mkldnn_rnn`` in aten/src/ATen/native/mkldnn/RNN.cpp,
  one ``mkldnn_rnn_layer`` per layer and direction. With grad enabled each call also returns
  oneDNN's training workspace, kept for backward; its size is
  :func:`onednn_workspace_nbytes`, oneDNN v3.12's own arithmetic (the fake kernel says 0).
- **Everything else** (:func:`native_rnn`): GRU and RNN always (only ``lstm`` has a oneDNN
  branch on CPU), LSTM with projections, with oneDNN off or a dtype it does not take:
  RNN.cpp's ``FullLayer``/``FullBidirectionalLayer`` and its CPU cells. On CPU a layer first
  computes ``linear_ih`` for the whole sequence (one ``[T, B, G*H]`` tensor) and each step
  adds its slice in place.
- **The cells** ``nn.LSTMCell``, ``nn.GRUCell`` (:func:`lstm_cell`, :func:`gru_cell`): the
  same CPU cells on one step's input. (``nn.RNNCell``'s ``rnn_tanh_cell``/``rnn_relu_cell``
  run as they are: no size-reading kernel in them.)

Read for torch 2.13.0 (cf30153c) and the oneDNN it bundles (v3.12, 80afa710): RNN.cpp
(``use_mkldnn``, ``lstm``, ``ONE_HIDDEN_RNN``, ``_lstm_impl``, ``_rnn_impl``,
``apply_layer_stack``, ``FullLayer``, ``FullBidirectionalLayer``, ``LSTMCell``, ``GRUCell``,
``SimpleCell``, ``gather_params``), mkldnn/RNN.cpp (``mkldnn_rnn``, ``mkldnn_rnn_layer``),
oneDNN src/cpu/rnn/rnn_utils.{hpp,cpp} (``init_conf``, ``set_workspace_sizes``,
``set_offsets``, ``get_good_ld``) and ref_rnn.cpp (``pd_t::init``). Each transcription was
checked op by op (names, shapes, storage sizes) against the eager kernel it stands for, and
every step against :func:`fxmem.measure` (``tests/test_cpu_rnn.py``).

>>> import torch
>>> x = torch.empty(30, 4, 64)  # T, B, input size
>>> onednn_workspace_nbytes(x, 128, torch.float32)  # one layer and direction, H = 128
950272
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch

aten = torch.ops.aten
PAGE = 4096  # rnn_utils.cpp set_offsets: every workspace part starts on a 4 KiB boundary
_ACC_BYTES = 4  # gemm_acc_t: float32 for float32 and bfloat16 cells


# --- which kernel ------------------------------------------------------------------------------

def uses_onednn(input, hx, params) -> bool:
    """RNN.cpp ``use_mkldnn`` and ``lstm``'s check for projections: does eager CPU run this
    LSTM through oneDNN? oneDNN enabled; input, hidden states and weights on the CPU; float32,
    bfloat16 if the CPU has the instructions (``mkldnn_bf16_device_check``), float16 only
    without grad and if the CPU has them; ``h`` and ``c`` of one size (no projections)."""
    dtype_ok = (input.dtype == torch.float32
                or (input.dtype == torch.bfloat16 and _cpu_supports("bf16"))
                or (input.dtype == torch.float16 and not torch.is_grad_enabled()
                    and _cpu_supports("fp16")))
    return (torch._C._get_mkldnn_enabled() and input.device.type == "cpu"
            and all(t.device.type == "cpu" for t in (*hx, *params)) and dtype_ok
            and hx[0].size(2) == hx[1].size(2))


@functools.cache
def _cpu_supports(dtype: str) -> bool:
    """``mkldnn_bf16_device_check`` / ``mkldnn_fp16_device_check`` (mkldnn/Utils.h): this
    CPU's instructions, asked once and outside any dispatch mode (they are ops)."""
    with torch._C._DisableTorchDispatch():
        return bool(getattr(torch.ops.mkldnn, f"_is_mkldnn_{dtype}_supported")())


def route(name: str, args) -> Callable | None:
    """The transcription eager CPU runs for ``torch._VF.<name>(*args)`` (``name`` one of lstm,
    gru, rnn_tanh, rnn_relu, lstm_cell, gru_cell), or None for a packed sequence (``.data``:
    RNN.cpp's ``PackedLayer`` reads the batch sizes' values, which fake tensors do not
    have)."""
    if name in ("lstm_cell", "gru_cell"):
        return lstm_cell if name == "lstm_cell" else gru_cell
    if len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].dtype == torch.int64:
        return None
    if name == "lstm" and uses_onednn(*args[:3]):
        return onednn_lstm
    return lambda *a, **k: native_rnn(name, *a, **k)


# --- oneDNN -------------------------------------------------------------------------------------

def _good_ld(dim: int, nbytes: int) -> int:
    """rnn_utils.cpp ``get_good_ld``: a leading dimension 64-byte aligned, and not a multiple
    of 256 elements (4K aliasing)."""
    ld = -(-dim // (64 // nbytes)) * (64 // nbytes)
    return ld + 64 // nbytes if ld % 256 == 0 else ld


def _page(n):
    """``n`` rounded up to a page; on a SymInt, ``4096*ceiling(n/4096)`` in the formula."""
    return PAGE * math.ceil(n / PAGE) if isinstance(n, torch.SymInt) else -(-n // PAGE) * PAGE


def onednn_workspace_nbytes(input, hidden_size: int, cx_dtype: torch.dtype):
    """Bytes of the workspace ``mkldnn_rnn_layer`` returns with grad enabled: one oneDNN
    ``lstm_forward_training`` primitive of one layer and one direction (mkldnn/RNN.cpp always
    builds an LSTM primitive), ``input`` time-major ``[T, B, I]``, states in ``input``'s dtype,
    ``c`` in ``cx_dtype``. ``pd.workspace_desc().get_size()``, which is oneDNN v3.12's
    ``set_offsets``: seven parts, each starting on a page, their sizes from
    ``set_workspace_sizes`` (L = D = 1 layer and direction, G = 4 gates, s = the states' bytes,
    a = 4, the accumulator's, ld = ``get_good_ld``)::

        ws_gates               T     * B * ld(G*H, s)    * s
        ws_ht                  T     * B * ld(H, s)      * s
        ws_states_layer        2(T+1) * B * ld(max(H, I), s) * s
        ws_states_iter_c       2(T+1) * B * H             * bytes(c)
        ws_diff_states_layer   2(T+1) * B * ld(max(H, I), a) * a
        ws_diff_states_iter    2(T+1) * B * ld(max(H, I), a) * a
        ws_diff_states_iter_c  2(T+1) * B * H             * a

    (``ws_grid_comp`` is for linear-before-reset GRUs: 0.) The total is the sum of the parts
    each rounded up to 4,096 bytes. ``T`` and ``B`` may be symbolic: the result is then a
    SymInt with ``ceiling`` terms. Measured equal to eager's workspace for 300 random shapes
    (T 1..100, B 1..40, I 1..512, H 1..512, float32 and bfloat16; ``tests/test_cpu_rnn.py``
    checks a grid)."""
    steps, batch, isize = input.shape
    s, h, c = input.element_size(), int(hidden_size), cx_dtype.itemsize
    states = 2 * (steps + 1) * batch
    wide = max(h, int(isize))
    parts = (steps * batch * _good_ld(4 * h, s) * s,  # ws_gates
             steps * batch * _good_ld(h, s) * s,  # ws_ht
             states * _good_ld(wide, s) * s,  # ws_states_layer (= ws_states_iter)
             states * h * c,  # ws_states_iter_c
             states * _good_ld(wide, _ACC_BYTES) * _ACC_BYTES,  # ws_diff_states_layer
             states * _good_ld(wide, _ACC_BYTES) * _ACC_BYTES,  # ws_diff_states_iter
             states * h * _ACC_BYTES)  # ws_diff_states_iter_c
    return sum(_page(p) for p in parts)


def workspace_output(args):
    """``(position, bytes)`` of ``mkldnn_rnn_layer``'s workspace output for these arguments,
    or None: mkldnn/RNN.cpp allocates it when ``GradMode::is_enabled()`` (whatever ``train``
    says), an undefined tensor otherwise. The bytes are :func:`onednn_workspace_nbytes`."""
    if not torch.is_grad_enabled():
        return None
    if args[0].dtype == torch.float16:  # CPU autocast to float16 casts the layer's arguments
        raise NotImplementedError(
            "eager CPU cannot run this step either: oneDNN has no float16 LSTM training "
            "primitive (ref_rnn.cpp: 'f16 training not supported'); use bfloat16 autocast "
            "or torch.backends.mkldnn.flags(enabled=False)")
    return 3, onednn_workspace_nbytes(args[0], args[10], args[6].dtype)


def scratchpad_note(args) -> str:
    """What ``mkldnn_rnn_layer`` allocates that no PyTorch storage holds: oneDNN's scratchpad
    (ref_rnn.cpp ``init_scratchpad``; rnn_utils.hpp ``set_workspace_sizes``), whose largest
    part is ``scratch_gates``, a float32 row of ld(4H) gates per sample for every step
    (``merge_gemm_layer``: the forward below 128 samples, the backward always), plus the
    layer's weights reordered for oneDNN and its GEMM's buffers. Allocated and freed inside
    the op, so neither the CPU's live bytes nor :func:`fxmem.measure` count them. Seen in
    the process's peak RSS: ``mkldnn_rnn_layer_backward`` at T=100, B=512, I=H=512 (one
    thread) held 424.8 MB beyond its outputs; ``scratch_gates`` is 422.7 MB."""
    steps, hidden = args[0].shape[0], int(args[10])
    row = _good_ld(4 * hidden, _ACC_BYTES) * _ACC_BYTES  # bytes per sample and step
    gates = f"{steps * row}*B" if isinstance(steps, int) else f"{row}*T*B (T steps)"
    return (f"oneDNN RNN scratchpad, outside PyTorch's storages and freed when the op returns "
            f"(about {gates} bytes of gates, plus reordered weights and GEMM buffers)")


def onednn_lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                batch_first):
    """mkldnn/RNN.cpp ``mkldnn_rnn`` (from RNN.cpp ``lstm`` via ``lstm_mkldnn``): the
    time-major input made contiguous, one ``mkldnn_rnn_layer`` per layer and direction,
    ``cat`` of the directions, ``dropout`` between layers, ``stack`` of the final states.
    Without biases each call gets ``zeros`` shaped like the two weights, the second one's
    first (GCC evaluates a call's arguments right to left, as eager's op order shows).
    ``layer_output`` lives across layers, as the C++ vector does."""
    x = input.transpose(0, 1) if batch_first else input
    x = x.contiguous()
    h0, c0 = hx[0].contiguous(), hx[1].contiguous()
    hidden_size = h0.size(2)
    dirs = 2 if bidirectional else 1
    stride = 4 if has_biases else 2
    layer_input = x
    layer_output = [None] * dirs
    layer_hy, layer_cy = [None] * (num_layers * dirs), [None] * (num_layers * dirs)
    for layer in range(num_layers):
        for d in range(dirs):
            i = layer * dirs + d
            w = params[i * stride:(i + 1) * stride]
            layer_hx, layer_cx = h0[i], c0[i]
            if has_biases:
                b_ih, b_hh = w[2], w[3]
            else:
                b_hh = torch.zeros(w[1].size(), dtype=w[1].dtype, device=w[1].device)
                b_ih = torch.zeros(w[0].size(), dtype=w[0].dtype, device=w[0].device)
            outputs = aten.mkldnn_rnn_layer.default(
                layer_input, w[0], w[1], b_ih, b_hh, layer_hx, layer_cx, d > 0, [], 2,
                hidden_size, num_layers, has_biases, bidirectional, batch_first, train)
            del b_ih, b_hh  # temporaries of the call
            layer_output[d], layer_hy[i], layer_cy[i] = outputs[0], outputs[1], outputs[2]
            del outputs, layer_hx, layer_cx, w  # the loop body's locals
        layer_input = layer_output[0] if dirs == 1 else torch.cat(layer_output, -1)
        if dropout != 0 and train and layer < num_layers - 1:
            layer_input = torch.dropout(layer_input, dropout, True)
    output = layer_input
    hy = torch.stack(layer_hy, 0)
    cy = torch.stack(layer_cy, 0)
    if batch_first:
        output = output.transpose(0, 1)
    return output, hy, cy


# --- the native kernels: RNN.cpp's layers and CPU cells ------------------------------------------

class _CellParams:
    """RNN.cpp ``CellParams``: ``linear_ih``/``linear_hh`` are ``at::linear`` (bias optional),
    ``matmul_hr`` is ``at::matmul(h, w_hr.t())`` with projections, else ``h``."""

    def __init__(self, w_ih, w_hh, b_ih=None, b_hh=None, w_hr=None):
        self.w_ih, self.w_hh, self.b_ih, self.b_hh, self.w_hr = w_ih, w_hh, b_ih, b_hh, w_hr

    def linear_ih(self, x):
        return torch.nn.functional.linear(x, self.w_ih, self.b_ih)

    def linear_hh(self, h):
        return torch.nn.functional.linear(h, self.w_hh, self.b_hh)

    def matmul_hr(self, h):
        return h if self.w_hr is None else torch.matmul(h, self.w_hr.t())


def _gather_params(params, has_biases: bool, has_projections: bool) -> list:
    """RNN.cpp ``gather_params``: one :class:`_CellParams` per layer and direction."""
    n = (4 if has_biases else 2) + (1 if has_projections else 0)
    out = []
    for i in range(0, len(params), n):
        g = params[i:i + n]
        w_hr = g[-1] if has_projections else None
        out.append(_CellParams(g[0], g[1], *(g[2:4] if has_biases else (None, None)), w_hr=w_hr))
    return out


def _unsafe_chunk(t, chunks: int):
    """``t.unsafe_chunk(chunks, 1)`` as its C++ body runs it, ``unsafe_split`` into pieces of
    ceil(size / chunks) (TensorShape.cpp; the method itself asks for concrete sizes)."""
    return t.unsafe_split(-(-t.shape[1] // chunks), 1)


def _lstm_cell(x, hidden, p, pre=True):
    """RNN.cpp ``LSTMCell``, CPU branch; ``pre``: ``x`` is the input's part, precomputed (a
    layer's step), else the input (``lstm_cell``: ``linear_hh`` first, C++17 sequences a
    member call's object before its argument)."""
    hx, cx = hidden
    gates = p.linear_hh(hx).add_(x if pre else p.linear_ih(x))
    chunked_gates = _unsafe_chunk(gates, 4)
    ingate = chunked_gates[0].sigmoid_()
    forgetgate = chunked_gates[1].sigmoid_()
    cellgate = chunked_gates[2].tanh_()
    outgate = chunked_gates[3].sigmoid_()
    cy = (forgetgate * cx).add_(ingate * cellgate)
    hy = outgate * cy.tanh()
    hy = p.matmul_hr(hy)
    return hy, cy


def _gru_cell(x, hidden, p, pre=True):
    """RNN.cpp ``GRUCell``, CPU branch; ``pre``: ``x`` is the input's part, precomputed, else
    the input (``gru_cell``: ``linear_ih`` first)."""
    chunked_igates = _unsafe_chunk(x if pre else p.linear_ih(x), 3)
    chunked_hgates = _unsafe_chunk(p.linear_hh(hidden), 3)
    reset_gate = chunked_hgates[0].add_(chunked_igates[0]).sigmoid_()
    input_gate = chunked_hgates[1].add_(chunked_igates[1]).sigmoid_()
    new_gate = chunked_igates[2].add(chunked_hgates[2].mul_(reset_gate)).tanh_()
    return (hidden - new_gate).mul_(input_gate).add_(new_gate)


def _simple_cell(nonlinearity):
    """RNN.cpp ``SimpleCell``: ``nonlinearity(linear_hh(h).add_(x))``, ``at::tanh`` or
    ``at::relu``."""
    def cell(x, hidden, p):
        return nonlinearity(p.linear_hh(hidden).add_(x))
    return cell


_CELLS = {"lstm": _lstm_cell, "gru": _gru_cell, "rnn_tanh": _simple_cell(torch.tanh),
          "rnn_relu": _simple_cell(torch.relu)}


def _steps(cell, step_inputs, hidden, p):
    """RNN.cpp ``FullLayer::operator()`` over a list of steps: the cell per step, each
    step's output kept (an LSTM's ``h``)."""
    outputs = []
    for x in step_inputs:
        hidden = cell(x, hidden, p)
        outputs.append(hidden[0] if isinstance(hidden, tuple) else hidden)
    return outputs, hidden


def _full_layer(cell, x, hidden, p):
    """RNN.cpp ``FullLayer::operator()`` on a tensor, CPU branch: ``linear_ih`` of the whole
    sequence, the steps over its ``unbind(0)``, ``stack``."""
    inputs_w = p.linear_ih(x)
    outputs, hidden = _steps(cell, inputs_w.unbind(0), hidden, p)
    return torch.stack(outputs, 0), hidden


def _bidirectional_layer(cell, x, hidden, p):
    """RNN.cpp ``FullBidirectionalLayer::operator()``, CPU branch. The forward direction's
    ``inputs_w`` lives until the reverse one's ``unbind`` replaces its views; both
    directions' step outputs live until the ``cat``."""
    input_w = p[0].linear_ih(x)
    step_inputs = input_w.unbind(0)
    fw_outputs, fw_hidden = _steps(cell, step_inputs, hidden[0], p[0])
    fw_output = torch.stack(fw_outputs, 0)
    input_w = p[1].linear_ih(x)
    step_inputs = input_w.unbind(0)
    rev_step_inputs, step_inputs = step_inputs[::-1], ()  # reverse(std::move(step_inputs))
    rev_outputs, rev_hidden = _steps(cell, rev_step_inputs, hidden[1], p[1])
    rev_outputs.reverse()
    rev_output = torch.stack(rev_outputs, 0)
    return torch.cat([fw_output, rev_output], fw_output.dim() - 1), (fw_hidden, rev_hidden)


def _apply_layer_stack(layer, cell, x, hiddens, weights, num_layers, dropout_p, train):
    """RNN.cpp ``apply_layer_stack``: the layers in turn, ``dropout`` (train) between them.
    ``layer_output`` ends with its loop iteration, as in C++."""
    layer_input, final_hiddens = x, []
    for i in range(num_layers):
        outputs, final = layer(cell, layer_input, hiddens[i], weights[i])
        final_hiddens.append(final)
        layer_input = outputs
        if dropout_p != 0 and train and i < num_layers - 1:
            layer_input = torch.dropout(layer_input, dropout_p, True)
        del outputs, final
    return layer_input, final_hiddens


def native_rnn(name, input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
               batch_first):
    """RNN.cpp's CPU path for ``name``: ``ONE_HIDDEN_RNN`` (gru, rnn_tanh, rnn_relu; the output
    transposed back in place) or ``lstm``'s fallback through ``_lstm_impl`` (a new transposed
    view), both via ``_rnn_impl`` (directions paired for ``FullBidirectionalLayer``)."""
    lstm = name == "lstm"
    cell = _CELLS[name]
    x = input.transpose(0, 1) if batch_first else input
    if isinstance(x.shape[0], torch.SymInt):
        raise NotImplementedError(_steps_refusal(name, x.shape[0], batch_first))
    params = _gather_params(params, has_biases, lstm and hx[0].size(2) != hx[1].size(2))
    hiddens = list(zip(hx[0].unbind(0), hx[1].unbind(0))) if lstm else list(hx.unbind(0))
    if bidirectional:
        pairs = [(hiddens[i], hiddens[i + 1]) for i in range(0, len(hiddens), 2)]
        weights = [(params[i], params[i + 1]) for i in range(0, len(params), 2)]
        output, finals = _apply_layer_stack(_bidirectional_layer, cell, x, pairs, weights,
                                            num_layers, dropout, train)
        finals = [h for pair in finals for h in pair]
    else:
        output, finals = _apply_layer_stack(_full_layer, cell, x, hiddens, params, num_layers,
                                            dropout, train)
    if lstm:  # _lstm_impl's make_tuple(outputs, stack(hy), stack(cy)): GCC stacks cy first
        cy = torch.stack([f[1] for f in finals], 0)
        hy = torch.stack([f[0] for f in finals], 0)
        return (output.transpose(0, 1) if batch_first else output), hy, cy
    hy = torch.stack(finals, 0)
    if batch_first:
        output.transpose_(0, 1)
    return output, hy


def _steps_refusal(name: str, steps: torch.SymInt, batch_first: bool) -> str:
    """Why ``name`` cannot run ``steps`` (a symbol) time steps, and what to do: the symbol
    is B (a sequence-first input given with B at dim 0) or a named dim."""
    node = steps.node
    sources = getattr(node.shape_env, "var_to_sources", {})
    names = {getattr(src, "source_name", "") for sym in node.expr.free_symbols
             for src in sources.get(sym, ())}
    where = "dim 1 (batch_first=True)" if batch_first else "dim 0 (batch_first=False)"
    head = (f"{name} on the CPU runs one cell per time step (RNN.cpp FullLayer), so the "
            f"sequence length, the input's {where}, must be a number")
    if "B" in names:
        return (f"{head}, not B: say where B is with batch_dim=1 for a sequence-first "
                "(L, B, F) input (fxmem analyze: --input 100,B,64)")
    return f"{head}, not a named dim ({', '.join(sorted(names)) or 'a symbol'})"


def lstm_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """RNN.cpp ``lstm_cell`` (``nn.LSTMCell``): ``LSTMCell`` on the input, no precomputation."""
    return _lstm_cell(input, (hx[0], hx[1]), _CellParams(w_ih, w_hh, b_ih, b_hh), pre=False)


def gru_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """RNN.cpp ``gru_cell`` (``nn.GRUCell``): ``GRUCell`` on the input, no precomputation."""
    return _gru_cell(input, hx, _CellParams(w_ih, w_hh, b_ih, b_hh), pre=False)
