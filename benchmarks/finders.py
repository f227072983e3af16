"""What the frameworks' batch-size finders cost against fxmem's answer, on one model.

    python benchmarks/finders.py [--start 64] [--steps 3] [--fit 24]

The model: a GPT-2 from a config (4 layers, width 128, 128 tokens, vocabulary 512, random
weights), trained on the CPU. The device is **simulated**: a budget of bytes, halfway between
fxmem's predicted peaks at ``--fit`` and ``--fit + 1`` (the Trainer's step, live bytes on
the CPU); a step runs out of memory when its batch is larger than the largest batch fitting
that budget. That threshold is checked against ground truth first: ``fxmem.measure`` of the
same step at the answer is within the budget and at the answer + 1 over it.

Compared, each training ``--steps`` optimizer steps once it has a batch size:

- fxmem: ``fxmem.integrations.hf.batch_size_for`` (its analysis timed), then the Trainer at
  the answer;
- the Trainer's ``auto_find_batch_size=True`` from ``per_device_train_batch_size=--start``:
  each out-of-memory error (raised by a forward pre-hook, before any of the step's work, so
  the cost of a failed try is a lower bound of a GPU's, where the error comes inside the step)
  restarts its inner training loop at a smaller batch size (accelerate's reduction);
- a plain PyTorch loop under ``accelerate.utils.find_executable_batch_size(starting_batch_size
  =--start)``, and under fxmem's drop-in (``fxmem.integrations.accelerate``) started from
  fxmem's report.
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings

import torch
from torch._subclasses.fake_tensor import is_fake


def gpt2():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=512,
                                  n_positions=128, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


class Device:
    """Out of memory when the model is called with a batch over ``limit``; counts tries."""

    def __init__(self, model, limit):
        self.limit, self.ooms, self.calls, self.tried = limit, 0, 0, []
        self.handle = model.register_forward_pre_hook(self.check, with_kwargs=True)

    def check(self, module, args, kwargs):
        x = next(t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor))
        if is_fake(x):  # fxmem's trace: no device step
            return
        b = x.shape[0]
        self.calls += 1
        if not self.tried or self.tried[-1] != b:
            self.tried.append(b)
        if b > self.limit:
            self.ooms += 1
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate a batch of {b} (simulated)")


def trainer_run(model, args, data, steps, **kw):
    import transformers

    args = transformers.TrainingArguments(
        "/tmp/fxmem-finders", report_to=[], use_cpu=True, save_strategy="no",
        disable_tqdm=True, logging_strategy="no", max_steps=steps, **kw)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.remove_callback(transformers.PrinterCallback)  # its metrics line
    t0 = time.perf_counter()
    trainer.train()
    return time.perf_counter() - t0, trainer.state.train_batch_size, trainer.state.global_step


def loop(model, ids, steps):
    """A plain training loop, ``steps`` AdamW steps at ``batch_size``."""
    def train(batch_size):
        opt = torch.optim.AdamW(model.parameters())
        for i in range(steps):
            x = ids[i * batch_size:(i + 1) * batch_size]
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()
        return batch_size
    return train


def main():
    import accelerate.utils
    import transformers

    import fxmem
    from fxmem.integrations import accelerate as fx_accelerate
    from fxmem.integrations import hf
    from fxmem.validate.zoo import CausalLM

    p = argparse.ArgumentParser()
    p.add_argument("--start", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--fit", type=int, default=24)
    a = p.parse_args()
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, accelerate "
          f"{accelerate.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads")

    ids = torch.randint(0, 512, (a.start * a.steps, 128), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": x, "labels": x} for x in ids]
    batch = {"input_ids": ids[:4], "labels": ids[:4]}
    args = transformers.TrainingArguments("/tmp/fxmem-finders", report_to=[], use_cpu=True)
    model = gpt2()
    first = hf.trainer_step(model, args, batch, device="cpu").analyze()
    budget = (first.peak_bytes(a.fit) + first.peak_bytes(a.fit + 1)) // 2

    t0 = time.perf_counter()
    fit = hf.batch_size_for(model, args, batch, budget, device="cpu")
    t_fx = time.perf_counter() - t0
    b = fit.per_device_train_batch_size
    step = hf.trainer_step(model, args, batch, device="cpu")
    at, over = step.measure(b).peak_bytes, step.measure(b + 1).peak_bytes
    print(f"\nsimulated device: {budget:,} B; fxmem's answer B={b} (predicted peak "
          f"{fit.peak_bytes:,} B); measured: {at:,} B at B={b}, {over:,} B at B={b + 1}: "
          f"{'the threshold holds' if at <= budget < over else 'THRESHOLD WRONG'}")
    rows, tried = [], []

    dev = Device(model, b)
    t, used, done = trainer_run(model, args, data, a.steps, per_device_train_batch_size=b)
    rows.append(("fxmem batch_size_for + Trainer", t_fx, t, dev.ooms, dev.calls, used, done))
    dev.handle.remove()
    tried.append(dev.tried)

    model = gpt2()
    dev = Device(model, b)
    t, used, done = trainer_run(model, args, data, a.steps, per_device_train_batch_size=a.start,
                                auto_find_batch_size=True)
    rows.append((f"Trainer auto_find_batch_size from {a.start}", 0.0, t, dev.ooms, dev.calls,
                 used, done))
    dev.handle.remove()
    tried.append(dev.tried)

    # the plain loop's step (no clipping, a CausalLM wrapper): its own answer, checked
    model = gpt2()
    t0 = time.perf_counter()
    report = fxmem.analyze(CausalLM(model), (ids[:4], ids[:4]), optimizer=torch.optim.AdamW,
                           device="cpu")
    train = fx_accelerate.find_executable_batch_size(loop(model, ids, a.steps),
                                                     prediction=report, budget_bytes=budget)
    t_an = time.perf_counter() - t0
    lb = train.starting_batch_size
    at, over = (fxmem.measure(CausalLM(model), (ids[:4], ids[:4]), optimizer=torch.optim.AdamW,
                              B=x).peak_bytes for x in (lb, lb + 1))
    print(f"plain loop: fxmem's answer B={lb}; measured {at:,} B at B={lb}, {over:,} B at "
          f"B={lb + 1}: {'the threshold holds' if at <= budget < over else 'THRESHOLD WRONG'}")
    dev = Device(model, lb)
    t0 = time.perf_counter()
    used = train()
    rows.append(("fxmem drop-in (analysis + loop)", t_an, time.perf_counter() - t0, dev.ooms,
                 dev.calls, used, a.steps))
    dev.handle.remove()
    tried.append(dev.tried)

    model = gpt2()
    dev = Device(model, lb)
    t0 = time.perf_counter()
    used = accelerate.utils.find_executable_batch_size(loop(model, ids, a.steps),
                                                       starting_batch_size=a.start)()
    rows.append((f"accelerate find_executable_batch_size from {a.start}", 0.0,
                 time.perf_counter() - t0, dev.ooms, dev.calls, used, a.steps))
    dev.handle.remove()
    tried.append(dev.tried)

    print(f"\n| finder | fxmem analysis (s) | training until {a.steps} steps done (s) | "
          "simulated OOMs | forward calls | batch size trained | steps | batch sizes tried |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for (name, ta, tt, ooms, calls, used, done), seq in zip(rows, tried):
        print(f"| {name} | {ta:.1f} | {tt:.1f} | {ooms} | {calls} | {used} | {done} | "
              f"{', '.join(map(str, seq))} |")


if __name__ == "__main__":
    main()
