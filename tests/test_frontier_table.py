"""The checkpoint frontier in the terminal: a long one (256 points over 80 blocks) is shown
evenly spaced, both ends kept, and said to be so; md and json give every point."""

import dataclasses
import io
import json

import torch
from rich.console import Console

import fxmem
from fxmem.report.jsonout import render_json
from fxmem.report.markdown import render_markdown
from fxmem.report.summary import summarize
from fxmem.report.terminal import FRONTIER_ROWS, render_terminal


def _summary(points: int):
    m = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU())
                              for _ in range(4)))
    r = fxmem.analyze(m, torch.randn(8, 32), torch.randn(8, 32),
                      loss=torch.nn.functional.mse_loss, optimizer=torch.optim.SGD)
    s = summarize(r, B=8, frontier=r.frontier(8))
    # as many points as asked, each its own peak, cost and plan
    fake = tuple((10_000 - k, 1_000 * k, (f"layer{k}",), None) for k in range(points))
    return dataclasses.replace(s, frontier=fake)


def _table(s) -> str:
    c = Console(width=200, record=True, file=io.StringIO())
    c.print(render_terminal(s))
    return c.export_text()


def test_a_long_frontier_shows_evenly_spaced_points_and_says_so():
    s = _summary(256)
    out = _table(s)
    table = out[out.index("Checkpoint frontier"):]
    shown = [line for line in table.splitlines() if "layer" in line]
    assert len(shown) == FRONTIER_ROWS
    plans = [int(line.split("layer")[1].split()[0]) for line in shown]
    assert plans[0] == 0 and plans[-1] == 255 and plans == sorted(plans)
    assert f"{FRONTIER_ROWS} of its 256 points, evenly spaced" in " ".join(out.split())
    md = render_markdown(s)
    assert all(f"| layer{k} |" in md for k in range(256))
    assert len(json.loads(render_json(s))["frontier"]) == 256


def test_a_short_frontier_is_shown_whole():
    s = _summary(FRONTIER_ROWS)
    out = _table(s)
    assert "points, evenly spaced" not in out
    assert all(f"layer{k} " in out for k in range(FRONTIER_ROWS))


def test_the_plan_in_use_reads_as_runs_of_alike_blocks():
    """The plan a report is under, in the terminal and in md: blocks of one stack
    checkpointed alike as one range, as the frontier's plans (Llama-3.1-8B's 24 blocks
    saving one op output each had been listed one by one); json keeps every entry."""
    s = dataclasses.replace(_summary(2), plan=tuple(
        [f"layers.{i} (saving 1 op output)" for i in range(24)] + ["layers.24", "lm_head"]))
    line = " ".join(_table(s).split())
    assert "Checkpoint plan: layers.0-23 (saving 1 op output each), layers.24, lm_head (" \
        in line
    assert "Plan applied: layers.0-23 (saving 1 op output each), layers.24, lm_head;" \
        in render_markdown(s)
    assert len(json.loads(render_json(s))["plan"]) == 26
