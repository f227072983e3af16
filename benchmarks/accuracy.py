"""Predicted peak vs measured peak (a real eager CPU step) for the model zoo.

    python benchmarks/accuracy.py [--batches 2 3 13] [--gpt2-small]

Every zoo model (tests/zoo.py) with SGD-momentum and Adam, training and inference, is
analysed once (traced at B=4) and measured with ``fxmem.measure`` at each batch size.
``--gpt2-small`` adds transformers' default GPT2Config (124M parameters) at sequence length
512, AdamW, measured at B=1 and B=2 (needs about 12 GB of RAM and a few minutes).
Prints a Markdown table; the error is (predicted - measured) / measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import fxmem  # noqa: E402
from zoo import OPTIMIZERS, ZOO, gpt2  # noqa: E402


def rows_for(label, kw, batches):
    t0 = time.perf_counter()
    report = fxmem.analyze(**kw, device="cpu")
    t_analyze = time.perf_counter() - t0
    for b in batches:
        measured = fxmem.measure(**kw, B=b).peak_bytes
        predicted = report.peak_bytes(b)
        note = "; ".join(f"not modelled: {what}" for _, _, what in report.unmodelled)
        yield (label, b, predicted, measured, (predicted - measured) / measured, t_analyze, note)


def zoo_rows(batches):
    for name in sorted(ZOO):
        model, x, y, loss = ZOO[name]()
        for opt in sorted(OPTIMIZERS):
            kw = dict(model=model, inputs=x, targets=y, loss=loss, optimizer=OPTIMIZERS[opt])
            yield from rows_for(f"{name} / train / {opt}", kw, batches)
        kw = dict(model=model, inputs=x, train=False)
        yield from rows_for(f"{name} / inference", kw, batches)


def gpt2_small_rows():
    torch.manual_seed(0)
    model = gpt2()
    ids = torch.randint(0, 50257, (2, 512))
    kw = dict(model=model, inputs=(ids, ids), optimizer=torch.optim.AdamW)
    yield from rows_for("gpt2-small L=512 / train / adamw", kw, (1, 2))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[2, 3, 13])
    ap.add_argument("--gpt2-small", action="store_true")
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU cores, device=cpu (live bytes)\n")
    print("| model / step / optimizer | B | predicted bytes | measured bytes | error | "
          "analyze s | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    rows = list(zoo_rows(args.batches))
    if args.gpt2_small:
        rows += list(gpt2_small_rows())
    worst = 0.0
    for label, b, p, m, err, t, note in rows:
        worst = max(worst, abs(err)) if not note else worst
        print(f"| {label} | {b} | {p:,} | {m:,} | {err:+.4%} | {t:.2f} | {note} |")
    exact = sum(1 for r in rows if r[2] == r[3])
    print(f"\n{exact}/{len(rows)} points exact; worst |error| where everything is modelled: "
          f"{worst:.4%}")


if __name__ == "__main__":
    main()
