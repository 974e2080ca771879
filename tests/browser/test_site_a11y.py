"""The course site (``make site``): every page passes axe-core, every link leads somewhere.

The site is built afresh into a temporary folder (``tools/build_site.py``, about half a
minute), then each page is opened from disk in headless Chromium and checked with
axe-core's WCAG 2.1 A and AA rules: no serious or critical violation is allowed. The
link check reads every page: internal links and anchors must exist, nothing may be
loaded from another host (the site works offline), external links must be well-formed.
"""

from __future__ import annotations

import re
import sys

import pytest

from a11y import blocking, by_impact, check_links, describe, keyboard_walk, run_axe
from conftest import VIEWPORT
from lab_harness import REPO

sys.path.insert(0, str(REPO / "tools"))
import build_site  # noqa: E402
from alt_text import figures, widget_models  # noqa: E402

pytestmark = [pytest.mark.browser]

PAGES = [p.url for p in build_site.course_pages()]


@pytest.fixture(scope="module")
def site_page(browser):
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(60_000)
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


def test_the_site_has_every_notebook_and_exercise_in_course_order(site):
    _, pages = site
    notebooks = [p.source.name for p in pages if p.kind == "notebook"]
    assert notebooks == sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb")) and notebooks
    assert [p.kind for p in pages][:1 + len(notebooks)] == ["map"] + ["notebook"] * len(notebooks)
    assert {p.url for p in pages} >= {"index.html", "glossary.html", "instructors.html", "search.html"}


@pytest.mark.parametrize("url", PAGES)
def test_site_page_passes_axe(url, site, site_page, axe, a11y_report):
    out, _ = site
    site_page.goto((out / url).resolve().as_uri())
    violations = run_axe(site_page, axe)
    a11y_report.append((f"site: {url}", by_impact(violations)))
    assert not blocking(violations), f"{url}:\n{describe(blocking(violations))}"


def test_site_links_and_anchors_lead_somewhere(site):
    out, _ = site
    problems, checked = check_links(out)
    assert checked > 200, f"only {checked} links found: did the build write the pages?"
    assert not problems, "\n".join(problems)


def test_the_link_check_finds_what_it_looks_for(tmp_path):
    (tmp_path / "a.html").write_text(
        '<html><body><h1 id="top">A</h1><a href="b.html#nowhere">1</a><a href="missing.html">2</a>'
        '<a href="#top">3</a><a href="https//example.org">4</a><a href="https://example.org/x">5</a>'
        '<script src="https://cdn.example.org/x.js"></script><a href="../outside.html">6</a></body></html>')
    (tmp_path / "b.html").write_text('<html><body><p id="here">B</p></body></html>')
    problems, checked = check_links(tmp_path)
    text = "\n".join(problems)
    assert checked == 7 and len(problems) == 5, text
    assert "no element with id 'nowhere'" in text and "no file missing.html" in text
    assert "fetched from outside the site" in text and "leads out of the site" in text
    assert "no file https/example.org" in text  # "https//..." is a relative path, to no file


def test_every_figure_on_the_site_has_its_alternative_text(site):
    """Each figure of notebooks/ (outputs and explorer stills) is an <img> with the cell's text."""
    import nbformat

    out, pages = site
    expected = 0
    for page in pages:
        if page.kind != "notebook":
            continue
        nb = nbformat.read(page.source, as_version=4)
        models = widget_models(nb)
        alts = [a for c in nb.cells for a in (c.metadata.get("mhalib") or {}).get("alt", [])
                if figures(c, models)]
        text = (out / page.url).read_text(encoding="utf-8")
        imgs = re.findall(r"<img\b[^>]*>", text)
        found = [re.search(r'alt="([^"]*)"', i) for i in imgs]
        assert all(f and f.group(1).strip() for f in found), f"{page.url}: an <img> without alt text"
        assert len(imgs) == len(alts), f"{page.url}: {len(imgs)} images, {len(alts)} texts in the notebook"
        expected += len(imgs)
    assert expected >= 20


def test_explorers_are_stills_that_say_they_need_a_kernel(site):
    out, _ = site
    text = (out / "notebooks" / "02_multi_head_attention.html").read_text(encoding="utf-8")
    stills = re.findall(r'<figure class="widget-still widget-still-explorer">(.*?)</figure>', text, re.S)
    assert len(stills) == 2 and all("<img " in s and "need a running kernel" in s for s in stills)
    assert "H (heads):</span> <strong>2</strong>" in stills[0]  # the slider as saved, in words
    assert "<script" not in text.split("</footer>")[0].split("<main", 1)[1]  # nothing runs in the page


def test_search_finds_a_section_and_the_skip_link_comes_first(site, site_page):
    out, _ = site
    site_page.goto((out / "index.html").resolve().as_uri())
    site_page.keyboard.press("Tab")
    assert site_page.evaluate("() => document.activeElement.className") == "skip-link"
    site_page.keyboard.press("Enter")
    assert site_page.evaluate("() => document.activeElement.id") == "content"
    # Search by keyboard alone: into the box, type, Enter.
    site_page.locator("#search-box").focus()
    site_page.keyboard.type("grouped-query attention")
    site_page.keyboard.press("Enter")
    site_page.wait_for_selector("#search-results li")
    links = site_page.eval_on_selector_all("#search-results li a", "(as) => as.map((a) => a.href)")
    assert any("07_mqa_gqa.html" in link for link in links), links[:5]
    assert "match" in site_page.inner_text("#search-status")


def test_a_site_page_skips_nothing_a_keyboard_needs(site, site_page):
    """Tab from the top reaches the search box, then the navigation, then the page."""
    out, _ = site
    site_page.goto((out / "notebooks" / "01_single_head_attention.html").resolve().as_uri())
    stops = keyboard_walk(site_page, "body", site_page.locator("body"), max_stops=8)
    roles = [(s["role"], s["name"]) for s in stops]
    assert roles[0] == ("link", "Skip to the content"), roles
    assert ("searchbox", "Search the course") in roles or ("search", "Search the course") in roles, roles
    assert all(name for _, name in roles), roles
