"""Models a user names but does not have as a file: ``timm:NAME``, ``torchvision:NAME``,
``hf:PRESET`` (:mod:`fxmem.cli.presets`: published configs by name), ``hf:ConfigClass``,
``hf:path/to/config.json`` and ``hf:ORG/NAME`` (a Hub id whose config.json the local Hugging
Face cache holds), built with random weights on the meta device (nothing is downloaded), with
their example inputs, targets and loss.

``--config key=value`` pairs are checked against what the model's configuration knows before
anything is built: a Hugging Face config takes any keyword silently, so a mistyped key would
otherwise be ignored. An unknown key is an :class:`fxmem.InputError` (exit 2) naming the
closest known one.

>>> closest("n_layers", ["n_layer", "n_head", "n_embd"])
'n_layer'
"""

from __future__ import annotations

import difflib
import inspect
import json
import os

import torch

from ..errors import InputError, one_line
from ..validate.zoo import CausalLM
from . import presets

# where a config says its longest sequence, and its image size
_POSITIONS = ("n_positions", "max_position_embeddings", "max_source_positions")
_DEFAULT_SEQ = 512
_DEFAULT_IMAGE = 224


def closest(key: str, known) -> str | None:
    """The known name nearest to ``key`` (a typo's intended field), or None."""
    match = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return match[0] if match else None


def check_keys(config: dict, known, what: str) -> None:
    """Refuse keys ``what`` does not know, naming the closest known one."""
    for key in config:
        if key not in known:
            near = closest(key, known)
            hint = f"; did you mean {near}?" if near else ""
            raise InputError(f"--config {key}: {what} has no such field{hint}")


class ImageClassifier(torch.nn.Module):
    """A Hugging Face image classifier called as ``model(pixel_values, labels)``: its output
    has ``.loss``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values, labels=None):
        return self.model(pixel_values=pixel_values, labels=labels)


# --- Hugging Face ----------------------------------------------------------------------------

def _transformers():
    try:
        import transformers
    except ImportError:
        raise InputError("hf: targets need transformers (pip install transformers)") from None
    return transformers


def _config_keys(config_class) -> set:
    """What a config class knows: its defaults' fields, its aliases, its init parameters."""
    known = set(config_class().to_dict())
    known |= set(getattr(config_class, "attribute_map", {}))
    for cls in config_class.__mro__:  # PretrainedConfig's own (num_labels is a property)
        if "__init__" in vars(cls):
            known |= set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}
        known |= {n for n, v in vars(cls).items() if isinstance(v, property)}
    return known


def _hf_config(name: str, overrides: dict):
    """The config named by ``name`` (a preset, a config class, or a config.json file) with
    ``overrides`` checked and applied, and the model class a preset fixes (or None)."""
    transformers = _transformers()
    preset = presets.find(name)
    if preset is not None:
        config_class = getattr(transformers, preset.config)
        base, model_class = dict(preset.fields), getattr(transformers, preset.model)
    elif name.endswith(".json") or "/" in name or os.sep in name:
        data = _read_json(_local_config(name))
        model_type = data.pop("model_type", None)
        if not model_type:
            raise InputError(f"{name} has no model_type: not a Hugging Face config")
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        if model_type not in CONFIG_MAPPING_NAMES:
            near = closest(str(model_type), CONFIG_MAPPING_NAMES)
            raise InputError(f"{name}: transformers {transformers.__version__} knows no "
                             f"model_type {model_type!r}" + (f"; did you mean {near}?"
                                                             if near else ""))
        try:
            config_class = transformers.AutoConfig.for_model(model_type).__class__
        except Exception as e:  # noqa: BLE001 - transformers' own refusal, in one line
            raise InputError(f"{name}: {one_line(str(e), 200)}") from None
        base, model_class = {**data}, None
    else:
        config_class = getattr(transformers, name, None)
        if not (isinstance(config_class, type)
                and issubclass(config_class, transformers.PretrainedConfig)):
            near = ", ".join("hf:" + n for n in presets.near(name))
            raise InputError(f"unknown preset hf:{name}" + (f"; did you mean {near}?" if near
                                                            else ".") +
                             f" The presets: {presets.listing()}. Or give a transformers "
                             "config class (hf:GPT2Config), a config.json path or a Hub id "
                             "in your Hugging Face cache (hf:ORG/NAME)")
        base, model_class = {}, None
    check_keys(overrides, _config_keys(config_class), config_class.__name__)
    check_types(overrides, config_class)
    try:
        return config_class(**{**base, **overrides}), model_class
    except Exception as e:  # noqa: BLE001 - transformers' validation, in one line
        raise InputError(f"hf:{name}: bad --config: {one_line(str(e))}") from None


def _hub_id(name: str) -> bool:
    """Whether ``name`` reads as a Hugging Face Hub id (``ORG/NAME``), not a path."""
    return (name.count("/") == 1 and not name.endswith(".json")
            and not name.startswith((".", "/", "~")) and not os.path.exists(name))


def _cached(name: str) -> str | None:
    """The config.json of the Hub id ``name`` in the local Hugging Face cache, or None."""
    if not _hub_id(name):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
        cached = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id, or no huggingface_hub: not cached
        cached = None
    return cached if isinstance(cached, str) and os.path.isfile(cached) else None


def _local_config(name: str) -> str:
    """``name`` itself when it is a file, or the config.json of the Hugging Face Hub id
    ``name`` (``meta-llama/Llama-3.1-8B``) when the local Hub cache already holds it:
    fxmem downloads nothing, so a Hub id not in the cache is an :class:`fxmem.InputError`,
    in one line, naming the presets (the one written from that repository first) and how to
    get its config.json."""
    if not _hub_id(name):
        return name
    cached = _cached(name)
    if cached:
        return cached
    short = name.split("/")[1]
    near = " or ".join("hf:" + n for n in presets.near(name, 2))
    raise InputError(f"hf:{name} looks like a Hugging Face Hub id, its config is not in "
                     "the local Hub cache, and fxmem downloads nothing: use a preset"
                     + (f" such as {near}" if near else "") +
                     f" (the presets: {presets.listing()}), or save the model's "
                     f"config.json (`hf download {name} config.json --local-dir {short}`) "
                     f"and give hf:{short}/config.json; the weights are never needed")


def _read_json(name: str) -> dict:
    """A config.json's fields, or an error saying what is wrong with the file."""
    if not os.path.exists(name):
        raise InputError(f"no such config file: {name}")
    if not os.path.isfile(name):
        raise InputError(f"{name} is not a file: give a config.json")
    try:
        with open(name, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {name}: {e}") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{name} is not valid JSON: {e.msg} at line {e.lineno} column "
                         f"{e.colno}") from None
    if not isinstance(data, dict):
        raise InputError(f"{name} holds a JSON {type(data).__name__}, not an object of "
                         "config fields")
    return data


def check_types(config: dict, config_class) -> None:
    """Values of the type of the config's defaults (an int field takes an int, a flag true
    or false): older transformers releases take any value and fail later, or not at all."""
    defaults = config_class()
    for key, value in config.items():
        default = getattr(defaults, key, None)
        if default is None:
            continue
        ok = (isinstance(value, bool) if isinstance(default, bool) else
              isinstance(value, int) and not isinstance(value, bool)
              if isinstance(default, int) else
              isinstance(value, (int, float)) and not isinstance(value, bool)
              if isinstance(default, float) else True)
        if not ok:
            kind = {bool: "true or false", int: "an integer", float: "a number"}[type(default)]
            raise InputError(f"--config {key}={value!r}: {config_class.__name__}.{key} is "
                             f"{kind} (default {default!r})")


# task heads tried in order for a config with no preset: (mapping, kind). Masked LM first:
# encoders (BERT, RoBERTa) have a causal-LM head too, for decoder use, but train as masked LMs
_HEADS = (("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "text"),
          ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "text"),
          ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "text"),
          ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "image"))


def _hf_head(cfg):
    """The training head for ``cfg``: (model class, "text" or "image")."""
    transformers = _transformers()
    from transformers.models.auto import modeling_auto

    for mapping, kind in _HEADS:
        names = getattr(modeling_auto, mapping, {})
        model_name = names.get(cfg.model_type)
        if isinstance(model_name, (tuple, list)):
            model_name = model_name[0]
        if model_name and hasattr(transformers, model_name):
            return getattr(transformers, model_name), kind
    raise InputError(f"no training head fxmem knows for model_type {cfg.model_type!r} (causal "
                     "or masked LM, sequence-to-sequence LM, image classification): write a "
                     "file target that builds the model and returns its loss")


def hf(name: str, overrides: dict, seq: int | None):
    """A Hugging Face model from a preset, a config class or a config.json: (model, name,
    input specs, loss name, named dims)."""
    cfg, model_class = _hf_config(name, overrides)
    kind = "text"
    if model_class is None:
        model_class, kind = _hf_head(cfg)
    if cfg.is_encoder_decoder and getattr(cfg, "decoder_start_token_id", None) is None:
        # the labels are shifted right into the decoder's inputs, starting from this token;
        # the published T5 and BART configs set it (to the pad token, or 2), defaults may not
        cfg.decoder_start_token_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    try:
        with torch.device("meta"):
            model = model_class(cfg)
    except Exception as e:  # noqa: BLE001 - a config transformers cannot build, in one line
        raise InputError(f"cannot build {model_class.__name__} from hf:{name}: "
                         f"{type(e).__name__}: {one_line(str(e))}") from None
    if kind == "image":
        size = getattr(cfg, "image_size", _DEFAULT_IMAGE)
        size = size if isinstance(size, int) else _DEFAULT_IMAGE
        channels = getattr(cfg, "num_channels", 3)
        specs = (f"B,{channels},{size},{size}", f"B:int64:{cfg.num_labels}")
        return ImageClassifier(model), f"hf:{name}", specs, "none", {}
    if getattr(model, "loss_type", "") is None:
        # GPT2LMHeadModel's name names no loss: transformers warns on stderr, then uses the
        # causal-LM loss. Name that loss, so the CLI's output is the report alone.
        model.loss_type = "ForCausalLM"
    limit = next((int(v) for v in (getattr(cfg, k, None) for k in _POSITIONS)
                  if isinstance(v, int) and v > 0), _DEFAULT_SEQ)
    length = seq or min(limit, _DEFAULT_SEQ)
    spec = f"B,L:int64:{cfg.vocab_size}"  # the length is a symbol too; numbers at L=length
    return CausalLM(model), f"hf:{name}", (spec, spec), "none", {"L": length}


# --- timm and torchvision --------------------------------------------------------------------

def _init_keys(module_name: str) -> set:
    """Init parameters of every nn.Module class in a module: what its factories pass on."""
    import sys

    out = set()
    for obj in vars(sys.modules.get(module_name, object)).values():
        if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
            out |= set(inspect.signature(obj.__init__).parameters) - {"self", "args", "kwargs"}
    return out


def torchvision_release() -> str:
    """The torchvision release made for the running torch (torch 2.N ships with
    torchvision 0.(N + 15)), e.g. ``"0.29"`` beside torch 2.14.

    >>> import re
    >>> bool(re.fullmatch(r"0\\.\\d+", torchvision_release()))
    True
    """
    from ..trace.kernels import TORCH

    return f"0.{TORCH[1] + 15}" if TORCH[0] == 2 else "(the one made for your torch)"


def _vision_package(name: str):
    """``import name`` (torchvision, or timm, which imports torchvision), or an
    :class:`fxmem.InputError` saying which torchvision this torch needs: a torchvision built
    for another torch fails at import ('operator torchvision::nms does not exist'), as
    PyPI's does beside a CPU build of torch from elsewhere."""
    import importlib

    route = (f"install the torchvision made for torch {torch.__version__}: "
             f"torchvision=={torchvision_release()}.*, from the same package index as your "
             "torch (a CPU build of torch needs a CPU build of torchvision); see the "
             "README's 'Models from torchvision and timm'")
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if e.name == name:
            raise InputError(f"{name}: targets need {name}: " + (
                route if name == "torchvision" else
                f"pip install {name}, beside the torchvision made for your torch ({route})")
            ) from None
        failure = e
    except Exception as e:  # noqa: BLE001 - a mismatched torchvision fails as it loads
        failure = e
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = f"torchvision {version('torchvision')}"
    except PackageNotFoundError:
        have = "torchvision"
    raise InputError(f"{name}: targets need torchvision, and the installed {have} does not "
                     f"load beside torch {torch.__version__} ({type(failure).__name__}: "
                     f"{one_line(str(failure), 120)}): {route}") from None


def timm_model(name: str, overrides: dict):
    """``timm.create_model(name, pretrained=False, **overrides)`` on the meta device, with its
    default input size (``pretrained_cfg["input_size"]``) and class count."""
    timm = _vision_package("timm")
    if not timm.is_model(name):
        near = closest(name, timm.list_models())
        raise InputError(f"timm has no model {name}" + (f"; did you mean {near}?" if near
                                                          else ""))
    fn = timm.models.model_entrypoint(name)
    known = _init_keys(fn.__module__) | {"num_classes", "in_chans", "drop_rate",
                                         "drop_path_rate", "img_size", "global_pool"}
    check_keys(overrides, known, f"timm {name}")
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, **overrides)
    except Exception as e:  # noqa: BLE001 - what timm refuses, in one line
        raise InputError(f"timm:{name}: bad --config: {type(e).__name__}: "
                         f"{one_line(str(e))}") from None
    channels, h, w = model.pretrained_cfg.get("input_size", (3, _DEFAULT_IMAGE, _DEFAULT_IMAGE))
    if "img_size" in overrides:
        size = overrides["img_size"]
        h, w = (size, size) if isinstance(size, int) else size
    channels = overrides.get("in_chans", channels)
    return model, (f"B,{channels},{h},{w}", f"B:int64:{model.num_classes}")


def torchvision_model(name: str, overrides: dict):
    """``torchvision.models.get_model(name, weights=None, **overrides)`` on the meta device, a
    classifier, with the crop size of its weights' transforms."""
    torchvision = _vision_package("torchvision")
    models = torchvision.models
    classifiers = set(models.list_models(module=models))
    if name not in classifiers:
        other = name in set(models.list_models())
        near = closest(name, classifiers)
        raise InputError(f"torchvision:{name}: " + (
            "a detection, segmentation or video model takes targets fxmem cannot write on the "
            "command line: build it in a file target" if other else
            "no such classifier" + (f"; did you mean {near}?" if near else "")))
    builder = models.get_model_builder(name)
    known = _init_keys(builder.__module__) | set(inspect.signature(builder).parameters)
    check_keys(overrides, known - {"weights", "progress", "kwargs"}, f"torchvision {name}")
    try:
        with torch.device("meta"):
            model = models.get_model(name, weights=None, **overrides)
    except Exception as e:  # noqa: BLE001 - what torchvision refuses, in one line
        raise InputError(f"torchvision:{name}: bad --config: {type(e).__name__}: "
                         f"{one_line(str(e))}") from None
    crop = _DEFAULT_IMAGE
    try:
        crop = models.get_model_weights(name).DEFAULT.transforms().crop_size[0]
    except (ValueError, AttributeError, IndexError):
        pass
    classes = overrides.get("num_classes", 1000)
    return model, (f"B,3,{crop},{crop}", f"B:int64:{classes}")
