"""What a reader sees in a stored notebook before running it (on a code-hosting site, in
nbviewer, or freshly opened in JupyterLab): widgets drawn from their saved state, finished
progress bars, and no stray return values of plotting calls."""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
STORED = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

# The plain-text form of an output that says nothing to a reader.
STRAY = {
    "a widget shown as its Python repr": re.compile(r"^(VBox|HBox|Box|Output)\(children="),
    "a progress bar frozen before it started": re.compile(r"\b0%\|"),
    "the return value of a matplotlib call": re.compile(r"^(Text\(|Line2D\(|<matplotlib\.|\[<matplotlib\.)"),
}


def outputs(nb):
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            yield index, out


def plain_text(out):
    text = out.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


@pytest.mark.parametrize("path", STORED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_displayed_widget_has_its_state_stored(path):
    nb = nbformat.read(path, as_version=4)
    shown = {out["data"][WIDGET_VIEW]["model_id"] for _, out in outputs(nb) if WIDGET_VIEW in out.get("data", {})}
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    missing = sorted(shown - set(state))
    assert not missing, f"{path.name}: widgets shown without a stored state: {missing[:3]}"


@pytest.mark.parametrize("path", STORED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_stray_plain_text_outputs(path):
    nb = nbformat.read(path, as_version=4)
    found = [(index, what, plain_text(out)[:60]) for index, out in outputs(nb)
             for what, pattern in STRAY.items() if pattern.search(plain_text(out))]
    assert not found, f"{path.name}: cell, problem, text: {found}"


def test_the_checks_catch_what_they_look_for():
    assert STRAY["a widget shown as its Python repr"].search("VBox(children=(HTML(value='x'),))")
    assert STRAY["a progress bar frozen before it started"].search("training:   0%|          | 0/1500")
    assert not STRAY["a progress bar frozen before it started"].search("training: 100%|##| 1500/1500")
    assert STRAY["the return value of a matplotlib call"].search("Text(0.5, 1.0, 'title')")


def test_a_training_bar_ends_in_its_final_state():
    from mhalib.runtime import progress_bar

    with progress_bar(10, "steps", enabled=True) as bar:
        bar.update(4)  # a callback stopped training early, on purpose
    assert bar.total == 4 and bar.n == 4
    with pytest.raises(RuntimeError), progress_bar(10, "steps", enabled=True) as bar:
        bar.update(4)
        raise RuntimeError("training failed")
    assert bar.total == 10, "a failed run keeps its total, so the bar shows it stopped short"
