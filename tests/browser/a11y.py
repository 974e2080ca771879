"""Accessibility checks the browser tests share: axe-core in the page, a link check, the keyboard.

* :func:`axe_source` reads axe-core's ``axe.min.js``, installed by ``make test`` with npm
  at the version pinned in ``tests/browser/package-lock.json`` into ``.venv/axe/``
  (git-ignored; ``$AXE_JS`` names another file);
* :func:`run_axe` runs it on a page (or a part of one) with the WCAG 2.1 A and AA rules
  and returns the violations; :func:`blocking` keeps the serious and critical ones;
* :func:`check_links` reads a built site's pages and lists every internal link or anchor
  that leads nowhere, every resource fetched from elsewhere, and every external link
  that is not a well-formed URL (nothing is fetched);
* :func:`keyboard_walk` tabs through an explorer and reports what each stop announces;
* :func:`lab_notebook_passes_axe` checks a notebook open in JupyterLab, with the course's
  extension (``labextension/``) giving each figure its alternative text.
"""

from __future__ import annotations

import html
import os
import re
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from lab_harness import REPO

AXE_TAGS = ("wcag2a", "wcag2aa", "wcag21a", "wcag21aa")
BLOCKING = ("serious", "critical")
AXE_JS = REPO / ".venv" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
HOW_TO_INSTALL_AXE = ("install axe-core with `make test` (its browser stage runs npm ci into .venv/axe "
                      "from tests/browser/package-lock.json; needs node and npm), or point $AXE_JS at axe.min.js")


def axe_path() -> Path:
    return Path(os.environ["AXE_JS"]) if os.environ.get("AXE_JS") else AXE_JS


def axe_source() -> str | None:
    """The text of axe.min.js, or ``None`` when it is not installed."""
    path = axe_path()
    return path.read_text(encoding="utf-8") if path.is_file() else None


_RUN = """
async ([context, tags]) => {
  const result = await axe.run(context ? document.querySelectorAll(context) : document,
                               {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']});
  return result.violations.map((v) => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.map((n) => ({target: n.target.join(' '), html: n.html.slice(0, 300),
                                summary: (n.failureSummary || '').slice(0, 400)}))}));
}
"""


def run_axe(page, source: str, context: str | None = None) -> list[dict]:
    """axe-core's WCAG 2.1 A and AA violations on ``page`` (or on the elements ``context`` selects)."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.evaluate(source)
    return page.evaluate(_RUN, [context, list(AXE_TAGS)])


def by_impact(violations: list[dict]) -> dict[str, int]:
    """Number of failing elements per impact, e.g. ``{"serious": 2}``."""
    counts = Counter()
    for v in violations:
        counts[v["impact"] or "unknown"] += len(v["nodes"])
    return dict(counts)


def blocking(violations: list[dict]) -> list[dict]:
    return [v for v in violations if v["impact"] in BLOCKING]


def describe(violations: list[dict], limit: int = 3) -> str:
    lines = []
    for v in violations:
        lines.append(f"{v['id']} ({v['impact']}): {v['help']}; {len(v['nodes'])} element(s)")
        for n in v["nodes"][:limit]:
            lines.append(f"    {n['target']}\n      {n['html']}\n      {n['summary']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ links

class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[tuple[str, str, str]] = []  # (tag, attribute, value)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(key):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if attrs.get(key) is not None and not (tag == "form"):
                self.links.append((tag, key, attrs[key]))
        if tag == "form" and attrs.get("action"):
            self.links.append((tag, "action", attrs["action"]))


_URL = re.compile(r"^(https?)://[A-Za-z0-9.-]+\.[A-Za-z]{2,}(:\d+)?(/[^\s<>\"']*)?$")


def check_links(site: Path) -> tuple[list[str], int]:
    """Every broken internal link or anchor of a built site, and the number of links checked.

    Internal links (relative paths, with or without ``#anchor``) must name a file of the
    site and, with an anchor, an element with that id. Scripts, style sheets and images
    must be in the site (or ``data:`` URLs): nothing may be fetched from elsewhere.
    External links (``http``, ``https``, ``mailto``) are checked as text only.
    """
    site = Path(site)
    parsed: dict[Path, _Page] = {}
    for path in site.rglob("*.html"):
        p = _Page()
        p.feed(path.read_text(encoding="utf-8"))
        parsed[path.resolve()] = p
    problems, checked = [], 0
    for path, p in sorted(parsed.items()):
        rel = path.relative_to(site.resolve())
        for tag, attr, value in p.links:
            checked += 1
            value = html.unescape(value)
            parts = urlsplit(value)
            where = f"{rel}: <{tag} {attr}=\"{value[:120]}\">"
            if parts.scheme == "data":
                if tag == "a":
                    problems.append(f"{where}: a link to a data: URL")
                continue
            if parts.scheme in ("http", "https", "mailto") or parts.netloc:
                if tag != "a":
                    problems.append(f"{where}: fetched from outside the site (no network at view time)")
                elif parts.scheme == "mailto":
                    if not re.match(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$", parts.path):
                        problems.append(f"{where}: not a well-formed mail address")
                elif not _URL.match(value.split("#", 1)[0]):
                    problems.append(f"{where}: not a well-formed URL")
                continue
            if parts.scheme:
                problems.append(f"{where}: scheme {parts.scheme!r} is neither a page of the site nor a web link")
                continue
            target = path if not parts.path else (path.parent / unquote(parts.path)).resolve()
            if site.resolve() not in target.parents and target != site.resolve():
                problems.append(f"{where}: leads out of the site")
                continue
            if not target.is_file():
                problems.append(f"{where}: no file {target.relative_to(site.resolve()) if site.resolve() in target.parents else target}")
                continue
            if parts.fragment:
                ids = parsed[target].ids if target in parsed else set()
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{where}: no element with id {unquote(parts.fragment)!r} in "
                                    f"{target.relative_to(site.resolve())}")
    return problems, checked


# ------------------------------------------------------------------------------ keyboard

#: What the focused element is and says, as a screen reader would get it from the DOM.
_FOCUSED = r"""
(scope) => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const box = el.closest(scope);
  const byIds = (ids) => ids.split(/\s+/).map((id) => document.getElementById(id))
      .filter(Boolean).map((n) => n.textContent.trim()).join(' ');
  let name = el.getAttribute('aria-label') || '';
  if (!name && el.getAttribute('aria-labelledby')) name = byIds(el.getAttribute('aria-labelledby'));
  if (!name && el.labels && el.labels.length) name = [...el.labels].map((l) => l.textContent.trim()).join(' ');
  if (!name && ['BUTTON', 'A'].includes(el.tagName)) name = el.textContent.trim();
  if (!name && el.closest('label')) name = el.closest('label').textContent.trim();
  if (!name) name = el.getAttribute('title') || '';
  const role = el.getAttribute('role') || ({SELECT: 'combobox', BUTTON: 'button', A: 'link'}[el.tagName])
      || (el.tagName === 'INPUT' ? el.type : el.tagName.toLowerCase());
  const slider = el.closest('.widget-slider');
  const readout = slider && slider.querySelector('.widget-readout');
  return {inside: !!box, role, name: name.replace(/\s+/g, ' ').trim(),
          value: el.getAttribute('aria-valuetext') || (el.tagName === 'SELECT' ? el.options[el.selectedIndex].text
                 : el.type === 'checkbox' ? String(el.checked) : el.getAttribute('aria-pressed') || ''),
          valuenow: el.getAttribute('aria-valuenow'),
          readout: readout ? readout.innerText.trim() : null,
          tag: el.tagName, cls: el.className && String(el.className).slice(0, 80)};
}
"""


def focused(page, scope: str) -> dict | None:
    """What the element that has the focus announces: role, accessible name, value."""
    return page.evaluate(_FOCUSED, scope)


def keyboard_walk(page, scope: str, start, max_stops: int = 40) -> list[dict]:
    """Press Tab from ``start`` (a locator just before the controls) until focus leaves ``scope``.

    Returns one entry per focus stop inside the scope, in order (see :func:`focused`).
    """
    start.evaluate("(e) => { if (e.tabIndex < 0) e.tabIndex = -1; e.focus(); }")
    stops = []
    for _ in range(max_stops):
        page.keyboard.press("Tab")
        now = focused(page, scope)
        if now is None or not now["inside"]:
            if stops:
                break
            continue
        stops.append(now)
    return stops


_CONTROLS = """
(box) => [...box.querySelectorAll('.noUi-handle, .widget-readout, select, button, input[type=checkbox]')]
  .filter((e) => !e.closest('.mhalib-explorer-output') && e.offsetParent !== null && !e.disabled
                 && (!e.classList.contains('widget-readout') || e.isContentEditable))
  .map((e) => e.classList.contains('noUi-handle') ? 'slider' : e.classList.contains('widget-readout') ? 'textbox'
       : e.tagName === 'SELECT' ? 'combobox' : e.tagName === 'BUTTON' ? 'button' : 'checkbox')
"""
SCOPE = "[data-a11y-scope]"


def explorer_by_keyboard(nb, explorer: int, timeout: float = 60.0) -> list[dict]:
    """Reach and use every control of one explorer with the keyboard alone.

    Focus starts on the explorer's title; Tab goes through its controls (a learner's
    way in from the cell above). Each stop must have a role and an accessible name; a
    slider must also announce its value as the readout shows it (aria-valuetext), move
    with ArrowRight (ArrowLeft at its maximum), announce the new value, and redraw.
    Every visible control must be reached. Returns the stops, each with what was
    announced (``role``, ``name``, ``value``) and, for sliders, ``moved_to``.
    Raises ``AssertionError`` saying what a keyboard user would miss.
    """
    page = nb.page
    box = page.locator(".jp-Notebook .mhalib-explorer").nth(explorer)
    box.scroll_into_view_if_needed()
    page.evaluate("() => document.querySelectorAll('[data-a11y-scope]').forEach((e) => e.removeAttribute('data-a11y-scope'))")
    box.evaluate("(e) => e.setAttribute('data-a11y-scope', '')")
    visible = box.evaluate(_CONTROLS)
    stops = keyboard_walk(page, SCOPE, box.locator(".widget-html").first, max_stops=2 * len(visible) + 5)
    where = f"{nb.relpath}, explorer {explorer + 1}"
    roles = [s["role"] for s in stops]
    assert roles == visible, f"{where}: Tab reaches {roles}; the explorer shows {visible}"
    unnamed = [s for s in stops if not s["name"]]
    assert not unnamed, f"{where}: controls without an accessible name: {unnamed}"
    # A row of toggle buttons says which one is on, not by colour alone.
    toggles = box.evaluate("(b) => [...b.querySelectorAll('.widget-toggle-buttons')].map((g) => "
                           "[...g.querySelectorAll('button')].map((x) => x.getAttribute('aria-pressed')))")
    for row in toggles:
        assert row.count("true") == 1 and row.count("false") == len(row) - 1, f"{where}: toggle buttons {row}"
    # Walk again and use each slider: its value must be announced before and after a move.
    box.locator(".widget-html").first.evaluate("(e) => { e.tabIndex = -1; e.focus(); }")
    for stop in stops:
        page.keyboard.press("Tab")
        now = focused(page, SCOPE)
        assert now and now["name"] == stop["name"], f"{where}: focus order changed: {now} after {stop}"
        if now["role"] != "slider":
            continue
        assert now["value"] and now["value"] == now["readout"], (
            f"{where}: slider {now['name']!r} announces {now['value']!r} but shows {now['readout']!r}")
        before = now["valuenow"]
        at_max = page.evaluate("() => document.activeElement.getAttribute('aria-valuenow') === "
                               "document.activeElement.getAttribute('aria-valuemax')")
        key = "ArrowLeft" if at_max else "ArrowRight"
        page.keyboard.press(key)
        page.wait_for_function("(v) => document.activeElement.getAttribute('aria-valuenow') !== v", arg=before,
                               timeout=timeout * 1000)
        nb.wait_kernel_idle(timeout, settle=0.3)
        moved = focused(page, SCOPE)
        assert moved["value"] == moved["readout"] and moved["value"] != now["value"], (
            f"{where}: after {key}, slider {now['name']!r} announces {moved['value']!r}, shows {moved['readout']!r}")
        stop["moved_to"] = moved["value"]
    return stops


# ------------------------------------------------------------------------------ JupyterLab

LAB_NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"
#: The images a code cell shows as its own outputs (not those inside a widget).
LAB_OUTPUT_IMAGES = f"{LAB_NOTEBOOK} .jp-Cell-outputArea > .jp-OutputArea-child > .jp-RenderedImage > img"
#: The course's JupyterLab extension (``labextension/``): the ``alt`` of each image output
#: from its cell's metadata, a name for each cell's editor and heading fold button, and
#: the cells as the "article"s of JupyterLab's cell list (a "feed").
COURSE_LABEXTENSION = "mha-course-a11y"
COURSE_PLUGIN = f"{COURSE_LABEXTENSION}:plugin"


def _alt_text():
    if str(REPO / "tools") not in sys.path:
        sys.path.insert(0, str(REPO / "tools"))
    import alt_text

    return alt_text


def stored_alt_texts(stored) -> list[str | None]:
    """The ``alt`` each image output of a notebook should get in JupyterLab, in order.

    One entry per ``image/png`` output of a code cell: the text its cell's metadata holds
    for that figure (``tools/alt_text.py``: the cell's figures in order, those drawn in its
    widgets included), or ``None`` when there is none.
    """
    alt_text = _alt_text()
    models = alt_text.widget_models(stored)
    wanted = []
    for cell in stored.cells:
        texts = alt_text.alt_texts(cell)
        for k, (kind, _) in enumerate(alt_text.figures(cell, models)):
            if kind == "output":
                text = texts[k] if k < len(texts) else None
                wanted.append(text if isinstance(text, str) and text.strip() else None)
    return wanted


def lab_notebook_passes_axe(nb, path: Path, source: str, report: list) -> None:
    """axe-core on a stored notebook open in JupyterLab: no serious or critical violation.

    Nothing is set aside as JupyterLab's: the course's extension gives JupyterLab's own
    markup what it lacks. Also: JupyterLab drew every stored figure, each with the
    alternative text its cell's metadata holds for it.
    """
    import nbformat

    stored = nbformat.read(path, as_version=4)
    wanted = stored_alt_texts(stored)
    nb.page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length >= n",
                              arg=[LAB_OUTPUT_IMAGES, len(wanted)])
    nb.wait_widgets_rendered()
    try:  # the extension names what JupyterLab draws within a frame; axe reports what is left
        nb.page.wait_for_function("(sel) => [...document.querySelectorAll(sel)].every((i) => i.hasAttribute('alt'))",
                                  arg=LAB_OUTPUT_IMAGES, timeout=5_000)
    except Exception:  # noqa: BLE001 - a Playwright timeout: the check below says what is missing
        pass
    violations = run_axe(nb.page, source, LAB_NOTEBOOK)
    report.append((f"JupyterLab: notebooks/{path.name}", by_impact(violations)))
    assert not blocking(violations), f"{path.name} in JupyterLab:\n{describe(blocking(violations))}"
    shown = nb.page.evaluate("(sel) => [...document.querySelectorAll(sel)].map((i) => i.getAttribute('alt'))",
                             LAB_OUTPUT_IMAGES)
    wrong = [(i + 1, (s or "")[:60], (w or "")[:60]) for i, (s, w) in enumerate(zip(shown, wanted)) if s != w]
    assert len(shown) == len(wanted) and not wrong, (
        f"{path.name}: JupyterLab shows {len(shown)} image outputs, the file holds {len(wanted)}; "
        f"(image, alt shown, alt in the cell's metadata) that differ: {wrong}")
    assert not _alt_text().missing(stored), f"{path.name}: figures without alternative text"
