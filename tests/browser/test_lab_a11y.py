"""Each notebook opened in JupyterLab, checked with axe-core (WCAG 2.1 A and AA).

The check covers the notebook (``.jp-Notebook``: its cells, as JupyterLab draws the
course's prose, code and stored outputs), not JupyterLab's menus and side panels. Four
serious or critical findings come from JupyterLab's own markup and appear in every
notebook whatever it holds; the course cannot change them, so they are listed in
:data:`JUPYTERLAB_OWN` with the element each one is on, and any other serious or
critical violation fails the test. Measured with JupyterLab 4.6.6 and axe-core 4.14.1:

* ``image-alt``: JupyterLab's image renderer (``renderImage`` in @jupyterlab/rendermime)
  sets an output image's source, width and height, and never an ``alt``, whatever the
  output's metadata holds. The course keeps each figure's text in its cell's metadata
  (``tools/alt_text.py``); the site shows it as the ``alt``; in JupyterLab it is not on
  screen. The test checks that every image it reports belongs to a cell with that text.
* ``aria-input-field-name``: each code cell's editor (CodeMirror's ``.cm-content``, role
  "textbox") has no accessible name.
* ``aria-required-children``: the cell list (``.jp-WindowedPanel-viewport``, role "feed")
  holds cells that are not "article"s.
* ``button-name``: the button that folds a heading's section (``.jp-collapseHeadingButton``)
  has no text or label.
"""

from __future__ import annotations

import re
import sys

import pytest

from a11y import blocking, by_impact, describe, run_axe
from lab_harness import REPO, NotebookPage

sys.path.insert(0, str(REPO / "tools"))
import alt_text  # noqa: E402

pytestmark = [pytest.mark.browser]

NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"
#: rule -> a pattern that the failing element's markup or selector matches when the
#: finding is JupyterLab's own (see the module's docstring).
JUPYTERLAB_OWN = {
    "image-alt": re.compile(r"jp-RenderedImage|^<img src=\"data:image/png"),
    "aria-input-field-name": re.compile(r"cm-content"),
    "aria-required-children": re.compile(r"jp-WindowedPanel-viewport"),
    "button-name": re.compile(r"jp-collapseHeadingButton"),
}

NOTEBOOKS = [pytest.param(p, id=p.stem) for p in sorted((REPO / "notebooks").glob("*.ipynb"))]


def split_own(violations):
    """(the course's violations, JupyterLab's own), each a list of axe violations."""
    course, own = [], []
    for v in violations:
        pattern = JUPYTERLAB_OWN.get(v["id"])
        mine = [n for n in v["nodes"] if not (pattern and (pattern.search(n["html"]) or pattern.search(n["target"])))]
        theirs = [n for n in v["nodes"] if n not in mine]
        if mine:
            course.append({**v, "nodes": mine})
        if theirs:
            own.append({**v, "nodes": theirs})
    return course, own


def test_the_split_keeps_anything_jupyterlab_does_not_explain():
    found = [{"id": "image-alt", "impact": "critical", "help": "", "nodes": [
                 {"target": ".jp-RenderedImage > img", "html": "<img src=\"data:image/png;base64,x\">", "summary": ""},
                 {"target": ".jp-RenderedHTMLCommon > img", "html": "<img src=\"figure.svg\">", "summary": ""}]},
             {"id": "color-contrast", "impact": "serious", "help": "", "nodes": [
                 {"target": ".jp-RenderedMarkdown p", "html": "<p>", "summary": ""}]}]
    course, own = split_own(found)
    assert [(v["id"], len(v["nodes"])) for v in course] == [("image-alt", 1), ("color-contrast", 1)]
    assert [(v["id"], len(v["nodes"])) for v in own] == [("image-alt", 1)]


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_opened_in_jupyterlab_passes_axe(notebook, lab_page, lab_server, axe, a11y_report):
    import nbformat

    nb = NotebookPage(lab_page, lab_server, f"notebooks/{notebook.name}").open()
    nb.wait_widgets_rendered()
    violations = run_axe(lab_page, axe, NOTEBOOK)
    course, own = split_own(blocking(violations))
    a11y_report.append((f"JupyterLab: notebooks/{notebook.name} (course)",
                        by_impact(course + [v for v in violations if v["impact"] not in ("serious", "critical")])))
    a11y_report.append((f"JupyterLab: notebooks/{notebook.name} (JupyterLab's own, listed)", by_impact(own)))
    assert not course, f"{notebook.name} in JupyterLab:\n{describe(course)}"
    # Every image JupyterLab draws without alt is a stored figure whose cell holds its text.
    stored = nbformat.read(notebook, as_version=4)
    drawn = sum(len(v["nodes"]) for v in own if v["id"] == "image-alt")
    images = sum(1 for c in stored.cells if c.cell_type == "code" for o in c.get("outputs", [])
                 if "image/png" in o.get("data", {}))
    assert drawn == images, f"{notebook.name}: JupyterLab drew {drawn} images without alt; the file holds {images}"
    assert not alt_text.missing(stored), f"{notebook.name}: figures without alternative text"
