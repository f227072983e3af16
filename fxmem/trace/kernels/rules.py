"""Per-op rules: every place fxmem mirrors what an eager kernel does that its fake (meta)
kernel does not, in one registry. :mod:`fxmem.trace` applies them while tracing.

Each rule says why it exists; an op with no rule is traced as PyTorch's fake kernel runs it.
"""

from __future__ import annotations

import linecache
import os
import sys

import torch
from torch._prims_common import suggest_memory_format

from . import cpu_rnn

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
# Adafactor reads its step count and two norms per parameter (``s.item() ** beta2_decay``,
# ``max(eps2, p.norm(2).item() / ...)``, ``max(1.0, update.norm(2).item() / ...)``), in both
# implementations; each only scales an update by a Python float, so no value changes what
# the step allocates: the tracer answers 1 to every read.
ADAFACTOR_SOURCE = ("torch", "optim", "_adafactor.py")
# Metadata queries and profiler markers: they create nothing and are not recorded.
SKIP_NAMESPACES = ("prim", "profiler")
# Of those, two the recorder answers before the modes below it see them: each reaches it
# hundreds or thousands of times a trace, and the modes' dispatch cost 25 to 250 us a call
# (Llama-3.1-8B's trace over 8 GPUs: 9,704 device queries and 465 markers opened).
# A fake tensor's device, as the fake tensor mode answers (torch/_subclasses/fake_tensor.py,
# ``_device_handler``: the meta device inside a kernel's invocation): AdamW's foreach grouping
# asks it of every parameter, gradient and state, FSDP2's hooks of each gathered parameter.
DEVICE_QUERY = torch.ops.prim.device.default
# The profiler's ``record_function`` markers (FSDP2's hooks open one around each of their
# steps): they take no tensor, so no mode below has anything to do with them.
PROFILER_MARKERS = {torch.ops.profiler._record_function_enter_new.default,
                    torch.ops.profiler._record_function_exit._RecordFunction}
# A C++ kernel asking a tensor with symbolic sizes for its concrete metadata (``sizes()``,
# ``strides()``, ``numel()``, ...): c10/core/TensorImpl.cpp's ``*_custom()`` methods hand the
# question to Python (torch/csrc/PyInterpreter.cpp), which sends these ops to the dispatch
# modes. Some are TorchScript builtins, not operators of the c10 dispatcher
# (``aten::size(Tensor self) -> int[]``, torch/csrc/jit/runtime/register_prim_ops.cpp), so
# they cannot be looked up there by name. They create nothing: the fake tensor mode answers
# them (an int for a symbol, which fixes it: see fxmem.trace.kernels.symbolic), and they are not
# recorded.
METADATA_QUERIES = {
    aten.size.default, aten.stride.default, aten.storage_offset.default,
    aten.numel.default, aten.dim.default, aten.is_contiguous.default,
    aten.is_contiguous.memory_format, aten.is_strides_like_format.default,
    aten.is_non_overlapping_and_dense.default,
}
# A functional collective's wait returns the tensor it was given, once the collective that
# writes it is done (torch/csrc/distributed/c10d/Functional.cpp, ``wait_tensor``: ``return
# tensor;``); its meta kernel returns a new one (torch/distributed/_functional_collectives.py,
# ``_wait_tensor_meta``: ``torch.empty_like(self)``), which would count the collective's
# output twice. The recorder returns the input, as eager does.
def _functional_waits() -> set:
    try:  # a build without torch.distributed has no such op
        return {torch.ops._c10d_functional.wait_tensor.default}
    except (AttributeError, RuntimeError):
        return set()


RETURNS_ITS_INPUT = _functional_waits()
# Autograd nodes whose backward formula reads a symbolic size as an int: as_strided_backward
# (torch/csrc/autograd/FunctionsManual.cpp) makes its gradient storage with
# ``grad.new_zeros_symint({base_size})``, then, when the input or output geometry may overlap
# (the frames of torch.stft), ``at::arange(0, base_size.guard_int(...))``, which would fix B.
# The recorder lets that one read pass unguarded and gives arange the storage's symbolic size,
# the value the C++ read (fxmem.trace.engine.recorder.Recorder.unguarded_size).
GUARD_INT_BACKWARD_NODES = {"AsStridedBackward0", "AsStridedBackward1"}
# Eager CPU kernels of these losses return the reduced loss as a view into the unreduced
# buffer, so its storage keeps input.numel() elements; meta kernels say one element.
# (reduction argument position; Reduction::None == 0 allocates that buffer anyway.)
UNREDUCED_STORAGE_LOSSES = {
    aten.mse_loss.default: 2, aten.smooth_l1_loss.default: 2,
    aten.binary_cross_entropy.default: 3,
}
# Window functions, periodic (their default): aten/src/ATen/native/TensorFactories.cpp's
# hann_window and the like compute window_length + 1 samples and return a view of the first
# window_length, so the storage keeps one more element. The fake tensor mode says so when it
# runs the op, but a hit in its dispatch cache synthesizes the output compactly
# (torch/_subclasses/fake_tensor.py _get_output_tensor_from_cache_entry: empty_strided), so a
# second window of the same length (in the step, or in any trace before it in the process)
# would lose that element. op -> position of its ``periodic`` argument (None: periodic).
PERIODIC_WINDOW_OPS = {
    aten.hann_window.default: None, aten.hann_window.periodic: 1,
    aten.hamming_window.default: None, aten.hamming_window.periodic: 1,
    aten.hamming_window.periodic_alpha: 1, aten.hamming_window.periodic_alpha_beta: 1,
    aten.blackman_window.default: None, aten.blackman_window.periodic: 1,
    aten.bartlett_window.default: None, aten.bartlett_window.periodic: 1,
    aten.kaiser_window.default: None, aten.kaiser_window.periodic: 1,
    aten.kaiser_window.beta: 1,
}
# Eager kernels of these ops (CPU: Im2Col.cpp ``im2col_cpu``, Col2Im.cpp ``col2im_cpu``; CUDA:
# cuda/Im2Col.cu ``im2col_cuda``, cuda/Col2Im.cu ``col2im_cuda``) make the output as
# ``at::empty_like(input)`` and then ``resize_`` it to the output's shape, and a storage never
# shrinks: it keeps max(input, output) elements, as F.unfold with stride = kernel size (fewer
# elements out than in) or F.fold of overlapping blocks (the columns are larger than the
# image) show. Meta kernels say the output's elements. Backward calls the other op.
STORAGE_AT_LEAST_INPUT_OPS = {aten.im2col.default, aten.col2im.default}


# Ops whose meta kernel says other than their eager kernels: fxmem.trace.kernels.symbolic registers
# these Python ones while tracing, and the recorder runs the op without the Python dispatcher,
# which would prefer PyTorch's own Python meta (OpOverload.py_kernels).
OWN_META_OPS = {aten._grouped_mm.default}


def grouped_mm_meta(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """``aten._grouped_mm`` (``F.grouped_mm``, transformers' MoE experts) as the eager kernels
    run it. PyTorch's meta kernel (torch/_meta_registrations.py ``_meta_grouped_mm_common``)
    checks the CUDA fast path's dtypes: float32 is refused ("Expected mat_a to be BFloat16 or
    supported Float16 matrix"), float16 unless cuBLASLt's grouped GEMM is there; and it pads
    the output's rows only when ``torch.version.cuda`` is set. The kernels themselves, the
    CPU's ``_grouped_mm`` (CompositeExplicitAutograd, aten/src/ATen/native/LinearAlgebra.cpp,
    which loops over the groups in ``_grouped_mm_fallback``) and CUDA's ``_grouped_mm_cuda``
    (aten/src/ATen/native/cuda/GroupedBlas.cpp), take float32, bfloat16 and float16
    (aten/src/ATen/native/GroupedMMUtils.h ``_grouped_mm_validate_inputs``) and make the
    output with ``create_grouped_gemm_output_tensor``: rows padded to 16 bytes on every build
    but ROCm's. Its size does not depend on ``offs``'s values (the routing)."""
    for name, m in (("mat_a", mat_a), ("mat_b", mat_b)):
        torch._check(m.dtype in (torch.float32, torch.bfloat16, torch.float16),
                     lambda m=m, name=name: f"Expected {name} to be Float32, BFloat16 or "
                                            f"Float16 matrix, got {m.dtype}")
        torch._check(m.dim() in (2, 3), lambda name=name: f"{name} has to be 2 or 3d")
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if not (a2 and b2):
        torch._check(mat_a.shape[-1] == mat_b.shape[-2],
                     lambda: "contraction dimension of mat_a and mat_b must match")
    torch._check((offs is not None) == (a2 or b2), lambda: "Have to provide offsets if there "
                 "is a 2d matrix, or no offset if both matrices are 3d")
    if offs is not None:
        torch._check(offs.dim() == 1 and offs.dtype == torch.int32,
                     lambda: "Offsets have to be a 1D int32 tensor")
    torch._check(bias is None, lambda: "Bias not supported yet")
    dtype = out_dtype or mat_a.dtype
    torch._check(dtype == mat_a.dtype,
                 lambda: "Grouped gemm output dtype must match `mat_a` dtype")
    if a2:
        size = [offs.shape[0], mat_a.shape[0], mat_b.shape[1]] if b2 else \
            [mat_a.shape[0], mat_b.shape[-1]]
    else:
        size = [mat_a.shape[1], mat_b.shape[1]] if b2 else \
            [mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1]]
    if torch.version.hip:
        return torch.empty(size, dtype=dtype, device=mat_a.device)
    align = 16 // dtype.itemsize
    padded = (size[-1] + align - 1) // align * align
    stride = [padded, 1] if a2 != b2 else [size[1] * padded, padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=mat_a.device)


def window_storage_nbytes(func, args, kwargs, t: torch.Tensor) -> int | None:
    """The storage bytes of a window function's output (:data:`PERIODIC_WINDOW_OPS`), or
    None when it is not periodic or shorter than 2 (no extra sample then)."""
    pos = PERIODIC_WINDOW_OPS[func]
    periodic = True if pos is None else (args[pos] if len(args) > pos
                                         else kwargs.get("periodic", True))
    length = args[0]
    if not periodic or length < 2:
        return None
    return (length + 1) * t.element_size()


# Kernels that allocate memory fxmem cannot size and no PyTorch storage holds: reported in
# ``Trace.unmodelled``, never hidden. op -> (does this call allocate it?, what it is (args)).
UNSIZED_WORKSPACE_OPS = {
    # oneDNN's scratchpad, which ideep allocates per call inside aten/src/ATen/native/mkldnn/
    # RNN.cpp mkldnn_rnn_layer (oneDNN src/cpu/rnn/ref_rnn.cpp init_scratchpad), training or
    # not: its leading term in the note (fxmem.trace.kernels.cpu_rnn.scratchpad_note)
    aten.mkldnn_rnn_layer.default: (lambda args: True, cpu_rnn.scratchpad_note),
}
# Outputs whose eager size the fake kernel does not know: op -> rule(args) giving (output
# position, bytes) or None. mkldnn/RNN.cpp mkldnn_rnn_layer's workspace (with grad enabled,
# kept for backward), sized as oneDNN v3.12 sizes it (src/cpu/rnn/rnn_utils.hpp
# set_workspace_sizes, rnn_utils.cpp set_offsets:
# fxmem.trace.kernels.cpu_rnn.onednn_workspace_nbytes); torch/_meta_registrations.py says 0 bytes.
SIZED_OUTPUTS = {aten.mkldnn_rnn_layer.default: cpu_rnn.workspace_output}
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
# Normalization kernels whose eager CPU kernel lays its output 0 (Y, or dX in backward) out
# in a memory format of its own, dense, where the fake kernel (their Python meta kernels:
# torch/_decomp/decompositions.py, on the Meta key by torch/_meta_registrations.py) gives it
# another tensor's strides: native_layer_norm_backward's and native_batch_norm_backward's
# follow dY's (a gradient arriving through a transpose or permute: Swin's, PVT's last norm),
# native_batch_norm's the input's; since torch 2.14, native_group_norm_backward's dY's and
# native_group_norm's the contiguous layout of a channels_last X (a no-op where the fake
# kernel agrees). The bytes are the same, but a later op then copies on one side only:
# ``reshape`` of a non-contiguous gradient is a ``clone`` on fake tensors and a ``view`` in
# eager (a Linear's input reshape, in backward), ``.contiguous()`` the reverse.
# op -> (position of the tensor X whose layout the kernel reads, memory format): "contiguous",
# or "suggested" (X.suggest_memory_format(): channels_last for a 4-D tensor with NHWC
# strides, channels_last_3d for 5-D, contiguous otherwise).
EAGER_CPU_OUTPUT_LAYOUTS = {
    # aten/src/ATen/native/layer_norm.cpp layer_norm_backward_cpu:
    # dX = at::native::empty_like(*X, ..., at::MemoryFormat::Contiguous)
    aten.native_layer_norm_backward.default: (1, "contiguous"),
    # aten/src/ATen/native/Normalization.cpp batch_norm_cpu_transform_input_template:
    # output = at::empty_like(input, input.suggest_memory_format());
    # batch_norm_backward_cpu_template: grad_input = the same
    aten.native_batch_norm.default: (0, "suggested"),
    aten.native_batch_norm_backward.default: (1, "suggested"),
    # aten/src/ATen/native/group_norm.cpp native_group_norm and native_group_norm_backward,
    # on the CPU: Y, dX = at::empty_like(X.contiguous(X.suggest_memory_format()))
    aten.native_group_norm.default: (0, "suggested"),
    aten.native_group_norm_backward.default: (1, "suggested"),
}


def eager_cpu_layout(func, args, out):
    """``out`` with output 0 laid out as the eager CPU kernel of ``func`` allocates it
    (:data:`EAGER_CPU_OUTPUT_LAYOUTS`), a new (fake) tensor when the fake kernel's differs."""
    pos, which = EAGER_CPU_OUTPUT_LAYOUTS[func]
    y = out[0]
    if y is None:
        return out
    fmt = suggest_memory_format(args[pos]) if which == "suggested" else torch.contiguous_format
    if y.is_contiguous(memory_format=fmt):
        return out
    return (torch.empty(y.shape, dtype=y.dtype, device=y.device, memory_format=fmt), *out[1:])


# torch._VF entry points whose C++ composite kernels (aten/src/ATen/native/RNN.cpp) cannot run
# on fake tensors as eager runs them (lstm refuses oneDNN for symbolic sizes; the Python
# dispatcher swaps in torch._decomp's versions, which keep other tensors): they run
# transcriptions of what eager CPU runs (fxmem.trace.kernels.cpu_rnn: RNN.cpp's layers and cells,
# mkldnn/RNN.cpp's mkldnn_rnn); packed sequences PyTorch's decomposition (aten.<name>.data).
RNN_FUNCTIONS = ("lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell")


def _rnn_route(name: str, args):
    from torch._decomp import decomposition_table

    return cpu_rnn.route(name, args) or decomposition_table[getattr(aten, name).data]


class RNNRouter(torch.overrides.TorchFunctionMode):
    """Sends torch._VF.lstm/gru/rnn_*/lstm_cell/gru_cell to what eager CPU runs for them
    (:func:`fxmem.trace.kernels.cpu_rnn.route`); everything else as is."""

    def __init__(self):
        super().__init__()
        self.targets = {getattr(torch._VF, n): n for n in RNN_FUNCTIONS}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = self.targets.get(func)
        if name is not None:
            return _rnn_route(name, args)(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class ValueOracle:
    """Values for the reads LBFGS, ASGD and Adafactor make in ``step()`` (see
    :data:`LBFGS_DECISIONS`, :data:`ASGD_SOURCE`, :data:`ADAFACTOR_SOURCE`)."""

    def __init__(self):
        self.reads = 0

    def __call__(self, t: torch.Tensor):
        """The value to return for ``t.item()``, or ``NotImplemented`` when the read is not
        one of theirs (the fake kernel then answers, or fails, as it would)."""
        lbfgs_end = os.path.join(*LBFGS_SOURCE)
        ones_ends = (os.path.join(*ASGD_SOURCE), os.path.join(*ADAFACTOR_SOURCE))
        lbfgs, ones = None, False
        frame = sys._getframe(1)  # not traceback.extract_stack(): reads every source line
        while frame is not None:
            name = frame.f_code.co_filename
            if lbfgs is None and name.endswith(lbfgs_end):
                lbfgs = frame  # the innermost
            ones = ones or name.endswith(ones_ends)
            frame = frame.f_back
        if lbfgs is None:
            return 1.0 if ones and t.dtype != torch.bool else NotImplemented
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
