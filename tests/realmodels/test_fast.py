"""A fast subset of the real-model zoo, one or two models a family, checked exactly: the
peak fxmem predicts from one trace at B=4 must equal the peak of real CPU steps at B=2 and
B=5. Runs only where torchvision and timm are installed (the second CI environment,
constraints-realmodels.txt); the whole zoo is benchmarks/realmodels.py.

A model fxmem gets wrong today is here too, marked ``xfail(strict=True)`` with the known
cause: when that cause is fixed the test passes, and the strict marker makes the run fail
until the marker is removed.
"""

import pytest

pytest.importorskip("torchvision")
pytest.importorskip("timm")
pytest.importorskip("transformers")

from realmodels.audit import audit, status_text  # noqa: E402


def known(reason):
    """A case fxmem is known to get wrong, for ``reason``."""
    return pytest.mark.xfail(strict=True, reason=reason)


FAST = [
    "torchvision/resnet18",
    "torchvision/mobilenet_v3_small",
    # nn.MultiheadAttention(batch_first=True) blocks: a copied block's gradient layout
    "torchvision/vit-small-custom",
    "timm/convnext_atto",
    "timm/vit_tiny_patch16_224",
    "timm/efficientnet_b0",  # SiLU, squeeze-excite, inplace activations
    "timm/beit_base_patch16_224",  # cat(q_bias, k_bias, v_bias) in copied blocks
    "hf/gpt2",
    "hf/t5",
    "hf/bert-frozen-finetune",
    "hf/llama-lora",
    "hf/bloom",  # ALiBi: baddbmm over a bias broadcast from a symbolic size
    "timm/resmlp_12_224",  # Affine: addcmul with (1, 1, dim) parameters
    # submodules shared by several paths (crpe): analyze left fake parameters on the model
    "timm/coat_lite_tiny",
    # SpecAugment's hidden_states[mask_time_indices] = masked_spec_embed: a boolean-mask
    # index_put_, its backward's grad[mask] sized by the count (fxmem.trace.kernels.datadep)
    "hf/wav2vec2-masked",
    "hf/clip",  # torch.arange(len(logits)) fixes B: the formula fitted (fxmem.trace.engine.lift)
    # a LayerNorm pooled through a transpose: its dX laid out as eager CPU lays it out
    # (fxmem.trace.kernels.rules.EAGER_CPU_OUTPUT_LAYOUTS)
    "hf/swin",
    "hf/bart",  # its decoder reads its own all-ones mask and skips it (fxmem.trace.kernels.values)
    "hf/mixtral-moe",  # aten._grouped_mm in float32 (fxmem.trace.kernels.rules.grouped_mm_meta)
]


@pytest.mark.parametrize("name", FAST)
def test_real_model_exact(name):
    """Predicted == fxmem.measure == the independent witness (tests/witness.py), at each B."""
    r = audit(name, witness=True)
    assert r.status == "exact", f"{name}: {status_text(r)}; points (B, predicted, measured): " \
                                f"{r.points}"
    assert [[b, m] for b, _, m in r.points] == r.witnessed, (name, r.points, r.witnessed)


@pytest.mark.parametrize("name, flag", [
    ("hf/wav2vec2", "config.mask_time_prob = 0.05 (SpecAugment)"),  # a NumPy mask of B rows
    ("hf/hubert", "config.layerdrop = 0.1 (LayerDrop)"),  # if torch.rand([]) < layerdrop
])
def test_random_in_training_refused_naming_its_config_flag(name, flag):
    r = audit(name)
    assert r.status == "refused" and flag in r.message and "model.eval()" in r.message, \
        status_text(r)
    assert "transformers/models/" in r.message  # the library's line
