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
- transformers' ``masking_utils.fast_all(mask)`` (``mask.sum() == mask.numel()``) decides
  whether an attention mask pads anything, so that ``_ignore_causal_mask_sdpa`` can skip the
  4-D mask and let SDPA take its causal path. BART's decoder, called without a decoder
  mask, makes one of its own (``torch.ones(batch, seq)``: a fill no kernel made on the fake
  GPU) and asks. The harness's batches pad nothing, so every mask asked about is all ones,
  for which a GPU computes True. On the fake GPU the sum reads 0, so the answer is False,
  and ``sdpa_mask`` builds a mask and SDPA takes its masked path where a GPU does not.
  The answer is a host tensor (no device block a GPU would not make).

Only the harness (``fxmem validate --fake-gpu``) and fxmem's tests apply these answers:
``fxmem.measure(..., fake_gpu=...)`` measures a user's batches, which may pack sequences
or pad them.

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
    """Within the block, the reads this module's docstring names get a GPU's answer for the
    harness's batches (one sequence per row, no padding); everything is restored on exit."""
    import torch

    mu = _transformers_masking()
    if mu is None:
        yield
        return
    orig = {name: getattr(mu, name) for name in ("find_packed_sequence_indices", "fast_all")
            if hasattr(mu, name)}

    def unpacked(position_ids):
        orig["find_packed_sequence_indices"](position_ids)  # as written: its allocations
        return None

    def all_ones(tensor):
        orig["fast_all"](tensor)  # as written: its allocations are the step's
        return torch.tensor(True)

    answers = {"find_packed_sequence_indices": unpacked, "fast_all": all_ones}
    for name in orig:
        setattr(mu, name, answers[name])
    try:
        yield
    finally:
        for name, fn in orig.items():
            setattr(mu, name, fn)
