"""CPU kernels against CUDA kernels: GPT-2 small (transformers' GPT2Config with 2048 positions,
SDPA attention and its dropout 0.1), one AdamW training step, analysed with L symbolic.

    python benchmarks/cuda_kernels.py [--batch 8] [--capability 9.0]

For fp32 and bf16 autocast, prints a Markdown table: the peak that ``device="cpu"`` predicts
(what the CPU build's kernels allocate: SDPA's math path, float dropout masks) and the peak
that ``device="cuda"`` predicts (the CUDA build's kernels, fxmem.trace.kernels.cuda.kernels, in
allocator blocks), at L = 512, 1024 and 2048, with the attention backend CUDA runs and each
prediction's B·L² term (the attention probabilities and masks the step saves).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import sympy
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from zoo import gpt2  # noqa: E402

GiB = 2**30


def _b_l2(r) -> sympy.Expr:
    """The coefficient of B·L² in the activations (ceilings of padded sizes as their
    argument: within a constant of it)."""
    from fxmem.formula.symbols import B, L

    e = sympy.expand(sympy.expand(r.parts["activations"]).replace(sympy.ceiling, lambda a: a))
    return sympy.Poly(e, B, L).coeff_monomial(B * L**2)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--capability", default="9.0")
    a = p.parse_args()
    import fxmem
    from fxmem.cli.targets import parse_capability

    cc = parse_capability(a.capability)
    with torch.device("meta"):
        model = gpt2(n_positions=2048)
    ids = torch.empty(8, 512, dtype=torch.int64, device="meta")
    print(f"GPT-2 small (124 M parameters, 2048 positions), AdamW, B = {a.batch}; torch "
          f"{torch.__version__}; CUDA kernels of compute capability {cc[0]}.{cc[1]}; "
          f"{platform.processor() or platform.machine()}\n")
    print("| precision | L | device=\"cpu\" peak (CPU kernels) | device=\"cuda\" peak (CUDA "
          "kernels) | CUDA attention | B·L² term, cpu | B·L² term, cuda |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for amp in (None, torch.bfloat16):
        reports = {dev: fxmem.analyze(model, (ids, ids), optimizer=torch.optim.AdamW,
                                      device=dev, amp=amp, compute_capability=cc,
                                      dims={"L": [(0, 1), (1, 1)]})
                   for dev in ("cpu", "cuda")}
        backend = "; ".join(w for _, w in reports["cuda"].trace.kernel_choices) or "-"
        for length in (512, 1024, 2048):
            cpu, cuda = (reports[d].peak_bytes(a.batch, L=length) for d in ("cpu", "cuda"))
            print(f"| {'bf16 autocast' if amp else 'fp32'} | {length} | {cpu / GiB:.2f} GiB | "
                  f"{cuda / GiB:.2f} GiB | {backend} | {_b_l2(reports['cpu'])}·B·L² | "
                  f"{_b_l2(reports['cuda'])}·B·L² |")


if __name__ == "__main__":
    main()
