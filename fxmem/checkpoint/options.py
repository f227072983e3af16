"""The planner over every granularity: for a chain of blocks (a stack: ``blocks.0`` ..
``blocks.11``, ``transformer.h.*``), each block can be left alone, checkpointed whole,
checkpointed with a selective policy (op outputs kept, :class:`fxmem.Region` ``save``), or
grouped with its neighbours as one segment (Chen et al.'s sqrt(n) segments, or any other
grouping). Each such choice is derived alone from the one trace
(:func:`fxmem.checkpoint.plans.derive`), which gives its numbers for
:mod:`fxmem.checkpoint.chain`'s dynamic program; the plan the program returns is derived
exactly, and the budget tightened if the model was short.

Selective policies considered for each block (:func:`policies`):

- ``knapsack:k``: the k op calls re-running the most FLOPs per byte kept (k = 1 ..);
- ``pointwise``: keep every op output but pointwise ones (``torch.Tag.pointwise``): only
  pointwise ops re-run;
- ``torchtitan``: torchtitan's default policy (torchtitan/distributed/activation_checkpoint.py
  ``_save_list`` and ``_custom_policy``): keep matmuls (``aten.mm``, every other one
  re-run), attention kernels and ``aten.max``.

Recompute cost is FLOPs as PyTorch counts them (``torch.utils.flop_counter``'s formulas, what
``FlopCounterMode`` reports), ties broken by the pointwise FLOPs fxmem also counts.

>>> import torch, fxmem
>>> blocks = [torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(),
...                               torch.nn.Linear(128, 32)) for _ in range(4)]
>>> r = fxmem.analyze(torch.nn.Sequential(*blocks), torch.randn(8, 32),
...                   loss=lambda o: o.square().mean(), device="cpu")
>>> c = r.plan_for(budget_bytes=r.peak_bytes(512) * 3 // 4, B=512)
>>> c.peak_bytes <= r.peak_bytes(512) * 3 // 4
True
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import replace

import numpy as np
import torch

from ..errors import InfeasibleBudgetError, InputError
from ..formula.symbols import B, Size
from ..memory.liveness import no_bytes, start_bytes, timeline
from ..trace.plans import Plan, Region
from . import chain as C
from .choose import FrontierPoint, PlanChoice, default_candidates, tightened
from .flops import ALIASES, OWN_FORMULAS
from .numbers import SizeValues
from .plans import derive_numbers
from .schedules import region_calls, sac_calls, schedule

KINDS = ("module", "group", "selective")
_ATTENTION = ("aten._scaled_dot_product_flash_attention.default",
              "aten._scaled_dot_product_efficient_attention.default",
              "aten._scaled_dot_product_cudnn_attention.default",
              "aten._scaled_dot_product_flash_attention_for_cpu.default")
# torchtitan's _save_list (torchtitan/distributed/activation_checkpoint.py): mm, the SDPA
# kernels (the CPU flash kernel is its CPU twin), max (low-precision scales),
# reduce_scatter_tensor (tensor parallel)
TORCHTITAN_SAVE = ("aten.mm.default", *_ATTENTION, "aten.max.default",
                   "_c10d_functional.reduce_scatter_tensor.default")


def primary_flops(report) -> dict:
    """``{op index: (FLOPs as a function of B, primary)}``: primary FLOPs are those of
    PyTorch's formulas (the CPU attention kernels' twins too, and the grouped matmuls of
    fxmem's own formula), the rest pointwise."""
    twins = {str(k) for k in (*ALIASES, *OWN_FORMULAS)}
    ops = report.trace.ops
    return {i: (Size.of(f), reg or ops[i].op.rsplit(".", 1)[0] in twins)
            for i, (f, reg) in report._op_flops.items()}


def counted_flops(report, b: int, *, recompute: bool = False, twins: bool = True) -> int:
    """FLOPs of the step at batch size ``b`` by PyTorch's formulas (what ``FlopCounterMode``
    counts: matmuls, convolutions, attention; not the pointwise ops fxmem counts too), of its
    re-run ops only with ``recompute``. ``twins``: the CPU attention kernels counted as their
    CUDA twins, as on a GPU, and the grouped matmuls PyTorch has no formula for (the planner's
    measure); False: as ``FlopCounterMode`` counts on this CPU. The planner minimises this
    count first; a plan's ``recompute_flops`` is the total, pointwise included
    (docs/checkpointing.md)."""
    per_op = primary_flops(report) if twins else \
        {i: (Size.of(f), reg) for i, (f, reg) in report._op_flops.items()}
    return sum(int(per_op[key][0](b)) for o in report.trace.ops
               if (key := o.index if o.source is None else o.source) in per_op
               and per_op[key][1] and (o.recompute or not recompute))


def stack_blocks(report) -> tuple:
    """The blocks of the model's outermost stack: numbered children of an ``nn.Sequential`` /
    ``nn.ModuleList`` (``blocks.3``, ``model.layers.3``) run once per step, outermost first.
    Unlike :func:`fxmem.checkpoint.choose.default_candidates` they need not be valid single
    segments: a Llama layer is also given the rotary ``cos``/``sin``, float tensors made once
    before the stack; the planner checks the chain itself (each block's window inside the one
    before it). Without such blocks, the module-only candidates."""
    calls = report.trace.calls  # as report.segments lists them, without their crossings
    runs = Counter(c.path for c in calls)
    first = {}
    for c in calls:
        first.setdefault(c.path, c)
    paths = [p for p, c in first.items()
             if runs[p] == 1 and p.rsplit(".", 1)[-1].isdigit() and c.last_op >= c.first_op]
    out = tuple(p for p in paths if not any(p.startswith(q + ".") for q in paths))
    return out or default_candidates(report)


class NotAChain(InputError):
    """The candidates are not a chain of blocks (the module-only solver handles them)."""


def _overload(name: str):
    ns, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def _pointwise(name: str) -> bool:
    try:
        return torch.Tag.pointwise in _overload(name).tags
    except (AttributeError, ValueError):
        return False


def policies(report, path: str, b: int, flops: dict | None = None) -> dict:
    """Selective policies for the block ``path``: ``{name: save calls}`` (see the module
    docstring), duplicates and the empty policy left out. ``flops``: the report's
    :func:`primary_flops`, if at hand."""
    trace = report.trace
    call = region_calls(trace, path)[0]
    sc = schedule(trace, path)
    if sc is None:
        return {}
    ops = trace.ops
    names = sac_calls(trace, call.forward_op, call.last_op, (path,))
    index = {i: k for k, i in names.items()}
    written = {}  # sid -> last op of the region writing it
    for i in range(call.forward_op, call.last_op + 1):
        for s in ops[i].written_sids:
            written[s] = i
    sizes = report.liveness.sizes
    flops = primary_flops(report) if flops is None else flops
    cands = [i for i in index if i < sc.stop and ops[i].new_sids
             and not any(written.get(s, -1) > i for s in ops[i].new_sids)]
    out: dict = {}
    reg = [i for i in cands if i in flops and flops[i][1]]

    def ratio(i):
        nbytes = sum(sizes[s](b) for s in ops[i].new_sids) or 1
        return -flops[i][0](b) / nbytes, i
    reg.sort(key=ratio)
    for k in range(1, min(len(reg), 8) + 1):
        out[f"knapsack:{k}"] = tuple(sorted(index[i] for i in reg[:k]))
    out["pointwise"] = tuple(sorted(index[i] for i in cands if not _pointwise(ops[i].op)))
    out["torchtitan"] = tuple(sorted(
        k for k in names
        if k[0] in TORCHTITAN_SAVE and (k[0] != "aten.mm.default" or k[1] % 2 == 0)))
    seen, uniq = set(), {}
    for n, save in out.items():
        if save and save not in seen:
            seen.add(save)
            uniq[n] = save
    return uniq


def _solve(problem: C.ChainProblem, budget_bytes: int, max_cost: int | None = None):
    """:func:`fxmem.checkpoint.chain.solve`, or at once its error when the model's smallest
    peak (:func:`~fxmem.checkpoint.chain.lowest_peak`, a thousandth of a solve) is over the
    budget: then no plan fits the model, and the solve would find none."""
    if C.lowest_peak(problem) > budget_bytes:
        raise InfeasibleBudgetError(f"no checkpoint plan keeps the peak within {budget_bytes} "
                                    "bytes", minimum_bytes=C.lowest_peak(problem))
    return C.solve(problem, budget_bytes, max_cost)


DERIVED_KEPT = 8  # plans whose derivation (arrays as large as the trace) a planner keeps


class Planner:
    """Every granularity over the chain of blocks ``candidates`` (default:
    :func:`stack_blocks`); the same methods as
    :class:`fxmem.checkpoint.choose.Chooser`."""

    def __init__(self, report, candidates=None, kinds=KINDS, max_group: int | None = None):
        bad = set(kinds) - set(KINDS)
        if bad or not kinds:
            raise InputError(f"checkpoint plan kinds are {', '.join(KINDS)}; got {sorted(kinds)}")
        if report.plan:
            raise InputError("choose a plan from a report without one (this one has "
                             f"{list(report.plan)})")
        self.report, self.kinds = report, tuple(kinds)
        trace = report.trace
        cands = stack_blocks(report) if candidates is None else tuple(candidates)
        scheds = [(p, schedule(trace, p)) for p in cands]
        scheds = sorted(((p, s) for p, s in scheds if s is not None and s.recompute_at is not None),
                        key=lambda ps: ps[1].first_op)
        for (_, a), (q, b_) in zip(scheds, scheds[1:]):
            if not (a.last_op < b_.first_op and b_.recompute_at <= a.recompute_at):
                raise NotAChain(f"{q} does not follow the block before it in a chain")
        self.blocks = tuple(p for p, _ in scheds)
        self.windows = [(s.last_op + 1, s.recompute_at) for _, s in scheds]
        n = len(self.blocks)
        ops = trace.ops
        self.own = _owners(ops, self.blocks)  # op -> the block whose op it is
        self.cover = _covers(len(ops), self.windows)  # op -> how many blocks' windows hold it
        b0 = trace.batch_hint
        self._flops = primary_flops(report)
        entries = []  # (first, last, plan entry)
        for k, p in enumerate(self.blocks):
            if "module" in kinds:
                entries.append((k, k, p))
            if "selective" in kinds:
                for save in policies(report, p, b0, self._flops).values():
                    entries.append((k, k, Region((p,), save)))
        if "group" in kinds and n > 1:
            longest = max_group or max(2, math.ceil(2 * math.sqrt(n)))
            for i in range(n):
                for j in range(i + 1, min(n, i + longest)):
                    g = Region(self.blocks[i:j + 1])
                    try:
                        region_calls(trace, g)
                    except InputError:
                        break  # not one segment: nor are longer ones
                    entries.append((i, j, g))
        self.entries = []
        self._sizes = sizes = SizeValues(report.liveness.sizes)  # each B's values, shared
        for i, j, e in entries:
            sc = schedule(trace, e)
            if sc is None or sc.recompute_at is None:
                continue
            self.entries.append((i, j, e, derive_numbers(trace, (e,), sizes),
                                 (sc.last_op + 1, sc.recompute_at)))
        self._step = Size.of(report.flop_count.total)
        self._peaks: dict = {}
        # the latest plans' derivations, for the next B a search asks about; their numbers
        # are kept apart (_peaks). 256 kept took Llama-3.1-70B's --fsdp 64 command to 3.65 GB
        # of peak RSS, 8 to 3.10 GB, the same answer (docs/benchmarks.md)
        self._derived = functools.lru_cache(maxsize=DERIVED_KEPT)(self._derive)
        self._problems: dict = {}
        self._chosen: dict = {}  # (budget, b, recompute limit) -> (choice, error)
        # (b, optimistic) -> (model peak, model cost) of each plan solved: no plan cheaper
        # than the cheapest whose peak is within a later budget needs searching past it
        self._solved: dict = {}

    # numbers -----------------------------------------------------------------------------
    def step_flops(self, b: int) -> int:
        return self._step(b)

    def _costs(self, t, b):
        """(PyTorch-counted, other) FLOPs of the recomputed ops of derived step ``t`` (a
        :class:`fxmem.checkpoint.plans.Derived`): sums of each base op's FLOPs at ``b``,
        counted once per B (:meth:`_op_costs`; a planner's candidates re-run much the same
        ops: Llama-3.1-8B's 606 had asked 81,000 FLOP formulas for one B)."""
        src = t.recomputed()
        per_op = self._op_costs(b)
        if per_op is not None and per_op[2] * len(src) < 1 << 63:  # (int64 sums exact)
            return int(per_op[0][src].sum()), int(per_op[1][src].sum())
        reg = other = 0
        for source in src.tolist():
            if source in self._flops:
                f, r = self._flops[source]
                v = f(b)
                if r:
                    reg += v
                else:
                    other += v
        return reg, other

    def _op_costs(self, b: int):
        """Each base op's (PyTorch-counted, other) FLOPs at ``b`` as two int64 arrays and
        the largest, made once per B; None where one is past 2**62."""
        key = ("op costs", b)
        if key not in self._problems:
            n = len(self.report.trace.ops)
            reg, other, top = np.zeros(n, np.int64), np.zeros(n, np.int64), 0
            for i, (f, r) in self._flops.items():
                v = int(f(b))
                top = max(top, v)
                if top >= 1 << 62:
                    break
                (reg if r else other)[i] = v
            self._problems[key] = None if top >= 1 << 62 else (reg, other, top)
        return self._problems[key]

    def problem(self, b: int, optimistic: bool = False) -> C.ChainProblem:
        """The chain model at ``b``. A choice releases, over its window, the least its
        derivation drops there (the model's peak is then never below the exact one, but can
        be a few bytes above it); ``optimistic``: the most, a model whose peak is never
        above the exact one, whose answers are checked exactly. Built once per ``(b,
        optimistic)``."""
        if (b, optimistic) not in self._problems:
            self._problems[b, False], self._problems[b, True] = self._problem(b)
        return self._problems[b, optimistic]

    def _problem(self, b: int, keep=None) -> tuple:
        """The chain model at ``b`` releasing the least, and the most (``problem``);
        ``keep``: a bool per storage of the trace, the others counted as no bytes (None:
        every storage)."""
        lv, values = self.report.liveness, None
        sizes = lv.sizes if keep is None else \
            tuple(z if k else no_bytes for z, k in zip(lv.sizes, keep))
        if keep is None:
            base = lv.timeline(b)
        else:
            values = self._sizes.at(b) * np.asarray(keep, np.int64)
            base = timeline(lv.graph.storages, sizes, len(lv.graph.ops), b)
        n = len(self.blocks)
        per_op = self._op_costs(b)  # (the other FLOPs' sum, counted once per B)
        weight = 1 + (sum(per_op[1].tolist()) if per_op is not None else
                      sum(f(b) for f, r in self._flops.values() if not r))
        boundary = [C._NONE] * (n + 1)
        none = [C._NONE] * n
        for t, v in enumerate(base):
            k = self.own[t]
            if k >= 0:
                none[k] = max(none[k], v)
            else:
                boundary[self.cover[t]] = max(boundary[self.cover[t]], v)
        least = [C.Choice(k, k, 0, 0, none[k], None) for k in range(n)]
        most = list(least)
        base, owner = np.asarray(base, np.int64), np.asarray(self.own)
        for i, j, e, d, (lo, hi) in self.entries:
            src, again = d.sources, d.recompute
            v, was = d.live(b, values), base[src]
            window = ~again & (lo <= src) & (src < hi)
            mine = again | (~window & (((i <= owner[src]) & (owner[src] <= j)) | (v != was)))
            own = int(v[mine].max()) if mine.any() else C._NONE
            drop = was[window] - v[window]
            reg, other = self._costs(d, b)
            for out, released in ((least, drop.min() if len(drop) else 0),
                                  (most, drop.max() if len(drop) else 0)):
                out.append(C.Choice(i, j, max(0, int(released)), reg * weight + other, own, e))
        start = start_bytes(self.report.trace.storages, sizes, b)
        return tuple(C.ChainProblem(n, tuple(c), tuple(boundary), start) for c in (least, most))

    def least_growing(self, b: int) -> int:
        """No plan's step at ``b`` holds fewer bytes at its peak of the storages whose size
        grows with B (the activations, their gradients, the batch) than this: the chain
        model's smallest peak of those alone, in the model below the exact peaks (as
        :func:`fxmem.checkpoint.chain.lowest_peak` bounds every plan's peak), over every plan
        of this planner's kinds and blocks. FSDP2 shards none of them, so no number of
        GPUs runs a plan's step in fewer."""
        grows = [B in z.expr.free_symbols for z in self.report.liveness.sizes]
        return C.lowest_peak(self._problem(b, grows)[1])

    # exact answers --------------------------------------------------------------------------
    def exact_numbers(self, plan, b: int):
        """(exact peak, recompute FLOPs, PyTorch-counted recompute FLOPs) of ``plan`` at b."""
        plan = Plan.of(plan)
        key = (plan, b)
        if key not in self._peaks:
            t = self._derived(plan)
            peak = max(t.start_bytes(b), int(t.live(b).max(initial=0)))
            reg, other = self._costs(t, b) if plan else (0, 0)
            self._peaks[key] = (peak, reg + other, reg)
        return self._peaks[key]

    def numbers(self, plan, b: int) -> tuple:
        """(exact peak, recompute FLOPs) of ``plan`` at ``b``."""
        return self.exact_numbers(plan, b)[:2]

    def choice_of(self, plan, b: int):
        """``plan`` at ``b`` as a :class:`PlanChoice` (not proven the cheapest)."""
        return self._choice(Plan.of(plan), b, False)

    def _derive(self, plan: Plan):
        """The step under ``plan`` in arrays (:func:`fxmem.checkpoint.plans.derive_numbers`):
        the same at every B. ``self._derived`` keeps the most recent for the next B a search
        asks about."""
        return derive_numbers(self.report.trace, plan, self._sizes)

    @staticmethod
    def _plan(sol) -> Plan:
        return Plan.of(c.name for c in sol.choices if c.name is not None)

    def choose(self, budget_bytes: int, b: int, max_recompute_flops: int | None = None, *,
               report: bool = True):
        """The cheapest plan whose exact peak at ``b`` fits, as a :class:`PlanChoice`
        (kept: a search asks the same budget again, e.g. a plan chosen on derived peaks, then
        confirmed). Kept without its report, which the plan's derivation makes again when
        asked after :meth:`fxmem.Report.with_plan` has dropped it: the walks over candidate
        plans ask for dozens (kept, their reports took Llama-3.1-8B's one-GPU command from
        1.22 to 1.62 GB of peak RSS: docs/benchmarks.md). ``report=False``: the choice's
        ``report`` is None (a search over rank groups reads its numbers alone)."""
        key = (budget_bytes, b, max_recompute_flops)
        if key not in self._chosen:
            try:
                got = self._choose(budget_bytes, b, max_recompute_flops)
                self._chosen[key] = (got, None)  # without its report (_choose's)
            except InfeasibleBudgetError as e:
                self._chosen[key] = (None, e)
        got, error = self._chosen[key]
        if error is not None:
            raise error.with_traceback(None)
        if got is None or not report:
            return got
        return replace(got, report=self.report.with_plan(got.plan) if got.plan else self.report)

    def _choose(self, budget_bytes: int, b: int, max_recompute_flops: int | None):
        found, costs = [], {}  # costs: plan -> its model cost, as solved

        def solve(optimistic, budget, dearer):
            solved = self._solved.setdefault((b, optimistic), [])  # (model peak, cost)
            bound = min((c for p, c in solved if p <= budget), default=dearer)
            sol = _solve(self.problem(b, optimistic), budget,
                         bound if dearer is None else min(bound, dearer))
            solved.append((sol.peak_bytes, sol.cost))
            plan = self._plan(sol)
            costs[plan] = sol.cost
            return plan, True, sol.peak_bytes, sol.cost
        for optimistic in (False, True):  # the model above the exact peaks, and below (a
            dearer = costs[found[0][0]] if found else None  # plan dearer: no answer)
            got = tightened(lambda budget: solve(optimistic, budget, dearer),
                            lambda plan: self.exact_numbers(plan, b)[:2], budget_bytes,
                            max_recompute_flops, dearer=dearer)
            if got is not None and got[0] is not None:
                found.append(got)
        if found:  # proven cheapest when the model below the exact peaks found it untightened
            plan, exact = min(reversed(found), key=lambda g: self._rank(g[0], b))
            return self._choice(plan, b, exact and len(found) == 2 and plan == found[1][0],
                                report=False)
        if max_recompute_flops is not None and \
                C.lowest_peak(self.problem(b, True)) > budget_bytes:
            return None  # over the budget even in the model below every exact peak
        # the chain model can put a plan a few bytes above its exact peak: the frontier's
        # plans, exactly, but for those over the budget in the model below the exact peaks
        fits = [p for p in self._frontier_plans(b, budget_bytes)
                if self.exact_numbers(p, b)[0] <= budget_bytes]
        if fits:
            best = min(fits, key=lambda p: self._rank(p, b))
            if max_recompute_flops is None or \
                    self.exact_numbers(best, b)[1] <= max_recompute_flops:
                return self._choice(best, b, False, report=False)
        if max_recompute_flops is not None:
            return None
        low = self.smallest(b, report=False)
        raise InfeasibleBudgetError(
            f"no checkpoint plan over {len(self.blocks)} blocks fits {budget_bytes:,} bytes at "
            f"B={b}: the smallest peak is {low.peak_bytes:,} bytes (plan {low.plan})",
            minimum_bytes=low.peak_bytes)

    def _rank(self, plan, b: int) -> tuple:
        """What the planner minimises: PyTorch-counted recompute FLOPs, then the others,
        then the peak."""
        peak, cost, reg = self.exact_numbers(plan, b)
        return reg, cost, peak

    def smallest(self, b: int, *, report: bool = True):
        """The plan of the smallest exact peak at ``b`` of two: the plan of each chain
        model's own smallest peak (:func:`fxmem.checkpoint.chain.min_peak`, in the model
        above the exact peaks, whose frontier ends with it, and in the one below), derived
        exactly; ties: the least recompute. Two solves and two derivations, not the
        frontier's (Llama-3.1-70B's 256, which the model below the exact peaks, 70 % under
        them there, could not cut short). :meth:`frontier` holds both plans: its last
        point is this one, or one of a lower exact peak. ``report=False``: as
        :meth:`choose`'s."""
        key = ("smallest", b)
        if key not in self._problems:
            plans = dict.fromkeys(self._plan(C.min_peak(self.problem(b, optimistic)))
                                  for optimistic in (False, True))
            self._problems[key] = min(plans, key=lambda p: self._lowest(p, b))
        return self._choice(self._problems[key], b, False, report)

    def _lowest(self, plan, b: int) -> tuple:
        """What :meth:`smallest` minimises: the exact peak, then the PyTorch-counted
        recompute FLOPs, then the others."""
        peak, cost, reg = self.exact_numbers(plan, b)
        return peak, reg, cost

    def _solutions(self, b: int) -> tuple:
        """The chain model's frontier at ``b`` (kept: a search asks for it again)."""
        key = ("frontier", b)
        if key not in self._problems:
            self._problems[key] = C.frontier(self.problem(b))
        return self._problems[key]

    def _frontier_plans(self, b: int, budget_bytes: int | None = None):
        """The plans of the chain model's frontier at ``b``; with ``budget_bytes``, only
        those whose peak fits it in the model below the exact peaks (``optimistic``: a plan
        over the budget there is over it exactly), which need no derivation."""
        if budget_bytes is not None and \
                C.lowest_peak(self.problem(b, optimistic=True)) > budget_bytes:
            return []  # none fits that model: its frontier not solved (Llama-3.1-8B: 0.14 s)
        sols = self._solutions(b)
        if budget_bytes is not None:
            low = self.problem(b, optimistic=True)
            by = {(c.first, c.last, c.name): c for c in low.choices}
            sols = [s for s in sols if C.peak(low, [by[c.first, c.last, c.name]
                                                    for c in s.choices]) <= budget_bytes]
        return [self._plan(s) for s in sols]

    def frontier(self, b: int) -> tuple:
        """Pareto-optimal (exact peak, recompute FLOPs, plan) at ``b``, peak descending: the
        chain model's frontier's plans and :meth:`smallest`'s, derived exactly."""
        pts = set()
        for plan in [*self._frontier_plans(b), self.smallest(b, report=False).plan]:
            peak, cost, reg = self.exact_numbers(plan, b)
            pts.add((reg, cost, peak, plan))
        out = []
        for reg, cost, peak, plan in sorted(pts, key=lambda p: (p[0], p[1], p[2])):
            if not out or peak < out[-1].peak_bytes:
                out.append(FrontierPoint(peak, cost, plan))
        return tuple(out)

    def _choice(self, plan, b: int, exact: bool, report: bool = True):
        rep = None if not report else self.report.with_plan(plan) if plan else self.report
        peak, cost, _ = self.exact_numbers(plan, b)
        return PlanChoice(b, Plan.of(plan), peak, cost, self.step_flops(b), rep, exact)


def chooser(report, candidates=None, kinds=None):
    """The planner of ``report`` (a :class:`fxmem.Report` in B alone) for ``kinds`` (default
    all) over ``candidates``: every granularity on a chain of blocks (:class:`Planner`), else
    whole modules (:class:`fxmem.checkpoint.choose.Chooser`); made once per question and
    kept on the report (its walks and frontiers ask again).

    >>> import torch, fxmem
    >>> m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> r = fxmem.analyze(m, torch.randn(4, 8), loss=lambda o: o.sum(), device="cpu")
    >>> chooser(r, kinds=["module"]) is chooser(r, kinds=("module",))
    True
    """
    from .choose import Chooser

    kinds = KINDS if kinds is None else tuple(dict.fromkeys(kinds))
    key = (None if candidates is None else tuple(candidates), kinds)
    cache = report.__dict__.setdefault("_choosers", {})
    if key not in cache:
        if kinds == ("module",):
            cache[key] = Chooser(report, candidates)
        else:
            try:
                cache[key] = Planner(report, candidates, kinds)
            except NotAChain:
                if "module" not in kinds:
                    raise
                cache[key] = Chooser(report, candidates)
    return cache[key]


def _owners(ops, blocks) -> list:
    """Per op, the index of the block (a module path) whose forward or backward op it is (its
    module the block or inside it; the last such block), else -1."""
    index = {p: k for k, p in enumerate(blocks)}
    by_module: dict = {}
    out = [-1] * len(ops)
    for o in ops:
        if o.phase not in ("forward", "backward"):
            continue
        k = by_module.get(o.module)
        if k is None:
            parts = o.module.split(".")
            k = by_module[o.module] = max(
                (index[q] for q in (".".join(parts[:j]) for j in range(1, len(parts) + 1))
                 if q in index), default=-1)
        out[o.index] = k
    return out


def _covers(n: int, windows) -> list:
    """Per op of ``n``, how many of the blocks' ``windows`` ((first, end) op ranges, in block
    order) hold it, which must be the first that many: each window within the one before
    (:class:`NotAChain` naming the first op where they are not)."""
    count = np.zeros(n + 1, np.int64)
    for lo, hi in windows:
        lo, hi = max(lo, 0), min(hi, n)
        if lo < hi:
            count[lo] += 1
            count[hi] -= 1
    bad = []  # per window not within the one before, its first op outside that one
    for (lo0, hi0), (lo, hi) in zip(windows, windows[1:]):
        lo, hi = max(lo, 0), min(hi, n)
        if lo < hi and not (lo0 <= lo and hi <= hi0):
            bad.append(lo if lo < lo0 or lo >= hi0 else hi0)
    if bad:
        raise NotAChain(f"the windows over op {min(bad)} are not a prefix of the blocks")
    return np.cumsum(count[:n]).tolist()
