"""The per-rank table of a data-parallel step (issue 18): one row per group of alike ranks,
every number read from that group's own :class:`fxmem.Report` (its peak at B, its largest B
for the budget, its parts), in every format, through the API renderers and the command
line; ``--whatif`` with ``--fsdp``/``--ddp`` gives the API's rows. The groups differ: FSDP2
over 4 ranks shards 30 rows as 8, 8, 8 and 6 (the optimizer state differs), ZeRO-1 over 4
ranks partitions the parameters unevenly (rank 3 owns the rest)."""

import json
import re

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from markupsafe import escape
from rich.console import Console

import fxmem
from fxmem.cli.command import cli
from fxmem.errors import InfeasibleBudgetError
from fxmem.formula.symbols import B as SYM_B
from fxmem.memory.liveness import PARTS
from fxmem.report.html import render_html
from fxmem.report.jsonout import render_json
from fxmem.report.markdown import render_markdown
from fxmem.report.summary import summarize
from fxmem.report.terminal import render_terminal
from fxmem.report.text import fmt_bytes, read_as, render_ranks
from test_fsdp import STEP, Stack, _batch

B = 16
BUDGET = 2**20
STRATEGIES = {"fsdp4": (fxmem.FSDP(4), ["--fsdp", "4"]),
              "zero1": (fxmem.DDP(4, zero1=True), ["--ddp", "4", "--zero1"])}
CLI = ["analyze", "tests/test_fsdp.py:Stack", "--input", "B,30", "--target", "B:int64:10",
       "--optimizer", "adam", "--device", "cpu", "--batch", str(B)]
_reports: dict = {}


def _analyze(name):
    if name not in _reports:
        _reports[name] = fxmem.analyze(Stack(), *_batch(), parallel=STRATEGIES[name][0], **STEP)
    return _reports[name]


@pytest.fixture(params=list(STRATEGIES))
def report(request):
    return _analyze(request.param)


def _most(r, budget):
    try:
        return int(r.max_batch_size(budget))
    except InfeasibleBudgetError:
        return None


def _expected(report, budget, b=B):
    """The table as the per-group reports answer it, independently of per_rank."""
    rows = []
    for g in report.groups:
        r = g.report
        parts = {p: r.parts[p] for p in PARTS if r.parts[p] != 0}
        read = r.readable_peak(max(b, r.min_batch_size))  # its peak read around b
        rows.append(dict(ranks=list(g.ranks), label=g.label, peak_formula=str(r.peak),
                         peak_readable=str(read.formula) if read is not None else "",
                         readable_when=list(read.exact_when) if read is not None else [], B=b,
                         peak_bytes=r.peak_bytes(b),
                         max_batch_size=None if budget is None else _most(r, budget),
                         parts_formulas={p: str(e) for p, e in parts.items()},
                         parts_bytes={p: int(e.subs(SYM_B, b)) for p, e in parts.items()}))
    return rows


def _without_tightest(rows):
    return [{k: v for k, v in r.items() if k != "tightest"} for r in rows]


def test_the_groups_differ(report):
    """The cases are the ones the table is for: several groups, with different figures."""
    assert [g.ranks for g in report.groups] == [(0, 1, 2), (3,)]
    a, b = (g.report for g in report.groups)
    assert a.peak_bytes(B) != b.peak_bytes(B)
    assert a.parts["optimizer_state"] != b.parts["optimizer_state"]


@pytest.mark.parametrize("budget", [None, BUDGET, "between"])
def test_each_row_is_its_groups_report(report, budget):
    """Peak, largest B and parts of each row are its group's; ``tightest`` marks the group
    ``ParallelReport.tightest`` picks, the one whose largest B is smallest (with a budget
    between the groups' smallest peaks, the one where nothing fits)."""
    if budget == "between":
        lows = sorted(g.report.peak_bytes(g.report.min_batch_size) for g in report.groups)
        budget = (lows[0] + lows[-1]) // 2
    rows = report.per_rank(B, budget)
    assert _without_tightest([r.as_dict() for r in rows]) == _expected(report, budget)
    chosen = report.tightest(B, budget)
    assert [r.tightest for r in rows] == [g is chosen for g in report.groups]
    assert sum(r.tightest for r in rows) == 1
    if budget is None:
        assert next(r for r in rows if r.tightest).peak_bytes == report.peak_bytes(B)
    else:
        most = [r.max_batch_size or 0 for r in rows]
        assert next(r for r in rows if r.tightest).max_batch_size in (min(most), None)
        if None in [r.max_batch_size for r in rows]:
            assert next(r for r in rows if r.tightest).max_batch_size is None
        else:
            assert min(most) == report.max_batch_size(budget)
    for row, g in zip(rows, report.groups):
        for k in g.ranks:  # any rank of the group answers alike
            assert row.peak_bytes == report.peak_bytes(B, rank=k)


def test_the_summary_is_the_tightest_ranks_with_the_table(report):
    """``summarize`` of a ParallelReport: the table in ``ranks`` (JSON too) and the rest the
    report of the ranks with the least room, as if summarised alone."""
    s = summarize(report, B=B, budget_bytes=BUDGET, setup={"model": "Stack"})
    assert _without_tightest(list(s.ranks)) == _expected(report, BUDGET)
    chosen = report.tightest(B, BUDGET)
    alone = summarize(chosen.report, B=B, budget_bytes=BUDGET)
    assert (s.peak_bytes, s.max_batch_size, s.parts_bytes, s.peak_formula) == (
        alone.peak_bytes, alone.max_batch_size, alone.parts_bytes, alone.peak_formula)
    assert s.setup["parallel"] == report.strategy.name
    assert s.setup["ranks shown"] == f"{chosen.label} (the least room)"
    doc = json.loads(render_json(s))
    assert doc["ranks"] == [r.as_dict() for r in report.per_rank(B, BUDGET)]
    assert json.loads(render_json(summarize(chosen.report, B=B)))["ranks"] == []


def _cells(row):
    return [fmt_bytes(row["peak_bytes"]), f"{row['max_batch_size']:,}",
            *(fmt_bytes(v) for v in row["parts_bytes"].values())]


def _md_rows(md: str) -> dict:
    """The Markdown per-rank table: first cell (the ranks) -> the other cells."""
    section = md[md.index("## Per rank"):md.index("## Peak memory")]
    lines = [ln for ln in section.splitlines() if ln.startswith("| ")][1:]
    return {cells[0]: cells[1:] for cells in
            ([c.strip() for c in ln.strip("|").split("|")] for ln in lines)}


def _html_rows(page: str) -> dict:
    section = page[page.index('<section id="ranks">'):page.index('<section id="formula">')]
    out = {}
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", section, re.S)[1:]:
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>",
                                                                        tr, re.S)]
        out[cells[0]] = cells[1:]
    return out


def test_every_format_shows_each_groups_numbers(report):
    """Markdown, HTML, the terminal and plain text: a row per group with its peak at B,
    largest B, parts at B (in PARTS order) and formula; the tightest marked."""
    s = summarize(report, B=B, budget_bytes=BUDGET)
    expected = {r["label"]: r for r in s.ranks}
    tight = next(r["label"] for r in s.ranks if r["tightest"])

    # each group's formula: its readable polynomial and where it is exact, the exact
    # expression a click or a flag away
    read = {label: read_as(r["peak_readable"], r["readable_when"], r["peak_formula"])
            for label, r in expected.items()}
    assert all(when for _, when in read.values())  # (these groups' peaks read otherwise)
    markdown = render_markdown(s)
    md = _md_rows(markdown)
    assert set(md) == {f"**{tight}** (least room)", *(k for k in expected if k != tight)}
    for label, r in expected.items():
        cells = md[f"**{label}** (least room)" if label == tight else label]
        formula, when = read[label]
        assert cells == [*_cells(r), f"`{formula}`, {when}"]
        assert f"- ranks {label}: `{r['peak_formula']}`" in markdown.split("<details>")[1]

    page = render_html(s)
    html = _html_rows(page)
    assert set(html) == {f"{tight} least room", *(k for k in expected if k != tight)}
    for label, r in expected.items():
        cells = html[f"{label} least room" if label == tight else label]
        formula, when = read[label]
        assert cells == [*_cells(r), str(escape(formula)) + str(escape(when))]
        assert f"ranks {label}: peak bytes = {escape(r['peak_formula'])}" in page
    assert page.count('class="used"><td>') == 1

    console = Console(record=True, width=200, file=open("/dev/null", "w"))
    console.print(render_terminal(s))
    text = console.export_text()
    for label, r in expected.items():
        line = next(ln for ln in text.splitlines() if ln.startswith(
            label + (" *" if label == tight else " ")))
        assert line.split()[2 if label == tight else 1:] == " ".join(_cells(r)).split()
        assert f"ranks {label}: peak bytes = {read[label][0]}   {read[label][1]}" in text

    lines = render_ranks(report, B, BUDGET).splitlines()
    for label, r in expected.items():
        line = next(ln for ln in lines if ln.startswith(label + (" *" if label == tight else " ")))
        assert line.endswith(r["peak_formula"])
        assert line[:-len(r["peak_formula"])].split()[2 if label == tight else 1:] == \
            " ".join(_cells(r)).split()
    assert str(report) == render_ranks(report)


def _run(args):
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_the_command_line_shows_the_table(name):
    """``fxmem analyze ... --fsdp 4`` / ``--ddp 4 --zero1``: the JSON's ``ranks`` is the
    library's table; the Markdown, HTML and terminal outputs have it beside the tightest
    ranks' report."""
    report = _analyze(name)
    args = [*CLI, *STRATEGIES[name][1], "--budget", "1MiB"]
    doc = json.loads(_run([*args, "--format", "json"]))
    assert doc["ranks"] == [r.as_dict() for r in report.per_rank(B, BUDGET)]
    assert _without_tightest(doc["ranks"]) == _expected(report, BUDGET)
    chosen = report.tightest(B, BUDGET)
    assert doc["peak_bytes"] == chosen.report.peak_bytes(B)
    assert doc["max_batch_size"] == report.max_batch_size(BUDGET)
    md = _run([*args, "--format", "md"])
    assert len(_md_rows(md)) == len(report.groups)
    page = _run([*args, "--format", "html"])
    assert len(_html_rows(page)) == len(report.groups)
    table = _run(args)
    assert "Per rank" in table and all(  # each group's readable formula (the exact: JSON)
        f"ranks {r['label']}: peak bytes = {r['peak_readable'] or r['peak_formula']}" in table
        for r in doc["ranks"])


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_whatif_on_the_command_line_is_the_apis(name):
    """``--whatif`` with ``--fsdp``/``--ddp``: the rows of ``fxmem.whatif(...,
    parallel=)``, the last the sharding row, its figures those of the parallel report."""
    from fxmem.report.whatif import as_dict

    parallel, flags = STRATEGIES[name]
    doc = json.loads(_run([*CLI, *flags, "--budget", "1MiB", "--whatif", "--format", "json"]))
    rows = fxmem.whatif(Stack(), *_batch(), B=B, budget_bytes=BUDGET, parallel=parallel,
                        amp=torch.bfloat16, loss=F.cross_entropy,
                        optimizer=STEP["optimizer"], device="cpu")
    assert doc["whatifs"] == [as_dict(r) for r in rows]
    sharding = doc["whatifs"][-1]
    report = _analyze(name)
    assert sharding["method"] == "sharding"
    assert sharding["peak_bytes"] == report.peak_bytes(B) == max(
        r["peak_bytes"] for r in doc["ranks"])
    assert sharding["max_batch_size"] == report.max_batch_size(BUDGET) == min(
        r["max_batch_size"] for r in doc["ranks"])
