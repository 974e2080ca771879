"""The browser harness checked on two small fixtures: one sound, one broken on purpose.

If these pass, a green run of ``test_browser_notebooks.py`` means something: the same
checks find a traceback drawn by a slider, a widget shown as text and a widget whose
model is missing.
"""

from __future__ import annotations

import pytest

from lab_harness import QUICK_PLAN, NotebookPage, check_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_sound_explorer_passes(lab_page, lab_server, screenshots):
    nb = NotebookPage(lab_page, lab_server, "fixtures/tiny_explorer.ipynb").open()
    # One move per slider here; the course notebooks get the full plan.
    report = check_notebook(nb, screenshots / "fixtures", plan=QUICK_PLAN)
    assert report.explorers == 1
    # Both kinds of slider were found and moved one step (IntSlider, SelectionSlider) ...
    assert [(m.before, m.after) for m in report.moves] == [
        ("H (heads)=2", "H (heads)=3"), ("d_model=8", "d_model=12"),
        ("context length=4", "context length=8")]
    # ... and each move redrew the figure.
    assert all(m.changed for m in report.moves)
    shots = {p.name for p in report.screenshots}
    assert {"tiny_explorer-run-all.png", "tiny_explorer-explorer1-h-heads-moved.png"} <= shots


def test_broken_explorer_is_caught(lab_page, lab_server, tmp_path):
    nb = NotebookPage(lab_page, lab_server, "fixtures/broken_explorer.ipynb").open()
    # The check used on the course notebooks fails right after Run All Cells ...
    with pytest.raises(AssertionError) as failed:
        check_notebook(nb, tmp_path)
    problems = str(failed.value)
    # ... on a widget printed as text (what a missing widget manager looks like) ...
    assert "a widget is shown as plain text" in problems and "IntSlider(" in problems
    # ... and on a view whose model the page does not know (on screen and in the console).
    assert "model not found" in problems
    assert "browser console: Error: widget model not found" in problems
    assert (tmp_path / "broken_explorer-FAILED.png").stat().st_size > 0
    # The explorer itself draws fine at first ...
    [explorer] = nb.explorers()
    assert explorer["images"] == 1 and "Traceback" not in explorer["output_text"]
    # ... until H = 3 meets d_model = 8: the traceback inside its Output is found.
    move = nb.press(0, 0, "ArrowRight", expect_change=True)
    assert (move.before, move.after) == ("H (heads)=2", "H (heads)=3")
    found = "\n".join(move.problems)
    assert "Traceback" in found and "cannot split d_model=8 into H=3 heads" in found
