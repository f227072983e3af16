"""torch.compile's partitioner budgets as peers of fxmem's plans (issue 39), on the fake GPU.

    python benchmarks/compiled_peers.py --python /path/to/cuda-venv/bin/python
        [--models gpt_stack,llama,gpt2] [--budgets 1.0,0.7,0.5,0.3] [--out-md FILE]

The checkpoint benchmark's models (``benchmarks/checkpoint_frontier.py``, float32, their
optimizers, each at its batch size B), on CUDA: everything runs in ``--python`` (a CUDA build
of PyTorch) on the fake GPU, each measurement in a process of its own.

- **The peer**: the step compiled by ``torch.compile`` under
  ``torch._functorch.config.activation_memory_budget`` = each budget, run with PyTorch alone
  (its graphs from an inductor cache this run filled first), three steps at B, its
  ``max_memory_reserved()`` over the whole run (the first steps, which make the optimizer
  state, included): what a card must hold for it. It is then run again on a card whose
  allocator may hold just that, to show it runs there. Its FLOPs: fxmem's count on the
  trace of that compiled step by PyTorch's formulas (``counted_flops`` of
  ``fxmem.checkpoint.options``, the planner's own measure: matmuls and attention, the ops a
  compiled graph runs as they are), as for fxmem's choice (its re-runs included), on
  either side: the pointwise ops an eager step runs one by one, inductor fuses into kernels
  that are not ops of the trace, so a count with them (``FlopCount.total``) is not the same
  measure for the two kinds (GPT-2 small at B=4: its eager step 388.37 GFLOPs in all,
  387.95 by PyTorch's formulas, the step compiled under budget 1.0 387.95 either way).
- **fxmem**: the eager step analysed once (``fxmem.analyze(..., device="cuda")`` at B); at each
  peer's measured ``max_memory_reserved()`` as the budget, ``report.plan_for(reserved, B,
  kinds=["module", "group", "selective", "compiled"], by="device")``: the cheapest of the
  eager plans and the compile budgets whose step runs within that budget in the caching
  allocator's replay. Its choice is then run with PyTorch alone on a card whose allocator
  may hold just that (``torch.cuda.set_per_process_memory_fraction``; the caching allocator
  frees its cache and retries before it runs out, as fxmem's replay does): the step compiled
  under the chosen budget, or the eager step with the chosen plan applied by
  ``fxmem.apply_checkpoints``.

It meets a peer when its choice runs within the peer's ``max_memory_reserved()`` and needs
no more FLOPs. Prints a Markdown table (and writes it to ``--out-md``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")
sys.path[:0] = [HERE, TESTS]

from compiled_budgets import _bundle, _case, arguments  # noqa: E402
from compiled_budgets import _call as fake_gpu  # noqa: E402

KINDS = ["module", "group", "selective", "compiled"]


def choose(name: str, B: int, peaks: dict) -> dict:  # noqa: N803
    """In the fake GPU's child: the eager step analysed at ``B``; each compile budget's FLOPs
    (fxmem's count on its compiled step), and at each ``peaks`` value (budget -> the peer's
    measured ``max_memory_reserved()``) fxmem's cheapest plan among eager plans and compile
    budgets that runs within it."""
    import fxmem
    from fxmem.checkpoint.compiled import compiled_plans
    from fxmem.checkpoint.options import counted_flops
    from fxmem.report.text import compact_plan

    model, batch, loss, make_optimizer = _case(name)
    inputs, targets = batch(B, "cpu")
    t0 = time.perf_counter()
    report = fxmem.analyze(model, inputs, targets, loss=loss, optimizer=make_optimizer,
                           device="cuda")
    traced = time.perf_counter() - t0
    budgets = [float(b) for b in peaks]
    flops = {str(p.budget): counted_flops(p.report, B) for p in compiled_plans(report, budgets)}
    compiled = time.perf_counter() - t0 - traced
    out = {"traced_s": traced, "compiled_s": compiled, "peer_flops": flops, "choices": {}}
    for budget, reserved in peaks.items():
        t1 = time.perf_counter()
        c = report.plan_for(int(reserved), B, kinds=KINDS, by="device")
        out["choices"][budget] = {
            "compiled": c.compiled, "plan": fxmem.Plan.of(c.plan).to_dict(),
            "label": compact_plan(fxmem.Plan.of(c.plan)) or "no plan",
            "reserved": c.run.max_reserved if c.run is not None else None,
            "flops": counted_flops(c.report, B),  # the step as the choice runs it
            "seconds": time.perf_counter() - t1}
    return out


def measure_choice(name: str, B: int, cap: int | None = None,  # noqa: N803
                   plan: dict | None = None, budget: float | None = None) -> dict:
    """In the fake GPU's child: a run with PyTorch alone on a card whose caching allocator
    may hold ``cap`` bytes (``torch.cuda.set_per_process_memory_fraction``; None: the whole
    card) of the eager step with ``plan`` applied by ``fxmem.apply_checkpoints``, or of the
    step compiled under ``budget`` (its graphs from the cache): ``{"fits",
    "max_allocated", "max_reserved"}`` over the whole run; ``fits`` False when it runs out
    of memory."""
    import contextlib

    import torch
    from torch._functorch import config

    import fxmem
    from fakegpu_compile_targets import measure_step

    model, batch, loss, make_optimizer = _case(name)
    if plan is not None:
        model = fxmem.apply_checkpoints(model, fxmem.Plan.from_dict(plan))
    if cap is not None:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, (cap + 0.5) / total))
    patch = config.patch(activation_memory_budget=budget) if budget is not None else \
        contextlib.nullcontext()
    try:
        with patch:
            got = measure_step(model, batch, loss, make_optimizer, B, B,
                               compile=budget is not None, start_at_b=True, whole_run=True)
    except torch.OutOfMemoryError:
        return {"fits": False}
    return {"fits": True, **got}


def _call(python, fn, cache, **kwargs):
    return fake_gpu(python, fn, cache, module="compiled_peers", **kwargs)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def main(argv=None) -> None:
    args = arguments(argv, __doc__.splitlines()[0], "gpt_stack,llama,gpt2")
    with tempfile.TemporaryDirectory(prefix="fxmem_inductor_") as cache:
        lines = _run(args, cache)
    if args.out_md:
        with open(args.out_md, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def _run(args, cache: str) -> list:
    lines = ["| model, B | peer | peer's reserved MiB | peer runs within it | peer's GFLOPs | "
             "fxmem's choice | replayed within it, MiB | run within it, MiB | GFLOPs | "
             "runs, no more FLOPs |",
             "|---|---|---:|---|---:|---|---:|---:|---:|---|"]
    for name in args.models.split(","):
        at = _bundle(name).B
        peaks, alone = {}, {}
        for budget in (float(b) for b in args.budgets.split(",")):
            fake_gpu(args.python, "measure", cache, name=name, budget=budget,
                     compiled_at=at, B=at)  # fills the cache
            whole = _call(args.python, "measure_choice", cache, name=name, B=at, budget=budget)
            peaks[str(budget)] = whole["max_reserved"]
            alone[str(budget)] = _call(args.python, "measure_choice", cache, name=name, B=at,
                                       cap=whole["max_reserved"], budget=budget)["fits"]
        got = _call(args.python, "choose", cache, name=name, B=at, peaks=peaks)
        print(f"{name}: traced in {got['traced_s']:.1f} s, its compile budgets analysed in "
              f"{got['compiled_s']:.1f} s", flush=True)
        for budget, reserved in peaks.items():
            c = got["choices"][budget]
            peer_flops = got["peer_flops"][budget]
            what = (f"compile, budget {c['compiled']:g}" if c["compiled"] is not None
                    else c["label"])
            seen = _call(args.python, "measure_choice", cache, name=name, B=at, cap=reserved,
                         plan=None if c["compiled"] is not None else c["plan"],
                         budget=c["compiled"])
            more = c["flops"] - peer_flops
            why = ("yes" if seen["fits"] and more <= 0 else "no: " + ", ".join(
                x for x, bad in (("runs out", not seen["fits"]),
                                 (f"+{more / 1e9:.2f} GFLOPs", more > 0)) if bad))
            ran = _mib(seen["max_reserved"]) if seen["fits"] else "out of memory"
            replayed = _mib(c["reserved"]) if c["reserved"] is not None else ""
            lines.append(f"| {name}, {at} | compile, budget {float(budget):g} | {_mib(reserved)} "
                         f"| {'yes' if alone[budget] else 'no'} | {peer_flops / 1e9:.2f} "
                         f"| {what} | {replayed} | {ran} | "
                         f"{c['flops'] / 1e9:.2f} | {why} |")
            print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    main()
