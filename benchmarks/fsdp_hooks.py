"""What copying FSDP2's interior blocks with their hooks saves a trace (docs/distributed.md):
Llama-3.1-8B (its config, random weights on the meta device) over FSDP(8), AdamW, bf16
autocast, B = 2, L = 8192 on the cuda device, traced at that point, with the interior
blocks' hooks copied (fxmem's default) and with every block's hooks run
(``fxmem.trace.engine.tracer._hookless`` patched to say no), in turn, after one unmeasured
trace. Each line: the CPU seconds of one analysis at that point (the trace, most of it),
its ops, the blocks copied and the peak.

    python benchmarks/fsdp_hooks.py [--repeat 4]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=4, help="traces of each kind (default 4)")
    args = ap.parse_args()

    import fxmem.trace.engine.tracer as tracer
    from fxmem.analyze import analyzer
    from fxmem.cli.collector import paced
    from fxmem.cli.command import LOSSES
    from fxmem.cli.targets import load_target, named_dims, parse_config, parse_tensor
    from fxmem.trace.engine import Step
    from fxmem.trace.parallel import FSDP

    target = load_target("hf:llama-3.1-8b", parse_config(()), 8192)
    xs = tuple(parse_tensor(s, 8, dict(target.dims)) for s in target.inputs)
    step = Step(loss=LOSSES["none"], optimizer=torch.optim.AdamW, train=True, device="cuda",
                amp=torch.bfloat16, compute_capability=(9, 0))
    again = analyzer(target.model, xs, (), step=step, dims=named_dims(target.inputs) or None,
                     batch_dim=(0,) * len(xs), parallel=FSDP(8))
    point = dict(concrete_batch=2, concrete_dims={"L": 8192})
    own = tracer._hookless
    print(f"<!-- python benchmarks/fsdp_hooks.py --repeat {args.repeat}; torch "
          f"{torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads -->")
    times = {"copied": [], "run": []}
    try:
        with paced():
            again(**point)
            for _ in range(args.repeat):
                for kind in ("copied", "run"):
                    tracer._hookless = own if kind == "copied" else (lambda parallel: False)
                    t0 = time.process_time()
                    report = again(**point).groups[0].report
                    cpu = time.process_time() - t0
                    times[kind].append(cpu)
                    t = report.trace
                    print(f"interior hooks {kind}: {cpu:.2f} s of CPU, {len(t.ops):,} ops, "
                          f"{len(t.reused)} blocks copied, peak "
                          f"{report.peak_bytes(2, L=8192):,} B", flush=True)
    finally:
        tracer._hookless = own
    for kind, ts in times.items():
        print(f"hooks {kind}: {min(ts):.2f} to {max(ts):.2f} s, median "
              f"{statistics.median(ts):.2f} s")


if __name__ == "__main__":
    main()
