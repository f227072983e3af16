"""Compiled steps at AOTAutograd's partitioner budgets (issue 39), checked on the fake GPU.

    python benchmarks/compiled_budgets.py --python /path/to/cuda-venv/bin/python
        [--models gpt_stack,gpt2,llama] [--budgets 1.0,0.7,0.5,0.3] [--out-md FILE]

The checkpoint benchmark's three models (``benchmarks/checkpoint_frontier.py``: the GPT-style
stack, GPT-2 small and the small Llama, float32, their optimizers), each compiled with
``torch.compile`` under ``torch._functorch.config.activation_memory_budget`` = each budget,
with B dynamic, at the model's batch size (``compiled at``), and checked at half and twice
it. Everything runs in ``--python`` (a CUDA build of PyTorch) on the fake GPU, each
measurement in a process of its own:

- **predicted**: ``fxmem.analyze(model, ..., device="cuda", compile={"activation_memory_budget":
  b}).cuda_memory(B)``, traced at the compile batch size;
- **measured**: the same step with PyTorch alone (``tests/fakegpu_compile_targets.py``
  ``measure_step``: a process whose run starts at B, two steps, then
  ``max_memory_allocated`` / ``max_memory_reserved`` of the next step after ``empty_cache``
  and a peak reset), its graphs loaded from an inductor cache folder of this run's own,
  filled by one run at the compile batch size first. A run whose first steps are at
  another B makes its optimizer state beside those steps, and the blocks land elsewhere:
  the GPT stack at budget 1.0 and B=4 after two steps at B=8 reserves 350,224,384 B,
  started at B=4 352,321,536 (fxmem's figure; 2.14.1);
- **inductor's estimate**: the peak ``torch._inductor.memory`` estimates for each graph it
  schedules (forward, backward; at the compile batch size, the graph's own buffers and
  freeable inputs only: not the parameters, gradients or optimizer state), read from its
  ``reorder_for_peak_memory`` as the trace compiles.

Prints a Markdown table (and writes it to ``--out-md``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")
BUDGETS = (1.0, 0.7, 0.5, 0.3)


def _bundle(name):
    sys.path[:0] = [HERE, TESTS]
    from checkpoint_frontier import models

    return models()[name]


def _case(name):
    """(model, batch(b, device), loss(output, *targets), make_optimizer) of a bundle."""
    b = _bundle(name)

    def batch(n, device):
        inputs, targets = b.batch(n)
        return tuple(t.to(device) for t in inputs), tuple(t.to(device) for t in targets)

    loss = b.loss if b.loss is not None else (lambda out, *targets: out.loss)
    return b.build(), batch, loss, b.optimizer


def predict(name: str, budget: float, compiled_at: int, batches: list) -> dict:
    """In the fake GPU's child: fxmem's prediction at each B, inductor's graph estimates,
    and the seconds the analysis took."""
    import torch._inductor.memory as inductor_memory

    import fxmem

    model, batch, loss, make_optimizer = _case(name)
    inputs, targets = batch(compiled_at, "cpu")
    graphs: list = []
    reorder, estimate = inductor_memory.reorder_for_peak_memory, \
        inductor_memory.estimate_peak_memory

    def reorder_seen(*args, **kwargs):
        graphs.append([])
        return reorder(*args, **kwargs)

    def estimate_seen(*args, **kwargs):
        out = estimate(*args, **kwargs)
        if graphs:
            graphs[-1].append(int(out[0]))
        return out

    inductor_memory.reorder_for_peak_memory = reorder_seen
    inductor_memory.estimate_peak_memory = estimate_seen
    t0 = time.perf_counter()
    try:
        report = fxmem.analyze(model, inputs, targets, loss=loss, optimizer=make_optimizer,
                               device="cuda", compile={"activation_memory_budget": budget})
    finally:
        inductor_memory.reorder_for_peak_memory = reorder
        inductor_memory.estimate_peak_memory = estimate
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "inductor": [min(g) for g in graphs if g],
            "predicted": {str(b): [report.cuda_memory(b).max_allocated,
                                   report.cuda_memory(b).max_reserved] for b in batches}}


def measure(name: str, budget: float, compiled_at: int, B: int) -> list:  # noqa: N803
    """In the fake GPU's child: the step compiled under ``budget`` with PyTorch alone."""
    from torch._functorch import config

    sys.path.insert(0, TESTS)
    from fakegpu_compile_targets import measure_step

    model, batch, loss, make_optimizer = _case(name)
    with config.patch(activation_memory_budget=budget):
        got = measure_step(model, batch, loss, make_optimizer, B, compiled_at,
                           start_at_b=True)
    return [got["max_allocated"], got["max_reserved"]]


def _call(python, fn, cache, module="compiled_budgets", **kwargs):
    """``module:fn(**kwargs)`` in ``python`` on the fake GPU, its inductor cache ``cache``."""
    from fxmem.validate.fakegpu.run import call

    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    return call(python, f"{module}:{fn}", kwargs=kwargs, sys_path=[HERE, TESTS],
                env=env, timeout=3600)


def arguments(argv, description: str, models: str):
    """The command line of this benchmark and of ``compiled_peers.py``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--python", required=True, help="a CUDA build of PyTorch's Python")
    p.add_argument("--models", default=models)
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    p.add_argument("--out-md", default=None)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = arguments(argv, __doc__.splitlines()[0], "gpt_stack,gpt2,llama")
    with tempfile.TemporaryDirectory(prefix="fxmem_inductor_") as cache:
        _run(args, cache)


def _run(args, cache: str) -> None:
    lines = ["| model | budget | B | predicted allocated | measured | predicted reserved | "
             "measured | exact | inductor's graph estimates at the compile B | analysis s |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for name in args.models.split(","):
        at = _bundle(name).B
        batches = [max(1, at // 2), at * 2]
        for budget in (float(b) for b in args.budgets.split(",")):
            got = _call(args.python, "predict", cache, name=name, budget=budget,
                        compiled_at=at, batches=batches)
            _call(args.python, "measure", cache, name=name, budget=budget, compiled_at=at,
                  B=at)  # fills the cache
            for b in batches:
                seen = _call(args.python, "measure", cache, name=name, budget=budget,
                             compiled_at=at, B=b)
                want = got["predicted"][str(b)]
                est = ", ".join(f"{e:,}" for e in got["inductor"])
                lines.append(f"| {name} (compiled at {at}) | {budget:g} | {b} | {want[0]:,} | "
                             f"{seen[0]:,} | {want[1]:,} | {seen[1]:,} | "
                             f"{'yes' if want == seen else 'no'} | {est} | "
                             f"{got['seconds']:.1f} |")
                print(lines[-1], flush=True)
    if args.out_md:
        with open(args.out_md, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
