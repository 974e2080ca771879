"""Each notebook opened in JupyterLab, checked with axe-core (WCAG 2.1 A and AA).

The check covers the notebook (``.jp-Notebook``: its cells, as JupyterLab draws the
course's prose, code and stored outputs), not JupyterLab's menus and side panels. Four
serious or critical findings come from JupyterLab's own markup and appear in every
notebook whatever it holds; the course cannot change them, so they are listed in
:data:`a11y.JUPYTERLAB_OWN` with the element each one is on, and any other serious or
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

import pytest

from a11y import lab_notebook_passes_axe, split_own
from lab_harness import REPO, NotebookPage, widget_notebooks

pytestmark = [pytest.mark.browser]

# The notebooks with explorers are opened, stored, by test_browser_notebooks.py's
# test_a_stored_notebook_reads_cleanly_before_it_runs, which runs the same check.
NOTEBOOKS = [pytest.param(p, id=p.stem) for p in sorted((REPO / "notebooks").glob("*.ipynb"))
             if p not in widget_notebooks()]


def test_the_split_keeps_anything_jupyterlab_does_not_explain():
    found = [{"id": "image-alt", "impact": "critical", "help": "", "nodes": [
                 {"target": "div.jp-RenderedImage > img", "html": "<img src=\"data:image/png;base64,x\">", "summary": ""},
                 {"target": "div.jp-RenderedMarkdown > img", "html": "<img src=\"data:image/png;base64,x\">",
                  "summary": ""}]},
             {"id": "color-contrast", "impact": "serious", "help": "", "nodes": [
                 {"target": ".jp-RenderedMarkdown p", "html": "<p>", "summary": ""}]}]
    course, own = split_own(found, lambda target, selector: selector in target)
    assert [(v["id"], [n["target"] for n in v["nodes"]]) for v in course] == [
        ("image-alt", ["div.jp-RenderedMarkdown > img"]), ("color-contrast", [".jp-RenderedMarkdown p"])]
    assert [(v["id"], len(v["nodes"])) for v in own] == [("image-alt", 1)]


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_opened_in_jupyterlab_passes_axe(notebook, lab_page, lab_server, axe, a11y_report):
    nb = NotebookPage(lab_page, lab_server, f"notebooks/{notebook.name}").open(wait_for_kernel=False)
    lab_notebook_passes_axe(nb, notebook, axe, a11y_report)
