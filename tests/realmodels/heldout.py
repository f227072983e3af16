"""A held-out audit: real architectures chosen by a rule, not by the team.

The registry (:mod:`.registry`) is a list someone wrote, and a list one writes is a list
one has fixed. ``HELDOUT`` is drawn instead, with a fixed seed, from what the installed
libraries offer, leaving out every name the registry has:

- **timm**: one model from each of timm's architecture files (``timm.models.<file>``) whose
  models have at most :data:`MAX_PARAMS` parameters with 10 classes; 64x64 images where the
  model takes them (``img_size=64`` where it has that argument), else its default input;
- **torchvision**: classifiers of ``torchvision.models.list_models`` under
  :data:`MAX_PARAMS`, at 64x64 (their own minimum size where larger);
- **Hugging Face**: model types of transformers' causal-LM, masked-LM and
  image-classification auto classes, their configs shrunk by one generic rule
  (:data:`SHRINK`: 2 layers, width 64, 4 heads, vocabulary 128), never by hand.

A case the rule builds but whose real step fails (the shrunk config is invalid, the model
needs inputs the rule does not give) is not fxmem's: :func:`.audit.audit` marks it
``invalid``. Build them with ``heldout_cases()``; ``benchmarks/realmodels.py --held-out``
audits them.
"""

from __future__ import annotations

import random
from typing import Callable

import torch

from .registry import (
    BATCH,
    CASES,
    CLASSES,
    HF,
    SEQ,
    VOCAB,
    Case,
    _classifier,
    _ids,
    _labels,
    cross_entropy,
)

SEED = 21  #: the sample's seed (the issue's number)
MAX_PARAMS = 30_000_000
N_TIMM = 60  #: architecture files sampled (of about 98)
N_HF = {"causal": 30, "masked": 8, "image": 8}
N_TORCHVISION = 8

#: The one rule that shrinks a Hugging Face config: every field the config has, set.
SHRINK = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "emb_dim",
                     "width"), 64),
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_dim", "d_ff", "hidden_dim",
                     "encoder_ffn_dim", "decoder_ffn_dim", "moe_intermediate_size",
                     "shared_expert_intermediate_size"), 128),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers",
                     "encoder_layers", "decoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads",
                     "encoder_attention_heads", "decoder_attention_heads"), 4),
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": VOCAB,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_k": 2, "top_k": 2,
}


def _shrunk(fields: dict) -> dict:
    """The :data:`SHRINK` values of the fields a config has that are integers or unset (a
    list, such as a hierarchical model's heads per stage, is kept), its sub-configs (``text_config``,
    ``vision_config``, ...) shrunk alike."""
    out = {k: v for k, v in SHRINK.items()
           if k in fields and (type(fields[k]) is int or fields[k] is None)}
    for k, v in fields.items():
        if k.endswith("_config") and isinstance(v, dict):
            out[k] = _shrunk(v)
    return out


def _shrunk_config(model_type: str):
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    return cls(**_shrunk(cls().to_dict()), num_labels=CLASSES)


def _hf_case(kind: str, model_type: str) -> Callable[[], tuple]:
    def build():
        import transformers as T

        auto = {"causal": T.AutoModelForCausalLM, "masked": T.AutoModelForMaskedLM,
                "image": T.AutoModelForImageClassification}[kind]
        config = _shrunk_config(model_type)
        params = _params_meta(lambda: auto.from_config(config))
        if params > MAX_PARAMS:  # the rule did not shrink it (fields it does not know)
            raise ValueError(f"{params:,} parameters after the shrink rule")
        m = auto.from_config(config)
        if kind == "image":
            size = getattr(m.config, "image_size", 224)
            hw = (size, size) if isinstance(size, int) else tuple(size)[-2:]
            images = torch.randn(BATCH, getattr(m.config, "num_channels", 3), *hw)
            return HF(m, "pixel_values", "labels"), (images, _labels()), (), None
        if getattr(m, "loss_type", "") is None:
            m.loss_type = "ForCausalLM" if kind == "causal" else "ForMaskedLM"
        ids = _ids()
        return HF(m, "input_ids", "labels"), (ids, ids), (), None
    return build


def _runs(model, shape) -> bool:
    """Does ``model`` take an input of ``shape`` (one eval forward, no gradients)?"""
    try:
        with torch.no_grad():
            model.eval()(torch.randn(*shape))
        return True
    except Exception:  # noqa: BLE001 - it does not
        return False
    finally:
        model.train()


def _timm_case(name: str) -> Callable[[], tuple]:
    def build():
        import inspect

        import timm

        kw = {"pretrained": False, "num_classes": CLASSES}
        entry = timm.models.model_entrypoint(name)
        try:  # a model whose grid follows img_size, at 64x64 where it runs there
            model = timm.create_model(name, img_size=64, **kw)
            if _runs(model, (1, 3, 64, 64)):
                return _classifier(model, 64)
        except TypeError:
            if "img_size" in inspect.signature(entry).parameters:
                raise
        model = timm.create_model(name, **kw)
        size = model.pretrained_cfg.get("input_size", (3, 224, 224))
        # a convolutional network takes small images: 64x64 where it runs, else its own size
        hw = (64, 64) if _runs(model, (1, size[0], 64, 64)) else tuple(size[1:])
        return model, (torch.randn(BATCH, size[0], *hw),), (_labels(),), cross_entropy
    return build


def _tv_hw(name: str) -> int:
    """The image size of a torchvision classifier: 64, or the least it takes."""
    if name.startswith("inception"):
        return 75
    return 224 if name.startswith(("vit", "maxvit", "swin")) else 64


def _tv_case(name: str) -> Callable[[], tuple]:
    def build():
        import torchvision

        return _classifier(torchvision.models.get_model(name, weights=None,
                                                        num_classes=CLASSES), _tv_hw(name))
    return build


def heldout_case(name: str) -> Case:
    """The held-out case called ``name`` (as :func:`heldout_cases` names it), built without
    drawing the sample again."""
    family, rest = name.split("/", 1)
    if family == "timm":
        return Case(name, family, _timm_case(rest))
    if family == "torchvision":
        return Case(name, family, _tv_case(rest))
    model_type, kind = rest.rsplit("-", 1)
    return Case(name, family, _hf_case(kind, model_type))


def _params_meta(build_model) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build_model().parameters())


def heldout_cases() -> dict[str, Case]:
    """The held-out cases, drawn with :data:`SEED` (deterministic for installed versions)."""
    rng = random.Random(SEED)
    cases: dict[str, Case] = {}

    def add(family, name, build, note):
        key = f"{family}/{name}"
        if key not in CASES and key not in cases:
            cases[key] = Case(key, family, build, note)

    import timm
    from timm.models import _registry

    taken = {n.split("/", 1)[1] for n in CASES if n.startswith("timm/")}
    files: dict[str, list[str]] = {}
    for n in timm.list_models():
        files.setdefault(_registry._model_to_module[n], []).append(n)
    for file in rng.sample(sorted(files), min(N_TIMM, len(files))):
        names = [n for n in sorted(files[file]) if n not in taken]
        rng.shuffle(names)
        for n in names[:6]:  # the first small one of a few tries
            try:
                p = _params_meta(lambda n=n: timm.create_model(n, num_classes=CLASSES))
            except Exception:  # noqa: BLE001 - a model that does not build is skipped
                continue
            if p <= MAX_PARAMS:
                add("timm", n, _timm_case(n), f"timm.models.{file}; 64x64 images where taken")
                break

    import torchvision

    tv = [n for n in sorted(torchvision.models.list_models(module=torchvision.models))
          if f"torchvision/{n}" not in CASES]
    rng.shuffle(tv)
    for n in tv:
        if sum(c.family == "torchvision" for c in cases.values()) >= N_TORCHVISION:
            break
        try:
            p = _params_meta(lambda n=n: torchvision.models.get_model(n, weights=None,
                                                                     num_classes=CLASSES))
        except Exception:  # noqa: BLE001
            continue
        if p <= MAX_PARAMS:
            add("torchvision", n, _tv_case(n), f"{_tv_hw(n)}x{_tv_hw(n)} images, 10 classes")

    from transformers.models.auto import modeling_auto as ma

    taken_hf = {n.split("/", 1)[1].split("-")[0] for n in CASES if n.startswith("hf/")}
    mappings = {"causal": ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                "masked": ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
                "image": ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES}
    for kind, mapping in mappings.items():
        types = sorted(t for t in mapping if t not in taken_hf)
        for t in rng.sample(types, min(N_HF[kind], len(types))):
            add("hf", f"{t}-{kind}", _hf_case(kind, t),
                f"{mapping[t]}, config shrunk by the held-out rule, "
                + ("images of its config's size" if kind == "image" else f"sequence {SEQ}"))
    return cases
