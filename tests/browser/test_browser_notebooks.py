"""Every notebook with widgets, as a learner meets it: JupyterLab in headless Chromium.

For each notebook whose code uses ``mhalib.widgets``: open it, run all cells from the
Run menu, wait for the kernel, then check that the explorers are drawn as widgets, that
no output shows a traceback or a widget error, and that every slider redraws its figure
without breaking anything (see ``lab_harness.check_notebook``); then that every control
of every explorer is usable by keyboard alone and named for a screen reader, and that
axe-core finds no serious or critical WCAG 2.1 A/AA violation in the explorers.
"""

from __future__ import annotations

import pytest

from a11y import blocking, by_impact, describe, explorer_by_keyboard, lab_notebook_passes_axe, run_axe
from lab_harness import NotebookPage, check_notebook, widget_notebooks

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOKS = [pytest.param(p, id=p.stem) for p in widget_notebooks()] or [
    pytest.param(None, id="none", marks=pytest.mark.skip(
        reason="no notebook in notebooks/ uses mhalib.widgets yet"))]


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_widgets_work_in_jupyterlab(notebook, lab_page, lab_server, screenshots, axe, a11y_report):
    nb = NotebookPage(lab_page, lab_server, f"notebooks/{notebook.name}").open()
    report = check_notebook(nb, screenshots)
    print(report.summary())
    assert report.explorers >= 1
    # By keyboard alone: every control reached with Tab, named, its value announced, and
    # each slider moved with the arrow keys (see a11y.explorer_by_keyboard) ...
    for i in range(report.explorers):
        stops = explorer_by_keyboard(nb, i)
        print(f"explorer {i + 1} by keyboard: " + "; ".join(
            f"{s['role']} {s['name']!r}" + (f" {s['value']!r} -> {s['moved_to']!r}" if "moved_to" in s else "")
            for s in stops))
    # ... and the explorers, as drawn in the running notebook, pass axe (WCAG 2.1 A and AA).
    violations = run_axe(lab_page, axe, ".jp-Notebook .mhalib-explorer")
    a11y_report.append((f"JupyterLab, run: the explorers of notebooks/{notebook.name}", by_impact(violations)))
    assert not blocking(violations), f"{notebook.name}, explorers:\n{describe(blocking(violations))}"


def test_widget_notebooks_are_found():
    """The course's explorers (02 H and d_model, 06 KV cache, 07 GQA) are all checked.

    Guards the detection above: a notebook that imported its explorer another way would
    otherwise drop out of the browser tests without a word.
    """
    found = {p.stem for p in widget_notebooks()}
    assert {"02_multi_head_attention", "06_kv_cache", "07_mqa_gqa"} <= found, found



@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_a_stored_notebook_reads_cleanly_before_it_runs(notebook, lab_page, lab_server, screenshots, axe,
                                                        a11y_report):
    """Opened and not run. JupyterLab 4 with ipywidgets 8 does not draw widgets from the
    state saved in a notebook (jupyterlab/jupyterlab#15361; nbviewer and nbconvert's HTML
    do, see tests/test_stored_outputs.py), so each widget shows its plain-text form: for the
    course's explorers and quizzes a short label that says to run the notebook, never a
    Python repr, a widget error or a traceback."""
    nb = NotebookPage(lab_page, lab_server, f"notebooks/{notebook.name}").open()
    nb.wait_widgets_rendered()
    nb.screenshot(screenshots / f"{notebook.stem}-stored.png")
    problems = nb.problems()
    assert not problems, "\n".join(problems)
    text = lab_page.inner_text(".jp-Notebook")
    assert "run the notebook to use the sliders]" in text, f"{notebook.name}: no explorer label shown"
    # The same check as test_lab_a11y.py's for the other notebooks: axe-core on the notebook.
    lab_notebook_passes_axe(nb, notebook, axe, a11y_report)
