"""Every figure of the course has alternative text that says what it shows.

A figure is an ``image/png`` output, or the figure an explorer's ``Output`` widget held
when the notebook was saved (the site shows that still). Its text is in the cell's
metadata (``{"mhalib": {"alt": [...]}}``, one per figure), written from the table in
``tools/alt_text.py``; the site (``tools/build_site.py``) makes it the image's ``alt``.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import alt_text  # noqa: E402

NOTEBOOKS = sorted(p for d in ("notebooks", "solutions") for p in (ROOT / d).glob("*.ipynb"))
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_figure_has_alternative_text(path):
    nb = nbformat.read(path, as_version=4)
    bad = alt_text.missing(nb)
    rel = path.relative_to(ROOT).as_posix()
    assert not bad, "\n".join(
        f"{rel}: code cell {i + 1} (id {cid}) shows {n} figure(s) with {k} alternative text(s); "
        f"add them to tools/alt_text.py's ALT and run python tools/alt_text.py {rel}" for i, cid, n, k in bad)


def _cell(outputs, alt=None):
    cell = nbformat.v4.new_code_cell("plot()")
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    if alt is not None:
        cell.metadata["mhalib"] = {"alt": alt}
    return cell


def _explorer_state():
    """A saved explorer: a VBox holding an Output with one figure."""
    return {"state": {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_out"]}},
        "out": {"model_name": "OutputModel", "state": {"outputs": [
            {"output_type": "display_data", "data": {"image/png": PNG}, "metadata": {}}]}},
    }, "version_major": 2, "version_minor": 0}


def test_the_check_finds_a_figure_without_text():
    png = {"output_type": "display_data", "data": {"image/png": PNG, "text/plain": "<Figure>"}, "metadata": {}}
    view = {"output_type": "display_data", "metadata": {},
            "data": {alt_text.WIDGET_VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0}}}
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {alt_text.WIDGET_STATE: _explorer_state()}
    nb.cells = [
        _cell([png]),                                  # a figure, no text
        _cell([png], ["A heatmap of the weights."]),   # fine
        _cell([view], []),                             # an explorer's saved figure, no text
        _cell([png, view], ["Only one text."]),        # two figures, one text
        _cell([png], ["Text.", "A text for a figure that is not there."]),
        _cell([{"output_type": "stream", "name": "stdout", "text": "no figure"}]),
    ]
    found = [(i, n, k) for i, _, n, k in alt_text.missing(nb)]
    assert found == [(0, 1, 0), (2, 1, 0), (3, 2, 1), (4, 1, 2)]


def test_the_table_and_the_notebooks_agree():
    """What tools/alt_text.py would write is what the notebooks hold (so it can restore them)."""
    for rel, cells in alt_text.ALT.items():
        nb = nbformat.read(ROOT / rel, as_version=4)
        by_id = {c.get("id"): c for c in nb.cells}
        models = alt_text.widget_models(nb)
        for cell_id, texts in cells.items():
            assert cell_id in by_id, f"{rel}: tools/alt_text.py names cell {cell_id}, which is not there"
            cell = by_id[cell_id]
            assert alt_text.alt_texts(cell) == texts, f"{rel}: cell {cell_id}: run python tools/alt_text.py {rel}"
            assert len(alt_text.figures(cell, models)) == len(texts), f"{rel}: cell {cell_id}"


def test_the_texts_say_what_a_figure_shows():
    """A sentence or more, not a placeholder: at least 15 words, and not just a file name."""
    for rel, cells in alt_text.ALT.items():
        for cell_id, texts in cells.items():
            for text in texts:
                words = text.split()
                assert len(words) >= 15, f"{rel}: cell {cell_id}: too short to describe a figure: {text!r}"
                assert not text.lower().endswith((".png", ".jpg")) and "placeholder" not in text.lower()


def test_apply_writes_only_the_metadata_of_the_named_cells(tmp_path, monkeypatch):
    png = {"output_type": "display_data", "data": {"image/png": PNG}, "metadata": {}}
    nb = nbformat.v4.new_notebook()
    nb.cells = [_cell([png]), nbformat.v4.new_markdown_cell("# Title")]
    nb.cells[0].id, nb.cells[1].id = "fig1", "title"
    (tmp_path / "notebooks").mkdir()
    path = tmp_path / "notebooks" / "x.ipynb"
    nbformat.write(nb, path)
    monkeypatch.setattr(alt_text, "ROOT", tmp_path)
    report = alt_text.apply(table={"notebooks/x.ipynb": {"fig1": ["A figure that shows one thing."]}})
    assert report == ["notebooks/x.ipynb: 1 cell(s) updated, 1 in the table"]
    after = nbformat.read(path, as_version=4)
    assert after.cells[0].metadata["mhalib"]["alt"] == ["A figure that shows one thing."]
    assert after.cells[0].outputs == nb.cells[0].outputs and after.cells[1] == nb.cells[1]
    assert not alt_text.missing(after)
    with pytest.raises(SystemExit, match="no cell with id gone"):
        alt_text.apply(table={"notebooks/x.ipynb": {"gone": ["A figure that is no longer there at all."]}})
