"""PyTorch kernels that take only concrete sizes, and their symbolic stand-ins while a step
is traced.

Why this module exists (the cause of ``operator aten::size does not exist``): some of
PyTorch's ``CompositeImplicitAutograd`` kernels are C++ bodies that ask their input for its
*concrete* sizes, ``input.sizes()`` or ``input.size(0)``, an ``IntArrayRef`` of plain
integers. On a fake tensor whose batch dimension is a symbol, c10/core/TensorImpl.cpp's
``TensorImpl::sizes_custom()`` cannot answer in C++ (``has_symbolic_sizes_strides_``) and asks
the Python interpreter, whose ``sizes()`` (torch/csrc/PyInterpreter.cpp) sends
``torch.ops.aten.size.default`` to the active dispatch modes. That op,
``aten::size(Tensor self) -> int[]``, is a TorchScript builtin
(torch/csrc/jit/runtime/register_prim_ops.cpp), not an operator of the c10 dispatcher, so
looking it up there by name fails, as fxmem.trace.ledger.tracking's composite check did; and any
answer is a list of ints, which fixes the batch size to its example value. The recorder
answers such metadata queries without taking them for ops
(:data:`fxmem.trace.kernels.rules.METADATA_QUERIES`), and raises a
:class:`fxmem.SpecializationError` naming the op when one fixes B. This module removes the queries
at their source, for the ops models use, and the failures that come next on the same ops:

- **routes**: ``CompositeImplicitAutograd`` kernels replaced by Python bodies that call the
  same aten ops in the same order with the same arguments, their sizes computed from the
  symbolic shape, so autograd saves what it saves in eager and the recorder sees every op:

  - the ``.vec`` overloads of the upsampling ops (``F.interpolate``, ``nn.Upsample``:
    ``upsample_{nearest,linear,bilinear,bicubic,trilinear}*``, ``_upsample_nearest_exact*``,
    the antialiased ``_upsample_*_aa``), whose kernels in aten/src/ATen/native/UpSample*.cpp
    compute the output size with ``compute_output_size(input.sizes(), ...)``
    (aten/src/ATen/native/UpSample.cpp) and call the op's ``.default`` overload;
  - ``aten::stft``, ``aten::stft.center`` and ``aten::istft``
    (aten/src/ATen/native/SpectralOps.cpp ``stft``, ``istft``), which read the batch size
    as an int to frame the signal (``as_strided``) and to overlap-add it back
    (``unfold_backward``);

- **metas**: meta kernels that cannot take a symbolic size, replaced by Python ones that
  allocate what the originals say:

  - the backward ops of the upsampling ops whose only meta kernel is the C++ structured one
    (``TORCH_META_FUNC(upsample_bilinear2d_backward)`` and the like, in UpSample*.cpp),
    registered with ``IntArrayRef`` sizes, where a symbolic ``input_size`` fails
    (``Expected IntList but got GenericList``): one ``input_size`` gradient in
    ``grad_output``'s suggested memory format. PyTorch's own Python metas
    (``upsample_nearest2d_backward`` and others in torch/_meta_registrations.py) stay;
  - ``hardshrink_backward`` and ``softshrink_backward`` (``nn.Hardshrink``,
    ``nn.Softshrink`` in training), whose only meta kernel is the C++ structured one
    (aten/src/ATen/native/Activation.cpp ``TORCH_META_FUNC(hardshrink_backward)``,
    ``TORCH_META_FUNC(softshrink_backward)``: ``build_borrowing_binary_op(grad, self)``), a
    TensorIterator, which "does not support symbolic shapes": the output that binary
    TensorIterator makes;
  - ``_fft_r2c``, ``_fft_c2c`` and ``_fft_c2r``, whose Python metas
    (torch/_meta_registrations.py ``_exec_fft``) ``resize_`` a new tensor, which a tensor with
    symbolic sizes refuses: the same output, laid out as mkl/SpectralOps.cpp ``_exec_fft``
    lays it out, made with ``empty_strided``.

A backward formula that reads a symbolic size as an int (``as_strided_backward``, which the
frames of ``stft`` reach) is a recorder rule instead:
:data:`fxmem.trace.kernels.rules.GUARD_INT_BACKWARD_NODES`.

:func:`symbolic_kernels` registers the routes and metas for the duration of a trace, on
either device. ``tests/test_real_ops.py`` checks each route against the installed C++ kernel
op by op on real tensors, each meta against PyTorch's on concrete sizes, and the traced
formulas against measured steps.

>>> import torch
>>> from torch._dynamo.source import ConstantSource
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
>>> env = ShapeEnv()
>>> b = env.create_symintnode(env.create_symbol(4, ConstantSource("B"),
...                                             dynamic_dim=DimDynamic.DYNAMIC), hint=4)
>>> with FakeTensorMode(shape_env=env), symbolic_kernels():
...     x = torch.empty(b, 3, 8, 8)
...     y = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear")
>>> y.shape[0] is b or str(y.shape[0]) == str(b), tuple(y.shape[1:]), env.replacements
(True, (3, 16, 16), {})
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Callable, Iterator

import torch
from torch._C import DispatchKey

from .compat import register
from .rules import grouped_mm_meta

aten = torch.ops.aten


# --- upsampling: the .vec overloads ----------------------------------------------------------

def _scaled(size, scale: float):
    """``static_cast<int64_t>(size * scale)`` of UpSample.cpp ``compute_output_size``: the
    product in double precision, truncated; symbolically for a symbolic size (a whole scale
    as an integer product, the same number, so that the formula stays a polynomial)."""
    if isinstance(size, int):
        return int(size * scale)
    if float(scale).is_integer():
        return size * int(scale)
    return torch.sym_int(torch.sym_float(size) * scale)


def output_size(input: torch.Tensor, size, scale_factors) -> list:
    """aten/src/ATen/native/UpSample.cpp ``compute_output_size``: the output's spatial sizes,
    ``size`` as given or each spatial input size times its scale factor (exactly one of the
    two is given)."""
    spatial = input.dim() - 2
    if size is not None:
        torch._check(not scale_factors,
                     lambda: "Must specify exactly one of output_size and scale_factors")
        torch._check(len(size) == spatial, lambda: (
            f"Expected output_size to have {spatial} elements, got {len(size)}"))
        return list(size)
    torch._check(scale_factors is not None,
                 lambda: "Must specify exactly one of output_size and scale_factors")
    torch._check(len(scale_factors) == spatial, lambda: (
        f"Expected scale_factors to have {spatial} elements, got {len(scale_factors)}"))
    return [_scaled(s, f) for s, f in zip(input.shape[2:], scale_factors)]


def _upsample_vec(default, align: bool) -> Callable:
    """The composite kernel of an upsampling op's ``.vec`` overload (UpSample*.cpp): the
    output size from :func:`output_size`, then ``default`` (the op's ``.default`` overload)
    with one scale per spatial dim, ``None`` when a size was given (``get_scale_value``)."""
    if align:
        def kernel(input, size, align_corners, scale_factors):
            osize = output_size(input, size, scale_factors)
            scales = list(scale_factors) if scale_factors else [None] * len(osize)
            return default(input, osize, align_corners, *scales)
    else:
        def kernel(input, size, scale_factors):
            osize = output_size(input, size, scale_factors)
            scales = list(scale_factors) if scale_factors else [None] * len(osize)
            return default(input, osize, *scales)
    return kernel


def _upsample_ops() -> list[str]:
    """Names of the upsampling op packets this release registers (``upsample_bilinear2d``,
    ``_upsample_nearest_exact1d``, ...; their backward ops included)."""
    names = {n.partition("::")[2].partition(".")[0]
             for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")}
    return sorted(n for n in names if "upsample" in n)


def _upsample_routes() -> dict[str, Callable]:
    """``"<op>.vec"`` -> its route, for every upsampling op with a ``.vec`` overload whose
    kernel is a composite in this release (an ``align_corners`` argument or not)."""
    routes = {}
    for name in _upsample_ops():
        packet = getattr(aten, name)
        if not {"vec", "default"} <= set(packet.overloads()):
            continue
        vec = packet.vec
        if not torch._C._dispatch_has_kernel_for_dispatch_key(vec.name(),
                                                              "CompositeImplicitAutograd"):
            continue
        align = any(a.name == "align_corners" for a in vec._schema.arguments)
        routes[f"{name}.vec"] = _upsample_vec(packet.default, align)
    return routes


# --- stft ------------------------------------------------------------------------------------

# aten/src/ATen/native/SpectralOps.cpp fft_norm_mode: none, by_root_n, by_n
_NORM_NONE, _NORM_BY_ROOT_N = 0, 1


def stft_center(input, n_fft, hop_length=None, win_length=None, window=None, center=True,
                pad_mode="reflect", normalized=False, onesided=None, return_complex=None,
                align_to_window=None):
    """aten/src/ATen/native/SpectralOps.cpp ``stft`` (``aten::stft.center``), its ops in its
    order: a 1-D signal made a batch of one; with ``center``, the signal padded by
    ``n_fft // 2`` on each side (``at::pad`` of a 3-D view); a window shorter than ``n_fft``
    centred in a zero ``n_fft`` buffer (``zeros``, then ``fill_(1)`` or ``copy_`` of the
    window into its middle); with ``align_to_window`` (``center=False`` only), the signal
    padded by the window's offset; the frames as an ``as_strided`` view
    ``{batch, n_frames, n_fft}``; times the window; ``_fft_r2c`` (``_fft_c2c`` for complex
    input or window) along the frames; ``transpose_(1, 2)``; ``view_as_real`` when
    ``return_complex`` is False."""
    hop = n_fft // 4 if hop_length is None else hop_length
    win = n_fft if win_length is None else win_length
    complex_fft = input.is_complex() or (window is not None and window.is_complex())
    if return_complex is None:
        torch._check(complex_fft, lambda: (
            "stft requires the return_complex parameter be given for real inputs"))
        return_complex = True
    torch._check(input.dim() in (1, 2), lambda: "stft: expected a 1D or 2D tensor")
    torch._check(not (center and align_to_window is not None),
                 lambda: "stft only supports align_to_window for center = False.")
    torch._check(0 < win <= n_fft, lambda: (
        f"stft: expected 0 < win_length <= n_fft, but got win_length={win}"))
    torch._check(hop > 0, lambda: f"stft: expected hop_length > 0, but got {hop}")
    torch._check(window is None or (window.dim() == 1 and window.shape[0] == win), lambda: (
        f"stft: expected a 1D window tensor of size equal to win_length={win}"))
    x = input.unsqueeze(0) if input.dim() == 1 else input
    if center:
        pad = n_fft // 2
        x = aten.pad.default(x.view([1, *x.shape]), [pad, pad], pad_mode)
        x = x.view(x.shape[1:])
    window_ = window
    if win < n_fft:
        window_ = torch.zeros(n_fft, dtype=input.dtype, device=input.device)
        left = (n_fft - win) // 2
        middle = window_.narrow(0, left, win)
        if window is not None:
            middle.copy_(window)
        else:
            middle.fill_(1)
    if not center and align_to_window:
        pad = (n_fft - win) // 2
        x = aten.pad.default(x, [pad, pad], pad_mode)
    length = x.shape[1]
    torch._check(0 < n_fft <= length, lambda: (
        f"stft: expected 0 < n_fft < {length}, but got n_fft={n_fft}"))
    n_frames = 1 + (length - n_fft) // hop
    x = x.as_strided([x.shape[0], n_frames, n_fft],
                     [x.stride(0), hop * x.stride(1), x.stride(1)])
    if window_ is not None:
        x = x.mul(window_)
    norm = _NORM_BY_ROOT_N if normalized else _NORM_NONE
    if complex_fft:
        torch._check(not onesided, lambda: (
            "Cannot have onesided output if window or input is complex"))
        out = aten._fft_c2c.default(x, [2], norm, True)
    else:
        out = aten._fft_r2c.default(x, [2], norm, True if onesided is None else onesided)
    out.transpose_(1, 2)
    if input.dim() == 1:
        out.squeeze_(0)
    return out if return_complex else torch.view_as_real(out)


def stft(input, n_fft, hop_length=None, win_length=None, window=None, normalized=False,
         onesided=None, return_complex=None, align_to_window=None):
    """``aten::stft`` (what ``torch.stft`` calls, after padding a centred signal itself):
    :func:`stft_center` with ``center=False`` and constant padding for
    ``align_to_window``."""
    return stft_center(input, n_fft, hop_length, win_length, window, False, "constant",
                       normalized, onesided, return_complex, align_to_window)


_NORM_BY_N = 2


def istft(input, n_fft, hop_length=None, win_length=None, window=None, center=True,
          normalized=False, onesided=None, length=None, return_complex=False):
    """aten/src/ATen/native/SpectralOps.cpp ``istft``, its ops in its order: the complex
    input seen as real (``view_as_real``); a missing window made of ones, a short one
    padded to ``n_fft`` (``constant_pad_nd``); a batch of one for a 2-D input; frames first
    (``transpose``, back to complex); the inverse FFT (``_fft_c2r``, of the first
    ``n_fft // 2 + 1`` bins when the input is two-sided; ``_fft_c2c`` for a complex
    output); times the window; overlap-add of the frames and of the squared window
    (``unfold_backward``, the batch size read from the frames' size 0); both trimmed to
    ``length`` (or by ``n_fft // 2`` when centred); the check that the window envelope
    never vanishes; the division; a 2-D input's batch dim squeezed; zeros appended up to
    ``length``.

    The check reads a value (``abs().min().lt(1e-11)``, compared with ``equal`` to a
    ``new_ones``), which fake tensors do not have: the route makes the same temporaries and
    assumes it passes (when it does not, eager raises, and so does :func:`fxmem.measure`)."""
    hop = n_fft // 4 if hop_length is None else hop_length
    win = n_fft if win_length is None else win_length
    torch._check(input.is_complex(), lambda: "istft requires a complex-valued input tensor")
    torch._check(input.dim() in (2, 3), lambda: (
        f"istft: expected a tensor with 2 or 3 dimensions of complex, got {input.dim()}"))
    n_frames, fft_size = input.shape[-1], input.shape[-2]
    expected_len = n_fft + hop * (n_frames - 1)
    onesided_ = fft_size != n_fft if onesided is None else onesided
    torch._check(fft_size == (n_fft // 2 + 1 if onesided_ else n_fft), lambda: (
        "istft: the frequency dimension of the input does not match n_fft"))
    torch._check(0 < hop <= win, lambda: "istft: expected 0 < hop_length <= win_length")
    torch._check(0 < win <= n_fft, lambda: "istft: expected 0 < win_length <= n_fft")
    torch._check(window is None or (window.dim() == 1 and window.shape[0] == win),
                 lambda: "istft: Invalid window shape. window has to be 1D and length of "
                         "`win_length`")
    x = torch.view_as_real(input)
    window_ = window
    if window_ is None:
        window_ = torch.ones(win, dtype=x.dtype, device=x.device)
    if win != n_fft:
        left = (n_fft - win) // 2
        window_ = aten.constant_pad_nd.default(window_, [left, n_fft - win - left])
    if input.dim() == 2:
        x = x.unsqueeze(0)
    x = torch.view_as_complex(x.transpose(1, 2))
    norm = _NORM_BY_ROOT_N if normalized else _NORM_BY_N
    if return_complex:
        torch._check(not onesided_, lambda: (
            "cannot have onesided output if window or input is complex"))
        x = aten._fft_c2c.default(x, [2], norm, False)
    else:
        if not onesided_:
            x = x.narrow(-1, 0, n_fft // 2 + 1)
        x = aten._fft_c2r.default(x, [2], norm, n_fft)
    y_tmp = x * window_.view([1, 1, n_fft])
    y = aten.unfold_backward.default(y_tmp, [y_tmp.shape[0], expected_len], 1, n_fft, hop)
    envelope = aten.unfold_backward.default(window_.pow(2).expand([1, n_frames, n_fft]),
                                            [1, expected_len], 1, n_fft, hop)
    start = n_fft // 2 if center else 0
    if length is not None:
        end = start + length
    else:
        end = -(n_fft // 2) if center else expected_len
    y = aten.slice.Tensor(y, 1, start, end)
    envelope = aten.slice.Tensor(envelope, 1, start, end)
    magnitude = envelope.abs()
    lowest = magnitude.min()
    vanishes = lowest.lt(1e-11)
    ones = vanishes.new_ones(())  # at::is_scalar_tensor_true compares with it (``equal``)
    del magnitude, lowest, vanishes, ones
    y = y / envelope
    if input.dim() == 2:
        y = y.squeeze(0)
    if end > expected_len:
        y = aten.constant_pad_nd.default(y, [0, end - expected_len])
    return y


# --- upsampling backward: meta kernels that take symbolic sizes ------------------------------

def _upsample_backward_meta(keeps_layout: bool) -> Callable:
    """UpSample*.cpp ``TORCH_META_FUNC(upsample_*_backward)``: after checking that
    ``grad_output`` has the output's shape, one output of ``input_size`` with
    ``grad_output``'s dtype; in ``grad_output``'s suggested memory format when
    ``keeps_layout`` (``set_output_raw_strided(0, input_size, {},
    grad_output.options().memory_format(grad_output.suggest_memory_format()))``, as the
    bilinear and trilinear ones do), contiguous otherwise."""
    from torch._prims_common import suggest_memory_format

    def meta(grad_output, output_size, input_size, *args):
        spatial = len(output_size)
        torch._check(len(input_size) == spatial + 2, lambda: (
            f"It is expected input_size equals to {spatial + 2}, but got size "
            f"{len(input_size)}"))
        torch._check(grad_output.dim() == spatial + 2, lambda: (
            f"Expected grad_output to be a tensor of dimension {spatial + 2} but got: "
            f"dimension {grad_output.dim()}"))
        expected = [input_size[0], input_size[1], *output_size]
        for i, want in enumerate(expected):
            torch._check(grad_output.shape[i] == want, lambda: (
                "Expected grad_output to have the same shape as output; "
                f"output.size({i}) = {want} but got grad_output.size({i}) = "
                f"{grad_output.shape[i]}"))
        layout = suggest_memory_format(grad_output) if keeps_layout else \
            torch.contiguous_format
        return torch.empty(list(input_size), dtype=grad_output.dtype,
                           device=grad_output.device, memory_format=layout)
    return meta


def _keeps_layout(op) -> bool:
    """Does the installed C++ meta kernel of the upsampling backward ``op`` give a
    channels-last gradient for a channels-last ``grad_output``? (Asked once, on concrete
    meta tensors: bilinear2d and trilinear3d do, bicubic2d, nearest3d and the antialiased
    ones do not, in 2.13.)"""
    names = [a.name for a in op._schema.arguments]
    spatial = int(re.search(r"(\d)d", op.name()).group(1))  # upsample_bilinear2d...: 2
    if spatial not in (2, 3):
        return False  # no channels-last layout in 1-d
    layout = torch.channels_last if spatial == 2 else torch.channels_last_3d
    grad = torch.empty(2, 3, *[4] * spatial, device="meta").contiguous(memory_format=layout)
    args = [grad, [4] * spatial, [2, 3, *[2] * spatial]]
    if "align_corners" in names:
        args.append(False)
    return not op(*args).is_contiguous()


def _upsample_backward_metas() -> dict[str, Callable]:
    """``"<op>_backward"`` -> its meta kernel (:func:`_upsample_backward_meta`), for every
    upsampling op whose backward has no Python meta kernel in this release (only the C++
    one)."""
    import torch._meta_registrations  # noqa: F401  (PyTorch's Python metas, registered)

    metas = {}
    for name in _upsample_ops():
        if not name.endswith("_backward"):
            continue
        op = getattr(aten, name).default
        if DispatchKey.Meta not in op.py_kernels:
            metas[name] = _upsample_backward_meta(_keeps_layout(op))
    return metas


# --- pointwise backward ops: meta kernels that take symbolic sizes ---------------------------

def _binary_op_meta(grad, self, *args):
    """Activation.cpp ``TORCH_META_FUNC(hardshrink_backward)`` and
    ``TORCH_META_FUNC(softshrink_backward)``: ``build_borrowing_binary_op(maybe_get_output(),
    grad, self)``, one output of the two inputs' broadcast shape and common dtype, laid out
    as TensorIterator lays out a binary op's output. BinaryOps.cpp's ``add.Tensor`` is built
    by the same ``build_borrowing_binary_op``, and its Python meta (the elementwise
    reference) takes symbolic sizes: its output is the one the C++ meta would make."""
    return aten.add.Tensor(grad, self)


# ops whose only meta kernel is the TensorIterator one (no Python meta in 2.11 to 2.14)
BINARY_POINTWISE_BACKWARD = ("hardshrink_backward", "softshrink_backward")


def _binary_pointwise_metas() -> dict[str, Callable]:
    import torch._meta_registrations  # noqa: F401  (PyTorch's Python metas, registered)

    return {name: _binary_op_meta for name in BINARY_POINTWISE_BACKWARD
            if DispatchKey.Meta not in getattr(aten, name).default.py_kernels}


# --- FFTs: meta kernels that take symbolic sizes ---------------------------------------------

def _sorted_dims(x: torch.Tensor, dims, exclude_last: bool = False) -> list:
    """The transformed dims in the order aten/src/ATen/native/mkl/SpectralOps.cpp hands them
    to ``_exec_fft``: by decreasing input stride (all but the last with ``exclude_last``, the
    real-to-complex dim)."""
    dims, strides = list(dims), x.stride()
    end = len(dims) - int(exclude_last)
    dims[:end] = sorted(dims[:end], key=lambda d: strides[d], reverse=True)
    return dims


def _fft_output(x: torch.Tensor, out_sizes, dims, dtype) -> torch.Tensor:
    """The output mkl/SpectralOps.cpp ``_exec_fft`` makes (PyTorch's Python meta kernel
    ``_exec_fft`` says the same, but by ``resize_`` of a new tensor, which a tensor with
    symbolic sizes refuses: "tried to directly modify sizes for customized tensor"): the
    untransformed (batch) dims by decreasing input stride, then ``dims``, laid out
    contiguously in that order. Without MKL (pocketfft), a contiguous tensor."""
    if not torch.backends.mkl.is_available():
        return torch.empty(list(out_sizes), dtype=dtype, device=x.device)
    strides = x.stride()
    batch = sorted((d for d in range(x.dim()) if d not in dims),
                   key=lambda d: strides[d], reverse=True)
    out_strides, step = [0] * x.dim(), 1
    for d in reversed(batch + list(dims)):
        out_strides[d] = step
        step = step * out_sizes[d]
    return torch.empty_strided(list(out_sizes), out_strides, dtype=dtype, device=x.device)


def _fft_r2c_meta(self, dim, normalization, onesided):
    """mkl/SpectralOps.cpp ``_fft_r2c_mkl``: the complex output (the last transformed dim
    halved when ``onesided``) as ``_exec_fft`` lays it out."""
    from torch._prims_common import corresponding_complex_dtype

    torch._check(self.dtype.is_floating_point, lambda: "_fft_r2c expects a real input")
    out_sizes = list(self.shape)
    if onesided:
        out_sizes[dim[-1]] = self.shape[dim[-1]] // 2 + 1
    return _fft_output(self, out_sizes, _sorted_dims(self, dim, exclude_last=True),
                       corresponding_complex_dtype(self.dtype))


def _fft_c2c_meta(self, dim, normalization, forward):
    """mkl/SpectralOps.cpp ``_fft_c2c_mkl``: a clone when no dim is transformed, otherwise
    an output of the input's sizes as ``_exec_fft`` lays it out."""
    torch._check(self.dtype.is_complex, lambda: "_fft_c2c expects a complex input")
    if not dim:
        return self.clone()
    return _fft_output(self, self.shape, _sorted_dims(self, dim), self.dtype)


def _fft_c2r_meta(self, dim, normalization, last_dim_size):
    """mkl/SpectralOps.cpp ``_fft_c2r_mkl``: the dims but the last transformed complex to
    complex first, then the last one complex to real, ``last_dim_size`` long."""
    from torch._prims_common import corresponding_real_dtype

    torch._check(self.dtype.is_complex, lambda: "_fft_c2r expects a complex input")
    x = self
    if torch.backends.mkl.is_available() and len(dim) > 1:
        x = _fft_c2c_meta(self, dim[:-1], normalization, False)
        dim = dim[-1:]
    out_sizes = list(x.shape)
    out_sizes[dim[-1]] = last_dim_size
    return _fft_output(x, out_sizes, list(dim), corresponding_real_dtype(self.dtype))


def routes() -> dict[str, Callable]:
    """aten op name -> the Python kernel that replaces its CompositeImplicitAutograd one
    while tracing."""
    return {**_upsample_routes(), "stft": stft, "stft.center": stft_center, "istft": istft}


@functools.lru_cache(maxsize=None)
def kernels() -> dict[str, dict[str, Callable]]:
    """dispatch key -> {aten op name: kernel}: everything :func:`symbolic_kernels`
    registers (looked up once a process)."""
    return {"CompositeImplicitAutograd": routes(),
            "Meta": {**_upsample_backward_metas(), **_binary_pointwise_metas(),
                     "_fft_r2c": _fft_r2c_meta, "_fft_c2c": _fft_c2c_meta,
                     "_fft_c2r": _fft_c2r_meta, "_grouped_mm": grouped_mm_meta}}


@contextlib.contextmanager
def symbolic_kernels() -> Iterator[None]:
    """Register :func:`kernels` while the block runs (process-wide, as tracing is); restore
    PyTorch's own on exit."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        register(lib, kernels())
        yield
    finally:
        lib._destroy()
