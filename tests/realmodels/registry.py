"""The registry of real architectures: ``CASES[name]`` is a :class:`Case` whose ``build()``
returns ``(model, inputs, targets, loss)`` for one training step, at batch size 4 (dim 0 of
every input and target; fxmem makes it the symbol B).

Every model has random weights (nothing is downloaded) and a small configuration, so that a
real CPU step at B=5 takes seconds: torchvision and timm classifiers on 64x64 images (larger
where the architecture needs it) with 10 classes, timm's transformers with their own blocks
but fewer of them where the named variant is large, and Hugging Face models from their config
classes with two layers and widths of 64. ``Case.note`` says what was shrunk.

Names are ``<family>/<architecture>[-<variant>]``, the family being ``torchvision``,
``timm`` or ``hf``.

>>> len(CASES) >= 120
True
>>> sorted({c.family for c in CASES.values()})
['hf', 'timm', 'torchvision']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 4  #: dim 0 of the example tensors
CLASSES = 10
VOCAB = 128
SEQ = 16


@dataclass(frozen=True)
class Case:
    """One model of the zoo. ``build()`` returns ``(model, inputs, targets, loss)``:
    ``inputs`` and ``targets`` tuples of tensors with dim 0 = :data:`BATCH`, ``loss`` a
    callable ``loss(output, *targets)`` or ``None`` (the output is the loss or has
    ``.loss``). ``note``: how the configuration differs from the published one."""

    name: str
    family: str
    build: Callable[[], tuple]
    note: str = ""


CASES: dict[str, Case] = {}


def _add(family: str, name: str, build: Callable[[], tuple], note: str = "") -> None:
    key = f"{family}/{name}"
    assert key not in CASES, key
    CASES[key] = Case(key, family, build, note)


# ---------------------------------------------------------------------------- losses


def cross_entropy(out, y):
    """Cross-entropy on logits (the first of a tuple, or a dict's ``out``/``logits``)."""
    if isinstance(out, dict):
        out = out["out"] if "out" in out else out["logits"]
    elif isinstance(out, (tuple, list)):
        out = out[0]
    return F.cross_entropy(out, y)


def segmentation_loss(out, y):
    """torchvision's segmentation recipe: cross-entropy on ``out``, plus half of it on
    ``aux`` where the model has an auxiliary head."""
    loss = F.cross_entropy(out["out"], y)
    if "aux" in out:
        loss = loss + 0.5 * F.cross_entropy(out["aux"], y)
    return loss


# ---------------------------------------------------------------------------- wrappers


class Detection(nn.Module):
    """A torchvision detection model called on batched tensors: ``images`` (B, 3, H, W),
    ``boxes`` (B, n, 4) and ``labels`` (B, n) become the lists of images and target dicts
    its training mode takes; the output is the sum of its losses."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, images, boxes, labels):
        targets = [{"boxes": b, "labels": lab} for b, lab in zip(boxes, labels)]
        losses = self.model(list(images), targets)
        return sum(losses.values())


class OpticalFlow(nn.Module):
    """RAFT: two frames in, the L1 loss of its last flow prediction against ``flow``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, a, b):
        return self.model(a, b, num_flow_updates=2)[-1]


class HF(nn.Module):
    """A Hugging Face model called with keyword arguments named by ``keys``, in the order
    of the positional inputs (fxmem passes tensors positionally); its output has ``.loss``."""

    def __init__(self, model, *keys, **fixed):
        super().__init__()
        self.model = model
        self.keys = keys
        self.fixed = fixed

    def forward(self, *tensors):
        return self.model(**dict(zip(self.keys, tensors)), **self.fixed)


# ---------------------------------------------------------------------------- torchvision


def _images(hw=64, channels=3):
    hw = (hw, hw) if isinstance(hw, int) else hw
    return torch.randn(BATCH, channels, *hw)


def _labels(n=CLASSES):
    return torch.randint(0, n, (BATCH,))


def _classifier(model, hw=64):
    return model, (_images(hw),), (_labels(),), cross_entropy


def _tv(name, hw=64, note="", **kw):
    def build():
        import torchvision

        return _classifier(getattr(torchvision.models, name)(weights=None, num_classes=CLASSES,
                                                             **kw), hw)
    _add("torchvision", name, build, note or f"{hw}x{hw} images, 10 classes")


for _name in ["alexnet", "vgg11_bn", "resnet18", "resnet50", "resnext50_32x4d",
              "wide_resnet50_2", "densenet121", "squeezenet1_1", "mobilenet_v2",
              "mobilenet_v3_small", "mobilenet_v3_large", "shufflenet_v2_x0_5", "mnasnet0_5",
              "efficientnet_b0", "efficientnet_v2_s", "regnet_x_400mf", "regnet_y_400mf",
              "convnext_tiny", "swin_t", "swin_v2_t"]:
    _tv(_name)
_tv("googlenet", aux_logits=False, init_weights=False, note="64x64 images, no auxiliary heads")
_tv("inception_v3", hw=96, aux_logits=False, init_weights=False,
    note="96x96 images (75 at least), no auxiliary head")
_tv("vit_b_32", image_size=64, note="64x64 images (image_size=64), 12 layers")
_tv("maxvit_t", hw=224, note="224x224 images (its partition needs them)")


def _tv_vit_small():
    from torchvision.models.vision_transformer import VisionTransformer

    return _classifier(VisionTransformer(image_size=64, patch_size=8, num_layers=4,
                                         num_heads=4, hidden_dim=128, mlp_dim=256,
                                         num_classes=CLASSES))


_add("torchvision", "vit-small-custom", _tv_vit_small,
     "VisionTransformer(image_size=64, patch 8, 4 layers, width 128)")


def _tv_segmentation(name, hw=64, **kw):
    def build():
        import torchvision

        model = getattr(torchvision.models.segmentation, name)(
            weights=None, weights_backbone=None, num_classes=CLASSES, **kw)
        return (model, (_images(hw),), (torch.randint(0, CLASSES, (BATCH, hw, hw)),),
                segmentation_loss)
    _add("torchvision", name, build, f"{hw}x{hw} images, 10 classes, per-pixel cross-entropy")


_tv_segmentation("fcn_resnet50", aux_loss=True)
_tv_segmentation("deeplabv3_mobilenet_v3_large", aux_loss=True)
_tv_segmentation("lraspp_mobilenet_v3_large")


def _tv_detection(name, hw=128, **kw):
    def build():
        import torchvision

        model = getattr(torchvision.models.detection, name)(
            weights=None, weights_backbone=None, num_classes=CLASSES + 1, **kw)
        boxes = torch.tensor([[8.0, 8.0, 48.0, 56.0], [30.0, 20.0, 100.0, 90.0]])
        boxes = boxes.expand(BATCH, 2, 4).contiguous()
        labels = torch.randint(1, CLASSES + 1, (BATCH, 2))
        return Detection(model), (_images(hw), boxes, labels), (), None
    _add("torchvision", name, build, f"{hw}x{hw} images, 2 boxes an image, sum of the losses")


_tv_detection("fasterrcnn_mobilenet_v3_large_320_fpn", min_size=128, max_size=128)
_tv_detection("retinanet_resnet50_fpn", min_size=128, max_size=128)
_tv_detection("fcos_resnet50_fpn", min_size=128, max_size=128)
_tv_detection("ssdlite320_mobilenet_v3_large", hw=320)


def _tv_video(name, frames=4, hw=32):
    def build():
        import torchvision

        model = getattr(torchvision.models.video, name)(weights=None, num_classes=CLASSES)
        return model, (torch.randn(BATCH, 3, frames, hw, hw),), (_labels(),), cross_entropy
    _add("torchvision", name, build, f"video: {frames} frames of {hw}x{hw}")


for _name in ["r3d_18", "mc3_18", "r2plus1d_18"]:
    _tv_video(_name)


def _tv_raft():
    import torchvision

    model = OpticalFlow(torchvision.models.optical_flow.raft_small(weights=None))
    a, b = _images(128), _images(128)
    flow = torch.randn(BATCH, 2, 128, 128)
    return model, (a, b), (flow,), lambda out, f: (out - f).abs().mean()


_add("torchvision", "raft_small", _tv_raft, "128x128 frames, 2 flow updates, L1 loss")


class UNet(nn.Module):
    """A U-Net (Ronneberger et al. 2015) on a pretrained-style encoder, as
    segmentation_models_pytorch builds one: the ``encoder``'s feature maps (a list or a dict
    of them, shallow to deep) decoded by upsampling x2 (bilinear, or a
    transposed convolution), concatenating the skip and two conv-BN-ReLU; a 1x1 head gives
    per-pixel logits at the input's size."""

    def __init__(self, encoder, channels, classes=CLASSES, transposed=False):
        super().__init__()
        self.encoder = encoder
        self.up, self.blocks = nn.ModuleList(), nn.ModuleList()
        deep = channels[-1]
        for skip in reversed(channels[:-1]):
            self.up.append(nn.ConvTranspose2d(deep, deep, 2, stride=2) if transposed
                           else nn.Upsample(scale_factor=2, mode="bilinear"))
            self.blocks.append(nn.Sequential(
                nn.Conv2d(deep + skip, skip, 3, padding=1), nn.BatchNorm2d(skip), nn.ReLU(),
                nn.Conv2d(skip, skip, 3, padding=1), nn.BatchNorm2d(skip), nn.ReLU()))
            deep = skip
        self.head = nn.Conv2d(deep, classes, 1)

    def forward(self, x):
        feats = self.encoder(x)
        feats = list(feats.values()) if isinstance(feats, dict) else feats
        y = feats[-1]
        for up, block, skip in zip(self.up, self.blocks, reversed(feats[:-1])):
            y = block(torch.cat([up(y), skip], dim=1))
        return {"out": F.interpolate(self.head(y), size=x.shape[-2:], mode="bilinear")}


def _tv_unet():
    import torchvision
    from torchvision.models.feature_extraction import create_feature_extractor

    nodes = ["relu", "layer1", "layer2", "layer3", "layer4"]
    enc = create_feature_extractor(torchvision.models.resnet18(weights=None), nodes)
    model = UNet(enc, [64, 64, 128, 256, 512], transposed=True)
    return (model, (_images(64),), (torch.randint(0, CLASSES, (BATCH, 64, 64)),),
            segmentation_loss)


_add("torchvision", "unet-resnet18", _tv_unet, "a U-Net decoder (transposed convolutions) on "
     "ResNet-18's feature maps (torchvision's create_feature_extractor), 64x64 images, "
     "per-pixel cross-entropy")


# ---------------------------------------------------------------------------- timm


def _timm(name, hw=64, note="", **kw):
    def build():
        import timm

        return _classifier(timm.create_model(name, pretrained=False, num_classes=CLASSES, **kw),
                           hw)
    shrunk = ", ".join(f"{k}={v}" for k, v in kw.items())
    _add("timm", name, build, note or f"{hw}x{hw} images" + (f", {shrunk}" if shrunk else ""))


# convolutional networks, at their own configuration
for _name in ["resnet18", "resnet50d", "resnet10t", "resnetv2_50x1_bit", "regnetx_002",
              "regnety_002", "efficientnet_b0", "efficientnet_b1", "tf_efficientnet_b0",
              "efficientnetv2_rw_t", "efficientnet_b0_gn", "mobilenetv3_small_050",
              "mobilenetv3_large_100", "mobilenetv4_conv_small", "mixnet_s", "ghostnet_100",
              "ghostnetv2_100", "rexnet_100", "lcnet_050", "mnasnet_small", "fbnetc_100",
              "tinynet_e", "hardcorenas_a", "convnext_atto", "convnextv2_atto", "dla34",
              "dpn48b", "densenet121", "cspresnet50", "cspdarknet53", "res2net50_14w_8s",
              "selecsls42b", "skresnet18", "resnest14d", "ecaresnet26t", "seresnext26d_32x4d",
              "nf_resnet26", "repvgg_a0", "ese_vovnet19b_dw", "hrnet_w18_small", "gernet_s",
              "xception41", "inception_next_atto", "hgnet_tiny", "hgnetv2_b0", "repvit_m0_9",
              "fastvit_t8", "edgenext_xx_small", "poolformer_s12", "mambaout_femto",
              "starnet_s050", "rdnet_tiny", "mobilevit_xxs", "mobilevitv2_050",
              "efficientvit_b0", "lambda_resnet26t", "sequencer2d_s", "tiny_vit_5m_224",
              "davit_tiny", "focalnet_tiny_srf", "pvt_v2_b0", "twins_svt_small",
              "efficientvit_m0", "dm_nfnet_f0"]:
    _timm(_name)

# transformers whose patch grid follows img_size; the large ones with fewer blocks
_timm("vit_tiny_patch16_224", img_size=64)
_timm("deit_tiny_patch16_224", img_size=64)
_timm("vit_small_patch16_224", img_size=64, depth=4)
_timm("beit_base_patch16_224", img_size=64, depth=4)
_timm("beitv2_base_patch16_224", img_size=64, depth=4)
_timm("eva02_tiny_patch14_224", hw=56, img_size=56)
_timm("convit_tiny", img_size=64)
_timm("cait_xxs24_224", img_size=64, depth=4)
_timm("xcit_nano_12_p16_224", img_size=64)
_timm("tnt_s_patch16_224", img_size=64, depth=4)
_timm("volo_d1_224", img_size=64)
_timm("pit_ti_224", img_size=64)
_timm("resmlp_12_224", img_size=64)
_timm("mixer_s16_224", img_size=64)
_timm("gmlp_ti16_224", img_size=64)
_timm("swin_tiny_patch4_window7_224", img_size=64, window_size=4)
_timm("swinv2_tiny_window8_256", img_size=64, window_size=4)
_timm("crossvit_tiny_240", hw=240, note="240x240 images (its two branches need them)")
_timm("hiera_tiny_224", img_size=64)
for _name in ["efficientformerv2_s0", "botnet26t_256", "coatnet_nano_rw_224", "coatnet_0_rw_224",
              "maxvit_nano_rw_256", "nest_tiny", "gcvit_xxtiny", "visformer_tiny", "levit_128s",
              "coat_lite_tiny"]:
    _timm(_name, img_size=64)
_timm("mvitv2_tiny", img_size=64)


def _timm_unet():
    import timm

    enc = timm.create_model("convnext_atto", pretrained=False, features_only=True)
    model = UNet(enc, enc.feature_info.channels())
    return (model, (_images(64),), (torch.randint(0, CLASSES, (BATCH, 64, 64)),),
            segmentation_loss)


_add("timm", "unet-convnext_atto", _timm_unet, "a U-Net decoder (bilinear upsampling) on "
     "ConvNeXt-atto's feature maps (features_only=True), 64x64 images, per-pixel "
     "cross-entropy")


# ---------------------------------------------------------------------------- Hugging Face

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=VOCAB)


def _ids():
    return torch.randint(0, VOCAB, (BATCH, SEQ))


def _hf_lm(name, config, model, note="", **cfg):
    """A language model called as ``model(input_ids=ids, labels=ids)``."""
    def build():
        import transformers as T

        m = getattr(T, model)(getattr(T, config)(**cfg))
        if getattr(m, "loss_type", "") is None:
            m.loss_type = "ForCausalLM"
        ids = _ids()
        return HF(m, "input_ids", "labels"), (ids, ids), (), None
    _add("hf", name, build, note or f"{model}, 2 layers, width 64, sequence {SEQ}")


_LLAMA = dict(SMALL, num_key_value_heads=2)
_hf_lm("gpt2", "GPT2Config", "GPT2LMHeadModel", n_layer=2, n_embd=64, n_head=4,
       vocab_size=VOCAB, n_positions=64)
_hf_lm("llama", "LlamaConfig", "LlamaForCausalLM", **_LLAMA)
_hf_lm("mistral", "MistralConfig", "MistralForCausalLM", sliding_window=8, **_LLAMA)
_hf_lm("qwen2", "Qwen2Config", "Qwen2ForCausalLM", **_LLAMA)
_hf_lm("qwen3", "Qwen3Config", "Qwen3ForCausalLM", head_dim=16, **_LLAMA)
_hf_lm("gemma", "GemmaConfig", "GemmaForCausalLM", head_dim=16, **_LLAMA)
_hf_lm("gemma2", "Gemma2Config", "Gemma2ForCausalLM", head_dim=16, sliding_window=8, **_LLAMA)
_hf_lm("phi", "PhiConfig", "PhiForCausalLM", **SMALL)
_hf_lm("phi3", "Phi3Config", "Phi3ForCausalLM", pad_token_id=0, **SMALL)
_hf_lm("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", **SMALL)
_hf_lm("gptj", "GPTJConfig", "GPTJForCausalLM", n_layer=2, n_embd=64, n_head=4, rotary_dim=8,
       vocab_size=VOCAB, n_positions=64)
_hf_lm("opt", "OPTConfig", "OPTForCausalLM", hidden_size=64, ffn_dim=128, num_hidden_layers=2,
       num_attention_heads=4, vocab_size=VOCAB, word_embed_proj_dim=64)
_hf_lm("falcon", "FalconConfig", "FalconForCausalLM", hidden_size=64, num_hidden_layers=2,
       num_attention_heads=4, vocab_size=VOCAB)
_hf_lm("bloom", "BloomConfig", "BloomForCausalLM", hidden_size=64, n_layer=2, n_head=4,
       vocab_size=VOCAB)
_hf_lm("gpt_bigcode", "GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_layer=2, n_embd=64,
       n_head=4, vocab_size=VOCAB, n_positions=64)
_hf_lm("olmo2", "Olmo2Config", "Olmo2ForCausalLM", **_LLAMA)
_hf_lm("mixtral-moe", "MixtralConfig", "MixtralForCausalLM", num_local_experts=4,
       num_experts_per_tok=2, **_LLAMA)
_hf_lm("qwen2_moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=4,
       num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
       **_LLAMA)
_hf_lm("mamba", "MambaConfig", "MambaForCausalLM", hidden_size=64, state_size=8,
       num_hidden_layers=2, vocab_size=VOCAB)
_hf_lm("bert-mlm", "BertConfig", "BertForMaskedLM", **SMALL)
_hf_lm("roberta-mlm", "RobertaConfig", "RobertaForMaskedLM", max_position_embeddings=64,
       **SMALL)
_hf_lm("distilbert-mlm", "DistilBertConfig", "DistilBertForMaskedLM", dim=64, hidden_dim=128,
       n_layers=2, n_heads=4, vocab_size=VOCAB)
_hf_lm("albert-mlm", "AlbertConfig", "AlbertForMaskedLM", embedding_size=32, **SMALL)
_hf_lm("electra-mlm", "ElectraConfig", "ElectraForMaskedLM", embedding_size=32, **SMALL)
_hf_lm("deberta_v2-mlm", "DebertaV2Config", "DebertaV2ForMaskedLM", **SMALL)
_hf_lm("modernbert-mlm", "ModernBertConfig", "ModernBertForMaskedLM", pad_token_id=0,
       bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, **SMALL)
_hf_lm("t5", "T5Config", "T5ForConditionalGeneration", d_model=64, d_ff=128, num_layers=2,
       num_heads=4, d_kv=16, vocab_size=VOCAB, decoder_start_token_id=0,
       note="encoder-decoder, labels = inputs")
_hf_lm("bart", "BartConfig", "BartForConditionalGeneration", d_model=64, encoder_layers=2,
       decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
       encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB, max_position_embeddings=64,
       note="encoder-decoder, labels = inputs")


def _hf_seq_classifier(name, config, model, frozen, note, **cfg):
    """A sequence classifier; ``frozen``: freeze every parameter whose name does not start
    with one of these prefixes' complement (fine-tuning the head and the last layer)."""
    def build():
        import transformers as T

        m = getattr(T, model)(getattr(T, config)(num_labels=CLASSES, **cfg))
        for n, p in m.named_parameters():
            p.requires_grad_(any(n.startswith(k) for k in frozen))
        return HF(m, "input_ids", "labels"), (_ids(), _labels()), (), None
    _add("hf", name, build, note)


_hf_seq_classifier("bert-frozen-finetune", "BertConfig", "BertForSequenceClassification",
                   ("classifier", "bert.pooler", "bert.encoder.layer.3"),
                   "BertForSequenceClassification, 4 layers, only the last layer, pooler and "
                   "classifier trainable", **dict(SMALL, num_hidden_layers=4))
_hf_seq_classifier("gpt2-frozen-finetune", "GPT2Config", "GPT2ForSequenceClassification",
                   ("score",), "GPT2ForSequenceClassification, 2 layers, only the score head "
                   "trainable", n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                   n_positions=64, pad_token_id=0)


def _hf_lora():
    import peft
    import transformers as T

    m = T.LlamaForCausalLM(T.LlamaConfig(**_LLAMA))
    m = peft.get_peft_model(m, peft.LoraConfig(r=4, lora_alpha=8, target_modules=[
        "q_proj", "v_proj"], lora_dropout=0.1))
    ids = _ids()
    return HF(m, "input_ids", "labels"), (ids, ids), (), None


_add("hf", "llama-lora", _hf_lora, "peft LoRA (r=4 on q_proj, v_proj, dropout 0.1) on a "
     "2-layer Llama; the base weights frozen")


def _hf_image(name, config, model, note, hw=32, **cfg):
    def build():
        import transformers as T

        m = getattr(T, model)(getattr(T, config)(num_labels=CLASSES, **cfg))
        return HF(m, "pixel_values", "labels"), (_images(hw), _labels()), (), None
    _add("hf", name, build, note)


_hf_image("vit", "ViTConfig", "ViTForImageClassification", "32x32 images, patch 8, 2 layers",
          image_size=32, patch_size=8, **{k: v for k, v in SMALL.items() if k != "vocab_size"})
_hf_image("swin", "SwinConfig", "SwinForImageClassification", "64x64 images, window 4, "
          "2 stages", hw=64, image_size=64, patch_size=4, embed_dim=32, depths=[1, 1],
          num_heads=[2, 4], window_size=4)
_hf_image("convnext", "ConvNextConfig", "ConvNextForImageClassification",
          "64x64 images, 2 stages", hw=64, num_stages=2, hidden_sizes=[32, 64], depths=[1, 1])
_hf_image("resnet", "ResNetConfig", "ResNetForImageClassification", "64x64 images, 2 stages",
          hw=64, hidden_sizes=[32, 64], depths=[1, 1], embedding_size=16)


def _hf_segformer():
    import transformers as T

    cfg = T.SegformerConfig(num_labels=CLASSES, hidden_sizes=[16, 32], depths=[1, 1],
                            num_encoder_blocks=2, sr_ratios=[2, 1], num_attention_heads=[1, 2],
                            decoder_hidden_size=32, strides=[4, 2], patch_sizes=[7, 3])
    m = T.SegformerForSemanticSegmentation(cfg)
    return (HF(m, "pixel_values", "labels"),
            (_images(64), torch.randint(0, CLASSES, (BATCH, 64, 64))), (), None)


_add("hf", "segformer", _hf_segformer, "64x64 images, 2 encoder blocks")


def _hf_clip():
    import transformers as T

    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=SEQ)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, image_size=32, patch_size=8)
    m = T.CLIPModel(T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32))
    return (HF(m, "input_ids", "pixel_values", return_loss=True), (_ids(), _images(32)), (),
            None)


_add("hf", "clip", _hf_clip, "contrastive loss over the batch; 2+2 layers, 32x32 images")


def _hf_audio_classifier(config, model, mask_time_prob, layerdrop=0.1, mask_input=False):
    """A speech classifier on 800 samples (79 frames). ``mask_input``: SpecAugment's time
    mask drawn outside the model, as a data collator does, and passed as
    ``mask_time_indices`` (the model then draws none itself)."""
    def build():
        import transformers as T

        cfg = getattr(T, config)(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, conv_dim=(32, 32), conv_stride=(5, 2),
                                 conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                 num_conv_pos_embedding_groups=4, num_labels=CLASSES,
                                 mask_time_prob=mask_time_prob, mask_time_length=2,
                                 layerdrop=layerdrop)
        m = getattr(T, model)(cfg)
        if not mask_input:
            return HF(m, "input_values", "labels"), (torch.randn(BATCH, 800), _labels()), (), None
        from transformers.models.wav2vec2.modeling_wav2vec2 import _compute_mask_indices

        frames = int(m.base_model._get_feat_extract_output_lengths(800))
        mask = torch.from_numpy(_compute_mask_indices((BATCH, frames), mask_time_prob, 2))
        return (HF(m, "input_values", "labels", "mask_time_indices"),
                (torch.randn(BATCH, 800), _labels(), mask), (), None)
    return build


_add("hf", "wav2vec2", _hf_audio_classifier("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification",
                                            0.05),
     "Wav2Vec2ForSequenceClassification, 800 samples, SpecAugment on (mask_time_prob 0.05), "
     "LayerDrop 0.1")
_add("hf", "wav2vec2-nospecaugment",
     _hf_audio_classifier("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification", 0.0),
     "as wav2vec2, with mask_time_prob=0")
_add("hf", "wav2vec2-masked",
     _hf_audio_classifier("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification", 0.05,
                          layerdrop=0.0, mask_input=True),
     "as wav2vec2, LayerDrop off, SpecAugment's time mask drawn by the data pipeline and "
     "passed as mask_time_indices")
_add("hf", "hubert", _hf_audio_classifier("HubertConfig", "HubertForSequenceClassification", 0.0),
     "HubertForSequenceClassification, 800 samples, mask_time_prob=0, LayerDrop 0.1")
_add("hf", "hubert-nolayerdrop",
     _hf_audio_classifier("HubertConfig", "HubertForSequenceClassification", 0.0, layerdrop=0.0),
     "as hubert, LayerDrop off (layerdrop=0)")


def _hf_whisper():
    import transformers as T

    cfg = T.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4,
                          encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB,
                          num_mel_bins=16, max_source_positions=32, max_target_positions=32,
                          decoder_start_token_id=1, pad_token_id=0)
    m = T.WhisperForConditionalGeneration(cfg)
    return (HF(m, "input_features", "labels"), (torch.randn(BATCH, 16, 64), _ids()), (), None)


_add("hf", "whisper", _hf_whisper, "16 mel bins x 64 frames, 2+2 layers, labels of 16 tokens")
