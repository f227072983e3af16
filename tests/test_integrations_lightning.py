"""fxmem.integrations.lightning and .pytorch_lightning: a real ``Trainer.fit`` on the CPU with
the batch size fxmem chose, the peak of its steps measured beside the prediction."""

import importlib
import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import fxmem


def _available(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


PACKAGES = [p for p in ("lightning.pytorch", "pytorch_lightning") if _available(p) is not None]
if not PACKAGES:
    pytest.skip("neither lightning nor pytorch-lightning is installed", allow_module_level=True)

from fxmem.integrations.lightning_step import lightning_step  # noqa: E402

V, L, N = 128, 32, 256
IDS = torch.randint(0, V, (N, L), generator=torch.Generator().manual_seed(0))


def integration(package):
    return importlib.import_module("fxmem.integrations." + package.split(".")[0])


def lm_class(pl, log=False, manual=False):
    """A two-layer transformer LM as a LightningModule, its batch size in ``hparams``."""

    class LM(pl.LightningModule):
        def __init__(self, batch_size=4, datamodule=False):
            super().__init__()
            self.save_hyperparameters()
            self.automatic_optimization = not manual
            self.emb = torch.nn.Embedding(V, 64)
            layer = torch.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.1, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(64, V)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self(x).flatten(0, 1), y.flatten())
            if log:
                self.log("train_loss", loss)
            return {"loss": loss} if log else loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.01)

        def train_dataloader(self):
            return DataLoader(TensorDataset(IDS, IDS), batch_size=self.hparams.batch_size)

    return LM


def data_module(pl):
    class Data(pl.LightningDataModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 3

        def train_dataloader(self):
            return DataLoader(TensorDataset(IDS, IDS), batch_size=self.batch_size)

    return Data()


def trainer(pl, tmp_path, callbacks, **kw):
    base = dict(accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False,
                default_root_dir=str(tmp_path))
    return pl.Trainer(callbacks=callbacks, **{**base, **kw})


def fit(pl, tmp_path, model, callback, datamodule=None, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers, loggers
        t = trainer(pl, tmp_path, [callback], **kw)
        t.fit(model, datamodule=datamodule)
    return t


def prediction(pl, tmp_path, model, **kw):
    """The step's report, from a Trainer set up as fit sets it up (a callback stopping at
    fit start)."""
    got = {}

    class Stop(pl.Callback):
        def on_fit_start(self, trainer, module):
            got["step"] = lightning_step(trainer, module, next(iter(module.train_dataloader())),
                                         device="cpu")
            raise _Stopped

    with warnings.catch_warnings(), pytest.raises(_Stopped):
        warnings.simplefilter("ignore")
        trainer(pl, tmp_path, [Stop()], **kw).fit(model)
    return got["step"]


class _Stopped(Exception):
    """Ends a fit at its start."""


def budget_between(report, b):
    lo, hi = report.peak_bytes(b), report.peak_bytes(b + 1)
    assert lo < hi
    return (lo + hi) // 2


def measured_steps(callback):
    return [s for s in callback.steps if s.measured_peak_bytes is not None]


@pytest.mark.parametrize("package", PACKAGES)
def test_fit_trains_at_the_predicted_batch_size_and_peak(package, tmp_path):
    pl = importlib.import_module(package)
    torch.manual_seed(0)
    step = prediction(pl, tmp_path, lm_class(pl)())
    report = step.analyze()
    budget = budget_between(report, 9)
    torch.manual_seed(0)
    model = lm_class(pl)()
    cb = integration(package).FxmemBatchSize(budget, device="cpu", cpu_steps=1)
    t = fit(pl, tmp_path, model, cb)
    assert cb.fit.batch_size == model.hparams.batch_size == 9
    assert [s.batch_size for s in cb.steps] == [9, 9, 9]  # the loader was made with it
    (m,) = measured_steps(cb)
    assert m.predicted_peak_bytes == cb.fit.peak_bytes == m.measured_peak_bytes
    assert step.measure(9).peak_bytes == cb.fit.peak_bytes  # fxmem.measure agrees too
    assert t.callback_metrics["fxmem/predicted_peak_bytes"] == cb.fit.peak_bytes


@pytest.mark.parametrize("precision,accumulate,clip", [
    ("16-mixed", 1, 1.0), ("bf16-mixed", 2, None), ("bf16-true", 1, 0.5), ("64-true", 3, None),
    ("32-true", 2, 0.5)])
def test_precisions_accumulation_and_clipping(precision, accumulate, clip, tmp_path):
    pl = importlib.import_module(PACKAGES[0])
    kw = dict(precision=precision, accumulate_grad_batches=accumulate, gradient_clip_val=clip,
              max_steps=2)
    torch.manual_seed(0)
    cb = integration(PACKAGES[0]).FxmemBatchSize(6_000_000, device="cpu")
    model = lm_class(pl)()
    fit(pl, tmp_path, model, cb, **kw)
    (m,) = measured_steps(cb)
    assert m.batch_size == cb.fit.batch_size == model.hparams.batch_size
    assert m.measured_peak_bytes == m.predicted_peak_bytes == cb.fit.peak_bytes
    assert cb.report.peak_bytes(cb.fit.batch_size + 1) > 6_000_000


def test_lightning_zeroes_gradients_after_the_forward(tmp_path):
    # the mirrored step with the idiomatic loop's order (zero_grad first) predicts less
    # than Lightning's real step: its forward runs beside the last step's gradients
    pl = importlib.import_module(PACKAGES[0])
    torch.manual_seed(0)
    step = prediction(pl, tmp_path, lm_class(pl)())
    late = step.analyze()
    early = fxmem.analyze(step.module, step.inputs, batch_dim=step.batch_dim,
                          step=fxmem.Step.of(step.step, zero_grad_at="start"))
    grads = sum(p.numel() * 4 for p in step.module.parameters())
    assert late.peak_bytes(2) - early.peak_bytes(2) > grads // 2


def test_datamodule_batch_size_and_logged_values(tmp_path):
    pl = importlib.import_module(PACKAGES[0])
    torch.manual_seed(0)
    model, data = lm_class(pl, log=True)(), data_module(pl)
    cb = integration(PACKAGES[0]).FxmemBatchSize(5_000_000, device="cpu")
    fit(pl, tmp_path, model, cb, datamodule=data)
    # set everywhere Lightning's BatchSizeFinder sets it (lightning_setattr)
    assert data.batch_size == model.hparams.batch_size == cb.fit.batch_size
    assert {s.batch_size for s in cb.steps} == {data.batch_size}
    (m,) = measured_steps(cb)
    # self.log keeps copies of the logged loss, which the step does not model: here none
    # at the peak (4 bytes each on the CPU; docs/integrations.md)
    assert m.measured_peak_bytes == m.predicted_peak_bytes


def test_a_checkpoint_plan_when_no_batch_fits_without_one(tmp_path):
    pl = importlib.import_module(PACKAGES[0])
    torch.manual_seed(0)
    step = prediction(pl, tmp_path, lm_class(pl)())
    report = step.analyze()
    # not even the smallest batch fits: B = 1, traced at 1 (the formulas hold from B = 2)
    budget = report.peak_bytes(report.least_batch_size) - 1
    torch.manual_seed(0)
    model = lm_class(pl)()
    cb = integration(PACKAGES[0]).FxmemBatchSize(budget, device="cpu")
    fit(pl, tmp_path, model, cb)
    assert cb.fit.checkpoint is not None and cb.fit.peak_bytes <= budget
    wrapped = [n for n, _ in model.named_modules() if n.endswith("_checkpoint_wrapped_module")]
    assert wrapped  # the plan is applied to the module that trained
    (m,) = measured_steps(cb)
    assert m.batch_size == cb.fit.batch_size
    assert m.measured_peak_bytes == m.predicted_peak_bytes == cb.fit.peak_bytes


def test_predicting_for_cuda_from_a_cpu_trainer(tmp_path):
    pl = importlib.import_module(PACKAGES[0])
    torch.manual_seed(0)
    model = lm_class(pl)()
    cb = integration(PACKAGES[0]).FxmemBatchSize(gpu="H100-80GB", device="cuda",
                                                 set_batch_size=False)
    fit(pl, tmp_path, model, cb, max_steps=1)
    assert model.hparams.batch_size == 4  # predicted only
    assert cb.fit.batch_size > 10_000 and cb.fit.peak_bytes % 512 == 0
    assert cb.steps[0].predicted_peak_bytes == cb.report.peak_bytes(4)


def test_what_is_refused(tmp_path):
    pl = importlib.import_module(PACKAGES[0])
    FxmemBatchSize = integration(PACKAGES[0]).FxmemBatchSize
    with pytest.raises(fxmem.InputError, match="manual optimization"):
        fit(pl, tmp_path, lm_class(pl, manual=True)(), FxmemBatchSize(10**9, device="cpu"))
    with pytest.raises(fxmem.InputError, match="'bs' is not an attribute"):
        fit(pl, tmp_path, lm_class(pl)(), FxmemBatchSize(10**9, device="cpu",
                                                         batch_arg_name="bs"))
    with pytest.raises(fxmem.InputError, match="give budget_bytes"):
        fit(pl, tmp_path, lm_class(pl)(), FxmemBatchSize(device="cpu"))
    with pytest.raises(fxmem.InputError, match="budget_bytes must be a positive int"):
        FxmemBatchSize(-1)


def test_import_fxmem_imports_no_lightning():
    code = ("import sys, fxmem; print(sorted(m for m in ('lightning', 'pytorch_lightning') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
