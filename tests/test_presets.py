"""The CLI's ``hf:`` presets (fxmem/cli/presets.py): each builds its model on the meta device
with the parameter count its published configuration gives, the command answers for them
without materialising a weight, and a name it does not know is one line naming the presets."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import fxmem
from fxmem.cli import presets
from fxmem.cli.families import _hf_config
from fxmem.cli.targets import load_target
from test_mistakes import run_in_process

transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# parameter counts of the published checkpoints (the sums of their safetensors' tensors),
# where they are well known; the model transformers builds from the preset must have them
PUBLISHED = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "mistral-7b": 7_248_023_552,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-8b": 8_190_735_360,
    "qwen3-30b-a3b": 30_532_122_624,
    "gemma-2-2b": 2_614_341_888,
    "gemma-2-9b": 9_241_705_984,
    "gemma-2-27b": 27_227_128_320,
    "gemma-3-1b": 999_885_952,
    "phi-3-mini": 3_821_079_552,
}
SIZE = re.compile(r"-(\d+(?:\.\d+)?)b$")  # the size a name says, in billions
NEW = [n for n in presets.PRESETS if n not in ("gpt2", "llama", "mistral", "bert")]


def _params(name: str, **overrides) -> int:
    cfg, model_class = _hf_config(name, overrides)
    with torch.device("meta"):
        model = model_class(cfg)
    return sum(p.numel() for p in model.parameters())


def test_every_preset_has_the_published_size():
    for name in NEW:
        preset = presets.PRESETS[name]
        assert re.fullmatch(r"[\w.-]+/[\w.-]+( \(text_config\))?", preset.source), name
        n = _params(name)
        if name in PUBLISHED:
            assert n == PUBLISHED[name], name
        size = SIZE.search(name)
        if size:  # about what the name says (Gemma 2 2B has 2.61B, Gemma 3 4B's text 3.88B)
            assert 0.75 < n / (float(size.group(1)) * 1e9) < 1.35, (name, n)
    assert _params("deepseek-v3") == 671_026_404_352  # 671B, without its next-token layer
    assert _params("qwen3-235b-a22b") == 235_093_634_560


def test_preset_fields_are_the_published_ones():
    def cfg(name, **kw):
        return _hf_config(name, kw)[0]

    c = cfg("llama-3.1-8b")
    assert (c.hidden_size, c.num_key_value_heads, c.vocab_size, c.max_position_embeddings) == \
        (4096, 8, 128256, 131072)
    assert c.rope_parameters["rope_type"] == "llama3" and c.rope_parameters["factor"] == 8.0
    assert c.rope_parameters["rope_theta"] == 500000.0 and not c.tie_word_embeddings
    assert cfg("llama-3.2-1b").tie_word_embeddings and cfg("llama-3.2-1b").head_dim == 64
    d = cfg("deepseek-v3")
    assert (d.q_lora_rank, d.kv_lora_rank, d.qk_rope_head_dim, d.qk_nope_head_dim,
            d.v_head_dim, d.n_routed_experts, d.n_shared_experts, d.num_experts_per_tok,
            d.first_k_dense_replace) == (1536, 512, 64, 128, 128, 256, 1, 8, 3)
    assert d.rope_parameters["rope_type"] == "yarn" and d.rope_parameters["factor"] == 40
    q = cfg("qwen3-30b-a3b")
    assert (q.num_experts, q.num_experts_per_tok, q.moe_intermediate_size) == (128, 8, 768)
    g = cfg("gemma-3-27b")
    assert g.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert g.sliding_window == 1024 and g.query_pre_attn_scalar == 168
    assert cfg("gemma-2-9b").layer_types[:2] == ["sliding_attention", "full_attention"]
    assert cfg("mistral-7b-v0.1").sliding_window == 4096 and cfg("mistral-7b").vocab_size == 32768
    # --config goes on top of the preset, and the layer types follow the depth
    small = cfg("gemma-3-4b", num_hidden_layers=2, sliding_window=64)
    assert small.num_hidden_layers == 2 and small.sliding_window == 64
    assert small.hidden_size == 2560 and len(small.layer_types) == 2
    assert presets.find("Llama-3.1-8B") is presets.PRESETS["llama-3.1-8b"]


def test_short_names_keep_transformers_defaults():
    for name, model in [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM"),
                        ("mistral", "MistralForCausalLM"), ("bert", "BertForMaskedLM")]:
        cfg, model_class = _hf_config(name, {})
        assert model_class.__name__ == model
        assert cfg.to_dict() == type(cfg)().to_dict()


def _cli(*args):
    """The command in a fresh Python, with its own peak resident memory (KiB) on stderr:
    ``VmHWM``, its address space's own high-water mark (``ru_maxrss`` would carry the
    parent's from the fork, a test worker's gigabytes)."""
    code = ("import re, sys\nfrom fxmem.cli.command import cli\ntry:\n"
            "    cli(sys.argv[1:], prog_name='fxmem')\nfinally:\n"
            "    hwm = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read())\n"
            "    sys.stderr.write(f'\\nMAXRSS {hwm.group(1)}\\n')")
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    return r, int(re.search(r"MAXRSS (\d+)", r.stderr).group(1)) * 1024


ARGS = ("--config", "num_hidden_layers=2", "--batch", "1", "--seq", "128", "--device", "cuda",
        "--format", "json")


def _check(name, out):
    doc = json.loads(out)
    assert doc["title"].endswith(f"hf:{name}") and doc["setup"]["dim L"] == 128
    params = _params(name, num_hidden_layers=2)
    assert doc["parts_bytes"]["params"] == 4 * params  # float32 weights, counted not made
    assert doc["peak_bytes"] > 8 * params
    return params


def test_the_command_answers_for_a_small_preset(capfd):
    code, out, err = run_in_process(["analyze", "hf:qwen2.5-0.5b", *ARGS], capfd)
    assert code == 0 and not err, err  # and transformers warned nothing
    _check("qwen2.5-0.5b", out)


def test_a_large_preset_is_never_materialised():
    r, rss = _cli("analyze", "hf:llama-3.1-8b", *ARGS)
    assert r.returncode == 0, r.stderr
    params = _check("llama-3.1-8b", r.stdout)
    assert rss < 1.5 * 2**30 < 4 * params  # its 5.9 GB of weights are never allocated


def test_an_unknown_preset_is_one_line_naming_the_closest():
    with pytest.raises(fxmem.InputError) as e:
        load_target("hf:llama-3.1-7b")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("unknown preset hf:llama-3.1-7b; did you mean ")
    assert "hf:llama-3.1-8b" in msg.split("?")[0] and "qwen3-{0.6b,1.7b,4b,8b,14b,32b}" in msg


def test_a_hub_id_not_in_the_cache_names_the_presets(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(fxmem.InputError) as e:
        load_target("hf:Qwen/Qwen3-8B")
    msg = str(e.value)
    assert "\n" not in msg and "use a preset such as hf:qwen3-8b (the presets: gpt2," in msg
    assert "hf download Qwen/Qwen3-8B config.json" in msg


def test_the_docs_list_every_preset_with_its_source():
    with open(os.path.join(ROOT, "docs", "models.md"), encoding="utf-8") as f:
        page = f.read()
    for name in NEW:
        source = presets.PRESETS[name].source.split()[0]
        assert any(f"`hf:{name}`" in line and f"{source}/blob/main/config.json" in line
                   for line in page.splitlines()), name
