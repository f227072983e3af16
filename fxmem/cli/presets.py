"""Published model configurations by name, for the CLI's ``hf:NAME``: the Llama 3.x, Mistral
and Mixtral, Qwen 2.5 and 3, DeepSeek-V3, Gemma 2 and 3 and Phi families at their published
sizes, and transformers' own defaults under the short names ``gpt2``, ``llama``, ``mistral``
and ``bert``.

Each preset holds the fields of one published ``config.json`` that shape the model and its
memory (widths, layer, head and key/value-head counts, ``head_dim`` where the file sets it,
vocabulary, rope settings, longest position, tied embeddings, sliding windows, experts and
their routing, DeepSeek-V3's latent-attention ranks), written from the file in the Hugging
Face repository it names as its ``source``. Nothing is downloaded. Left to the config class's
defaults, as they change no byte of a training step: token ids, ``torch_dtype`` (the step's
dtypes are fxmem's ``--amp`` and ``--param-dtype``), initialiser ranges, dropout (0 in every
file here), ``use_cache``, and the window fields of Qwen 2.5 files, which
``use_sliding_window: false`` turns off. For Gemma 3 at 4B and up, whose files describe an
image-and-text model, the preset is the text model (the file's ``text_config``).

>>> find("Llama-3.1-8B").source
'meta-llama/Llama-3.1-8B'
>>> find("llama-3.1-7b") is None
True
>>> near("meta-llama/Llama-3.1-8B")
['llama-3.1-8b']
>>> near("Qwen/Qwen3-8B-FP8", 2)
['qwen3-8b', 'qwen3-4b']
"""

from __future__ import annotations

import difflib
import re
from typing import NamedTuple


class Preset(NamedTuple):
    source: str  # the Hugging Face repository whose config.json the fields are from
    config: str  # the transformers config class
    model: str  # the transformers model class
    fields: dict  # the config's fields


# --- transformers' own defaults (the short names) --------------------------------------------

_DEFAULTS = {
    "gpt2": Preset("transformers' GPT2Config() (openai-community/gpt2's sizes)", "GPT2Config",
                   "GPT2LMHeadModel", {}),
    "llama": Preset("transformers' LlamaConfig() (Llama 2 7B's sizes)", "LlamaConfig",
                    "LlamaForCausalLM", {}),
    "mistral": Preset("transformers' MistralConfig() (Mistral 7B's sizes)", "MistralConfig",
                      "MistralForCausalLM", {}),
    "bert": Preset("transformers' BertConfig() (google-bert/bert-base-uncased's sizes)",
                   "BertConfig", "BertForMaskedLM", {}),
}


# --- Llama 3.x -------------------------------------------------------------------------------

_LLAMA3 = dict(vocab_size=128256, hidden_act="silu", rms_norm_eps=1e-05, rope_theta=500000.0,
               attention_bias=False, mlp_bias=False, tie_word_embeddings=False)
_LLAMA31 = dict(_LLAMA3, max_position_embeddings=131072,
                rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=8192, rope_type="llama3"))
_LLAMA32 = dict(_LLAMA31, tie_word_embeddings=True,
                rope_scaling=dict(_LLAMA31["rope_scaling"], factor=32.0))


def _llama(source: str, base: dict, **fields) -> Preset:
    return Preset(source, "LlamaConfig", "LlamaForCausalLM", dict(base, **fields))


_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
           num_attention_heads=32, num_key_value_heads=8)
_70B = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
            num_attention_heads=64, num_key_value_heads=8)

_LLAMA = {
    "llama-3-8b": _llama("meta-llama/Meta-Llama-3-8B", _LLAMA3, **_8B,
                         max_position_embeddings=8192),
    "llama-3-70b": _llama("meta-llama/Meta-Llama-3-70B", _LLAMA3, **_70B,
                          max_position_embeddings=8192),
    "llama-3.1-8b": _llama("meta-llama/Llama-3.1-8B", _LLAMA31, **_8B),
    "llama-3.1-70b": _llama("meta-llama/Llama-3.1-70B", _LLAMA31, **_70B),
    "llama-3.1-405b": _llama("meta-llama/Llama-3.1-405B", _LLAMA31, hidden_size=16384,
                             intermediate_size=53248, num_hidden_layers=126,
                             num_attention_heads=128, num_key_value_heads=8),
    "llama-3.2-1b": _llama("meta-llama/Llama-3.2-1B", _LLAMA32, hidden_size=2048,
                           intermediate_size=8192, num_hidden_layers=16,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    "llama-3.2-3b": _llama("meta-llama/Llama-3.2-3B", _LLAMA32, hidden_size=3072,
                           intermediate_size=8192, num_hidden_layers=28,
                           num_attention_heads=24, num_key_value_heads=8, head_dim=128),
    "llama-3.3-70b": _llama("meta-llama/Llama-3.3-70B-Instruct", _LLAMA31, **_70B),
}


# --- Mistral and Mixtral ---------------------------------------------------------------------

_MISTRAL = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
                max_position_embeddings=32768, rms_norm_eps=1e-05, tie_word_embeddings=False)

_MISTRALS = {
    "mistral-7b": Preset("mistralai/Mistral-7B-v0.3", "MistralConfig", "MistralForCausalLM",
                         dict(_MISTRAL, vocab_size=32768, rope_theta=1000000.0,
                              sliding_window=None)),
    "mistral-7b-v0.3": None,  # the same file as mistral-7b, below
    "mistral-7b-v0.1": Preset("mistralai/Mistral-7B-v0.1", "MistralConfig",
                              "MistralForCausalLM",
                              dict(_MISTRAL, vocab_size=32000, rope_theta=10000.0,
                                   sliding_window=4096)),
    "mixtral-8x7b": Preset("mistralai/Mixtral-8x7B-v0.1", "MixtralConfig",
                           "MixtralForCausalLM",
                           dict(_MISTRAL, vocab_size=32000, rope_theta=1000000.0,
                                sliding_window=None, num_local_experts=8,
                                num_experts_per_tok=2, router_aux_loss_coef=0.02)),
    "mixtral-8x22b": Preset("mistralai/Mixtral-8x22B-Instruct-v0.1", "MixtralConfig",
                            "MixtralForCausalLM",
                            dict(_MISTRAL, hidden_size=6144, intermediate_size=16384,
                                 num_hidden_layers=56, num_attention_heads=48,
                                 num_key_value_heads=8, vocab_size=32768,
                                 max_position_embeddings=65536, rope_theta=1000000.0,
                                 sliding_window=None, num_local_experts=8,
                                 num_experts_per_tok=2, router_aux_loss_coef=0.001)),
}
_MISTRALS["mistral-7b-v0.3"] = _MISTRALS["mistral-7b"]  # keeps its place in the listing


# --- Qwen 2.5 (dense, biased q/k/v) ----------------------------------------------------------

def _qwen25(size: str, hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int,
            positions: int, eps: float, tied: bool) -> Preset:
    return Preset(f"Qwen/Qwen2.5-{size}", "Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
        max_position_embeddings=positions, rms_norm_eps=eps, tie_word_embeddings=tied,
        hidden_act="silu", rope_theta=1000000.0, use_sliding_window=False))


_QWEN25 = {  # size: hidden, intermediate, layers, heads, kv heads, vocab, positions, eps, tied
    f"qwen2.5-{size.lower()}": _qwen25(size, *row) for size, row in {
        "0.5B": (896, 4864, 24, 14, 2, 151936, 32768, 1e-06, True),
        "1.5B": (1536, 8960, 28, 12, 2, 151936, 131072, 1e-06, True),
        "3B": (2048, 11008, 36, 16, 2, 151936, 32768, 1e-06, True),
        "7B": (3584, 18944, 28, 28, 4, 152064, 131072, 1e-06, False),
        "14B": (5120, 13824, 48, 40, 8, 152064, 131072, 1e-05, False),
        "32B": (5120, 27648, 64, 40, 8, 152064, 131072, 1e-05, False),
        "72B": (8192, 29568, 80, 64, 8, 152064, 131072, 1e-05, False),
    }.items()}


# --- Qwen 3 (dense and mixture of experts; q/k norms, head_dim 128) --------------------------

_QWEN3 = dict(vocab_size=151936, head_dim=128, hidden_act="silu", max_position_embeddings=40960,
              rms_norm_eps=1e-06, rope_theta=1000000.0, attention_bias=False,
              use_sliding_window=False)


def _qwen3(size: str, hidden: int, inter: int, layers: int, heads: int, kv: int,
           tied: bool) -> Preset:
    return Preset(f"Qwen/Qwen3-{size}", "Qwen3Config", "Qwen3ForCausalLM", dict(
        _QWEN3, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied))


def _qwen3_moe(size: str, hidden: int, inter: int, expert: int, layers: int, heads: int,
               kv: int) -> Preset:
    return Preset(f"Qwen/Qwen3-{size}", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        _QWEN3, hidden_size=hidden, intermediate_size=inter, moe_intermediate_size=expert,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        router_aux_loss_coef=0.001))


_QWEN3S = {  # size: hidden, intermediate, layers, heads, kv heads, tied embeddings
    f"qwen3-{size.lower()}": _qwen3(size, *row) for size, row in {
        "0.6B": (1024, 3072, 28, 16, 8, True),
        "1.7B": (2048, 6144, 28, 16, 8, True),
        "4B": (2560, 9728, 36, 32, 8, True),
        "8B": (4096, 12288, 36, 32, 8, False),
        "14B": (5120, 17408, 40, 40, 8, False),
        "32B": (5120, 25600, 64, 64, 8, False),
    }.items()}
_QWEN3S.update({  # size: hidden, intermediate, expert intermediate, layers, heads, kv heads
    "qwen3-30b-a3b": _qwen3_moe("30B-A3B", 2048, 6144, 768, 48, 32, 4),
    "qwen3-235b-a22b": _qwen3_moe("235B-A22B", 4096, 12288, 1536, 94, 64, 4),
})


# --- DeepSeek-V3 (multi-head latent attention, 256 routed experts and a shared one) ----------

_DEEPSEEK = {
    "deepseek-v3": Preset("deepseek-ai/DeepSeek-V3", "DeepseekV3Config", "DeepseekV3ForCausalLM",
                          dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432,
                               moe_intermediate_size=2048, num_hidden_layers=61,
                               num_attention_heads=128, num_key_value_heads=128,
                               n_shared_experts=1, n_routed_experts=256,
                               routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536,
                               qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                               n_group=8, topk_group=4, num_experts_per_tok=8,
                               first_k_dense_replace=3, norm_topk_prob=True, hidden_act="silu",
                               max_position_embeddings=163840, rms_norm_eps=1e-06,
                               rope_theta=10000, attention_bias=False,
                               tie_word_embeddings=False,
                               rope_scaling=dict(beta_fast=32, beta_slow=1, factor=40,
                                                 mscale=1.0, mscale_all_dim=1.0,
                                                 original_max_position_embeddings=4096,
                                                 type="yarn"))),
}


# --- Gemma 2 and 3 ---------------------------------------------------------------------------

_GEMMA2 = dict(vocab_size=256000, hidden_activation="gelu_pytorch_tanh",
               max_position_embeddings=8192, rms_norm_eps=1e-06, rope_theta=10000.0,
               sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
               attention_bias=False, tie_word_embeddings=True)


def _gemma2(size: str, hidden: int, inter: int, layers: int, heads: int, kv: int, head: int,
            scalar: int) -> Preset:
    return Preset(f"google/gemma-2-{size}", "Gemma2Config", "Gemma2ForCausalLM", dict(
        _GEMMA2, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head,
        query_pre_attn_scalar=scalar))


_GEMMA3 = dict(hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-06, rope_theta=1000000.0,
               rope_local_base_freq=10000.0, sliding_window_pattern=6,
               attn_logit_softcapping=None, final_logit_softcapping=None,
               attention_bias=False, tie_word_embeddings=True)


def _gemma3(size: str, hidden: int, inter: int, layers: int, heads: int, kv: int, head: int,
            scalar: int, **fields) -> Preset:
    text = "" if size == "1b" else " (text_config)"
    return Preset(f"google/gemma-3-{size}-pt{text}", "Gemma3TextConfig", "Gemma3ForCausalLM",
                  dict(_GEMMA3, hidden_size=hidden, intermediate_size=inter,
                       num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=head, query_pre_attn_scalar=scalar,
                       **fields))


_LONG = dict(vocab_size=262208, max_position_embeddings=131072, sliding_window=1024,
             rope_scaling=dict(factor=8.0, rope_type="linear"))

_GEMMAS = {  # hidden, intermediate, layers, heads, kv heads, head_dim, query_pre_attn_scalar
    "gemma-2-2b": _gemma2("2b", 2304, 9216, 26, 8, 4, 256, 256),
    "gemma-2-9b": _gemma2("9b", 3584, 14336, 42, 16, 8, 256, 256),
    "gemma-2-27b": _gemma2("27b", 4608, 36864, 46, 32, 16, 128, 144),
    "gemma-3-1b": _gemma3("1b", 1152, 6912, 26, 4, 1, 256, 256, vocab_size=262144,
                          max_position_embeddings=32768, sliding_window=512,
                          rope_scaling=None),
    "gemma-3-4b": _gemma3("4b", 2560, 10240, 34, 8, 4, 256, 256, **_LONG),
    "gemma-3-12b": _gemma3("12b", 3840, 15360, 48, 16, 8, 256, 256, **_LONG),
    "gemma-3-27b": _gemma3("27b", 5376, 21504, 62, 32, 16, 128, 168, **_LONG),
}


# --- Phi (Phi3ForCausalLM: fused q/k/v and gate/up projections) -------------------------------

_PHI3 = dict(hidden_act="silu", rms_norm_eps=1e-05, tie_word_embeddings=False,
             rope_scaling=None)

_PHIS = {
    "phi-3-mini": Preset("microsoft/Phi-3-mini-4k-instruct", "Phi3Config", "Phi3ForCausalLM",
                         dict(_PHI3, vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                              num_hidden_layers=32, num_attention_heads=32,
                              num_key_value_heads=32, max_position_embeddings=4096,
                              original_max_position_embeddings=4096, rope_theta=10000.0,
                              sliding_window=2047)),
    "phi-3-medium": Preset("microsoft/Phi-3-medium-4k-instruct", "Phi3Config",
                           "Phi3ForCausalLM",
                           dict(_PHI3, vocab_size=32064, hidden_size=5120,
                                intermediate_size=17920, num_hidden_layers=40,
                                num_attention_heads=40, num_key_value_heads=10,
                                max_position_embeddings=4096,
                                original_max_position_embeddings=4096, rope_theta=10000.0,
                                sliding_window=2047)),
    "phi-4": Preset("microsoft/phi-4", "Phi3Config", "Phi3ForCausalLM",
                    dict(_PHI3, vocab_size=100352, hidden_size=5120, intermediate_size=17920,
                         num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=10,
                         max_position_embeddings=16384, original_max_position_embeddings=16384,
                         rope_theta=250000.0, sliding_window=None)),
}


PRESETS: dict[str, Preset] = {**_DEFAULTS, **_LLAMA, **_MISTRALS, **_QWEN25, **_QWEN3S,
                              **_DEEPSEEK, **_GEMMAS, **_PHIS}
FAMILIES = ("Llama 3.x", "Mistral", "Mixtral", "Qwen 2.5", "Qwen 3", "DeepSeek-V3", "Gemma 2",
            "Gemma 3", "Phi")


# --- lookup ----------------------------------------------------------------------------------

def find(name: str) -> Preset | None:
    """The preset ``name`` (in any case), or None."""
    return PRESETS.get(name.lower())


def near(name: str, n: int = 3) -> list[str]:
    """The preset names closest to ``name``: a typo's intended preset; for a Hub id, the
    preset written from that repository's config.json, or the closest to its model's name
    without its ``-Instruct``, ``-it``, ``-Base`` ... suffix."""
    same = [k for k, p in PRESETS.items() if p.source.lower() == name.lower()]
    if same:
        return same[:1]
    key = re.sub(r"^meta-|(-(instruct|it|base|pt|hf|chat|fp8|\d{4}))+$", "",
                 name.lower().rpartition("/")[2])
    return difflib.get_close_matches(key, list(PRESETS), n=n, cutoff=0.5)


def listing() -> str:
    """Every preset name in one short line, sizes of a family in braces:
    ``gpt2, ..., llama-3.1-{8b,70b,405b}, ...``."""
    groups: dict[tuple, list[str]] = {}
    for name in PRESETS:
        stem, dash, size = name.rpartition("-")
        if dash and (size[:1].isdigit() or size in ("mini", "medium")):
            groups.setdefault((stem,), []).append(size)
        else:
            groups.setdefault((name, None), [])
    return ", ".join(key[0] if not sizes else f"{key[0]}-{sizes[0]}" if len(sizes) == 1
                     else f"{key[0]}-{{{','.join(sizes)}}}" for key, sizes in groups.items())
