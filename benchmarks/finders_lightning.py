"""What Lightning's ``BatchSizeFinder`` costs against fxmem's callback, on one model.

    python benchmarks/finders_lightning.py [--steps 3] [--fit 24]

The model: a GPT-style LightningModule (4 pre-norm transformer layers, width 128, 128
tokens, vocabulary 512, random weights, AdamW), trained on the CPU with ``lightning``. The
device is **simulated**, as in ``benchmarks/finders.py``: a budget of bytes halfway between
fxmem's predicted peaks at ``--fit`` and ``--fit + 1`` (live bytes on the CPU), and a
forward pre-hook raising ``torch.cuda.OutOfMemoryError`` when the batch is larger than the
largest fitting it. The threshold is checked against ground truth first (``fxmem.measure``
of the mirrored step at the answer and at the answer + 1).

Compared, each then training ``--steps`` optimizer steps:

- fxmem: ``FxmemBatchSize(budget)`` (its analysis at ``fit`` start timed within the fit);
- ``BatchSizeFinder(mode="power")`` and ``BatchSizeFinder(mode="binsearch")``, Lightning's
  defaults otherwise (from 2, 3 steps per trial, binsearch's 5 % margin).
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

from finders import Device  # the simulated device, shared with benchmarks/finders.py

V, L, W = 512, 128, 128


def lm_class(pl):
    class LM(pl.LightningModule):
        def __init__(self, batch_size=2, n=1024):
            super().__init__()
            self.save_hyperparameters()
            self.emb = torch.nn.Embedding(V, W)
            layer = torch.nn.TransformerEncoderLayer(W, 4, 4 * W, dropout=0.1, batch_first=True,
                                                     norm_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
            self.head = torch.nn.Linear(W, V)
            mask = torch.nn.Transformer.generate_square_subsequent_mask(L)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, x):
            return self.head(self.enc(self.emb(x), mask=self.mask, is_causal=True))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x).flatten(0, 1), y.flatten())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self):
            ids = torch.randint(0, V, (self.hparams.n, L),
                                generator=torch.Generator().manual_seed(0))
            return DataLoader(TensorDataset(ids, ids), batch_size=self.hparams.batch_size)

    return LM


def run(pl, callback, limit, steps):
    torch.manual_seed(0)
    model = lm_class(pl)()
    dev = Device(model, limit)
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir="/tmp/fxmem-finders-pl")
    t0 = time.perf_counter()
    trainer.fit(model)
    elapsed = time.perf_counter() - t0
    dev.handle.remove()
    return elapsed, dev, model.hparams.batch_size, trainer.global_step


def main():
    import logging

    import lightning
    import lightning.pytorch as pl

    from fxmem.integrations.lightning import FxmemBatchSize
    from fxmem.integrations.lightning_step import lightning_step

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--fit", type=int, default=24)
    a = p.parse_args()
    warnings.simplefilter("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    print(f"torch {torch.__version__}, lightning {lightning.__version__}, "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")

    got = {}

    class Analyse(pl.Callback):
        def on_fit_start(self, trainer, module):
            got["step"] = lightning_step(trainer, module, next(iter(module.train_dataloader())),
                                         device="cpu")
            trainer.should_stop = True

    torch.manual_seed(0)
    pl.Trainer(accelerator="cpu", max_steps=1, callbacks=[Analyse()], logger=False,
               enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(lm_class(pl)(n=2))
    step = got["step"]
    first = step.analyze()
    budget = (first.peak_bytes(a.fit) + first.peak_bytes(a.fit + 1)) // 2
    b = int(first.max_batch_size(budget, by="live"))
    at, over = step.measure(b).peak_bytes, step.measure(b + 1).peak_bytes
    print(f"\nsimulated device: {budget:,} B; fxmem's answer B={b} (predicted peak "
          f"{first.peak_bytes(b):,} B); measured: {at:,} B at B={b}, {over:,} B at B={b + 1}: "
          f"{'the threshold holds' if at <= budget < over else 'THRESHOLD WRONG'}")

    fx = FxmemBatchSize(budget, device="cpu", cpu_steps=1)  # untimed: the tracker is slow
    run(pl, fx, b, a.steps)
    (m,) = [s for s in fx.steps if s.measured_peak_bytes is not None]
    print(f"fxmem's callback: batch size {fx.fit.batch_size}, predicted peak "
          f"{m.predicted_peak_bytes:,} B, measured in the fit {m.measured_peak_bytes:,} B")

    rows = []
    fx = FxmemBatchSize(budget, device="cpu", cpu_steps=0)
    start, spent = fx.on_fit_start, []

    def timed(*args):
        t0 = time.perf_counter()
        start(*args)
        spent.append(time.perf_counter() - t0)

    fx.on_fit_start = timed
    t, dev, used, done = run(pl, fx, b, a.steps)
    rows.append(("fxmem FxmemBatchSize", spent[0], t, dev, used, done))
    for mode in ("power", "binsearch"):
        finder = pl.callbacks.BatchSizeFinder(mode=mode)
        t, dev, used, done = run(pl, finder, b, a.steps)
        rows.append((f"BatchSizeFinder(mode={mode!r})", 0.0, t, dev, used, done))

    print(f"\n| finder | fxmem analysis (s) | fit until {a.steps} steps done, finder included "
          "(s) | simulated OOMs | training steps run | batch size trained | batch sizes tried |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, ta, t, dev, used, done in rows:
        print(f"| {name} | {ta:.1f} | {t:.1f} | {dev.ooms} | {dev.calls - dev.ooms} | {used} | "
              f"{', '.join(map(str, dev.tried))} |")


if __name__ == "__main__":
    main()
