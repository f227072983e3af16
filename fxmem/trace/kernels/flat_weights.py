"""An RNN's weights on CUDA: views of one flat buffer, as ``model.cuda()`` leaves them.

Moving an ``nn.LSTM``/``GRU``/``RNN`` to CUDA runs ``RNNBase._apply``, which calls
``flatten_parameters`` (torch/nn/modules/rnn.py): when the module's weights are distinct
tensors of one dtype that ``torch.backends.cudnn.is_acceptable`` takes (fp16, fp32, fp64),
``torch._cudnn_rnn_flatten_weight`` (cudnn/RNN.cpp) allocates cuDNN's weight space,
``zeros(num_weights)`` (the two biases of each layer and direction included even without
``bias``: Descriptors.h sets CUDNN_RNN_DOUBLE_BIAS), copies the weights into it and makes each
parameter a view of it; the per-parameter storages go. So the parameters are one block of
the caching allocator, not one block each (each rounded to 512 bytes: a GRU of hidden 64 has
768-byte biases). :func:`flat_rnn_params` fakes them so for ``device="cuda"``; the
parameters' order in the buffer does not change a byte, so they follow ``_flat_weights``
and the double biases' space without ``bias`` comes last.

>>> import torch
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> gru = torch.nn.GRU(4, 8)
>>> with FakeTensorMode() as mode:
...     fakes = flat_rnn_params(mode, gru)
>>> storages = {p.untyped_storage()._cdata for p in fakes.values()}
>>> len(fakes), len(storages), fakes["weight_hh_l0"].untyped_storage().nbytes()
(4, 1, 1344)
"""

from __future__ import annotations

import torch

from .cuda.rnn import MODES, num_weights

_CUDNN_TENSOR_DTYPES = (torch.float16, torch.float32, torch.float64)  # cudnn/__init__.py


def _flattened(rnn: torch.nn.RNNBase) -> bool:
    """rnn.py ``flatten_parameters``' conditions, for a module about to move to CUDA: every
    flat weight a tensor of one cuDNN dtype, no two sharing their data, cuDNN enabled."""
    ws = rnn._flat_weights
    if len(ws) != len(rnn._flat_weights_names) or not all(isinstance(w, torch.Tensor)
                                                          for w in ws):
        return False
    if not torch.backends.cudnn.enabled or ws[0].dtype not in _CUDNN_TENSOR_DTYPES:
        return False
    return (all(w.dtype == ws[0].dtype for w in ws)
            and len({w.untyped_storage()._cdata for w in ws}) == len(ws))


def flat_rnn_params(mode, model: torch.nn.Module) -> dict:
    """Fake parameters of ``mode`` for the weights of each RNN module of ``model`` that
    ``flatten_parameters`` flattens on CUDA, by parameter name (as ``named_parameters`` gives
    it): views of one fake buffer of cuDNN's weight space per module."""
    out = {}
    for prefix, m in model.named_modules():
        if not isinstance(m, torch.nn.RNNBase) or not _flattened(m):
            continue
        ws = m._flat_weights
        stride0 = (4 if m.bias else 2) + (1 if m.proj_size > 0 else 0)
        hidden = m.hidden_size
        n = num_weights(ws, stride0, MODES[m.mode.lower()], hidden, m.proj_size,
                        m.num_layers, m.bidirectional)
        with mode:
            buf = torch.empty(n, dtype=ws[0].dtype, device="cpu")
        at = 0
        for name, w in zip(m._flat_weights_names, ws):
            view = buf.narrow(0, at, w.numel()).view(w.shape)
            at += w.numel()
            out[f"{prefix}.{name}" if prefix else name] = torch.nn.Parameter(
                view, requires_grad=w.requires_grad)
    return out
