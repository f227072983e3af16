"""One case of the real-model zoo predicted and measured.

:func:`audit` traces the case's training step with Adam once, at B=4, on fake tensors
(``fxmem.analyze(..., device="cpu")``: live bytes, the CPU's kernels), then runs the same
step for real with :func:`fxmem.measure` at each batch size and compares the two. The result
is a :class:`Result`: ``exact``, ``inexact`` (the error at each batch size), ``refused``
(fxmem raised: its one-line message, while the real step runs) or ``invalid`` (the real step
itself fails: the case is wrong, not fxmem). ``benchmarks/realmodels.py`` adds ``error``: the
audit's process crashed or timed out.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field

import torch

import fxmem

from .registry import CASES, Case

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRACE_BATCH = 4
BATCHES = (2, 5)


@dataclass
class Result:
    """What :func:`audit` found for one case. ``points``: ``[B, predicted, measured]`` for
    each batch size measured; ``seconds``: time of ``fxmem.analyze``; ``unmodelled``: what
    the trace reports it could not size (``Report.unmodelled``)."""

    name: str
    family: str
    params: int = 0
    trainable: int = 0
    status: str = "refused"
    message: str = ""
    seconds: float = 0.0
    points: list = field(default_factory=list)
    unmodelled: list = field(default_factory=list)
    witnessed: list = field(default_factory=list)  # [B, bytes] of tests/witness.py's steps
    note: str = ""

    @property
    def worst(self) -> tuple[int, float]:
        """(bytes, relative) error of the point with the largest relative error."""
        if not self.points:
            return 0, 0.0
        b, p, m = max(self.points, key=lambda pt: abs(pt[1] - pt[2]) / pt[2])
        return p - m, (p - m) / m

    def to_json(self) -> dict:
        return asdict(self)


def portable(text: str) -> str:
    """``text`` without this machine's paths: installed packages' files from their package
    (``timm/models/tnt.py``), the repository's from its root, PyTorch's build directory
    dropped."""
    text = re.sub(r"/\S*?/site-packages/", "", text)
    text = re.sub(r"/\S*?/build/aten/src/", "aten/src/", text)
    text = text.replace(ROOT + os.sep, "")
    return re.sub(r"(?<![\w.])/(?:[\w.+-]+/)+[\w.+-]*", "...", text)  # any other path


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return portable(f"{type(exc).__name__}: {text[0] if text else ''}")[:400]


def audit(case: Case | str, batches=BATCHES, trace_batch: int = TRACE_BATCH,
          witness: bool = False) -> Result:
    """Predict the case's step at ``trace_batch`` and measure it at each of ``batches``;
    ``witness``: also run each step under ``tests/witness.py`` (which shares no code with
    fxmem), its peaks in ``witnessed``."""
    case = CASES[case] if isinstance(case, str) else case
    torch.manual_seed(0)
    try:
        model, inputs, targets, loss = case.build()
    except Exception as e:  # noqa: BLE001 - the case cannot even be built: not fxmem's
        return Result(case.name, case.family, status="invalid", note=case.note,
                      message=f"the model does not build: {one_line(e)}")
    params = list(model.parameters())
    res = Result(case.name, case.family, sum(p.numel() for p in params),
                 sum(p.numel() for p in params if p.requires_grad), note=case.note)
    kw = dict(loss=loss, optimizer=torch.optim.Adam)
    t0 = time.perf_counter()
    try:
        report = fxmem.analyze(model, inputs, targets, **kw, device="cpu")
    except Exception as e:  # noqa: BLE001 - every refusal is recorded, none is fatal
        res.seconds = time.perf_counter() - t0
        res.status, res.message = "refused", one_line(e)
        try:  # fxmem's refusal, or a step that cannot run at all?
            fxmem.measure(model, inputs, targets, **kw, B=batches[0])
        except Exception as real:  # noqa: BLE001
            res.status = "invalid"
            res.message = f"the real step fails at B={batches[0]}: {one_line(real)}"
        return res
    res.seconds = time.perf_counter() - t0
    res.unmodelled = [str(what) for *_, what in report.unmodelled]
    for b in batches:
        try:
            measured = fxmem.measure(model, inputs, targets, **kw, B=b).peak_bytes
        except Exception as e:  # noqa: BLE001
            res.status = "invalid"
            res.message = f"the real step fails at B={b}: {one_line(e)}"
            return res
        res.points.append([b, int(report.peak_bytes(b)), int(measured)])
        if witness:
            from witness import witness_step

            res.witnessed.append([b, witness_step(model, inputs, targets, loss,
                                                  torch.optim.Adam, B=b).peak_bytes])
    res.status = "exact" if all(p == m for _, p, m in res.points) else "inexact"
    return res


def status_text(r: Result) -> str:
    """The status as the docs table shows it: ``exact``, ``+x B (y %)`` at each batch size,
    or ``status: message`` (refused, invalid, error)."""
    if r.status == "exact":
        return "exact"
    if r.status == "inexact":
        parts = []
        for b, p, m in r.points:
            d = p - m
            parts.append(f"B={b}: {d:+,} B ({d / m:+.4%})")
        return "; ".join(parts)
    return f"{r.status}: {portable(r.message)}"
