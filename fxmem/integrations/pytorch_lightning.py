"""fxmem's batch size inside ``pytorch_lightning``: :class:`FxmemBatchSize`, a callback that sets
the batch size at ``fit`` start to the largest whose training step fits the budget,
predicted before the first step, without a GPU (where Lightning's ``BatchSizeFinder``
grows the batch until the GPU runs out of memory), and logs the prediction beside the
peak each step reaches. What it mirrors of the step:
:mod:`fxmem.integrations.lightning_step`; what it does at each hook:
:mod:`fxmem.integrations.lightning_callback`. Needs ``pip install 'fxmem[pytorch-lightning]'``.

>>> from fxmem.integrations.pytorch_lightning import FxmemBatchSize
>>> cb = FxmemBatchSize(budget_bytes=8 * 2**30, device="cuda")
>>> cb.batch_arg_name, cb.fit
('batch_size', None)
"""

from __future__ import annotations

from ..errors import InputError
from .lightning_callback import BatchSizeFromFxmem
from .lightning_step import LightningFit, LightningStep, batch_size_for, lightning_step

try:
    from pytorch_lightning import Callback
except ImportError:
    raise InputError("fxmem.integrations.pytorch_lightning needs pytorch_lightning: pip install "
                     "'fxmem[pytorch-lightning]'") from None


class FxmemBatchSize(BatchSizeFromFxmem, Callback):
    __doc__ = BatchSizeFromFxmem.__doc__


__all__ = ["FxmemBatchSize", "LightningFit", "LightningStep", "batch_size_for",
           "lightning_step"]
