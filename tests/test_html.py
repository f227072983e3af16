"""The HTML report and its plots, checked as a person would: the page has every section and
number, loads nothing from the network, and in a real (headless) Chromium it shows its plots
with no console errors."""

import base64
import dataclasses
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from markupsafe import escape
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

import fxmem
from fxmem.report import plots
from fxmem.report.html import render_html
from fxmem.report.summary import summarize
from fxmem.report.text import fmt_bytes

from browser import require_chromium

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

WINDOW = (1280, 4000)
IMG_SRC = re.compile(r'<img src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)" alt="([^"]+)">')


# ---- summaries -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def seed():
    """The seed CNN at B = 64 with an 8 GiB budget (a one-point frontier)."""
    from seed_convnet import seed_step

    m, x, y = seed_step()
    r = fxmem.analyze(m, x, y, loss=F.cross_entropy, optimizer=torch.optim.Adam)
    return summarize(r, B=64, budget_bytes=8 * 2**30, frontier=r.frontier(64),
                     setup={"model": "SimpleConvNet", "optimizer": "adam"})


@pytest.fixture(scope="module")
def nofit(seed):
    """The seed CNN with a 1 KiB budget: no B fits, no frontier."""
    from seed_convnet import seed_step

    m, x, y = seed_step()
    r = fxmem.analyze(m, x, y, loss=F.cross_entropy, optimizer=torch.optim.Adam)
    return summarize(r, B=64, budget_bytes=2**10, setup={"model": "SimpleConvNet"})


@pytest.fixture(scope="module")
def resnet():
    """A small ResNet under checkpoint plan ['layer1.0'], with its frontier and what-ifs."""
    from zoo import ZOO

    model, x, y, loss = ZOO["resnet"]()
    kw = dict(loss=loss, optimizer=torch.optim.Adam, device="cpu")
    r = fxmem.analyze(model, x, y, **kw)
    rows = fxmem.whatif(model, x, y, **kw, B=64, budget_bytes=2**24)
    return summarize(r.with_plan(["layer1.0"]), B=64, budget_bytes=2**24,
                     frontier=r.frontier(64, kinds=["module"]), whatifs=rows,
                     setup={"model": "resnet", "optimizer": "adam"})


@pytest.fixture(params=["seed", "nofit", "resnet"])
def summary(request):
    return request.getfixturevalue(request.param)


# ---- the page ----------------------------------------------------------------------------

def _images(page: str) -> list[tuple[str, str]]:
    """(decoded SVG, alt) of every embedded image."""
    return [(base64.b64decode(data).decode("utf-8"), alt) for data, alt in IMG_SRC.findall(page)]


def test_every_section_is_there(summary):
    page = render_html(summary)
    for section in ("summary", "plots", "setup", "formula", "at-b", "budget", "parts",
                    "breakdown"):
        assert f'id="{section}"' in page, section
    assert ('id="checkpoint"' in page) == bool(summary.frontier or summary.plan)
    assert ('id="whatifs"' in page) == bool(summary.whatifs)
    assert ('id="plot-frontier"' in page) == bool(summary.frontier)
    assert page.count("<figure") == 3 + bool(summary.frontier)


def test_seed_page_numbers(seed):
    page = render_html(seed)
    assert "<title>fxmem report</title>" in page
    assert "SimpleConvNet" in page and "adam" in page
    assert fmt_bytes(seed.peak_bytes) in page and f"{seed.peak_bytes:,} bytes" in page
    assert f"<strong>{seed.max_batch_size:,}</strong>" in page and "8.00 GiB" in page
    assert f"B = {seed.max_batch_size + 1:,} runs out at" in page  # the card's answer, why
    assert "threshold_backward" in page and "(root)" in page
    # the formula one Max branch a line, and as MathML
    assert "peak bytes = max(\n    " in page and '<math display="block">' in page
    for r in seed.regimes:
        assert f'<td class="num">{r.B_from:,}</td><td><code title="{r.op}">' in page
    for name, n in seed.parts_bytes.items():
        assert f"<td>{name.replace('_', ' ')}</td><td><code>{seed.parts_formulas[name]}</code>" \
            f"</td><td class=\"num\">{fmt_bytes(n)}</td>" in page
    for module, n in seed.by_module.items():
        assert f"<td><code>{escape(module)}</code></td><td class=\"num\">{fmt_bytes(n)}</td>" \
            in page


def test_no_batch_size_fits(nofit):
    page = render_html(nofit)
    assert nofit.max_batch_size is None
    assert "none fits" in page
    assert "No B fits within 1.00 KiB" in page


def test_plan_frontier_and_whatifs(resnet):
    page = render_html(resnet)
    assert "Plan in use: checkpoint <code>layer1.0</code>" in page
    assert f"{resnet.recompute_flops:,} FLOPs" in page
    frontier = page[page.index('id="frontier"'):page.index('id="whatifs"')]
    assert frontier.count("<tr") == 1 + len(resnet.frontier)
    assert frontier.count('class="used"') == 1 and "in use" in frontier
    for row in resnet.whatifs:
        assert f"<td>{row['method']}</td>" in page
    assert "\u2212" in page  # negative changes with a real minus sign


def test_user_text_is_escaped(seed):
    page = render_html(dataclasses.replace(seed, setup={"model": "<script>alert(1)</script>"}))
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;optimizer&gt;" in page  # a module name from the trace


def test_setup_formula_gets_a_block_of_its_own(seed):
    """A setup value that is a formula in B (the CLI's "peak in B, L") is laid out one Max
    branch a line in a full-width block, with its MathML; long values get a block too; short
    ones stay in the grid; text that is not plain arithmetic is never handed to sympy."""
    formula = "Max(16*B*L + 737267720, 288*B*L**2 + 122920*B*L + 389898248)"
    long_text = "cuBLAS workspace (main thread); cuBLAS workspace (backward thread)"
    evil = "B + __import__('os').getpid()"
    page = render_html(dataclasses.replace(seed, setup={
        "model": "SimpleConvNet", "inputs": "B,3,32,32", "peak in B, L": formula,
        "CUDA kernels": long_text, "note": evil}))
    setup = page[page.index('id="setup"'):page.index('id="formula"')]
    assert "<dt>model</dt><dd>SimpleConvNet</dd>" in setup
    assert "<dt>inputs</dt><dd>B,3,32,32</dd>" in setup
    assert '<h3>peak in B, L</h3>' in setup and '<div class="math"><div class="max">' in setup
    assert "<pre class=\"formula\">max(\n    16*B*L + 737267720,\n    288*B*L**2" in setup
    assert f'<p class="long-value">{long_text}</p>' in setup
    assert str(escape(evil)) in setup and setup.count("<math") == 2


def test_page_is_offline(summary):
    page = render_html(summary)
    assert "http://" not in page and "https://" not in page
    for bad in ("<script", "<link", "<iframe", "@import", "url(", "//fonts"):
        assert bad not in page, bad
    assert re.findall(r'\b(?:src|href)="([^"]*)"', page) and all(
        v.startswith("data:image/svg+xml;base64,")
        for v in re.findall(r'\b(?:src|href)="([^"]*)"', page))
    for svg, _ in _images(page):
        # namespace names are identifiers, never fetched; nothing else may name a URL
        assert "http" not in re.sub(r'xmlns(:\w+)?="[^"]*"', "", svg)
        assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', svg))


def test_every_image_is_embedded_and_drawn(summary):
    page = render_html(summary)
    images = _images(page)
    assert len(images) == page.count("<img") == 3 + bool(summary.frontier)
    for svg, alt in images:
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg") and float(root.get("width").removesuffix("pt")) > 100
        assert svg.count("<path") > 20 and alt


def test_render_is_deterministic(resnet):
    assert render_html(resnet) == render_html(resnet)


# ---- the plots ---------------------------------------------------------------------------

def _figures(s) -> list[Figure]:
    figs = [plots.peak_vs_batch(s), plots.timeline(s), plots.categories(s), plots.frontier(s)]
    return [f for f in figs if f is not None]


def test_plots_have_titles_and_axis_labels(summary):
    figs = _figures(summary)
    assert len(figs) == 3 + bool(summary.frontier)
    for fig in figs:
        ax = fig.axes[0]
        assert isinstance(fig, Figure) and ax.get_title(loc="left") and ax.get_xlabel()
        assert ax.get_ylabel() or [t.get_text() for t in ax.get_yticklabels()]
    assert plots.categories(summary).axes[0].get_yticklabels()[0].get_text()


def test_units_follow_the_data(seed, resnet):
    assert plots.peak_vs_batch(seed).axes[0].get_ylabel() == "peak memory (GiB)"
    assert plots.peak_vs_batch(resnet).axes[0].get_ylabel() == "peak memory (MiB)"
    assert plots.frontier(resnet).axes[0].get_xlabel() == "recompute (MFLOP)"
    assert [plots.unit_for(n)[0] for n in (0, 1023, 1024, 3 * 2**20, 5 * 2**30)] == \
        ["B", "B", "KiB", "MiB", "GiB"]
    assert plots.unit_for(2.5e9, plots.FLOP_UNITS) == ("GFLOP", 10**9)


def test_peak_is_labelled_with_op_and_module(seed):
    notes = [t.get_text() for t in plots.timeline(seed).axes[0].texts]
    assert any("threshold_backward" in n and "(root)" in n and fmt_bytes(seed.peak_bytes) in n
               for n in notes)
    notes = [t.get_text() for t in plots.peak_vs_batch(seed).axes[0].texts]
    assert any(f"largest B = {seed.max_batch_size:,}" in n for n in notes)


def test_short_names():
    assert plots.short_op("aten.threshold_backward.default") == "threshold_backward"
    assert len(plots.short_op("aten." + "x" * 80 + ".default")) == 28
    assert plots.short_module("") == "(root)"
    assert plots.short_module("a." * 30 + "conv2").endswith(".conv2")


def test_no_frontier_no_plot(nofit):
    assert plots.frontier(nofit) is None


def _drawn_texts(fig: Figure) -> list[Text]:
    """Every non-empty text ``fig`` shows; tick labels only within the view (matplotlib keeps
    ticks outside it that it does not draw)."""
    ticks = {}
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            slack = (hi - lo) * 1e-6
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                for label in (tick.label1, tick.label2):
                    ticks[id(label)] = lo - slack <= tick.get_loc() <= hi + slack
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
            and ticks.get(id(t), True)]


def _layout_problems(fig: Figure) -> list:
    """Texts that stick out of the figure or overlap another, once ``fig`` is drawn."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer, page = canvas.get_renderer(), fig.bbox
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _drawn_texts(fig)]
    out = [text for text, b in boxes
           if b.x0 < page.x0 - 1 or b.x1 > page.x1 + 1 or b.y0 < page.y0 - 1 or b.y1 > page.y1 + 1]
    return out + [(t1, t2) for i, (t1, b1) in enumerate(boxes) for t2, b2 in boxes[i + 1:]
                  if b1.overlaps(b2)]


def test_labels_do_not_overlap_and_stay_inside(summary):
    for fig in _figures(summary):
        assert _layout_problems(fig) == [], fig.axes[0].get_title(loc="left")


def test_layout_check_sees_overlaps():
    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.set_title("a title")
    ax.text(0.5, 0.5, "one label", transform=ax.transAxes)
    ax.text(0.52, 0.5, "another label", transform=ax.transAxes)
    ax.text(1.5, 0.5, "outside", transform=ax.transAxes)
    problems = _layout_problems(fig)
    assert ("one label", "another label") in problems and "outside" in problems
    assert not any("a title" in p for p in problems)


def test_plots_leave_rcparams_alone(resnet):
    before = dict(matplotlib.rcParams)
    for fig in _figures(resnet):
        plots.svg(fig)
        plots.png_base64(fig)
    render_html(resnet)
    assert dict(matplotlib.rcParams) == before


def test_svg_is_stable_and_png_decodes(resnet):
    assert plots.svg(plots.timeline(resnet)) == plots.svg(plots.timeline(resnet))
    png = base64.b64decode(plots.png_base64(plots.categories(resnet)))
    assert png.startswith(b"\x89PNG")


# ---- in a real browser -------------------------------------------------------------------

@pytest.fixture(scope="session")
def chromium():
    return require_chromium()


def _browse(exe: str, profile: Path, html: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--user-data-dir={profile}",
           "--no-first-run", "--no-default-browser-check", "--disable-extensions",
           "--disable-background-networking", *args, html.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _console_lines(stderr: str) -> list[str]:
    """Messages the page wrote to the console, or uncaught exceptions. With
    ``--enable-logging=stderr --v=0`` Chromium logs each as ``...:INFO:CONSOLE:<line>] "..."``
    (``CONSOLE(<line>)`` in older versions), whatever its level."""
    return [line for line in stderr.splitlines()
            if re.search(r":CONSOLE[:(]\d*", line) or "Uncaught" in line]


# measures every image once the page has loaded; added to a copy of the page only
PROBE = """<script>
addEventListener("load", () => {
  const boxes = Array.from(document.images).map(i => {
    const r = i.getBoundingClientRect();
    return {alt: i.alt, loaded: i.complete && i.naturalWidth > 0,
            x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height};
  });
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(boxes);
  document.body.append(out);
});
</script>"""


def test_console_error_detection_works(chromium, tmp_path):
    """The detector used below does see console errors and uncaught exceptions."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><p>x</p><script>console.error('boom');</script>"
                   "<script>notAFunction();</script>")
    done = _browse(chromium, tmp_path / "profile", bad, "--enable-logging=stderr", "--v=0",
                   "--dump-dom")
    lines = _console_lines(done.stderr)
    assert any("boom" in x for x in lines) and any("Uncaught" in x for x in lines), done.stderr


def test_chromium_shows_the_report(chromium, tmp_path, resnet):
    from PIL import Image

    html, png = tmp_path / "report.html", tmp_path / "report.png"
    page = render_html(resnet)
    html.write_text(page, encoding="utf-8")
    shot = _browse(chromium, tmp_path / "profile", html, "--enable-logging=stderr", "--v=0",
                   f"--screenshot={png}")
    assert shot.returncode == 0, shot.stderr[-2000:]
    assert _console_lines(shot.stderr) == []

    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = _browse(chromium, tmp_path / "profile", probe, "--dump-dom").stdout
    assert dom.count('src="data:image/svg+xml;base64,') == 4 and "<math" in dom
    boxes = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1))
    assert len(boxes) == 4 and all(b["loaded"] and b["w"] > 300 and b["h"] > 150
                                   for b in boxes), boxes

    with Image.open(png) as im:
        shot_rgb = im.convert("RGB")
    assert shot_rgb.size == WINDOW
    assert len(shot_rgb.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 50  # not blank
    for b in boxes:  # every plot is drawn where the page put it
        region = shot_rgb.crop((int(b["x"]), int(b["y"]), int(b["x"] + b["w"]),
                                int(b["y"] + b["h"])))
        colors = region.getcolors(maxcolors=1 << 16) or []
        white = sum(n for n, c in colors if min(c) >= 245)
        assert len(colors) > 20, b["alt"]
        assert white < 0.97 * region.width * region.height, b["alt"]
