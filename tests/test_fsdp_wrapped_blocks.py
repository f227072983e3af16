"""FSDP2 given its blocks by class on a model whose blocks are under ``checkpoint_wrapper``
(issue 41 item 6): the wrappers are the blocks, as their paths name them, and the step
equals a real multi-process run (gloo) of the same wrapping, to the byte."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import fxmem
from fxmem.trace.parallel.fsdp import FSDP

STEP = dict(loss=F.cross_entropy, optimizer=torch.optim.Adam, device="cpu")
PATHS = ("layers.0", "layers.1", "layers.2")


class Block(nn.Module):
    def __init__(self, d=30):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Stack(nn.Module):
    """Three Blocks and a head; 30 and 10 rows shard unevenly over 4 ranks."""

    def __init__(self, d=30, n=3):
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(n)])
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _batch():
    torch.manual_seed(0)
    return torch.randn(4, 30), torch.randint(0, 10, (4,))


def test_a_block_class_under_checkpoint_wrapper_names_the_wrapper():
    m = fxmem.apply_checkpoints(Stack(), list(PATHS))
    assert FSDP(4, blocks=[Block]).block_paths(m) == PATHS
    assert FSDP(4, blocks=list(PATHS)).block_paths(m) == PATHS
    assert FSDP(4, blocks=[Block]).block_paths(Stack()) == PATHS


def test_blocks_by_class_of_checkpointed_blocks_is_exact_per_rank():
    """Was: "Cannot call numel() on tensor with symbolic sizes/strides" (the modules inside
    the wrappers were sharded, and their FSDP2 hooks never ran in the trace)."""
    m = fxmem.apply_checkpoints(Stack(), list(PATHS))
    x, y = _batch()
    by_class = fxmem.analyze(m, x, y, parallel=FSDP(4, blocks=[Block]), **STEP)
    by_path = fxmem.analyze(m, x, y, parallel=FSDP(4, blocks=list(PATHS)), **STEP)
    assert by_class.peak == by_path.peak
    b = 7
    measured = fxmem.measure(m, x, y, B=b, parallel=FSDP(4, blocks=[Block]), **STEP)
    assert [by_class.peak_bytes(b, rank=k) for k in range(4)] == \
        [r.peak_bytes for r in measured]


INNER = [p + "._checkpoint_wrapped_module" for p in PATHS]


def test_the_modules_inside_the_wrappers_sharded_are_exact_per_rank():
    """``fully_shard`` on the module inside each wrapper: its FSDP2 hooks run where
    ``CheckpointWrapper.forward`` calls it, inside the checkpoint and again in its re-run.
    Was the same error: the trace's checkpoint called the module's ``forward``, not the
    module, so its all-gather never ran."""
    m = fxmem.apply_checkpoints(Stack(), list(PATHS))
    x, y = _batch()
    inner = FSDP(4, blocks=INNER)
    assert inner.block_paths(m) == tuple(INNER)
    r = fxmem.analyze(m, x, y, parallel=inner, **STEP)
    for b in (3, 7):
        measured = fxmem.measure(m, x, y, B=b, parallel=inner, **STEP)
        assert [r.peak_bytes(b, rank=k) for k in range(4)] == \
            [q.peak_bytes for q in measured], b


def test_a_model_wrapped_so_is_analysed_as_it_is():
    """The user's own ``fully_shard`` of the modules inside the wrappers, over a fake
    process group: the rank's figures are those of the same wrapping made by fxmem."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    x, y = _batch()
    expected = fxmem.analyze(fxmem.apply_checkpoints(Stack(), list(PATHS)), x, y,
                             parallel=FSDP(4, blocks=INNER), **STEP)
    hook = sys.excepthook  # init_process_group wraps it; destroying the group does not undo it
    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=4)
    try:
        with torch.device("meta"):
            m = fxmem.apply_checkpoints(Stack(), list(PATHS))
        for layer in m.layers:
            fully_shard(layer._checkpoint_wrapped_module)
        fully_shard(m)
        r = fxmem.analyze(m, x, y, **STEP)
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook
    assert r.peak_bytes(7, rank=3) == expected.peak_bytes(7, rank=3)
    assert r.parts(3)["activations"] == expected.parts(3)["activations"]


def test_llama_decoder_layers_by_class():
    """The issue's case, small: a 2-layer Llama whose decoder layers are under
    checkpoint_wrapper, ``blocks=[LlamaDecoderLayer]``: the wrappers are sharded, exact."""
    import pytest

    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    m = fxmem.apply_checkpoints(transformers.LlamaForCausalLM(cfg),
                                ["model.layers.0", "model.layers.1"])
    ids = torch.randint(0, 128, (2, 16))
    step = dict(STEP, loss=lambda out, y: F.cross_entropy(out.logits.flatten(0, 1),
                                                          y.flatten()),
                optimizer=torch.optim.AdamW)
    spec = FSDP(2, blocks=[LlamaDecoderLayer])
    assert spec.block_paths(m) == ("model.layers.0", "model.layers.1")
    r = fxmem.analyze(m, ids, ids, parallel=spec, **step)
    measured = fxmem.measure(m, ids, ids, B=3, parallel=spec, **step)
    assert [r.peak_bytes(3, rank=k) for k in range(2)] == [q.peak_bytes for q in measured]
