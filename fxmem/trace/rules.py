"""Per-op rules: every place fxmem mirrors what an eager kernel does that its fake (meta)
kernel does not, in one registry. :mod:`fxmem.trace` applies them while tracing.

Each rule says why it exists; an op with no rule is traced as PyTorch's fake kernel runs it.
"""

from __future__ import annotations

import linecache
import os
import sys

import torch

aten = torch.ops.aten

# Fake kernels of these ops choose a backend (and so a memory format) by asking for concrete
# sizes, which would add guards such as ``B < 16``. The choice changes strides, never the
# number of bytes, so their guards are suppressed.
LAYOUT_ONLY_GUARD_OPS = {
    aten.convolution.default, aten.convolution_backward.default,
    aten._convolution.default, aten.cudnn_convolution.default,
}
# Reading a tensor's value: in the model (forward, loss, backward) memory would depend on
# data, so it is an error; the optimizer's reads of its step counters are harmless.
DATA_DEPENDENT_OPS = {aten._local_scalar_dense.default, aten.item.default}
# LBFGS decides in Python, reading values, whether to stop iterating. Fake tensors have no
# values, so the tracer answers for the steady state of a long run, the most memory: every
# one of ``max_iter`` iterations runs and stores its curvature pair. Keyed by the source
# line of torch/optim/lbfgs.py that reads (a value read elsewhere in it is an error);
# numbers it reads (losses, step sizes) get distinct values, so no "loss unchanged" stop.
LBFGS_SOURCE = ("torch", "optim", "lbfgs.py")
LBFGS_DECISIONS = {
    "if opt_cond:": False,  # gradient below tolerance_grad
    "if ys > 1e-10:": True,  # curvature pair accepted into the history
    "if gtd > -tolerance_change:": False,  # not a descent direction
    "if d.mul(t).abs().max() <= tolerance_change:": False,  # step below tolerance_change
    # first iteration ever: t = min(1, 1/|g|_1) * lr, a tensor when |g|_1 > 1
    "t = min(1.0, 1.0 / flat_grad.abs().sum()) * lr": True,
}
# ASGD reads its step size and averaging weight (``eta.item()``, ``mu.item() != 1``). The
# weight mu = 1 / max(1, step - t0) is 1 for the first t0 steps (10^6 by default), when the
# average is a copy; the tracer answers 1 to every read.
ASGD_SOURCE = ("torch", "optim", "asgd.py")
# Metadata queries and profiler markers: they create nothing and are not recorded.
SKIP_NAMESPACES = ("prim", "profiler")
# Eager CPU kernels of these losses return the reduced loss as a view into the unreduced
# buffer, so its storage keeps input.numel() elements; meta kernels say one element.
# (reduction argument position; Reduction::None == 0 allocates that buffer anyway.)
UNREDUCED_STORAGE_LOSSES = {
    aten.mse_loss.default: 2, aten.smooth_l1_loss.default: 2,
    aten.binary_cross_entropy.default: 3,
}
# Eager kernels of these ops (CPU: Im2Col.cpp ``im2col_cpu``, Col2Im.cpp ``col2im_cpu``; CUDA:
# cuda/Im2Col.cu ``im2col_cuda``, cuda/Col2Im.cu ``col2im_cuda``) make the output as
# ``at::empty_like(input)`` and then ``resize_`` it to the output's shape, and a storage never
# shrinks: it keeps max(input, output) elements, as F.unfold with stride = kernel size (fewer
# elements out than in) or F.fold of overlapping blocks (the columns are larger than the
# image) show. Meta kernels say the output's elements. Backward calls the other op.
STORAGE_AT_LEAST_INPUT_OPS = {aten.im2col.default, aten.col2im.default}
# Kernels that allocate a backend workspace whose size fxmem cannot know (oneDNN sizes it
# internally, in page-aligned pieces): reported in ``Trace.unmodelled``, never hidden.
# op -> (does this call allocate one?, what it is)
UNSIZED_WORKSPACE_OPS = {
    aten.mkldnn_rnn_layer.default: (
        lambda args: bool(args[15]),  # train=True keeps a workspace for backward
        "oneDNN RNN workspace (sized inside oneDNN; "
        "disable with torch.backends.mkldnn.flags(enabled=False))"),
}
# Batch norm on a reduced-precision input with float32 weights (autocast leaves batch_norm
# alone): eager keeps the saved mean and inverse std (outputs 1 and 2, one value per
# channel) in the weights' dtype, the meta kernel in the input's.
STATS_IN_WEIGHT_DTYPE_OPS = {aten.native_batch_norm.default}
# torch.tensor(...) inside the step makes a real constant outside dispatch, then lifts it:
# on fake tensors the real constant is this op's input and a fake copy its output; in eager
# they are one storage, allocated here. The real input is counted as the output's storage.
CONSTANT_LIFT_OPS = {aten.lift_fresh.default, aten.lift.default}
# Meta kernels that return one storage for outputs eager returns separately:
# op -> (i, j) output positions.
SPLIT_ALIASED_OUTPUTS = {aten.mkldnn_rnn_layer_backward.default: (3, 4)}

# torch._VF entry points whose C++ composite kernels read concrete sizes: they run
# PyTorch's registered decomposition (aten.<name>.input / .data) instead.
RNN_FUNCTIONS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


def _rnn_decomposition(name: str, args):
    from torch._decomp import decomposition_table

    packet = getattr(aten, name)
    data = len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].dtype == torch.int64
    if name == "lstm" and not data and _eager_uses_mkldnn(*args[:3]):
        return _mkldnn_lstm
    return decomposition_table[packet.data if data else packet.input]


def _eager_uses_mkldnn(input, hx, params) -> bool:
    """aten/src/ATen/native/RNN.cpp use_mkldnn(): what eager CPU LSTM runs."""
    mkldnn = torch.ops.mkldnn
    dtype_ok = (input.dtype == torch.float32
                or (input.dtype == torch.bfloat16 and mkldnn._is_mkldnn_bf16_supported())
                or (input.dtype == torch.float16 and not torch.is_grad_enabled()
                    and mkldnn._is_mkldnn_fp16_supported()))  # CPU ISA checks, as in C++
    return (torch._C._get_mkldnn_enabled() and input.device.type == "cpu"
            and all(t.device.type == "cpu" for t in (*hx, *params)) and dtype_ok
            and hx[0].size(2) == hx[1].size(2))  # no projections


def _mkldnn_lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                 batch_first):
    """Eager CPU's LSTM through oneDNN, written as aten/src/ATen/native/mkldnn/RNN.cpp's
    ``mkldnn_rnn`` is: same ops, same order, and the same locals alive until it returns
    (PyTorch's decomposition covers inference only and frees the input earlier)."""
    x = input.transpose(0, 1) if batch_first else input
    x = x.contiguous()
    h0, c0 = hx[0].contiguous(), hx[1].contiguous()
    dirs = 2 if bidirectional else 1
    stride = len(params) // (num_layers * dirs)
    layer_input, hys, cys = x, [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            i = layer * dirs + d
            w = params[i * stride:(i + 1) * stride]
            b_ih = w[2] if has_biases else torch.zeros(w[0].size())
            b_hh = w[3] if has_biases else torch.zeros(w[1].size())
            y, hy, cy, *_ = aten.mkldnn_rnn_layer.default(
                layer_input, w[0], w[1], b_ih, b_hh, h0[i], c0[i], d > 0, [], 2,
                h0.size(2), num_layers, has_biases, bidirectional, batch_first,
                train and torch.is_grad_enabled())  # eager keeps no workspace under no_grad
            outs.append(y)
            hys.append(hy)
            cys.append(cy)
        layer_input = outs[0] if dirs == 1 else torch.cat(outs, -1)
        if dropout != 0 and train and layer < num_layers - 1:
            layer_input = torch.dropout(layer_input, dropout, train=True)
    out = layer_input.transpose(0, 1) if batch_first else layer_input
    return out, torch.stack(hys, 0), torch.stack(cys, 0)


class RNNRouter(torch.overrides.TorchFunctionMode):
    """Sends torch._VF.lstm/gru/rnn_* to their decompositions; everything else as is."""

    def __init__(self):
        super().__init__()
        self.targets = {getattr(torch._VF, n): n for n in RNN_FUNCTIONS}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = self.targets.get(func)
        if name is not None:
            return _rnn_decomposition(name, args)(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class ValueOracle:
    """Values for the reads LBFGS and ASGD make in ``step()`` (see
    :data:`LBFGS_DECISIONS`, :data:`ASGD_SOURCE`)."""

    def __init__(self):
        self.reads = 0

    def __call__(self, t: torch.Tensor):
        """The value to return for ``t.item()``, or ``NotImplemented`` when the read is not
        one of theirs (the fake kernel then answers, or fails, as it would)."""
        lbfgs_end = os.path.join(*LBFGS_SOURCE)
        asgd_end = os.path.join(*ASGD_SOURCE)
        lbfgs, asgd = None, False
        frame = sys._getframe(1)  # not traceback.extract_stack(): reads every source line
        while frame is not None:
            name = frame.f_code.co_filename
            if lbfgs is None and name.endswith(lbfgs_end):
                lbfgs = frame  # the innermost
            asgd = asgd or name.endswith(asgd_end)
            frame = frame.f_back
        if lbfgs is None:
            return 1.0 if asgd and t.dtype != torch.bool else NotImplemented
        self.reads += 1
        if t.dtype != torch.bool:
            return 1.0 + self.reads  # distinct: never "loss unchanged"
        lineno = lbfgs.f_lineno
        line = linecache.getline(lbfgs.f_code.co_filename, lineno).strip()
        if line not in LBFGS_DECISIONS:
            raise ValueError(f"LBFGS reads a value at torch/optim/lbfgs.py line "
                             f"{lineno} ({line!r}) that fxmem has no steady-state "
                             "answer for")
        return LBFGS_DECISIONS[line]
