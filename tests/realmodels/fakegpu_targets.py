"""The fast real-model subset on the fake GPU (``test_fast_cuda.py``): :func:`run`, called in
the fake GPU's child (:func:`fxmem.validate.fakegpu.call`), measures each named case of
:mod:`realmodels.registry` with Adam (as :mod:`realmodels.audit` does) at each batch size with
``fxmem.measure(..., device="cuda")``, one child for every case.

transformers' ``find_packed_sequence_indices`` (its causal LMs with no attention mask) reads a
value computed on the device; no kernel ran, so the child answers what a GPU computes for these
batches, one sequence per row (:func:`fxmem.validate.fakegpu.reads.gpu_answers`, as the fake
GPU's zoo does).
"""

from __future__ import annotations

from fakegpu_zoo_targets import fresh  # tests/ is on the child's path

BATCHES = (2, 5)  #: as :data:`realmodels.audit.BATCHES`


def run(names, batches=BATCHES, record_history=False):
    """``fxmem.measure`` of each case at each B on the fake GPU: a list of dicts (case, B,
    max_allocated, max_reserved, seconds; ``allocations`` with ``record_history``) or
    ``{"case", "error"}``."""
    from fxmem.validate.fakegpu.reads import gpu_answers

    with gpu_answers():
        out = [row for name in names for row in _measure(name, batches, record_history)]
    fresh()
    return out


def _measure(name, batches, record_history):
    import time

    import torch

    import fxmem

    from .registry import CASES

    rows = []
    try:
        torch.manual_seed(0)
        model, inputs, targets, loss = CASES[name].build()
        for b in batches:
            fresh()
            t0 = time.perf_counter()
            m = fxmem.measure(model, inputs, targets, loss=loss, optimizer=torch.optim.Adam,
                              B=b, device="cuda", record_history=record_history)
            row = {"case": name, "B": b, "max_allocated": m.peak_bytes,
                   "max_reserved": m.peak_reserved_bytes,
                   "seconds": round(time.perf_counter() - t0, 2)}
            if record_history:
                row["allocations"] = [list(a) for a in m.allocations]
            rows.append(row)
    except Exception as e:  # noqa: BLE001 (reported per case)
        rows.append({"case": name, "error": f"{type(e).__name__}: {e}"})
    return rows
