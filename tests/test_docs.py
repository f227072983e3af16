"""The documentation site: generated pages match the code, the examples in the hand-written
pages run, and ``mkdocs build --strict`` succeeds."""

import doctest
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCTEST_PAGES = ("index.md", "concepts.md")  # pages whose ```pycon blocks are doctests


def _load_gallery():
    spec = importlib.util.spec_from_file_location("fxmem_examples_gallery",
                                                  ROOT / "examples" / "gallery.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gallery():
    return _load_gallery()


@pytest.fixture(scope="module")
def generated(gallery):
    pytest.importorskip("transformers", reason="the gallery's GPT-2 needs transformers "
                                               "(pip install -e '.[hf]')")
    return gallery.generate()


def test_generated_pages_match_the_code(gallery, generated):
    """``python examples/gallery.py --check``: the committed pages are what the code makes."""
    expected = {"docs/cli.md", "docs/gallery/index.md"} | {
        f"docs/gallery/{ex.name}.md" for ex in gallery.EXAMPLE_MODELS}
    assert set(generated) == expected
    bad = gallery.differences(generated)
    assert not bad, (f"generated docs differ from the committed files: {', '.join(bad)}; "
                     "run `python examples/gallery.py` and commit the result")


def test_gallery_pages_are_in_the_nav(gallery):
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [ex.name for ex in gallery.EXAMPLE_MODELS if f"gallery/{ex.name}.md" not in nav]
    assert not missing, f"add the gallery pages of {missing} to the nav in mkdocs.yml"


def test_generated_pages_are_portable(generated):
    """No absolute paths of this machine, no empty pages."""
    for path, text in generated.items():
        assert str(ROOT) not in text, f"{path} contains the absolute path {ROOT}"
        assert text.count("\n") > 10, f"{path} is almost empty"
    assert "## fxmem analyze" in generated["docs/cli.md"]
    for name in ("seed_convnet", "resnet18", "gpt2_tiny", "lstm_classifier"):
        page = generated[f"docs/gallery/{name}.md"]
        assert "## Peak memory as a formula of B" in page and "*B" in page, name


def _pycon(page: str) -> str:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return "\n".join(re.findall(r"```pycon\n(.*?)```", text, flags=re.S))


@pytest.mark.parametrize("page", DOCTEST_PAGES)
def test_page_examples_run(page):
    """Every number in the ```pycon blocks of the page is what the code prints."""
    source = _pycon(page)
    test = doctest.DocTestParser().get_doctest(source, {}, page, str(ROOT / "docs" / page), 0)
    assert test.examples, f"docs/{page} has no ```pycon examples"
    out = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=out.append)
    assert runner.failures == 0, f"docs/{page}: an example's output changed\n" + "".join(out)


def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: no broken links, every API object found."""
    for mod in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(mod.split(".")[0]) is None:
            pytest.skip(f"{mod} is not installed (pip install -e '.[docs]')")
    if not (ROOT / "docs" / "json-schema.md").is_file():
        pytest.fail("docs/json-schema.md is missing (the nav links to it)")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                        "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    assert (tmp_path / "site" / "api" / "index.html").is_file()
    assert "fxmem.analyze" in (tmp_path / "site" / "api" / "index.html").read_text("utf-8")
