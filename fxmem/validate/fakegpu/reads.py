"""Values a kernel computes that a step branches on, answered on the fake GPU as a GPU
computes them for the validation harness's own batches.

Kernels do not run on the fake GPU: a value read back from device memory is what the memory
held (zero for a block nothing wrote, ``stub.c`` ``fakegpu_block_zero``). Where a model
library branches on such a value, the fake GPU would take a branch a GPU does not. Each
answer here runs the library's function as written, so its allocations count, and returns
what a GPU computes for batches like the harness's:

- transformers' ``masking_utils.find_packed_sequence_indices(position_ids)`` decides from
  ``(cumsum(...)[:, -1] == 0).all()`` whether a batch packs several sequences per row; it
  runs when a causal LM is called without an attention mask and without a cache (a
  ``use_cache=False`` config, or every block checkpointed). The harness's batches hold one
  sequence per row (``position_ids`` is ``arange(L)`` in each), for which a GPU computes
  ``None``: no packed-sequence mask. On the fake GPU the value read is 0 (False), and
  ``sdpa_mask`` would build a mask a GPU does not.

Only the harness (``fxmem validate --fake-gpu``) and fxmem's tests apply these answers:
``fxmem.measure(..., fake_gpu=...)`` measures a user's batches, which may pack sequences.

>>> with gpu_answers():
...     pass
"""

from __future__ import annotations

import contextlib
import importlib.util


def _transformers_masking():
    if importlib.util.find_spec("transformers") is None:
        return None
    try:
        import transformers.masking_utils as mu
    except ImportError:  # a transformers release without masking_utils: nothing to answer
        return None
    return mu if hasattr(mu, "find_packed_sequence_indices") else None


@contextlib.contextmanager
def gpu_answers():
    """Within the block, the reads this module's docstring names get a GPU's answer for one
    sequence per row; everything is restored on exit."""
    mu = _transformers_masking()
    if mu is None:
        yield
        return
    orig = mu.find_packed_sequence_indices

    def unpacked(position_ids):
        orig(position_ids)  # as written: its allocations are the step's
        return None

    mu.find_packed_sequence_indices = unpacked
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = orig
