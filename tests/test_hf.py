"""Hugging Face models built from config classes (random weights, no downloads)."""

import pytest
import torch

import fxmem
from zoo import gpt2 as zoo_gpt2

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2():
    return zoo_gpt2(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64,
                    bos_token_id=0, eos_token_id=0)


@pytest.mark.parametrize("train", [True, False])
def test_gpt2_matches_measure(gpt2, train):
    ids = torch.randint(0, 128, (4, 16))
    kw = dict(optimizer=torch.optim.AdamW) if train else dict(train=False)
    r = fxmem.analyze(gpt2, (ids, ids), **kw, device="cpu")
    assert r.valid_when == (fxmem.B >= 2,)  # the label padding stayed symbolic
    for b in (2, 3, 7):
        assert r.peak_bytes(b) == fxmem.measure(gpt2, (ids, ids), **kw, B=b).peak_bytes
