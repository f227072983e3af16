"""The fake GPU's model zoo (issue 42, tests/test_fake_gpu_zoo.py): small Hugging Face models
built from their config classes (random weights, nothing downloaded), each under one training
setup, as :data:`CASES`. The same builders run in the test process (``fxmem.analyze``) and in
the fake GPU's child (:func:`run`: ``fxmem.measure`` for a list of cases and batch sizes in
one process).

GradScaler cases: kernels do not run on the fake GPU, so the scale, ``found_inf`` and the
grads hold whatever the memory held (zero-filled fresh memory, or bytes an earlier host copy
wrote). :func:`run` records, per measured step, how many times the optimizer stepped (a step
post-hook) and what ``GradScaler`` read from ``found_inf`` (its own ``.item()``), so a test can
check that the measured step took its optimizer step.

Branches on computed values: transformers' ``find_packed_sequence_indices`` (Llama, Mistral,
GPT-2) decides from ``(cumsum(...)[:, -1] == 0).all()`` whether the batch packs several
sequences per row; on the fake GPU that value is whatever the memory held (2.14.1: "packed",
so a B x 1 x L x L mask was built and SDPA took its masked path, allocations a GPU would not
make). The child runs the function as written (its allocations stay) and answers what a GPU
computes for these batches, one sequence per row: None
(:func:`fxmem.validate.fakegpu.reads.gpu_answers`, as ``fxmem validate --fake-gpu`` does).
"""

from __future__ import annotations

import gc

import torch
from torch import nn

VOCAB, SEQ, IMAGE = 512, 64, 32


class LM(nn.Module):
    """A Hugging Face model called as ``model(x, labels)``; its output has ``.loss``."""

    def __init__(self, model, key="input_ids"):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x, labels):
        return self.model(**{self.key: x}, labels=labels)


def _hf(config, model, attn="sdpa", **kw):
    import transformers

    cfg = getattr(transformers, config)(**kw)
    cfg._attn_implementation = attn
    return getattr(transformers, model)(cfg)


def gpt2(attn="sdpa"):
    return LM(_hf("GPT2Config", "GPT2LMHeadModel", attn, n_layer=2, n_embd=128, n_head=4,
                  vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0,
                  use_cache=False))


def llama(attn="sdpa"):
    return LM(_hf("LlamaConfig", "LlamaForCausalLM", attn, hidden_size=128,
                  intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
                  use_cache=False))


def llama_cache(attn="sdpa"):
    """Llama with ``use_cache`` left as its config's default (on): each layer writes its
    keys and values into the step's cache, except where checkpointed (it runs without it,
    fxmem.checkpoint.uncached)."""
    return LM(_hf("LlamaConfig", "LlamaForCausalLM", attn, hidden_size=128,
                  intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ))


def mistral(attn="sdpa"):
    return LM(_hf("MistralConfig", "MistralForCausalLM", attn, hidden_size=128,
                  intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
                  sliding_window=None, use_cache=False))


def bert(attn="sdpa"):
    return LM(_hf("BertConfig", "BertForMaskedLM", attn, num_hidden_layers=2,
                  hidden_size=128, num_attention_heads=4, intermediate_size=256,
                  vocab_size=VOCAB, max_position_embeddings=SEQ))


def vit(attn="sdpa"):
    return LM(_hf("ViTConfig", "ViTForImageClassification", attn, image_size=IMAGE,
                  patch_size=8, num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                  intermediate_size=256, num_labels=10, hidden_dropout_prob=0.1,
                  attention_probs_dropout_prob=0.1), key="pixel_values")


MODELS = {"gpt2": gpt2, "llama": llama, "llama_cache": llama_cache, "mistral": mistral,
          "bert": bert, "vit": vit}


def batch(model_name, n=2):
    """The example batch (``inputs``, ``targets``): n samples."""
    g = torch.Generator().manual_seed(0)
    if model_name == "vit":
        return (torch.randn(n, 3, IMAGE, IMAGE, generator=g),
                torch.randint(0, 10, (n,), generator=g)), ()
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return (ids, ids.clone()), ()


# --- optimizers (top-level functions: the child imports them by name) -----------------------

def sgd_momentum(p):
    return torch.optim.SGD(p, lr=1e-3, momentum=0.9)


def adam(p):
    return torch.optim.Adam(p, lr=1e-4)


def adam_loop(p):
    return torch.optim.Adam(p, lr=1e-4, foreach=False)


def adamw(p):
    return torch.optim.AdamW(p, lr=1e-4)


def adamw_loop(p):
    return torch.optim.AdamW(p, lr=1e-4, foreach=False)


def rmsprop(p):
    return torch.optim.RMSprop(p, lr=1e-4)


def adagrad(p):
    return torch.optim.Adagrad(p, lr=1e-3)


def adafactor(p):
    return torch.optim.Adafactor(p, lr=1e-3)


# --- the cases: model, attention, optimizer, step options, checkpoint plan, batch sizes -----

def _region(mods, save=()):
    from fxmem import Region

    return Region(tuple(mods), save=tuple(save))


GPT2_BLOCKS = [f"model.transformer.h.{i}" for i in range(2)]
LLAMA_LAYERS = [f"model.model.layers.{i}" for i in range(2)]
BERT_LAYERS = [f"model.bert.encoder.layer.{i}" for i in range(2)]

# name: dict(model, attn, optimizer, options (fxmem.Step fields), plan, batches)
CASES = {
    "gpt2 fp32 sdpa adamw": dict(model="gpt2", optimizer="adamw"),
    "gpt2 fp32 eager adamw loop": dict(model="gpt2", attn="eager", optimizer="adamw_loop"),
    "gpt2 bf16 sdpa adam": dict(model="gpt2", optimizer="adam", options={"amp": "bf16"}),
    "gpt2 fp16 scaler adamw": dict(model="gpt2", optimizer="adamw", options={"amp": "fp16"}),
    "gpt2 checkpoint whole blocks": dict(model="gpt2", optimizer="adamw", plan=GPT2_BLOCKS),
    "gpt2 grad_accum 2 sgd momentum": dict(model="gpt2", optimizer="sgd_momentum",
                                           options={"grad_accum": 2}),
    "llama fp32 sdpa adamw": dict(model="llama", optimizer="adamw"),
    "llama bf16 eager adamw": dict(model="llama", attn="eager", optimizer="adamw",
                                   options={"amp": "bf16"}),
    "llama checkpoint group": dict(model="llama", optimizer="adam",
                                   plan=("group", LLAMA_LAYERS)),
    "llama checkpoint selective": dict(model="llama", optimizer="adamw",
                                       plan=("save", LLAMA_LAYERS[:1],
                                             [("aten.mm.default", 0), ("aten.mm.default", 1)])),
    "llama cache checkpoint whole layers": dict(model="llama_cache", optimizer="adamw",
                                                plan=LLAMA_LAYERS),
    "llama cache checkpoint group": dict(model="llama_cache", optimizer="adamw",
                                         plan=("group", LLAMA_LAYERS)),
    "llama cache checkpoint selective": dict(model="llama_cache", optimizer="adamw",
                                             plan=("save", LLAMA_LAYERS[:1],
                                                   [("aten.mm.default", 0),
                                                    ("aten.mm.default", 1)])),
    "mistral fp32 sdpa adamw": dict(model="mistral", optimizer="adamw"),
    "mistral fp16 scaler set_to_none False": dict(model="mistral", optimizer="adamw",
                                                  options={"amp": "fp16",
                                                           "set_to_none": False}),
    "bert fp32 sdpa adamw": dict(model="bert", optimizer="adamw"),
    "bert eager rmsprop": dict(model="bert", attn="eager", optimizer="rmsprop"),
    "bert bf16 adagrad": dict(model="bert", optimizer="adagrad", options={"amp": "bf16"}),
    "bert adafactor": dict(model="bert", optimizer="adafactor"),
    "vit fp32 sdpa sgd momentum": dict(model="vit", optimizer="sgd_momentum"),
    "vit eager fp16 scaler adam loop": dict(model="vit", attn="eager", optimizer="adam_loop",
                                            options={"amp": "fp16"}),
    "vit grad_accum 2 set_to_none False": dict(model="vit", optimizer="adamw",
                                               options={"grad_accum": 2,
                                                        "set_to_none": False}),
}
BATCHES = (2, 5)
# Llama with its key/value cache (use_cache on, as the model's default) under plans over its
# layers, which run without the cache checkpointed: analyze(..., checkpoint=) traces them;
# tests/test_fake_gpu_zoo.py also checks the plan derived from the step without it
# (Report.with_plan, fxmem.checkpoint.uncached), phase by phase and allocation by allocation
CACHE_CASES = tuple(n for n, c in CASES.items() if c["model"] == "llama_cache")


def plan_of(case: dict):
    """The case's checkpoint plan as fxmem takes it (None: no plan)."""
    plan = case.get("plan")
    if plan is None:
        return None
    if isinstance(plan, tuple) and plan[0] == "group":
        return [_region(plan[1])]
    if isinstance(plan, tuple) and plan[0] == "save":
        return [_region(plan[1], plan[2])]
    return list(plan)


def build(name: str, seed: int = 0):
    """(model, inputs, targets, fxmem.Step, plan) of the case ``name``."""
    import fxmem

    case = CASES[name]
    torch.manual_seed(seed)
    model = MODELS[case["model"]](case.get("attn", "sdpa"))
    inputs, targets = batch(case["model"])
    step = fxmem.Step(optimizer=globals()[case["optimizer"]], device="cuda",
                      **case.get("options", {}))
    return model, inputs, targets, step, plan_of(case)


# --- in the fake GPU's child ----------------------------------------------------------------

class _Seen:
    """What the measured steps did: optimizer steps taken, GradScaler's ``found_inf`` reads."""

    def __init__(self):
        self.steps, self.found_inf, self.scale = 0, [], []


def _instrument(seen: _Seen):
    """Count optimizer steps (a post-hook on every optimizer made) and record, after each
    ``GradScaler.unscale_``, the ``found_inf`` and scale its inf check left on the device
    (read with ``.item()``: host copies, no allocation). Returns the undo function."""
    from torch.amp.grad_scaler import GradScaler

    orig_init, orig_unscale = torch.optim.Optimizer.__init__, GradScaler.unscale_

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        self.register_step_post_hook(lambda *_: setattr(seen, "steps", seen.steps + 1))

    def unscale_(self, optimizer):
        out = orig_unscale(self, optimizer)
        state = self._per_optimizer_states[id(optimizer)]
        seen.found_inf.append(sum(v.item() for v in state["found_inf_per_device"].values()))
        seen.scale.append(self._scale.item())
        return out

    torch.optim.Optimizer.__init__, GradScaler.unscale_ = init, unscale_

    def undo():
        torch.optim.Optimizer.__init__, GradScaler.unscale_ = orig_init, orig_unscale
    return undo


def fresh():
    """Let go of what an earlier case left on the device (fxmem.measure also lets earlier
    cuBLAS workspaces go first); what is left then (fxmem's, sympy's and transformers'
    objects, imported in this child after its own freeze, and the case's model) is exempt
    from the next collections (``gc.freeze``), so that fxmem.measure's full collections
    walk only what its step made (each had walked them: about a quarter of a second)."""
    gc.collect()
    gc.freeze()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def run(cases, batches=BATCHES, record_history=False):
    """``fxmem.measure`` of each case at each B on the fake GPU: a list of dicts (case, B,
    max_allocated, max_reserved, baselines, optimizer steps seen, GradScaler's reads) or
    ``{"case", "error"}``. ``record_history``: True, or the names of the cases whose rows
    also hold ``allocations`` (each allocation's bytes and frame, in order)."""
    from fxmem.validate.fakegpu.reads import gpu_answers

    with gpu_answers():
        out = _run(cases, batches, record_history)
    fresh()
    return out


def _run(cases, batches, record_history):
    import fxmem
    from fxmem.trace.plans.checkpointing import apply_checkpoints

    out = []
    for name in cases:
        try:
            model, inputs, targets, step, plan = build(name)
            real = apply_checkpoints(model, plan) if plan else model
            record = record_history is True or name in (record_history or ())
            for b in batches:
                fresh()
                seen = _Seen()
                undo = _instrument(seen)
                try:
                    m = fxmem.measure(real, inputs, targets, B=b, step=step,
                                      record_history=record)
                finally:
                    undo()
                row = {"case": name, "B": b, "max_allocated": m.peak_bytes,
                       "max_reserved": m.peak_reserved_bytes,
                       "baseline_allocated": m.baseline_bytes,
                       "baseline_reserved": m.baseline_reserved_bytes,
                       "phase_allocated": m.phase_peak_bytes,
                       "phase_reserved": m.phase_peak_reserved_bytes,
                       "optimizer_steps": seen.steps, "found_inf": seen.found_inf,
                       "scale": seen.scale}
                if record:
                    row["allocations"] = [list(a) for a in m.allocations]
                out.append(row)
            del model, real
        except Exception as e:  # noqa: BLE001 (reported per case)
            out.append({"case": name, "error": f"{type(e).__name__}: {e}"})
    return out
