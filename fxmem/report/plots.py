"""Matplotlib figures of a :class:`~fxmem.report.summary.Summary` (never of the trace).

Every function builds a :class:`matplotlib.figure.Figure` directly (no pyplot, so no global
figure registry) and leaves :data:`matplotlib.rcParams` as it found it. :func:`svg` and
:func:`png_base64` render a figure; SVG output is byte-for-byte stable between runs.

>>> import torch, fxmem
>>> from fxmem.report.summary import summarize
>>> r = fxmem.analyze(torch.nn.Linear(8, 2), torch.randn(4, 8), loss=lambda o: o.sum(),
...                   optimizer=torch.optim.SGD, device="cpu")
>>> fig = peak_vs_batch(summarize(r, B=16, budget_bytes=2**20))
>>> fig.axes[0].get_xlabel()
'batch size B'
>>> svg(fig).startswith("<svg")
True
"""

from __future__ import annotations

import base64
import io
import math

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .text import fmt_bytes

BYTE_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
FLOP_UNITS = (("TFLOP", 10**12), ("GFLOP", 10**9), ("MFLOP", 10**6), ("kFLOP", 10**3),
              ("FLOP", 1))
PHASE_COLORS = {"zero_grad": "#9d9d9d", "forward": "#4c78a8", "backward": "#f58518",
                "optimizer": "#54a24b"}
# categories at the peak and seed-style parts share one colour per kind of memory
KIND_COLORS = {"param": "#4c78a8", "buffer": "#72b7b2", "grad": "#f58518",
               "optimizer_state": "#54a24b", "input": "#b279a2", "activation": "#e45756",
               "temporary": "#bab0ac"}
OTHER_COLORS = ("#eeca3b", "#9d755d", "#ff9da6", "#79706e")
LINE, ACCENT, BUDGET = "#4c78a8", "#e45756", "#d62728"
RESERVED = "#f58518"  # the caching allocator's reserved bytes
FIGSIZE = (5.6, 3.3)  # inches; every plot the same size so a grid of them lines up
SAVE_RC = {"svg.hashsalt": "fxmem", "svg.fonttype": "path"}
NO_SVG_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}


def unit_for(max_value: float, units=BYTE_UNITS) -> tuple[str, int]:
    """The largest unit in which ``max_value`` is at least 1: ``unit_for(3 * 2**20)`` ->
    ``('MiB', 1048576)``; pass ``units=FLOP_UNITS`` for FLOPs."""
    for name, k in units:
        if abs(max_value) >= k:
            return name, k
    return units[-1]


def short_op(op: str, width: int = 28) -> str:
    """``'aten.threshold_backward.default'`` -> ``'threshold_backward'``; names longer than
    ``width`` end in an ellipsis."""
    name = op.removeprefix("aten.").removesuffix(".default")
    return name if len(name) <= width else name[:width - 1] + "\u2026"


def short_module(module: str, width: int = 28) -> str:
    """``''`` -> ``'(root)'``; long dotted paths keep their tail: ``'…layer4.1.conv2'``."""
    name = module or "(root)"
    return name if len(name) <= width else "\u2026" + name[-(width - 1):]


def _axes(title: str, xlabel: str, ylabel: str, figsize=FIGSIZE):
    """A figure with one styled axes; all style set explicitly (not through rcParams), so
    the figure looks the same wherever it is drawn."""
    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, loc="left", fontsize=11, fontweight="bold", color="#222")
    ax.set_xlabel(xlabel, fontsize=9.5, color="#333")
    ax.set_ylabel(ylabel, fontsize=9.5, color="#333")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color("#999")
    ax.tick_params(labelsize=8.5, colors="#444", length=3)
    ax.grid(True, color="#e6e6e6", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6))
    return fig, ax


def _legend_below(fig, ncol: int = 4) -> None:
    """The legend under the axes, in one row when its labels are short, else in two."""
    labels = fig.axes[0].get_legend_handles_labels()[1]
    if sum(len(x) + 6 for x in labels) > 80:
        ncol = min(ncol, math.ceil(len(labels) / 2))
    fig.legend(loc="outside lower center", ncol=ncol, fontsize=8.5, frameon=False,
               handlelength=1.6, columnspacing=1.4)


def peak_vs_batch(s) -> Figure:
    """Peak bytes against the batch size (``s.curve``), with the budget line, the chosen B
    and the largest B within the budget marked on the curve that answer is read from: for
    a CUDA step the caching allocator's ``max_memory_reserved`` (``s.cuda_curve``, also
    drawn with ``max_memory_allocated``), else the live bytes."""
    bs = [b for b, _ in s.curve]
    peaks = [p for _, p in s.curve]
    curves = {"live": dict(s.curve)}
    if s.cuda_curve:
        curves["allocated"] = {b: a for b, a, _ in s.cuda_curve}
        curves["device"] = {b: r for b, _, r in s.cuda_curve}
    top = max(max(c.values()) for c in curves.values())
    unit, k = unit_for(max(top, s.budget_bytes or 0))
    fig, ax = _axes("Peak memory vs batch size", "batch size B", f"peak memory ({unit})")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.plot(bs, [p / k for p in peaks], color=LINE, linewidth=1.8, label="live tensors: peak(B)")
    if s.cuda_curve:
        ax.plot(bs, [curves["allocated"][b] / k for b in bs], color=LINE, linewidth=1.0,
                linestyle=":", label="max_memory_allocated")
        ax.plot(bs, [curves["device"][b] / k for b in bs], color=RESERVED, linewidth=1.4,
                label="max_memory_reserved")
    if s.budget_bytes is not None:
        ax.axhline(s.budget_bytes / k, color=BUDGET, linestyle="--", linewidth=1.1,
                   label=f"budget {fmt_bytes(s.budget_bytes)}")
    ax.plot([s.B], [s.peak_bytes / k], "o", color="#222", markersize=6, zorder=3,
            label=f"B = {s.B:,}: {fmt_bytes(s.peak_bytes)}", clip_on=False)
    if s.max_batch_size is not None:
        most = curves.get(s.max_batch_size_by, curves["live"])[s.max_batch_size]
        ax.plot([s.max_batch_size], [most / k], "D", color=ACCENT, markersize=6, zorder=3,
                label="largest B within budget", clip_on=False)
        # below and right of the point: an increasing curve never passes there
        ax.annotate(f"largest B = {s.max_batch_size:,}\n{fmt_bytes(most)}",
                    (s.max_batch_size, most / k), xytext=(8, -8),
                    textcoords="offset points", ha="left", va="top", fontsize=8,
                    color=ACCENT)
    elif s.budget_bytes is not None:
        ax.text(0.98, s.budget_bytes / k, "no B fits the budget",
                transform=ax.get_yaxis_transform(), ha="right", va="bottom", fontsize=8,
                color=BUDGET)
    ax.set_xlim(min(bs), max(bs))
    ax.set_ylim(bottom=0)
    _legend_below(fig)
    return fig


def _runs(phases) -> list[tuple[str, int, int]]:
    """Contiguous runs ``(phase, first, last)`` of equal phases, in order."""
    runs = []
    for i, p in enumerate(phases):
        if runs and runs[-1][0] == p:
            runs[-1] = (p, runs[-1][1], i)
        else:
            runs.append((p, i, i))
    return runs


def _peak_index(s) -> int:
    """The op with the most live bytes; among ties, the one the summary names as the peak."""
    top = max(t[4] for t in s.timeline)
    ties = [i for i, t in enumerate(s.timeline) if t[4] == top]
    named = [i for i in ties if s.timeline[i][1] == s.peak_op
             and s.timeline[i][3] == s.peak_module]
    return (named or ties)[0]


def timeline(s) -> Figure:
    """Live bytes after every op of the step at ``s.B`` (``s.timeline``), coloured by phase,
    with the peak marked and labelled with its op and module."""
    xs = [t[0] for t in s.timeline]
    live = [t[4] for t in s.timeline]
    unit, k = unit_for(max(live))
    ys = [v / k for v in live]
    fig, ax = _axes(f"Live memory during the step at B = {s.B:,}",
                    "op index (execution order)", f"live memory ({unit})")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    extra = iter(OTHER_COLORS * 8)
    colors, seen = {}, set()
    for phase, i0, i1 in _runs([t[2] for t in s.timeline]):
        color = colors.setdefault(phase, PHASE_COLORS.get(phase) or next(extra))
        part = slice(i0, min(i1 + 2, len(xs)))  # one point more: runs join up
        ax.fill_between(xs[part], ys[part], step="post", color=color, alpha=0.22,
                        linewidth=0)
        ax.step(xs[part], ys[part], where="post", color=color, linewidth=1.3,
                label=None if phase in seen else phase.replace("_", " "))
        seen.add(phase)
    i = _peak_index(s)
    ax.plot([xs[i]], [ys[i]], "v", color="#222", markersize=6, zorder=3)
    where = (xs[i] - xs[0]) / max(1, xs[-1] - xs[0])
    ha = "left" if where < 0.3 else "right" if where > 0.7 else "center"
    ax.annotate(f"peak {fmt_bytes(live[i])} after {short_op(s.timeline[i][1])}\n"
                f"in {short_module(s.timeline[i][3])}, {s.timeline[i][2]}", (xs[i], ys[i]),
                xytext=(0, 9), textcoords="offset points", ha=ha, va="bottom", fontsize=8,
                color="#222")
    ax.set_xlim(xs[0], xs[-1] + 1)
    ax.set_ylim(0, max(ys) * 1.32)  # headroom for the peak's label
    _legend_below(fig)
    return fig


def _kind(name: str) -> str:
    """Seed-style part names (``params``) and peak categories (``param``) as one kind."""
    return {"params": "param", "buffers": "buffer", "grads": "grad", "inputs": "input",
            "activations": "activation"}.get(name, name)


def _stack(ax, y: float, items, k: int, xmax: float, colors: dict, seen: set) -> None:
    left = 0.0
    for name, value in items:
        kind = _kind(name)
        color = colors.setdefault(kind, KIND_COLORS.get(kind) or
                                  OTHER_COLORS[len(colors) % len(OTHER_COLORS)])
        w = value / k
        ax.barh(y, w, left=left, height=0.55, color=color, edgecolor="white", linewidth=0.8,
                label=None if kind in seen else kind.replace("_", " "))
        if w >= 0.1 * xmax:
            digits = 2 if xmax < 10 else 1 if xmax < 100 else 0  # one precision per plot
            ax.text(left + w / 2, y, f"{w:.{digits}f}", ha="center", va="center", fontsize=7.5,
                    color="white", fontweight="bold")
        seen.add(kind)
        left += w


def _kind_order(name: str) -> int:
    order = list(KIND_COLORS)
    kind = _kind(name)
    return order.index(kind) if kind in order else len(order)


def categories(s) -> Figure:
    """What is live at the peak by category (``s.by_category``) and the seed-style parts at
    ``s.B`` (``s.parts_bytes``), as two stacked horizontal bars with the peak marked."""
    cats = sorted(s.by_category.items(), key=lambda kv: _kind_order(kv[0]))
    parts = sorted(s.parts_bytes.items(), key=lambda kv: _kind_order(kv[0]))
    total = max(sum(v for _, v in cats), sum(v for _, v in parts), s.peak_bytes)
    unit, k = unit_for(total)
    fig, ax = _axes(f"Memory at the peak, B = {s.B:,}", f"bytes ({unit})", "")
    colors, seen = {}, set()
    _stack(ax, 1, cats, k, total / k, colors, seen)
    _stack(ax, 0, parts, k, total / k, colors, seen)
    ax.axvline(s.peak_bytes / k, color="#222", linestyle="--", linewidth=1)
    ax.text(s.peak_bytes / k, 1.45, f"peak {fmt_bytes(s.peak_bytes)} ", ha="right",
            va="bottom", fontsize=8, color="#222")
    ax.set_yticks([1, 0], ["at the peak\n(by category)", "parts at B\n(seed-style)"])
    ax.set_ylim(-0.5, 1.75)
    ax.set_xlim(0, total / k * 1.02)
    ax.grid(False, axis="y")
    _legend_below(fig)
    return fig


def _nearby(xs, ys, tol: float = 0.04) -> list[list[int]]:
    """Runs of consecutive points closer than ``tol`` of the axis ranges in both x and y: they
    share one label, so numbers never sit on top of each other."""
    dx = (max(xs) - min(xs)) or 1
    dy = (max(ys) - min(ys)) or 1
    groups = [[0]]
    for i in range(1, len(xs)):
        j = groups[-1][0]
        if abs(xs[i] - xs[j]) < tol * dx and abs(ys[i] - ys[j]) < tol * dy:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def frontier_points(s) -> list[tuple[int, int, tuple, float | None]]:
    """``s.frontier`` ordered by recompute FLOPs (then peak): the numbering of :func:`frontier`."""
    return sorted(s.frontier, key=lambda p: (p[1], p[0]))


def frontier(s) -> Figure | None:
    """The checkpoint frontier at ``s.B`` (``s.frontier``): peak memory against recompute
    FLOPs, points numbered as in the report's table; ``None`` when there is no frontier."""
    if not s.frontier:
        return None
    pts = frontier_points(s)
    unit, k = unit_for(max(p[0] for p in pts))
    funit, fk = unit_for(max(p[1] for p in pts), FLOP_UNITS)
    xs, ys = [p[1] / fk for p in pts], [p[0] / k for p in pts]
    fig, ax = _axes(f"Checkpoint frontier at B = {s.B:,}", f"recompute ({funit})",
                    f"peak memory ({unit})")
    ax.step(xs, ys, where="post", color=LINE, linewidth=1.2, alpha=0.6)
    ax.plot(xs, ys, "o", color=LINE, markersize=5, label="Pareto plan")
    applied = [i for i, p in enumerate(pts) if set(p[2]) == set(s.plan)]
    if applied:
        ax.plot([xs[applied[0]]], [ys[applied[0]]], "o", markersize=11, markerfacecolor="none",
                markeredgecolor=ACCENT, markeredgewidth=1.6,
                label="plan in use" if s.plan else "no checkpointing (in use)")
    for group in _nearby(xs, ys)[::max(1, math.ceil(len(pts) / 12))]:
        label = str(group[0] + 1) if len(group) == 1 else f"{group[0] + 1}\u2013{group[-1] + 1}"
        ax.annotate(label, (xs[group[0]], ys[group[0]]), xytext=(6, 5),
                    textcoords="offset points", fontsize=7.5, color="#333")
    if len(pts) == 1:
        ax.text(0.5, 0.25, "one plan only: no checkpoint lowers the peak",
                transform=ax.transAxes, ha="center", fontsize=8, color="#555")
        ax.set_xticks([xs[0]])
    ax.margins(x=0.08, y=0.15)
    _legend_below(fig, ncol=2)
    return fig


def svg(fig: Figure) -> str:
    """``fig`` as an SVG document (text drawn as paths, no XML prolog, no metadata), the same
    bytes every run."""
    buf = io.BytesIO()
    with matplotlib.rc_context(SAVE_RC):
        fig.savefig(buf, format="svg", metadata=NO_SVG_METADATA)
    text = buf.getvalue().decode("utf-8")
    return text[text.index("<svg"):]


def png_base64(fig: Figure, dpi: int = 150) -> str:
    """``fig`` as a PNG, base64-encoded (for a ``data:image/png;base64,`` URI)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")
