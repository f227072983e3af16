"""A third witness for the CPU: what the CPU allocator itself hands out during a step.

    python benchmarks/allocator_witness.py [--out docs/validation-allocator.md]

For every zoo model (tests/zoo.py: training with Adam, and inference) and every case of the
validation zoo at its small scale (fxmem.validate.zoo), the steady-state step runs once under
``tests/witness.py`` (the storages eager ops return, sharing no code with fxmem) with
``torch.profiler.profile(profile_memory=True)`` around it: the profiler records every
allocation and free of PyTorch's CPU allocator (``c10::Allocator``), storages or not. Its
peak over the step, less what was live when the step began, against the witness's (and
``fxmem.measure``'s, which the tests hold equal to it) tells which bytes no storage holds:
kernel scratch from the allocator (oneDNN's reorders, TensorIterator's buffers) that only
the allocator sees. Memory a library takes from ``malloc`` directly is seen by neither.
Prints a Markdown table; ``--out`` writes it.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from witness import witness_step  # noqa: E402
from zoo import OPTIMIZERS, ZOO  # noqa: E402


def _memory_events(prof) -> list:
    """(time ns, order, bytes) of every CPU allocation (+) and free (-), in time order."""
    return sorted((e.start_ns(), i, e.nbytes())
                  for i, e in enumerate(prof.profiler.kineto_results.events())
                  if e.name() == "[memory]" and str(e.device_type()).endswith("CPU"))


def allocator_peak(prof) -> int:
    """The most bytes the CPU allocator had out at once during the profiled block, above
    what it had out when the block began."""
    live = peak = 0
    for *_, n in _memory_events(prof):
        live += n
        peak = max(peak, live)
    return peak


def scratch_by_op(prof, seen) -> dict:
    """aten op name -> the most bytes one call of it held for a while and gave back before
    it returned (its running total's peak within the call, less what it kept), for the ops
    the witness saw whole (``seen``, ``aten::name``): kernel scratch, which no storage the
    op returns holds, and no dispatch mode sees."""
    ops = [(e.start_ns(), e.end_ns(), e.name()) for e in prof.profiler.kineto_results.events()
           if e.name() in seen and str(e.device_type()).endswith("CPU")]
    mem = _memory_events(prof)
    out: dict = {}
    for start, end, name in ops:
        live = top = 0
        for t, _, n in mem:
            if start <= t <= end:
                live += n
                top = max(top, live)
        if top > max(live, 0):
            out[name] = max(out.get(name, 0), top - max(live, 0))
    return out


def one(name, model, inputs, targets, loss, optimizer, b, **kw) -> dict:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    w = witness_step(model, inputs, targets, loss, optimizer, B=b, also=prof, **kw)
    storages = w.peak_bytes - w.baseline_bytes
    scratch = scratch_by_op(prof, {"aten::" + op.split(".")[1] for op in w.ops
                                   if op.startswith("aten.")})
    top = sorted(scratch.items(), key=lambda kv: -kv[1])[:2]
    return dict(name=name, B=b, storages=storages, allocator=allocator_peak(prof),
                scratch=", ".join(f"{op[6:]} {n:,}" for op, n in top))


def rows() -> list[dict]:
    from fxmem import apply_checkpoints
    from fxmem.validate.zoo import cases

    out = []
    for name in sorted(ZOO):
        model, x, y, loss = ZOO[name]()
        for b in (2, 13):
            out.append(one(f"{name}, Adam", model, x, y, loss, OPTIMIZERS["adam"], b))
            out.append(one(f"{name}, inference", model, x, (), None, None, b, train=False))
    for case in cases("small"):
        model, inputs, targets = case.build("small")
        if case.plan:
            model = apply_checkpoints(model, case.plan)
        train = case.options.get("train", True)
        for b in case.batches:
            out.append(one(case.name, model, inputs, targets if train else (), case.loss,
                           case.optimizer if train else None, b, train=train,
                           amp=case.options.get("amp")))
    return out


def table(rs: list[dict]) -> str:
    lines = ["| step | B | storages (witness = measure) | CPU allocator | only the allocator "
             "| the most scratch one call held (op, bytes) |", "|---|---:|---:|---:|---:|---|"]
    for r in rs:
        d = r["allocator"] - r["storages"]
        lines.append(f"| {r['name']} | {r['B']} | {r['storages']:,} | {r['allocator']:,} | "
                     f"{d:+,} | {r['scratch'] or '-'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the Markdown table here")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    text = (f"<!-- python benchmarks/allocator_witness.py; torch {torch.__version__}, "
            f"{platform.machine()}, {torch.get_num_threads()} threads -->\n" + table(rows()))
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
