"""The explorers and plots for readers who use a keyboard, a screen reader, or do not tell colours apart.

What can be checked without a browser: every control has a plain-text name; an explorer
shown in a notebook brings the script that names its sliders in the page (ipywidgets
does not; tests/browser/test_browser_notebooks.py checks the result in JupyterLab, by
keyboard alone); every figure a render draws has alternative text that states what it
shows; lines of one plot differ by more than colour; heatmaps use cividis or viridis.
"""

from __future__ import annotations

import html
import re

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import ipywidgets as w  # noqa: E402

from mhalib import plots  # noqa: E402
from mhalib.kv_cache import format_bytes  # noqa: E402
from mhalib.widgets import common, gqa, kv, mha  # noqa: E402

EXPLORERS = {
    "mha_explorer": mha.mha_explorer,
    "step_explorer": mha.step_explorer,
    "kv_explorer": kv.kv_explorer,
    "gqa_explorer": gqa.gqa_explorer,
    "cache_kinds_explorer": kv.cache_kinds_explorer,
}


def _widgets(box):
    yield box
    for child in getattr(box, "children", ()):
        yield from _widgets(child)


@pytest.mark.parametrize("name", EXPLORERS)
def test_every_control_has_a_plain_text_name(name):
    box = EXPLORERS[name]()
    controls = [c for c in _widgets(box)
                if isinstance(c, (w.IntSlider, w.SelectionSlider, w.Dropdown, w.ToggleButtons, w.Checkbox, w.Button))]
    assert controls
    for c in controls:
        assert c.description.strip(), f"{name}: a {type(c).__name__} without a description (its accessible name)"
        if hasattr(c, "description_allow_html"):
            assert c.description_allow_html is False, f"{name}: {c.description!r} is read as HTML"
    sliders = [c for c in controls if isinstance(c, (w.IntSlider, w.SelectionSlider))]
    assert sliders and all(not c.continuous_update for c in sliders)


def test_a_slider_without_a_name_is_refused():
    with pytest.raises(ValueError, match="accessible name"):
        common.slider("", 1, 0, 3)
    with pytest.raises(ValueError, match="accessible name"):
        common.choice_slider("  ", (1, 2), 1)


def test_an_explorer_shown_in_a_notebook_brings_the_script_that_names_its_sliders(monkeypatch):
    shown = []
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append((obj, raw)))
    box = gqa.gqa_explorer()
    box._ipython_display_()
    (bundle, raw), (script, raw_script) = shown
    assert raw and "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("[explorer: ")  # the label a viewer without widgets shows
    assert raw_script and script["text/plain"] == ""  # nothing for a plain-text viewer to show
    assert common.ACCESSIBLE_NAMES_JS in script["text/html"] and common.SLIDER_NAMES_CLASS in script["text/html"]
    assert "aria-labelledby" in common.ACCESSIBLE_NAMES_JS
    for attribute in ("aria-valuetext", "img.alt", common.FIGURE_ALT_CLASS):
        assert attribute in common.ACCESSIBLE_NAMES_JS
    # A quiz is a labelled box too, without sliders: no script.
    shown.clear()
    common.labelled_vbox([w.HTML("x")], "[quiz]")._ipython_display_()
    assert len(shown) == 1


RENDERS = [
    ("mha", lambda: mha.render_mha(16, 4, "The cat sat on")),
    ("trained", lambda: mha.render_trained(1, mha.TRAINED_SENTENCES[1])),
    ("step", lambda: mha.render_step("softmax", 8, 2)),
    ("kv", lambda: kv.render_kv(8192, 4, "Llama-2-7B")),
    ("cache kinds", lambda: kv.render_cache_kinds(65536, 2048)),
    ("gqa", lambda: gqa.render_gqa(16, 4, 32768)),
]


@pytest.mark.parametrize("name,render", RENDERS, ids=[n for n, _ in RENDERS])
def test_every_explorer_figure_says_what_it_shows(name, render):
    view = render()
    assert view.ok and view.figure is not None
    assert len(view.alt.split()) >= 15, view.alt
    data = view.data
    if name == "mha":  # the tokens, and each head's strongest weight, as drawn
        assert "'The cat sat on'" in view.alt and view.alt.count("head ") >= 4
        h0 = data["weights"][0]
        assert f"{h0.max():.2f}" in view.alt
    elif name in ("kv",):
        assert format_bytes(data["total_bytes"]) in view.alt and "g = 4" in view.alt
    elif name == "cache kinds":
        assert all(format_bytes(v) in view.alt for v in data["total_bytes"].values())
    elif name == "gqa":
        assert "16 query heads" in view.alt and "4 K/V heads" in view.alt and format_bytes(data["cache_bytes"]) in view.alt
    elif name == "step":
        assert "softmax" in view.alt and "(4, 4)" in view.alt
    elif name == "trained":
        assert "trained model's layer 1" in view.alt


def test_show_view_puts_the_text_on_the_figure_and_takes_it_away_with_it():
    msg, out = w.HTML(), w.Output()
    view = gqa.render_gqa(8, 2)
    common.show_view(view, msg, out)
    hidden = f'<span class="{common.FIGURE_ALT_CLASS}" hidden>'
    assert msg.value.startswith(view.html) and hidden in msg.value and len(out.outputs) == 1
    assert html.unescape(msg.value.split(hidden)[1].split("</span>")[0]) == view.alt
    assert out.tooltip is None  # ipywidgets 8.1.9 cannot draw an Output that has a tooltip
    common.show_view(gqa.render_gqa(8, 3), msg, out)  # a message, no figure
    assert hidden not in msg.value and out.outputs == ()


def _styles(ax):
    return [(line.get_linestyle(), line.get_marker()) for line in ax.get_lines() if line.get_label()[:1] != "_"]


def test_lines_of_one_plot_differ_by_more_than_colour():
    rng = np.random.default_rng(0)
    hist = lambda: {"loss": list(rng.random(60)), "accuracy": list(rng.random(60))}  # noqa: E731
    fig = plots.training_curves({"a": hist(), "b": hist(), "c": hist()}, window=5)
    styles = _styles(fig.axes[0])
    assert len(styles) == 3 and len(set(styles)) == 3, styles
    fig = plots.uptraining_curves({k: ([0, 1, 2], [3.0, 2.0, 1.0]) for k in ("x", "y", "z", "u")})
    styles = _styles(fig.axes[0])
    assert len(styles) == 4 and len(set(styles)) == 4, styles
    for view in (kv.render_kv(4096, 8), kv.render_cache_kinds(32768)):
        ax = view.figure.axes[0]
        labelled = [(line.get_linestyle(), line.get_marker()) for line in ax.get_lines()
                    if not line.get_label().startswith("_")]
        assert len(labelled) >= 4 and len(set(labelled)) == len(labelled), labelled
    matplotlib.pyplot.close("all")


def test_heatmaps_use_a_perceptually_uniform_colour_map():
    import inspect

    assert plots.CMAP in ("cividis", "viridis")
    assert inspect.signature(common.matrix_mosaic).parameters["cmap"].default in ("cividis", "viridis")
    fig, ax = matplotlib.pyplot.subplots()
    im = plots.heatmap(ax, np.eye(3))
    assert im.get_cmap().name in ("cividis", "viridis")
    matplotlib.pyplot.close(fig)
    # ... and the explorers' heatmaps say which end of the scale is which, in words.
    assert re.search(r"dark 0 to yellow 1|0 dark to 1 yellow", mha.render_mha(8, 2).alt + " ".join(
        mha.render_mha(8, 2).figure.mhalib_texts))
