"""A model far bigger than this machine: Llama-2-7B (transformers' default ``LlamaConfig``)
training step with AdamW, analysed on the meta device.

    python benchmarks/huge.py [--seq 512] [--batch 2]

Reports the analysis wall time, the process's peak resident memory, and checks the parts
against the closed forms people use: params 4P bytes (float32), grads 4P, AdamW's two
moments 8P (its ``step`` counters stay on the host), with P the parameter count.
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

import torch


def closed_forms(report, n_params: int) -> dict:
    """(fxmem's figure, the closed form) per part, in bytes."""
    parts = report.parts
    return {"params": (int(parts["params"]), 4 * n_params),
            "grads": (int(parts["grads"]), 4 * n_params),
            "optimizer_state": (int(parts["optimizer_state"]), 8 * n_params)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=2)
    a = p.parse_args()

    import transformers

    import fxmem
    from fxmem.cli.targets import CausalLM

    t0 = time.perf_counter()
    with torch.device("meta"):
        model = CausalLM(transformers.LlamaForCausalLM(transformers.LlamaConfig()))
    n = sum(q.numel() for q in model.parameters())
    ids = torch.empty(a.batch, a.seq, dtype=torch.int64, device="meta")
    report = fxmem.analyze(model, (ids, ids), optimizer=torch.optim.AdamW)
    peak = report.peak_bytes(a.batch)
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}, transformers {transformers.__version__}")
    print(f"Llama-2-7B (default LlamaConfig), {n:,} parameters, AdamW, seq {a.seq}, "
          f"device=cuda")
    print(f"analysis (build on meta + trace + formula + peak at B={a.batch}): {seconds:.1f} s; "
          f"peak RSS {rss / 2**30:.2f} GiB")
    print(f"peak = {report.peak}")
    print(f"peak at B={a.batch}: {peak:,} bytes ({peak / 2**30:.2f} GiB)")
    for part, (got, want) in closed_forms(report, n).items():
        print(f"  {part:<16} fxmem {got:>16,}   closed form {want:>16,}   "
              f"{'equal' if got == want else f'differs by {got - want:+,}'}")


if __name__ == "__main__":
    main()
