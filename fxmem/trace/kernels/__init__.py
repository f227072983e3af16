"""What eager kernels do that fake (meta) ones do not, on CPU and on CUDA.

- :mod:`~fxmem.trace.kernels.rules`: where eager CPU kernels allocate otherwise than their
  meta kernels; :mod:`~fxmem.trace.kernels.symbolic`: stand-ins for kernels that read
  concrete sizes; :mod:`~fxmem.trace.kernels.cpu_rnn`: the RNN kernels eager CPU runs;
- :mod:`~fxmem.trace.kernels.values`, :mod:`~fxmem.trace.kernels.affine`,
  :mod:`~fxmem.trace.kernels.datadep`, :mod:`~fxmem.trace.kernels.checks`: values the trace
  knows, and what it says where the data decides;
- :mod:`~fxmem.trace.kernels.amp`: CUDA's autocast lists; :mod:`~fxmem.trace.kernels.dtypes`:
  dtype names; :mod:`~fxmem.trace.kernels.grad_sums`: autograd's gradient sums;
  :mod:`~fxmem.trace.kernels.flat_weights`: an RNN's flat CUDA weights;
- :mod:`~fxmem.trace.kernels.cuda`: what CUDA's kernels run and allocate
  (``device="cuda"``); :mod:`~fxmem.trace.kernels.compat`: what each PyTorch release needs.

Every rule here is a fact about PyTorch's own kernels, checked against them (the CPU build,
PyTorch's CUDA build on the fake GPU): a change must keep each rule's test against the
kernel it describes, and name the source it follows.
"""

from .amp import autocast_cache_off
from .compat import TORCH, untested_release
from .cuda.kernels import check_capability
from .datadep import internal_file
from .dtypes import AMP, DTYPES, INTEGER, accepted, dtype_of

__all__ = ["AMP", "DTYPES", "INTEGER", "TORCH", "accepted", "autocast_cache_off",
           "check_capability", "dtype_of", "internal_file", "untested_release"]
