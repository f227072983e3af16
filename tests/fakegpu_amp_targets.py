"""Calls for tests/test_fake_gpu.py's autocast check: the dtype each op's CUDA kernel receives
under ``torch.autocast("cuda", torch.bfloat16)``, read by a dispatch mode below autocast (the
kernel itself is not run: the mode returns the input), on PyTorch's own CUDA build and under
fxmem's emulation of CUDA autocast on the CPU (fxmem.trace.kernels.amp)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class _Seen(TorchDispatchMode):
    def __init__(self, names):
        super().__init__()
        self.names, self.seen = names, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split("::")[-1]
        if name in self.names and name not in self.seen:
            self.seen[name] = [str(a.dtype)[6:] for a in args if isinstance(a, torch.Tensor)]
        return func(*args, **(kwargs or {}))


def _calls(device):
    x = torch.zeros(8, 8, device=device)
    calls = {
        "mm": lambda: torch.mm(x, x),                                # lower precision
        "_softmax": lambda: torch.softmax(x, -1),                    # fp32 (set dtype)
        "native_layer_norm": lambda: torch.nn.functional.layer_norm(x, (8,)),   # fp32
        "addcmul": lambda: torch.addcmul(x, x.bfloat16(), x),        # promote
        "exp": lambda: torch.exp(x.bfloat16()),                      # fp32
        "relu": lambda: torch.relu(x.bfloat16()),                    # not listed: as is
    }
    if hasattr(aten, "linalg_matrix_sqrth"):                         # 2.15, fp32
        calls["linalg_matrix_sqrth"] = lambda: aten.linalg_matrix_sqrth(x.bfloat16())
    return calls


def seen(device="cuda", emulate=False):
    """op name -> the dtypes of the tensors its kernel received."""
    import contextlib

    calls = _calls(device)
    ctx = contextlib.nullcontext()
    if emulate:
        from fxmem.trace.kernels.amp import emulate as emulation
        ctx = emulation("cuda")
    out = {}
    with ctx:
        for name, call in calls.items():
            mode = _Seen({name})
            with torch.autocast(device, dtype=torch.bfloat16), mode:
                try:
                    call()
                except Exception as e:  # noqa: BLE001 - the fake GPU runs no solver
                    mode.seen.setdefault(name, ["error: " + type(e).__name__])
            out[name] = mode.seen.get(name)
    return out
