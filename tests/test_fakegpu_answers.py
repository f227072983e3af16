"""``fxmem.validate.fakegpu.reads.gpu_answers``: within it, transformers' packed-sequence check
runs as written and answers None (a GPU's answer for one sequence per row); outside, the
library's own function is back."""

import pytest
import torch

from fxmem.validate.fakegpu.reads import gpu_answers

mu = pytest.importorskip("transformers.masking_utils")


def test_the_packed_sequence_check_answers_none_and_is_restored():
    orig = mu.find_packed_sequence_indices
    packed = torch.tensor([[0, 1, 0, 1]])  # two sequences in one row
    with gpu_answers():
        assert mu.find_packed_sequence_indices(packed) is None
    assert mu.find_packed_sequence_indices is orig
    assert orig(packed) is not None  # the library's own answer: packed


def test_it_is_restored_when_the_block_raises():
    orig = mu.find_packed_sequence_indices
    with pytest.raises(RuntimeError), gpu_answers():
        raise RuntimeError("a failing step")
    assert mu.find_packed_sequence_indices is orig
