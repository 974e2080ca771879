"""The multi-head attention explorers: every reachable slider position renders, and says the right thing.

The attention weights shown are checked against an explicit loop over heads written
here (an independent oracle), and the step-through's last step against
``mhalib.np_attention.multi_head_attention``.
"""

import io

import numpy as np
import pytest

from mhalib import np_attention as npa
from mhalib.sentences import SENTENCES, demo_weights, embed, tokens_of
from mhalib.widgets import common
from mhalib.widgets import mha
from tolerance import float_tol
from mhalib.widgets.mha import (
    D_MODEL_OPTIONS,
    MAX_HEADS,
    STEP_D_MODEL_OPTIONS,
    STEP_MAX_HEADS,
    STEP_SENTENCES,
    STEPS,
    parameter_count,
    render_mha,
    render_step,
)


def loop_weights(tokens, d_model, num_heads):
    """Attention weights per head by an explicit loop: head h uses columns h*d_head..(h+1)*d_head."""
    x = embed(tokens, d_model)
    w_q, w_k, _, _ = demo_weights(d_model)
    d_head = d_model // num_heads
    out = []
    for h in range(num_heads):
        cols = slice(h * d_head, (h + 1) * d_head)
        q, k = x @ w_q[:, cols], x @ w_k[:, cols]
        s = q @ k.T / np.sqrt(d_head)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out.append(e / e.sum(axis=1, keepdims=True))
    return np.stack(out)


# ------------------------------------------------------------------ the H / d_model explorer

@pytest.mark.parametrize("d_model", D_MODEL_OPTIONS)
def test_every_explorer_position_renders_or_explains(d_model):
    for num_heads in range(1, MAX_HEADS + 1):
        for sentence in SENTENCES:
            view = render_mha(d_model, num_heads, sentence)
            assert isinstance(view, common.View)
            if d_model % num_heads:
                assert not view.ok and view.figure is None
                assert f"H = {num_heads} heads cannot share d_model = {d_model}" in view.text
                offered = view.text.split("choose H from ")[1].rstrip(".").split(", ")
                assert offered and all(d_model % int(h) == 0 and int(h) <= MAX_HEADS for h in offered)
                assert "Traceback" not in view.text
                continue
            d_head = d_model // num_heads
            tokens = tokens_of(sentence)
            assert view.ok, view.text
            assert view.data["num_heatmaps"] == num_heads == view.figure.mhalib_panels
            assert view.data["d_head"] == d_head
            assert f"d_head = d_model / H = {d_model} / {num_heads} = {d_head}" in view.text
            assert f"{d_model * d_model:,} per projection" in view.text
            assert f"{4 * d_model * d_model:,} for W_q, W_k, W_v and W_o" in view.text
            shapes = view.data["shapes"]
            n = len(tokens)
            assert shapes["Q_h = transpose"] == (num_heads, n, d_head)
            assert shapes["scores = Q_h K_h^T / sqrt(d_head)"] == (num_heads, n, n)
            assert shapes["out = concat W_o"] == (n, d_model)
            assert f"({num_heads}, {n}, {d_head})" in view.html  # the printed shape trace
            texts = view.figure.mhalib_texts
            assert [f"head {h}" for h in range(num_heads)] == [t for t in texts if t.startswith("head ")]
            assert set(tokens) <= set(texts)  # token labels drawn
            assert view.figure.mhalib_image.shape[1] <= common.MAX_WIDTH_PX  # shown at its own size
            w = view.data["weights"]
            assert w.shape == (num_heads, n, n)
            np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12)


@pytest.mark.parametrize("d_model,num_heads", [(8, 2), (8, 4), (12, 3), (64, 8), (128, 16), (96, 12)])
def test_explorer_weights_match_an_explicit_loop_over_heads(d_model, num_heads):
    for sentence in SENTENCES:
        view = render_mha(d_model, num_heads, sentence)
        np.testing.assert_allclose(view.data["weights"], loop_weights(tokens_of(sentence), d_model, num_heads),
                                   atol=1e-12)


def test_parameter_count_equals_torch_modules_whatever_h():
    from torch import nn

    def count(module):
        return sum(p.numel() for p in module.parameters())

    assert parameter_count(64, 8) == {"per_head": 512, "per_projection": 4096, "total": 16384}
    for h in (1, 2, 4, 8, 16, 32, 64):
        got = parameter_count(64, h)
        assert got["per_head"] == count(nn.Linear(64, 64 // h, bias=False))  # one head's W_q: (d_model, d_head)
        assert got["per_projection"] == count(nn.Linear(64, 64, bias=False))
        assert got["total"] == count(nn.MultiheadAttention(64, h, bias=False))  # W_q, W_k, W_v and W_o


def test_explorer_figure_encodes_to_png():
    view = render_mha(64, 8, "the cat sat on the mat")
    png = common.figure_png(view.figure)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    h, w, c = view.figure.mhalib_image.shape
    assert c == 3 and 50 < h < 1000 and 100 < w < 2000


@pytest.mark.parametrize("args", [(0, 2), (8, 0), (8, -2), (-8, 2), (8, 2, []), ("eight", 2), (8, 2.5)])
def test_bad_values_give_a_message_not_an_exception(args):
    view = render_mha(*args)
    assert not view.ok and view.figure is None and view.text
    assert "Traceback" not in view.text


def test_safe_render_turns_any_exception_into_words():
    def broken():
        raise RuntimeError("boom")

    view = common.safe_render(broken)
    assert not view.ok and "could not be drawn" in view.text and "boom" in view.text


# ------------------------------------------------------------------ readable labels

#: JupyterLab's output area is about 1,090 px wide in a 1,280 px window (the browser
#: tests' size); a wider PNG is scaled down to fit, and its text with it.
OUTPUT_AREA_PX = 1000
#: The smallest readable label: a capital letter (or the ascender of an h) 8 px tall.
READABLE_PX = 8
LONGEST = max(SENTENCES, key=lambda s: len(SENTENCES[s]))


def first_row_label_height(png, n_rows):
    """Measured in the PNG: height in pixels of the ink of the first panel's first row label.

    The first panel's left edge is the first pixel column holding a vertical run of
    non-white pixels at least 60 px long (its cells; a line of text is never that tall).
    Its first row of cells spans the run's length / ``n_rows``; the label of that row is
    the dark ink to the left of the cells in that band.
    """
    from PIL import Image

    a = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)  # (height, width, 3)
    filled = ~(a == 255).all(-1)  # (height, width)
    for x in range(filled.shape[1]):
        edges = np.diff(np.concatenate([[0], filled[:, x].astype(int), [0]]))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if len(starts) and (ends - starts).max() >= 60:
            k = int(np.argmax(ends - starts))
            top, run = starts[k], ends[k] - starts[k]
            break
    else:
        raise AssertionError("no panel of cells found in the image")
    band = a[top:top + int(round(run / n_rows)), :x - 1]  # the first row, left of the cells
    ink_rows = np.flatnonzero((band.mean(-1) < 128).any(1))
    assert len(ink_rows), "no label found left of the first row of cells"
    return int(ink_rows[-1] - ink_rows[0] + 1)


def assert_readable(view, n_rows):
    png = common.figure_png(view.figure)
    width = view.figure.mhalib_image.shape[1]
    assert width <= OUTPUT_AREA_PX, f"{width} px wide: a notebook scales it down, labels with it"
    height = first_row_label_height(png, n_rows)
    assert height >= READABLE_PX, f"token labels {height} px tall; readable is {READABLE_PX} px or more"


@pytest.mark.parametrize("num_heads", [h for h in range(1, MAX_HEADS + 1) if any(d % h == 0 for d in D_MODEL_OPTIONS)])
def test_explorer_token_labels_are_readable_with_the_longest_sentence(num_heads):
    d_model = next(d for d in D_MODEL_OPTIONS if d % num_heads == 0)
    view = render_mha(d_model, num_heads, LONGEST)
    assert_readable(view, len(SENTENCES[LONGEST]))


def test_explorer_token_labels_are_readable_with_the_most_heads():
    for d_model in [d for d in D_MODEL_OPTIONS if d % MAX_HEADS == 0]:
        for sentence in SENTENCES:
            assert_readable(render_mha(d_model, MAX_HEADS, sentence), len(SENTENCES[sentence]))


@pytest.mark.parametrize("step", STEPS)
def test_step_through_token_labels_are_readable_at_the_largest_sizes(step):
    d_model = max(STEP_D_MODEL_OPTIONS)
    sentence = max(STEP_SENTENCES, key=lambda s: len(SENTENCES[s]))
    for num_heads in (1, STEP_MAX_HEADS):
        assert_readable(render_step(step, d_model, num_heads, sentence, True), len(SENTENCES[sentence]))


def test_the_label_measure_sees_a_small_font():
    """The measure above reads what is drawn: 7-point labels measure under 8 px."""
    panels = [common.Panel(np.eye(11), "head 0", SENTENCES[LONGEST], SENTENCES[LONGEST])]
    small = common.matrix_mosaic(panels, cell_px=16, fontsize=7)
    large = common.matrix_mosaic(panels, cell_px=16, fontsize=12)
    assert first_row_label_height(common.figure_png(small), 11) < READABLE_PX
    assert first_row_label_height(common.figure_png(large), 11) >= READABLE_PX


# ------------------------------------------------------------------ the step-through

def expected_shapes(step, n, d_model, num_heads):
    d_head = d_model // num_heads
    per_head = {"split": (n, d_head), "scores": (n, n), "mask": (n, n), "softmax": (n, n),
                "weighted sum": (n, d_head)}
    if step in per_head:
        return [per_head[step]] * num_heads
    if step == "project":
        return [(n, d_model)] * 3
    return [(n, d_model)]


@pytest.mark.parametrize("d_model", STEP_D_MODEL_OPTIONS)
def test_every_step_position_renders_or_explains(d_model):
    for num_heads in range(1, STEP_MAX_HEADS + 1):
        for sentence in STEP_SENTENCES:
            for causal in (False, True):
                for index, step in enumerate(STEPS):
                    view = render_step(step, d_model, num_heads, sentence, causal)
                    if d_model % num_heads:
                        assert not view.ok and "cannot share" in view.text
                        continue
                    n = len(tokens_of(sentence))
                    assert view.ok, view.text
                    assert view.data["index"] == index
                    assert view.data["shapes"] == expected_shapes(step, n, d_model, num_heads)
                    assert view.figure.mhalib_panels == len(view.data["shapes"])
                    assert f"Step {index + 1} of {len(STEPS)}" in view.text
                    mats = view.data["matrices"]
                    cells = sum(m.size for m in mats)
                    values = [t for t in view.figure.mhalib_texts if t.lstrip("-").replace(".", "").isdigit()
                              or t == "-inf"]
                    assert len(values) == cells  # every value written in its cell
                    assert view.figure.mhalib_image.shape[1] <= common.MAX_WIDTH_PX
                    if step == "mask" and causal:
                        upper = np.triu(np.ones((n, n), bool), 1)
                        assert all(np.isneginf(m[upper]).all() and np.isfinite(m[~upper]).all() for m in mats)
                    if step == "softmax":
                        assert all(np.allclose(m.sum(1), 1.0) for m in mats)


@pytest.mark.parametrize("causal", [False, True])
def test_step_through_ends_where_the_library_does(causal):
    for d_model, num_heads in [(8, 2), (8, 4), (12, 3), (16, 8)]:
        for sentence in STEP_SENTENCES:
            tokens = tokens_of(sentence)
            n = len(tokens)
            mask = npa.causal_mask(n) if causal else None
            out, weights = npa.multi_head_attention(embed(tokens, d_model), *demo_weights(d_model), num_heads,
                                                    mask=mask)
            last = render_step("W_o", d_model, num_heads, sentence, causal)
            np.testing.assert_allclose(last.data["matrices"][0], out, atol=1e-12)
            soft = render_step("softmax", d_model, num_heads, sentence, causal)
            np.testing.assert_allclose(np.stack(soft.data["matrices"]), weights, atol=1e-12)
            split = render_step("split", d_model, num_heads, sentence, causal)
            x = embed(tokens, d_model)
            d_head = d_model // num_heads
            w_q = demo_weights(d_model)[0]
            for h in range(num_heads):  # head h holds columns h*d_head .. (h+1)*d_head - 1 of Q
                np.testing.assert_allclose(split.data["matrices"][h], (x @ w_q)[:, h * d_head:(h + 1) * d_head])


@pytest.mark.parametrize("step", [-1, 9, "attend", None])
def test_unknown_steps_are_explained(step):
    view = render_step(step)
    assert not view.ok and view.text and "Traceback" not in view.text


def test_step_by_index_equals_step_by_name():
    for i, name in enumerate(STEPS):
        a, b = render_step(i), render_step(name)
        assert a.data["step"] == b.data["step"] == name


# ------------------------------------------------------------------ the widgets themselves

def _find(widget, cls):
    found = [widget] if isinstance(widget, cls) else []
    for child in getattr(widget, "children", ()):
        found += _find(child, cls)
    return found


def test_mha_explorer_follows_the_widget_contract():
    import ipywidgets as w

    box = mha.mha_explorer()
    assert isinstance(box, w.VBox) and "mhalib-explorer" in box._dom_classes
    sliders = {s.description: s for s in _find(box, (w.IntSlider, w.SelectionSlider))}
    assert set(sliders) == {"H (heads)", "d_model", "layer"}
    assert all(s.continuous_update is False for s in sliders.values())
    (msg,) = [h for h in _find(box, w.HTML) if "mhalib-explorer-message" in h._dom_classes]
    (out,) = [o for o in _find(box, w.Output) if "mhalib-explorer-output" in o._dom_classes]
    assert "d_head = d_model / H = 8 / 2 = 4" in msg.value
    sliders["H (heads)"].value = 3  # 8 / 3: impossible, explained
    assert "cannot share" in msg.value and "choose H from 1, 2, 4, 8" in msg.value
    sliders["d_model"].value = 12  # now 12 / 3 = 4
    assert "d_head = d_model / H = 12 / 3 = 4" in msg.value
    pick, trained_pick = _find(box, w.Dropdown)
    pick.value = "I love deep learning"
    assert "d_head = d_model / H = 12 / 3 = 4" in msg.value
    # the switch to the trained model: its sizes, its layers and its sentences, the others hidden
    assert sliders["layer"].layout.display == "none" and trained_pick.layout.display == "none"
    (mode,) = _find(box, w.ToggleButtons)
    assert all(len(label) <= 15 for label in mode.options)  # a toggle button cuts longer labels off
    mode.value = "trained model"
    assert "<b>Trained</b>" in msg.value and "layer 1; its 2 layers are numbered 0 to 1" in msg.value
    assert (sliders["layer"].min, sliders["layer"].max) == (0, 1)
    assert sliders["H (heads)"].layout.display == "none" and sliders["layer"].layout.display == ""
    sliders["layer"].value = 0
    assert "layer 0; its 2 layers" in msg.value
    mode.value = "random weights"
    assert "d_head = d_model / H = 12 / 3 = 4" in msg.value and sliders["layer"].layout.display == "none"


@pytest.mark.parametrize("sentence", mha.TRAINED_SENTENCES)
def test_trained_heads_are_the_language_models_own_beside_random_ones_of_its_sizes(sentence):
    import torch

    from mhalib.language import encode, load_language_model

    model = load_language_model()
    words = ["<bos>", *sentence.split()]
    for layer in range(model.num_layers):
        view = mha.render_trained(layer, sentence)
        assert view.ok and view.data["num_heatmaps"] == 2 * model.num_heads
        with torch.no_grad():
            _, weights = model(torch.tensor([encode(words)]), return_weights=True)  # (1, L, H, N, N)
        np.testing.assert_allclose(view.data["trained"], weights[0, layer].numpy(), **float_tol(np.float32, 2 * (3 * 64 + 4 * 64) + 16))
        rand = view.data["random"]  # (H, N, N): the demo projections at the model's d_model, causal
        assert rand.shape == view.data["trained"].shape
        assert np.allclose(np.triu(rand, 1), 0.0) and np.allclose(rand.sum(-1), 1.0)
        f = mha.forward_steps(words, model.config.d_model, model.num_heads, causal=True)
        np.testing.assert_allclose(rand, f["weights"])


@pytest.mark.parametrize("layer, sentence, words", [
    (1, "the zebra sleeps .", ["zebra", "only knows its grammar"]),
    (7, mha.TRAINED_SENTENCES[0], ["layers 0 to 1", "layer = 7"]),
    ("one", mha.TRAINED_SENTENCES[0], ["layer"]),
])
def test_trained_view_explains_words_and_layers_it_cannot_show(layer, sentence, words):
    view = mha.render_trained(layer, sentence)
    assert not view.ok and view.figure is None
    for word in words:
        assert word in view.html


def test_step_explorer_buttons_walk_the_steps():
    import ipywidgets as w

    box = mha.step_explorer()
    assert "mhalib-explorer" in box._dom_classes
    (step,) = [s for s in _find(box, w.SelectionSlider) if s.description == "step"]
    assert step.continuous_update is False
    prev, nxt = _find(box, w.Button)
    (msg,) = [h for h in _find(box, w.HTML) if "mhalib-explorer-message" in h._dom_classes]
    assert step.value == "input"
    prev.click()
    assert step.value == "input"  # stays at the first step
    for name in STEPS[1:]:
        nxt.click()
        assert step.value == name and f"<b>{name}</b>: shape" in msg.value
    nxt.click()
    assert step.value == "W_o"


def test_mosaic_draws_masked_cells_grey_and_refuses_bad_panels():
    m = np.array([[0.0, -np.inf], [1.0, 2.0]])
    fig = common.matrix_mosaic([common.Panel(m, "t", annotate=True)], cell_px=20)
    assert "-inf" in fig.mhalib_texts
    px = fig.mhalib_image
    assert px.dtype == np.uint8 and px.shape[2] == 3
    many = [common.Panel(np.zeros((11, 11)), f"head {h}", list("abcdefghijk"), list("abcdefghijk"))
            for h in range(16)]
    fig = common.matrix_mosaic(many, cols=8, cell_px=16, share_labels=True)
    assert fig.mhalib_cols == 4 and fig.mhalib_image.shape[1] <= common.MAX_WIDTH_PX  # 4 x 4, not 8 + 8
    fig = common.matrix_mosaic(many, cols=8, cell_px=16, share_labels=True, max_width=4000)
    assert fig.mhalib_cols == 8
    with pytest.raises(ValueError, match="at least one panel"):
        common.matrix_mosaic([])
    with pytest.raises(ValueError, match="2-D matrix"):
        common.matrix_mosaic([common.Panel(np.zeros(3))])


def test_block_diagram_names_every_head_and_refuses_bad_sizes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mhalib.plots import mha_diagram

    fig = mha_diagram(num_heads=4, d_model=8)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert sum(t.startswith("head ") for t in texts) == 4
    assert any("(8, 2)" in t for t in texts)  # W_q of one head: (d_model, d_k)
    plt.close(fig)
    fig = mha_diagram(num_heads=8, d_model=64)  # drawn as heads 0, 1, ..., 7
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert [t.split(":")[0] for t in texts if t.startswith("head ")] == ["head 0", "head 1", "head 7"]
    assert "..." in texts
    plt.close(fig)
    with pytest.raises(ValueError, match="not divisible"):
        mha_diagram(num_heads=7, d_model=64)


def test_a_message_clears_the_previous_figure():
    import ipywidgets as w

    out, msg = w.Output(), w.HTML()
    common.show_view(render_mha(8, 2), msg, out)
    assert len(out.outputs) == 1 and "image/png" in out.outputs[0]["data"] and "d_head" in msg.value
    common.show_view(render_mha(8, 3), msg, out)
    assert out.outputs == () and "cannot share" in msg.value  # no figure: the old one is gone


def test_step_explorer_lays_out_one_row_per_group():
    import ipywidgets as w

    box = mha.step_explorer()
    controls = box.children[1]
    assert isinstance(controls, w.VBox) and len(controls.children) == 3


@pytest.mark.parametrize("step,keys_are_tokens", [
    ("split", False), ("scores", True), ("mask", True), ("softmax", True), ("weighted sum", False),
])
def test_step_panels_label_columns_as_tokens_only_for_key_positions(step, keys_are_tokens):
    # d_model 8, H 2 and four tokens: d_head = N = 4, so shape alone cannot tell keys from features
    from mhalib.widgets.mha import _step_panels, forward_steps

    f = forward_steps("The cat sat on", 8, 2, causal=True)
    panels = _step_panels(step, f, 2, True, annotate=False)
    assert len(panels) == 2
    for panel in panels:
        assert panel.row_labels is not None and list(panel.row_labels) == list(f["tokens"])
        assert (panel.col_labels is not None) == keys_are_tokens, panel.title
