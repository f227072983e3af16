"""The validation harness: fxmem's predictions against real steps on a device, as a table.

``python -m fxmem.validate`` (or ``fxmem validate``) runs the zoo (:mod:`fxmem.validate.zoo`) on a
CUDA device: for each model and several B, :func:`fxmem.measure` warms up, collects,
empties the cache, resets the peak statistics and runs a step, reading the peaks of
``memory_allocated`` and ``memory_reserved`` per phase; fxmem predicts both for the same
step. It writes a Markdown and a JSON table (device, driver, torch and CUDA versions,
predicted, measured, error) to ``docs/validation.md`` / ``docs/validation.json``, and checks
on three models that the predicted largest batch for a budget fits and one more does not.

``--device cpu`` runs the same harness on this machine's CPU (live bytes, ``scale="small"``
models): it is how the harness itself is tested without a GPU.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import gc
import json
import platform
from dataclasses import asdict, dataclass, replace

import torch

from ..analyze import analyze
from ..trace.engine import Step
from ..trace.ledger import frozen_gc
from ..trace.plans import apply_checkpoints
from .divergence import first_divergence, predicted_allocations
from .fakegpu.reads import gpu_answers
from .fakegpu.remote import on_fake_gpu
from .measure import measure
from .zoo import Case, cases

GOAL_ALLOCATED, GOAL_UNDER, GOAL_RESERVED = 0.02, 0.01, 0.05  # the goals


@dataclass(frozen=True)
class Row:
    """One model at one B. Bytes; ``*_error``: (predicted - measured) / measured."""

    case: str
    B: int
    predicted_allocated: int
    measured_allocated: int
    allocated_error: float
    predicted_reserved: int | None
    measured_reserved: int | None
    reserved_error: float | None
    diverges: str | None = None  # a missed CUDA row: the first allocation that differs

    @property
    def exact(self) -> bool:
        """Predicted equal to measured (both figures on CUDA): the fake GPU's goal."""
        return (self.predicted_allocated == self.measured_allocated
                and self.predicted_reserved == self.measured_reserved)

    @property
    def meets_goal(self) -> bool:
        ok = abs(self.allocated_error) <= GOAL_ALLOCATED and self.allocated_error >= -GOAL_UNDER
        if self.reserved_error is not None:
            ok = ok and abs(self.reserved_error) <= GOAL_RESERVED
        return ok


@dataclass(frozen=True)
class BudgetCheck:
    """The predicted largest B for ``budget_bytes`` and what the device measured at it and
    at B + 1: ``fits`` when the first is within the budget and the second is not."""

    case: str
    budget_bytes: int
    B: int
    measured_at_B: int
    measured_at_B_plus_1: int

    @property
    def fits(self) -> bool:
        return self.measured_at_B <= self.budget_bytes < self.measured_at_B_plus_1


@dataclass(frozen=True)
class Validation:
    """A harness run: where it ran, the rows and the budget checks."""

    device: str
    device_name: str
    driver: str | None
    torch_version: str
    cuda_version: str | None
    scale: str
    rows: tuple
    budget_checks: tuple
    context_bytes: int | None = None  # CUDA context and libraries, outside both figures
    fake_gpu: bool = False  # measured on the fake GPU (fxmem.validate.fakegpu): goal exact


def _error(p, m):
    return (p - m) / m if m else 0.0


def _step(case: Case, device: str) -> Step:
    """The case's step on ``device`` (the GPU's compute capability on CUDA)."""
    cc = torch.cuda.get_device_capability() if device == "cuda" else (9, 0)
    options = {"loss": case.loss, "optimizer": case.optimizer, **case.options}
    if not options.get("train", True):  # inference: no loss, no optimizer
        options.update(loss=None, optimizer=None)
    return Step(**options, device=device, compute_capability=cc)


def _predict(case: Case, model, inputs, targets, device):
    step = _step(case, device)
    report = analyze(model, inputs, targets if step.train else (), step=step,
                     checkpoint=case.plan or None)
    return report, step


def _measure(case, model, inputs, targets, step, b, record_history=False):
    real = apply_checkpoints(copy.deepcopy(model), case.plan) if case.plan else model
    # on the fake GPU, the values a GPU computes for these batches where a library branches
    # on one (fxmem.validate.fakegpu.reads)
    answers = gpu_answers() if on_fake_gpu() else contextlib.nullcontext()
    with answers:
        m = measure(real, inputs, targets if step.train else (), step=step, B=b,
                    record_history=record_history)
    del real
    # the step's garbage (device memory in it) collected now, before a trace at a small B
    # (freeze_more) could exempt it from the next step's collections
    gc.collect()
    return m


# A case's prediction and measurements run with the objects made before them exempt from
# the collector (frozen_gc), so that the full collections of fxmem.measure (two per CUDA
# step) walk only what the case made: over torch's, sympy's and transformers' objects each
# took a quarter of a second. Each _measure collects its step's garbage before it returns,
# and validate collects everything once before the first case.
@frozen_gc()
def run_case(case: Case, scale: str, device: str) -> tuple:
    """The rows of one case: prediction and measurement at each of its batch sizes."""
    torch.manual_seed(0)
    model, inputs, targets = case.build(scale)
    report, step = _predict(case, model, inputs, targets, device)
    rows = []
    for b in case.batches:
        m = _measure(case, model, inputs, targets, step, b)
        if device == "cuda":  # the step through the caching allocator, workspaces included
            d = report.cuda_memory(b, compute_capability=torch.cuda.get_device_capability())
            p, pr = d.max_allocated, d.max_reserved
        else:
            p, pr = report.peak_bytes(b), None
        row = Row(case.name, b, p, m.peak_bytes, _error(p, m.peak_bytes), pr,
                  m.peak_reserved_bytes,
                  None if pr is None else _error(pr, m.peak_reserved_bytes))
        if device == "cuda" and not (row.exact if on_fake_gpu() else row.meets_goal):
            # where do they part ways?
            again = _measure(case, model, inputs, targets, step, b, True)
            d = first_divergence(predicted_allocations(report, b), again.allocations)
            row = replace(row, diverges=d.describe() if d else "no allocation differs")
        rows.append(row)
    return tuple(rows)


@frozen_gc()  # (as run_case)
def budget_check(case: Case, scale: str, device: str) -> BudgetCheck:
    """Budget = 1.5 x the measured peak at the case's first B; the predicted largest B for
    it (on CUDA: the formula's, less the cuBLAS workspaces kept) is measured, and so is one
    more."""
    torch.manual_seed(0)
    model, inputs, targets = case.build(scale)
    report, step = _predict(case, model, inputs, targets, device)
    first = _measure(case, model, inputs, targets, step, case.batches[0])
    budget = int(1.5 * first.peak_bytes)
    b = int(report.max_batch_size(budget - _kept_workspaces(report, device), by="live"))
    if device == "cuda":  # the allocator's block slack can matter at the boundary
        cc = torch.cuda.get_device_capability()
        fits = lambda n: report.cuda_memory(n, compute_capability=cc).max_allocated <= budget  # noqa: E731
        while b > 1 and not fits(b):
            b -= 1
        while fits(b + 1):
            b += 1
    at = _measure(case, model, inputs, targets, step, b).peak_bytes
    after = _measure(case, model, inputs, targets, step, b + 1).peak_bytes
    return BudgetCheck(case.name, budget, b, at, after)


def _kept_workspaces(report, device) -> int:
    if device != "cuda":
        return 0
    d = report.cuda_memory(report.min_batch_size,
                           compute_capability=torch.cuda.get_device_capability())
    return sum(n for _, n in d.workspaces)


def context_bytes() -> int:
    """Device memory in use that the caching allocator does not hold: the CUDA context,
    cuBLAS/cuDNN handles and kernels (``mem_get_info`` used minus ``memory_reserved``),
    measured after one matmul and one convolution have run."""
    x = torch.randn(64, 64, device="cuda")
    (x @ x).sum().item()
    torch.nn.functional.conv2d(x[None, None], x[None, None, :3, :3]).sum().item()
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def validate(device: str = "cuda", scale: str | None = None, only=None,
             budget_cases=("seed CNN, fp32, Adam", "ResNet-50, SGD momentum",
                           "GPT-2 small, seq 512, AdamW")) -> Validation:
    """Run the zoo on ``device``; ``scale``: "full" (default on CUDA) or "small" (default
    on CPU); ``only``: case names to run (default all)."""
    if device == "cuda" and not torch.cuda.is_available():
        from ..errors import InputError

        raise InputError("no CUDA device: run the harness where a GPU is (or --device cpu)")
    scale = scale or ("full" if device == "cuda" else "small")
    known = [c.name for c in cases(scale)]
    for name in only or ():
        if name not in known:
            from ..errors import InputError

            near = difflib.get_close_matches(name, known, n=3, cutoff=0.0)
            raise InputError(f"no validation case {name!r} ({len(known)} cases, in "
                             f"fxmem/validate/zoo.py); the closest: "
                             f"{', '.join(repr(n) for n in near)}")
    fake = device == "cuda" and on_fake_gpu()
    context = context_bytes() if device == "cuda" and not fake else None
    chosen = [c for c in cases(scale) if only is None or c.name in only]
    gc.collect()  # no earlier garbage (device memory in it) left to the cases' steps
    rows = tuple(r for c in chosen for r in run_case(c, scale, device))
    checks = tuple(budget_check(c, scale, device) for c in chosen if c.name in budget_cases)
    name, driver, cuda = platform.processor() or platform.machine(), None, None
    if device == "cuda":
        name, cuda = torch.cuda.get_device_name(), torch.version.cuda
        try:
            driver = ".".join(map(str, torch.cuda.driver_version())) \
                if hasattr(torch.cuda, "driver_version") else None
        except Exception:  # noqa: BLE001 - informational only
            driver = None
    if fake:
        name += " (fake GPU: PyTorch's CUDA build on fxmem's stub driver)"
    return Validation(device, name, driver, torch.__version__, cuda, scale, rows, checks,
                      context, fake)


def _pct(x):
    return "" if x is None else f"{100 * x:+.2f}%"


def _goal(r: Row, fake_gpu: bool) -> str:
    if not fake_gpu:
        return "met" if r.meets_goal else "missed"
    return "exact" if r.exact else "differs"


def to_markdown(v: Validation) -> str:
    """The tables of ``docs/validation.md``."""
    kind = "max_memory_allocated" if v.device == "cuda" else "peak live bytes"
    out = [f"Device: {v.device_name} ({v.device}); driver {v.driver or 'n/a'}; torch "
           f"{v.torch_version}; CUDA {v.cuda_version or 'n/a'}; models at scale "
           f"\"{v.scale}\"." + (f" CUDA context and libraries (outside both figures, "
                                  f"measured): {v.context_bytes:,} bytes."
                                  if v.context_bytes is not None else ""), "",
           f"| model | B | predicted {kind} | measured | error | predicted reserved | "
           "measured reserved | error | goal |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in v.rows:
        pr = "" if r.predicted_reserved is None else f"{r.predicted_reserved:,}"
        mr = "" if r.measured_reserved is None else f"{r.measured_reserved:,}"
        out.append(f"| {r.case} | {r.B} | {r.predicted_allocated:,} | {r.measured_allocated:,} "
                   f"| {_pct(r.allocated_error)} | {pr} | {mr} | {_pct(r.reserved_error)} | "
                   f"{_goal(r, v.fake_gpu)} |")
    missed = [r for r in v.rows if r.diverges]
    if missed:
        out += ["", "Where each missed (fake GPU: differing) row's step first allocated "
                "something else than predicted (`torch.cuda.memory._record_memory_history`):",
                ""]
        out += [f"- {r.case}, B={r.B}: {r.diverges}" for r in missed]
    if v.budget_checks:
        out += ["", "| model | budget | predicted largest B | measured at B | measured at B+1 "
                "| fits, and B+1 does not |", "|---|---:|---:|---:|---:|---|"]
        for c in v.budget_checks:
            out.append(f"| {c.case} | {c.budget_bytes:,} | {c.B} | {c.measured_at_B:,} | "
                       f"{c.measured_at_B_plus_1:,} | {'yes' if c.fits else 'no'} |")
    return "\n".join(out) + "\n"


def to_json(v: Validation) -> str:
    d = asdict(v)
    for r, row in zip(d["rows"], v.rows):
        r["meets_goal"] = row.meets_goal
        r["exact"] = row.exact
    for c, check in zip(d["budget_checks"], v.budget_checks):
        c["fits"] = check.fits
    return json.dumps(d, indent=2) + "\n"
