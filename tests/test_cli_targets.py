"""CLI targets for models a user does not have as a file (fxmem.cli.families): Hugging Face
presets, config classes and config.json files, with --config checked against the config's
fields. timm: and torchvision: targets are tested in tests/realmodels/test_targets.py (their
environment)."""

import json
import os
import subprocess
import sys

import pytest
import torch

import fxmem
from fxmem.cli.targets import load_target

transformers = pytest.importorskip("transformers")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FXMEM = os.path.join(os.path.dirname(sys.executable), "fxmem")
TINY = dict(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=128)


def _peak(t):
    x = [torch.zeros([4 if d == "B" else t.dims.get(d, 0) or int(d) for d in
                      s.partition(":")[0].split(",")], dtype=torch.int64) for s in t.inputs]
    return fxmem.analyze(t.model, tuple(x), loss=None, device="cpu").peak_bytes(2)


def test_a_config_class_is_the_preset_of_its_family():
    preset, by_class = load_target("hf:gpt2", TINY), load_target("hf:GPT2Config", TINY)
    assert type(by_class.model.model) is type(preset.model.model)
    assert by_class.inputs == preset.inputs and by_class.dims == preset.dims == {"L": 128}
    assert _peak(by_class) == _peak(preset)


def test_a_config_json_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(transformers.GPT2Config(**TINY).to_dict()))
    t = load_target(f"hf:{path}", {"n_layer": 2})
    assert t.model.model.config.n_layer == 2 and t.model.model.config.n_embd == 32
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(fxmem.InputError, match="has no model_type"):
        load_target(f"hf:{tmp_path / 'bad.json'}")


@pytest.mark.parametrize("target, key, near", [
    ("hf:gpt2", "n_layers", "n_layer"),
    ("hf:GPT2Config", "n_embed", "n_embd"),
    ("hf:LlamaConfig", "num_hidden_layer", "num_hidden_layers"),
])
def test_a_mistyped_config_key_is_refused_naming_the_field(target, key, near):
    with pytest.raises(fxmem.InputError, match=f"--config {key}: .* has no such field; "
                                               f"did you mean {near}"):
        load_target(target, {key: 1})


def test_a_mistyped_key_is_a_usage_error_on_the_command_line():
    r = subprocess.run([FXMEM, "analyze", "hf:gpt2", "--config", "n_layers=1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "did you mean n_layer?" in r.stderr
    assert r.stdout == ""


def test_heads_by_family_and_sizes_from_the_config():
    t5 = load_target("hf:T5Config", dict(num_layers=1, d_model=32, num_heads=2, d_ff=64,
                                          d_kv=16, vocab_size=64))
    assert type(t5.model.model).__name__ == "T5ForConditionalGeneration"
    assert t5.model.model.config.decoder_start_token_id == 0  # labels shift into the decoder
    assert _peak(t5) > 0
    vit = load_target("hf:ViTConfig", dict(num_hidden_layers=1, hidden_size=32,
                                            num_attention_heads=2, intermediate_size=64,
                                            image_size=32, patch_size=8, num_labels=5))
    assert type(vit.model.model).__name__ == "ViTForImageClassification"
    assert vit.inputs == ("B,3,32,32", "B:int64:5") and vit.dims == {}
    bert = load_target("hf:BertConfig", dict(num_hidden_layers=1, hidden_size=32,
                                              num_attention_heads=2, max_position_embeddings=64))
    assert type(bert.model.model).__name__ == "BertForMaskedLM" and bert.dims == {"L": 64}
    with pytest.raises(fxmem.InputError, match="unknown preset hf:NoSuchConfig"):
        load_target("hf:NoSuchConfig")


def test_family_targets_say_what_they_need():
    for prefix, lib in (("timm:", "timm"), ("torchvision:", "torchvision")):
        try:
            __import__(lib)
        except Exception:  # noqa: BLE001 - torchvision fails to import beside some wheels
            with pytest.raises(fxmem.InputError, match=f"{prefix} targets need {lib}"):
                load_target(prefix + "resnet18")
