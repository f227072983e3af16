"""fxmem.integrations: the Hugging Face Trainer's step and accelerate's batch-size finder, on
tiny models built from config classes (random weights, no downloads), on the CPU."""

import copy
import subprocess
import sys
import warnings

import pytest
import torch

import fxmem

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from fxmem.integrations import hf  # noqa: E402
from fxmem.integrations.accelerate import find_executable_batch_size  # noqa: E402
from fxmem.integrations.common import clipping  # noqa: E402
from fxmem.validate.zoo import CausalLM  # noqa: E402

V = 100


def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=V, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
                                   use_cache=False)
    return transformers.LlamaForCausalLM(cfg)


def training_args(tmp_path, **kw):
    base = dict(report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    return transformers.TrainingArguments(str(tmp_path / "out"), **{**base, **kw})


IDS = torch.randint(0, V, (64, 32), generator=torch.Generator().manual_seed(0))
BATCH = {"input_ids": IDS[:4], "labels": IDS[:4]}


def budget_between(report, b):
    """A byte count the step fits at ``b`` but not at ``b + 1``, from the prediction."""
    lo, hi = report.peak_bytes(b), report.peak_bytes(b + 1)
    assert lo < hi
    return (lo + hi) // 2


def test_import_fxmem_imports_no_framework():
    code = ("import sys, fxmem; print(sorted(m for m in ('transformers', 'accelerate', "
            "'fxmem.integrations') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_trainer_trains_at_the_answer_and_its_peak_is_measured(tmp_path):
    model = gpt2()
    args = training_args(tmp_path, max_steps=3, logging_steps=1)
    step = hf.trainer_step(model, args, BATCH, device="cpu")
    budget = budget_between(step.analyze(), 5)
    fit = hf.batch_size_for(model, args, BATCH, budget, device="cpu")
    assert (fit.per_device_train_batch_size, fit.gradient_accumulation_steps) == (5, 1)
    assert fit.by == "live" and fit.peak_bytes <= budget < fit.report.peak_bytes(6)
    # the prediction is the peak of the same step run for real
    assert fit.peak_bytes == step.measure(5).peak_bytes

    callback = hf.FxmemCallback(fit, cpu_steps=2)
    data = [{"input_ids": IDS[i], "labels": IDS[i]} for i in range(len(IDS))]
    trainer = transformers.Trainer(model=model, args=fit.training_arguments(args),
                                   train_dataset=data, callbacks=[callback])
    trainer.train()
    assert [s.batch_size for s in callback.steps] == [5, 5, 5]  # what the model was given
    assert [s.predicted_peak_bytes for s in callback.steps] == [fit.peak_bytes] * 3
    measured = [s.measured_peak_bytes for s in callback.steps]
    assert measured[0] is None  # the first step makes the optimizer state
    # the Trainer's real steps, tracked live, equal to the byte (accelerate's `loss / 1`
    # copy held through backward included: Accelerator.backward)
    assert measured[1:] == [fit.peak_bytes] * 2
    logged = [h for h in trainer.state.log_history if "fxmem_predicted_peak_bytes" in h]
    assert logged and logged[0]["fxmem_batch_size"] == 5
    assert logged[-1]["fxmem_measured_peak_bytes"] == fit.peak_bytes


@pytest.mark.parametrize("options", [
    dict(optim="sgd", gradient_accumulation_steps=3),
    dict(optim="adafactor"),
    dict(optim="adamw_torch_fused", bf16=True, max_grad_norm=0.0),
    dict(gradient_checkpointing=True),
], ids=["sgd-accum", "adafactor", "fused-bf16-noclip", "checkpointing"])
def test_training_arguments_predicted_as_measured(tmp_path, options):
    model = llama()
    step = hf.trainer_step(model, training_args(tmp_path, **options), BATCH, device="cpu")
    r = step.analyze()
    for b in (2, 5):
        assert r.peak_bytes(b) == step.measure(b).peak_bytes, b
    assert model.training and not model.is_activation_checkpointing  # left as it was


def test_gradient_checkpointing_is_traced_as_the_trainer_applies_it(tmp_path):
    model = llama()
    plain = hf.trainer_step(model, training_args(tmp_path), BATCH, device="cpu").analyze()
    ckpt = hf.trainer_step(model, training_args(tmp_path, gradient_checkpointing=True), BATCH,
                           device="cpu").analyze()
    assert ckpt.peak_bytes(8) < plain.peak_bytes(8)
    assert not model.is_activation_checkpointing


def test_padding_mask_the_eager_step_skips_when_all_ones(tmp_path):
    # with fake tensors the mask's values are unknown: the step with padding is predicted
    model = llama()
    args = training_args(tmp_path, optim="sgd")
    mask = torch.ones_like(IDS[:4])
    padded = mask.clone()
    padded[:, -3:] = 0
    peaks = {}
    for name, m in (("ones", mask), ("padded", padded)):
        step = hf.trainer_step(model, args, {**BATCH, "attention_mask": m}, device="cpu")
        peaks[name] = step.analyze().peak_bytes(3), step.measure(3).peak_bytes
    assert peaks["padded"][0] == peaks["padded"][1] == peaks["ones"][0]
    assert peaks["ones"][1] < peaks["ones"][0]  # no padding: no mask made, a few bytes less


def test_optimizer_is_the_trainers(tmp_path):
    model = gpt2()
    for optim in hf.TORCH_OPTIMIZERS:
        args = training_args(tmp_path, optim=optim, weight_decay=0.1)
        ours = hf.trainer_optimizer(args, model, device="cpu")(list(model.parameters()))
        theirs = transformers.Trainer(model=model, args=args).create_optimizer()
        assert isinstance(ours, type(theirs)) and type(ours).__name__ == type(theirs).__name__
        assert ours.defaults == theirs.defaults
        for g, h in zip(ours.param_groups, theirs.param_groups, strict=True):
            assert [id(p) for p in g["params"]] == [id(p) for p in h["params"]]
            assert {k: v for k, v in g.items() if k != "params"} == \
                {k: v for k, v in h.items() if k != "params"}


def test_weight_decay_groups_leave_the_cuda_prediction_unchanged(tmp_path):
    model = gpt2()
    args = training_args(tmp_path)
    step = hf.trainer_step(model, args, BATCH, device="cuda")  # foreach AdamW, per group
    cls, kw = transformers.Trainer.get_optimizer_cls_and_kwargs(args, model)
    one_group = fxmem.Step.of(step.step, optimizer=lambda p: clipping(cls, 1.0, True)(
        p, **kw))
    two = step.analyze()
    one = fxmem.analyze(step.module, step.inputs, step=one_group, batch_dim=step.batch_dim)
    assert two.peak == one.peak
    for b in (1, 8):  # the optimizer step's own peak too
        during = [max(p.live_bytes for p in r.timeline(b) if p.phase == "optimizer")
                  for r in (one, two)]
        assert during[0] == during[1], b
    # without a GPU the CUDA step is measured on the CPU, with the Trainer's CPU optimizer
    # (clip_grad_norm_'s foreach norms are CUDA's)
    if not torch.cuda.is_available():
        cpu = hf.trainer_step(model, args, BATCH, device="cpu")
        assert step.measure(3).peak_bytes == cpu.measure(3).peak_bytes == \
            cpu.analyze().peak_bytes(3)


def test_target_batch_size_takes_the_fewest_accumulation_steps(tmp_path):
    model = gpt2()
    args = training_args(tmp_path)
    step = hf.trainer_step(model, args, BATCH, device="cpu")
    budget = budget_between(step.analyze(), 5)
    fit = hf.batch_size_for(model, args, BATCH, budget, device="cpu", target_batch_size=12)
    k = fit.gradient_accumulation_steps
    assert fit.effective_batch_size == 12 and k > 1 and fit.report.grad_accum == k
    assert fit.peak_bytes == fit.report.peak_bytes(12 // k) <= budget
    for fewer in range(1, k):  # every smaller divisor's micro-batch is over the budget
        if 12 % fewer == 0:
            assert step.analyze(grad_accum=fewer).peak_bytes(12 // fewer) > budget
    assert fit.peak_bytes == step.measure(12 // k, grad_accum=k).peak_bytes


def test_a_checkpoint_plan_fits_a_batch_that_does_not_fit_without_one(tmp_path):
    model = gpt2()
    args = training_args(tmp_path)
    step = hf.trainer_step(model, args, BATCH, device="cpu")
    r = step.analyze()
    b = r.min_batch_size  # 2: GPT-2's label shift needs two tokens in all (valid_when)
    least = r.frontier(b)[-1].peak_bytes  # the smallest peak any plan reaches there
    assert r.peak_bytes(1) < least < r.peak_bytes(b)
    budget = (least + r.peak_bytes(b)) // 2  # B = 2 only with a plan (B = 1 without one)
    assert hf.batch_size_for(model, args, BATCH, budget, device="cpu").checkpoint is None
    fit = hf.batch_size_for(model, args, BATCH, budget, device="cpu", max_recompute=1.0)
    assert fit.checkpoint is not None and fit.per_device_train_batch_size >= b
    assert fit.peak_bytes <= budget and fit.report.plan == fit.checkpoint.plan
    # applied to the model, the plan's step measures as predicted (the step traced with it)
    planned = fit.apply_checkpoint(copy.deepcopy(model))
    again = hf.trainer_step(planned, args, BATCH, device="cpu")
    assert again.measure(fit.per_device_train_batch_size).peak_bytes == fit.peak_bytes


def test_callback_leaves_no_tracker_behind(tmp_path):
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    model, callback = gpt2(), hf.FxmemCallback(123)
    state = transformers.TrainerState()
    state.global_step = 1
    callback.on_train_begin(None, state, None, model=model)
    callback.on_step_begin(None, state, None, model=model, optimizer=None)
    assert _get_current_dispatch_mode() is callback._tracker is not None
    callback.close()  # a step that raised: the Trainer calls no on_step_end
    assert _get_current_dispatch_mode() is None and not model._forward_pre_hooks


@pytest.mark.parametrize("options,message", [
    (dict(torch_compile=True), "torch_compile=True"),
    (dict(optim="adamw_bnb_8bit"), "optim='adamw_bnb_8bit'"),
])
def test_unmodelled_arguments_are_refused(tmp_path, options, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = training_args(tmp_path, **options)
    with pytest.raises(fxmem.InputError, match=message):
        hf.batch_size_for(gpt2(), args, BATCH, 10**9, device="cpu")


def test_batch_without_labels_is_refused(tmp_path):
    with pytest.raises(fxmem.InputError, match="no 'labels'"):
        hf.trainer_step(gpt2(), training_args(tmp_path), {"input_ids": IDS[:4]})
    with pytest.raises(fxmem.InputError, match="dict of tensors"):
        hf.trainer_step(gpt2(), training_args(tmp_path), IDS[:4])


# accelerate -----------------------------------------------------------------------------
def _oom(b):
    return torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {b} batches")


def _device_of(model, budget):
    """A step on a device of ``budget`` bytes: it runs out of memory as CUDA would when the
    real step's measured peak is over the budget."""
    def train_step(b):
        peak = fxmem.measure(model, (IDS[:4], IDS[:4]), optimizer=torch.optim.AdamW,
                             B=b).peak_bytes
        if peak > budget:
            raise _oom(b)
        return peak
    return train_step


def test_accelerate_starts_at_fxmems_answer_without_oom():
    model = CausalLM(gpt2())  # called as model(ids, labels)
    r = fxmem.analyze(model, (IDS[:4], IDS[:4]), optimizer=torch.optim.AdamW, device="cpu")
    budget = budget_between(r, 6)
    step, tried = _device_of(model, budget), []

    @find_executable_batch_size(prediction=r, budget_bytes=budget)
    def train(batch_size):
        tried.append(batch_size)
        return step(batch_size)

    assert train.starting_batch_size == 6
    assert train() <= budget and tried == [6]

    # accelerate's own finder from its default start on the same device: failed tries first
    import accelerate.utils

    theirs = []

    @accelerate.utils.find_executable_batch_size(starting_batch_size=8)
    def train_theirs(batch_size):
        theirs.append(batch_size)
        return step(batch_size)

    train_theirs()
    assert theirs[-1] <= 6 < theirs[0]


def test_accelerate_fallback_is_kept_on_a_real_oom():
    import accelerate.utils

    def sequence(decorator):
        tried = []

        @decorator
        def train(batch_size):
            tried.append(batch_size)
            if len(tried) == 1:  # the first try runs out of memory, whatever its size
                raise _oom(batch_size)
            return batch_size

        train()
        return tried

    ours = sequence(find_executable_batch_size(prediction=40))
    assert ours == sequence(accelerate.utils.find_executable_batch_size(starting_batch_size=40))
    assert ours[0] == 40 and ours[1] < 40
    # a cap given as starting_batch_size
    assert find_executable_batch_size(lambda batch_size: batch_size, starting_batch_size=16,
                                      prediction=40).starting_batch_size == 16


def test_accelerate_drop_in_refuses_a_budget_without_prediction():
    with pytest.raises(fxmem.InputError, match="need a prediction"):
        find_executable_batch_size(lambda batch_size: 0, budget_bytes=10**9)
    if not torch.cuda.is_available():
        report = fxmem.analyze(torch.nn.Linear(4, 4), torch.randn(2, 4), loss=lambda o: o.sum(),
                               device="cpu")
        with pytest.raises(fxmem.InputError, match="give budget_bytes"):
            find_executable_batch_size(lambda batch_size: 0, prediction=report)
