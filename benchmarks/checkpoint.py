"""Activation checkpointing: memory saved against recompute, and the solver's speed.

    python benchmarks/checkpoint.py [--batch 8] [--seq 512] [--resnet-batch 32] [--measure]

Two models, each traced once on fake tensors (nothing real is allocated), ``device="cuda"``:

- GPT-2 small: transformers' default GPT2Config (124M parameters, 12 blocks), sequence 512,
  AdamW, ``use_cache=False`` (as transformers sets it when it checkpoints);
- a ResNet-50-like net: bottleneck blocks [3, 4, 6, 3] as one ``nn.Sequential`` of 16 blocks
  (``blocks.0`` .. ``blocks.15``), 224 x 224 images, SGD with momentum.

For each: no plan; every block checkpointed; Chen et al.'s sqrt(n) segments (the n blocks
regrouped into ceil(sqrt(n)) consecutive groups, each group checkpointed; a separate trace
of the regrouped model); fxmem's cheapest plan with at least 3x less activation memory; and
fxmem's plan with the least activation memory within 25 % extra step FLOPs.
*Activation memory* is what is live at the peak that is neither parameters, gradients,
optimizer state nor the batch (categories ``activation`` and ``temporary``). Recompute is
given as a share of the step's FLOPs without checkpointing (PyTorch's flop formulas).

Solver speed: ``fxmem.checkpoint.solve`` on a synthetic chain of 100 candidates (1,000 points) and on
the two real problems. ``--measure``: GPT-2 small with real weights, the planner's plan with
the least activation within 25 % recompute at B=1 on the CPU's kernels, one real eager CPU step at B=1 with the plan applied
(``fxmem.apply_checkpoints`` + ``fxmem.measure``, about 12 GB of RAM) against the prediction
(``device="cpu"``). Prints Markdown.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import fxmem  # noqa: E402
from fxmem.checkpoint import solve as S  # noqa: E402
from zoo import Group, gpt2  # noqa: E402

GIB = 2**30


# models -------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    def __init__(self, c_in, width, stride=1):
        super().__init__()
        c_out = 4 * width
        self.conv1, self.bn1 = nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, c_out, 1, bias=False), nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.down is None else self.down(x)))


class ResNet50ish(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        blocks, c = [], 64
        for i, n in enumerate(layers):
            width = 64 * 2**i
            for j in range(n):
                blocks.append(Bottleneck(c, width, 2 if j == 0 and i > 0 else 1))
                c = 4 * width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(
            self.blocks(self.stem(x)), 1), 1))


def chen_groups(blocks):
    n = len(blocks)
    k = math.ceil(n / math.ceil(math.sqrt(n)))  # blocks per group
    return [Group(list(blocks)[i:i + k]) for i in range(0, n, k)]


def gpt2_case(batch, seq):
    model = gpt2(use_cache=False).to("meta")
    ids = torch.zeros(batch, seq, dtype=torch.long)
    grouped = gpt2(use_cache=False).to("meta")
    h = grouped.model.transformer.h
    grouped.model.transformer.h = nn.ModuleList(chen_groups(h))
    kw = dict(optimizer=torch.optim.AdamW, device="cuda")
    blocks = [f"model.transformer.h.{i}" for i in range(len(h))]
    groups = [f"model.transformer.h.{i}" for i in range(len(grouped.model.transformer.h))]
    return "GPT-2 small (L=512)", (model, (ids, ids), (), kw), (grouped, (ids, ids), (), kw), \
        blocks, groups


def resnet_case(batch):
    model = ResNet50ish().to("meta")
    x, y = torch.zeros(batch, 3, 224, 224), torch.zeros(batch, dtype=torch.long)
    grouped = ResNet50ish().to("meta")
    grouped.blocks = nn.Sequential(*[nn.Sequential(*g.blocks) for g in chen_groups(grouped.blocks)])
    kw = dict(loss=nn.functional.cross_entropy,
              optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), device="cuda")
    blocks = [f"blocks.{i}" for i in range(len(model.blocks))]
    groups = [f"blocks.{i}" for i in range(len(grouped.blocks))]
    return "ResNet-50-like (224x224)", (model, (x,), (y,), kw), (grouped, (x,), (y,), kw), \
        blocks, groups


# measures ----------------------------------------------------------------------------
def activation_bytes(report, b):
    cats = report.breakdown(b).by_category
    return cats.get("activation", 0) + cats.get("temporary", 0)


def row(label, report, b, step_flops, base_act):
    act = activation_bytes(report, b)
    rec = int(report.recompute_flops.subs(fxmem.B, b))
    return (f"| {label} | {len(report.plan.regions)} | {report.peak_bytes(b) / GIB:.2f} | "
            f"{act / GIB:.2f} | {base_act / act:.2f}x | {rec / step_flops:.1%} |")


def _goals(label, base, front, b, step, base_act):
    """The two goal rows for one frontier: the cheapest plan with at least 3x less
    activation, the least activation within 25 % recompute."""
    reports = [(p, base.with_plan(p.plan) if p.plan else base) for p in front]
    three = [(p, r) for p, r in reports if base_act >= 3 * activation_bytes(r, b)]
    if three:
        _, r = min(three, key=lambda pr: pr[0].recompute_flops)
        print(row(f"{label}: cheapest with >= 3x less activation", r, b, step, base_act))
    else:
        best = max(base_act / activation_bytes(r, b) for _, r in reports)
        print(f"| {label}: >= 3x less activation | no plan reaches it (best {best:.2f}x) "
              f"| | | | |")
    within = [(p, r) for p, r in reports if p.recompute_flops <= 0.25 * step]
    p, r = min(within, key=lambda pr: (activation_bytes(pr[1], b), pr[0].recompute_flops))
    print(row(f"{label}: least activation within 25 % recompute", r, b, step, base_act))


def bench_model(case, b):
    """The table of one model; returns the module-only solver's problem."""
    name, (model, x, y, kw), (grouped, gx, gy, kw2), blocks, groups = case
    t0 = time.perf_counter()
    base = fxmem.analyze(model, x, y, **kw)
    t_trace = time.perf_counter() - t0
    t0 = time.perf_counter()
    modules = base.frontier(b, kinds=["module"])
    t_modules = time.perf_counter() - t0
    t0 = time.perf_counter()
    front = base.frontier(b)  # every kind: whole blocks, groups, selective
    t_front = time.perf_counter() - t0
    ch = base._chooser(kinds=["module"])
    step = ch.step_flops(b)
    base_act = activation_bytes(base, b)
    print(f"\n### {name}, B={b}\n")
    print(f"Trace {t_trace:.1f} s; candidates: {len(ch.candidates)} "
          f"({ch.candidates[0]} .. {ch.candidates[-1]}); module-only frontier of {len(modules)} "
          f"plans in {t_modules:.2f} s; the planner's frontier (every kind) of {len(front)} "
          f"plans in {t_front:.2f} s; step {step / 1e12:.2f} TFLOP.\n")
    print("| plan | segments | peak GiB | activation GiB | activation saved | recompute |")
    print("|---|---|---|---|---|---|")
    print(row("none", base, b, step, base_act))
    print(row("every block", base.with_plan(blocks), b, step, base_act))
    chen = fxmem.analyze(grouped, gx, gy, **kw2, checkpoint=groups)
    print(row(f"Chen sqrt(n): {len(groups)} groups", chen, b, step, base_act))
    _goals("fxmem, whole modules", base, modules, b, step, base_act)
    _goals("fxmem, every kind", base, front, b, step, base_act)
    _answer_times(base, front, b)
    return ch.problem(b)


def _answer_times(base, front, b):
    """What one answer costs after the frontier is known: ``plan_for`` at the budget halfway
    down the frontier, derived only (``confirm=False``) and confirmed by tracing the plan
    (the default), and ``max_batch_size`` within 25 % recompute at that budget."""
    budget = (front[0].peak_bytes + front[-1].peak_bytes) // 2
    t0 = time.perf_counter()
    base.plan_for(budget, b, confirm=False)
    t_derived = time.perf_counter() - t0
    t0 = time.perf_counter()
    choice = base.plan_for(budget, b)
    t_confirmed = time.perf_counter() - t0
    t0 = time.perf_counter()
    most = base.max_batch_size(budget, max_recompute=0.25)
    t_most = time.perf_counter() - t0
    print(f"\n`plan_for` at {budget / GIB:.2f} GiB (halfway down the frontier): "
          f"{len(choice.plan.regions)} segments, derived in {t_derived:.1f} s, confirmed by "
          f"tracing the plan in {t_confirmed:.1f} s; `max_batch_size` there within 25 % "
          f"recompute: B = {most.B}, in {t_most:.1f} s.")


def measure_gpt2(seq):
    """Ground truth on CPU at B=1: the planner's plan with the least activation within 25 %
    recompute, chosen on a ``device="cpu"`` trace (a selective plan names the CPU's ops),
    applied and measured."""
    torch.manual_seed(0)
    model = gpt2(use_cache=False)
    ids = torch.randint(0, model.model.config.vocab_size, (1, seq))
    kw = dict(optimizer=torch.optim.AdamW)
    base = fxmem.analyze(model, (ids, ids), **kw, device="cpu")
    step = base._chooser().step_flops(1)
    plan = min((p for p in base.frontier(1) if p.recompute_flops <= 0.25 * step),
               key=lambda p: (p.peak_bytes, p.recompute_flops)).plan
    predicted = base.with_plan(plan)
    fxmem.apply_checkpoints(model, plan)
    t0 = time.perf_counter()
    measured = fxmem.measure(model, (ids, ids), **kw, B=1).peak_bytes
    p = predicted.peak_bytes(1)
    print(f"\nGPT-2 small, plan {plan} ({len(plan.regions)} segments), B=1, CPU: predicted "
          f"{p:,} bytes, measured {measured:,} bytes (real step {time.perf_counter() - t0:.0f} s),"
          f" difference {p - measured:+,} bytes; {base.peak_bytes(1):,} without a plan.")


def synthetic_chain(n=100, points=1000, seed=0):
    rng = random.Random(seed)
    released = tuple(rng.randrange(10**7, 10**9) for _ in range(n))
    cost = tuple(rng.randrange(10**9, 10**12) for _ in range(n))
    pts = [S.Point(rng.randrange(10**10, 2 * 10**10), tuple(range(rng.randrange(n + 1))))
           for _ in range(points - n)]
    pts += [S.Point(rng.randrange(10**10, 2 * 10**10), tuple(range(i)), only_if=i)
            for i in range(n)]
    return S.Problem(released, cost, tuple(pts))


def timed(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def bench_solver(problems):
    print("\n### Solver\n")
    print("| problem | candidates | points | chain | solve s | frontier s | min_peak s |")
    print("|---|---|---|---|---|---|---|")
    for name, p in problems:
        top = max(pt.bytes for pt in p.points)
        low = S.min_peak(p).peak_bytes
        budget = (top + low) // 2
        t_solve, sol = timed(lambda: S.solve(p, budget))
        t_front, _ = timed(lambda: S.frontier(p), repeat=1)
        t_min, _ = timed(lambda: S.min_peak(p), repeat=1)
        print(f"| {name} | {len(p.released)} | {len(p.points)} | {S.is_chain(p)} | "
              f"{t_solve:.3f} | {t_front:.3f} | {t_min:.3f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--resnet-batch", type=int, default=32)
    ap.add_argument("--measure", action="store_true")
    args = ap.parse_args()
    print(f"fxmem checkpoint benchmark: torch {torch.__version__}, Python "
          f"{platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores")
    gpt = bench_model(gpt2_case(args.batch, args.seq), args.batch)
    res = bench_model(resnet_case(args.resnet_batch), args.resnet_batch)
    bench_solver([("synthetic chain", synthetic_chain()), ("GPT-2 small", gpt),
                  ("ResNet-50-like", res)])
    if args.measure:
        measure_gpt2(args.seq)


if __name__ == "__main__":
    main()
