"""The HTML report's layout in a real browser (headless Chromium driven by Playwright), at a
phone's width and a desktop's, for the CLI's own pages: the seed CNN, a GPT-2 whose formula is
in B and L, an LSTM on CUDA (a long setup entry, notes), and a step under FSDP2 (the per-rank
table). The page never scrolls sideways;
nothing, text included, runs past the screen but inside a box that scrolls itself; the peak
formulas are shown whole, across the page's width, not in a narrow cell; the plots scale to
the screen, undistorted.

Playwright cannot download its own browser here: it drives the system's Chromium through
``executable_path`` (tests/browser.py finds or installs it; under ``CI`` a missing browser or
a missing ``playwright`` fails instead of skipping)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from browser import missing, require_chromium

ROOT = Path(__file__).resolve().parent.parent
VIEWPORTS = {"phone": (375, 800), "desktop": (1280, 900)}
FORMULA_SHARE = 0.8  # a formula's box spans at least this share of the screen's width

REPORTS = {
    "seed": ["examples/seed_convnet.py:SimpleConvNet", "--input", "B,3,32,32", "--target",
             "B:int64:10", "--optimizer", "adam", "--budget", "8GiB"],
    "gpt2-BL": ["hf:gpt2", "--config", "n_layer=2", "--device", "cpu"],
    # cuDNN's LSTM on CUDA: a long "CUDA kernels" setup entry and a "Not modelled" list
    "lstm": ["examples/lstm_classifier.py:LSTMClassifier", "--input", "B,32:int64:1000",
             "--target", "B:int64:4", "--optimizer", "adam"],
    # FSDP2 over 4 ranks, two groups: the per-rank table (parts as columns, a formula each)
    "fsdp": ["tests/test_fsdp.py:Stack", "--input", "B,30", "--target", "B:int64:10",
             "--optimizer", "adam", "--device", "cpu", "--fsdp", "4", "--budget", "1MiB"],
}

# Everything the checks need, measured in the page. An element "sticks out" when its box
# reaches past the screen's left or right edge and no ancestor that scrolls sideways by
# itself (overflow-x auto or scroll) holds it within the screen.
MEASURE = """() => {
  const vw = window.innerWidth, slack = 0.5;
  const scrolls = el => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
  const out = r => r.right > vw + slack || r.left < -slack;
  const name = el => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
                     + (el.classList.length ? "." + [...el.classList].join(".") : "");
  const stickOut = [];
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || !out(r)) continue;
    let box = el.parentElement, held = false;
    for (; box && box !== document.body; box = box.parentElement) {
      if (scrolls(box)) { held = !out(box.getBoundingClientRect()); break; }
    }
    if (!held) stickOut.push(name(el) + " " + Math.round(r.left) + ".." + Math.round(r.right));
  }
  // text too: a long word runs out of its box without moving the box
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let t = walk.nextNode(); t; t = walk.nextNode()) {
    if (!t.textContent.trim()) continue;
    const range = document.createRange();
    range.selectNodeContents(t);
    const r = range.getBoundingClientRect();
    if (r.width === 0 || !out(r)) continue;
    let box = t.parentElement, held = false;
    for (; box && box !== document.body; box = box.parentElement) {
      if (scrolls(box)) { held = !out(box.getBoundingClientRect()); break; }
    }
    if (!held) stickOut.push("text '" + t.textContent.trim().slice(0, 40) + "' in "
                             + name(t.parentElement) + " " + Math.round(r.left) + ".."
                             + Math.round(r.right));
  }
  const box = el => {
    const r = el.getBoundingClientRect();
    return {name: name(el), text: el.textContent, width: r.width, height: r.height,
            right: r.right, visible: el.checkVisibility(),
            clipped: el.scrollWidth > el.clientWidth + 1};
  };
  return {
    vw, scrollWidth: document.documentElement.scrollWidth, stickOut,
    formulas: [...document.querySelectorAll("pre.formula, .math")].map(box),
    images: [...document.images].map(i => ({...box(i), natural: [i.naturalWidth, i.naturalHeight],
                                             parent: i.parentElement.clientWidth})),
  };
}"""


def _playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install -e '.[test]')")
    return sync_playwright


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The two reports as the CLI writes them (``--format html --out``), made side by side."""
    if "gpt2-BL" in REPORTS:
        pytest.importorskip("transformers", reason="hf:gpt2 needs transformers")
    out = tmp_path_factory.mktemp("reports")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    runs = {name: subprocess.Popen(
        [sys.executable, "-m", "fxmem", "analyze", *args, "--format", "html", "--out",
         str(out / f"{name}.html")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for name, args in REPORTS.items()}
    for name, run in runs.items():
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, f"{name}: {err[-2000:]}"
    return {name: out / f"{name}.html" for name in REPORTS}


@pytest.fixture(scope="module")
def browser():
    exe = require_chromium()
    with _playwright()() as p:
        b = p.chromium.launch(executable_path=exe)
        yield b
        b.close()


def _look(browser, url: str, viewport: str, shot: Path | None = None) -> dict:
    w, h = VIEWPORTS[viewport]
    page = browser.new_page(viewport={"width": w, "height": h})
    try:
        page.goto(url)
        # open the "exact expression" a person clicks to see: its layout is checked too
        page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true; })")
        if shot is not None:
            page.screenshot(path=str(shot), full_page=True)
        return page.evaluate(MEASURE)
    finally:
        page.close()


def _layout_problems(m: dict, formula_share: float = FORMULA_SHARE) -> list[str]:
    """What a person would see wrong at this width."""
    vw, bad = m["vw"], []
    if m["scrollWidth"] > vw:
        bad.append(f"the page scrolls sideways: {m['scrollWidth']} px wide in {vw}")
    bad += [f"sticks out of the screen: {x}" for x in m["stickOut"]]
    if not m["formulas"]:
        bad.append("no formula on the page")
    for f in m["formulas"]:
        if not f["visible"] or f["height"] < 10:
            bad.append(f"formula not shown: {f['name']}")
        if f["width"] < formula_share * vw:
            bad.append(f"formula in a narrow box: {f['name']} {f['width']:.0f} px of {vw}")
        if f["clipped"]:
            bad.append(f"formula cut (it scrolls inside its box): {f['name']}")
    for i in m["images"]:
        nw, nh = i["natural"]
        if not nw or not i["visible"]:
            bad.append(f"plot not drawn: {i['name']}")
        elif i["width"] > i["parent"] + 1 or abs(i["height"] / i["width"] - nh / nw) > 0.02:
            bad.append(f"plot not scaled to its box: {i['width']:.0f}x{i['height']:.0f} of "
                       f"{nw}x{nh} in {i['parent']} px")
    return bad


# the slow tier: the reports, made once by the `pages` fixture (four CLI runs, 30 s on two
# cores), are timed with whichever of these comes first, which tests/tiers.py cannot see
@pytest.mark.slow
@pytest.mark.parametrize("viewport", VIEWPORTS)
@pytest.mark.parametrize("report", REPORTS)
def test_report_fits_the_screen(browser, pages, report, viewport, tmp_path):
    shot = tmp_path / f"{report}-{viewport}.png"
    m = _look(browser, pages[report].as_uri(), viewport, shot)
    assert _layout_problems(m) == []
    assert len(m["images"]) >= 3
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one
    if report == "fsdp":  # the per-rank table is on the page (and held within the screen)
        assert '<table id="rank-table">' in pages[report].read_text(encoding="utf-8")
    if report == "gpt2-BL":  # the formula in B and L has a full-width block of its own
        bl = [f for f in m["formulas"] if f["name"] == "pre.formula" and "*L" in f["text"]]
        assert bl and bl[0]["width"] >= FORMULA_SHARE * m["vw"], m["formulas"]


BAD_PAGE = """<!DOCTYPE html><html><head><meta name="viewport" content="width=device-width">
</head><body><table><tr><td>setup</td><td><pre class="formula">Max(16*B*L + 737267720,
288*B*L**2 + 122920*B*L + 389898248)</pre></td><td style="white-space:nowrap">a cell that is far
too wide for a phone's screen, as the old setup table was</td></tr></table>
<div class="math" style="overflow-x:auto;width:100%"><div style="width:2000px">wide</div></div>
<ul><li>a note with a long word: aten._cudnn_rnn_backward.default_and_then_some_more_of_it</li></ul>
<img src="data:image/svg+xml;base64,PHN2ZyB4bWxucz0iaHR0cDovL3d3dy53My5vcmcvMjAwMC9zdmciIHdp
ZHRoPSI2MDAiIGhlaWdodD0iMzAwIj48cmVjdCB3aWR0aD0iNjAwIiBoZWlnaHQ9IjMwMCIvPjwvc3ZnPg==">
</body></html>"""


def test_the_checks_see_a_bad_layout(browser, tmp_path):
    """The checks above can fail: a page laid out as the report once was, in a table with a
    narrow formula cell, a formula that scrolls and an unscaled plot."""
    bad = tmp_path / "bad.html"
    bad.write_text(BAD_PAGE, encoding="utf-8")
    problems = _layout_problems(_look(browser, bad.as_uri(), "phone"))
    for what in ("the page scrolls sideways", "sticks out of the screen: td",
                 "sticks out of the screen: text 'a note with a long word",
                 "formula in a narrow box: pre.formula", "formula cut", "plot not scaled"):
        assert any(p.startswith(what) for p in problems), (what, problems)


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_missing_browser_skips_only_outside_ci(monkeypatch, ci):
    """Without a browser the layout tests skip on a developer's machine, and fail under CI."""
    import browser as b

    monkeypatch.setattr(b, "find_chromium", lambda: None)
    monkeypatch.setattr(b, "apt_install_chromium", lambda: None)
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected):
        b.require_chromium()
