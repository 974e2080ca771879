"""The KV-cache and GQA explorers: every reachable slider position renders, with the right numbers.

Bytes are checked against the formula written out here, and the grouping against
``repeat_interleave`` order (query head h reads K/V head h // (H / g)).
"""

import io

import numpy as np
import pytest

from mhalib.kv_cache import MODEL_CONFIGS
from mhalib.validation import divisors
from mhalib.widgets import common
from mhalib.widgets.gqa import CONTEXT_OPTIONS as GQA_CONTEXTS
from mhalib.widgets.gqa import HEAD_OPTIONS, HEAD_DIM, NUM_LAYERS, gqa_explorer, group_of, render_gqa
from mhalib.widgets.kv import CONTEXT_OPTIONS, DTYPE_BYTES, kv_explorer, render_kv


def draws_a_png_and_leaves_no_pyplot_figure_open(render, *args):
    """The view's figure encodes to a PNG of the figure's pixel size; no pyplot figure stays open."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    open_before = plt.get_fignums()
    view = render(*args)
    assert view.ok, view.text
    assert view.figure is not None
    png = common.figure_png(view.figure)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = (view.figure.get_size_inches() * view.figure.dpi).round().astype(int)
    assert Image.open(io.BytesIO(png)).size == (width, height)
    assert plt.get_fignums() == open_before  # built as a plain Figure, never registered with pyplot
    return view


# ------------------------------------------------------------------ KV-cache explorer

@pytest.mark.parametrize("model", list(MODEL_CONFIGS))
def test_kv_every_reachable_position_renders_with_the_formula(model):
    c = MODEL_CONFIGS[model]
    for g in divisors(c["num_heads"]):  # what the g slider offers for this model
        for n, dtypes in ((CONTEXT_OPTIONS[0], ["fp16 / bf16"]), (4096, list(DTYPE_BYTES)),
                          (CONTEXT_OPTIONS[-1], ["fp16 / bf16"])):
            for dtype in dtypes:
                bpe = DTYPE_BYTES[dtype]
                view = render_kv(n, g, model, dtype)
                assert view.ok, view.text
                want = 2 * c["num_layers"] * g * c["head_dim"] * bpe
                assert view.data["bytes_per_token"] == want
                assert view.data["total_bytes"] == want * n
                assert view.data["reduction"] == c["num_heads"] // g
                assert view.figure is not None
                view.figure.clear()


@pytest.mark.parametrize("n", CONTEXT_OPTIONS)
def test_kv_every_context_draws(n):
    view = draws_a_png_and_leaves_no_pyplot_figure_open(render_kv, n, 8, "Llama-3-8B")
    assert view.data["context_length"] == n
    assert view.data["total_bytes"] == 2 * 32 * 8 * 128 * n * 2  # Llama-3-8B: 32 layers, d_k 128, fp16


def test_kv_llama2_7b_numbers_in_the_text():
    view = render_kv(4096, 32, "Llama-2-7B")
    assert "512 KiB per token" in view.text and "2 GiB" in view.text
    view = render_kv(4096, 8, "Llama-2-7B")
    assert "128 KiB per token" in view.text and "512 MiB" in view.text and "4x smaller" in view.text
    ax = view.figure.axes[0]
    assert ax.get_xlabel() and ax.get_ylabel()


@pytest.mark.parametrize("args, given, allowed", [
    ((4096, 3, "Llama-2-7B"), "g = 3", "Choose g from 1, 2, 4, 8, 16, 32"),
    ((4096, 2, "Falcon-7B"), "g = 2", "Choose g from 1, 71"),
    ((4096, 64, "GPT-2"), "g = 64", "Choose g from 1, 2, 3, 4, 6, 12"),
    ((0, 8, "Llama-2-7B"), "got 0", "at least 1"),
    ((4096, 0, "Llama-2-7B"), "got 0", "at least 1"),
    ((4096, 8, "Llama-9"), "'Llama-9'", "GPT-2, Llama-2-7B, Llama-2-70B"),
    ((4096, 8, "Llama-2-7B", "fp8"), "'fp8'", "fp32, fp16 / bf16, int8"),
    ((4096.5, 8, "Llama-2-7B"), "got 4096.5", "whole number"),
    ((4096, True, "GPT-2"), "got True", "whole number"),
])
def test_kv_impossible_positions_name_what_was_given_and_what_is_allowed(args, given, allowed):
    view = render_kv(*args)
    assert not view.ok and view.figure is None
    assert "Traceback" not in view.text
    assert given in view.text and allowed in view.text, view.text


def test_kv_bad_g_lists_the_divisors():
    view = render_kv(4096, 3, "Llama-2-7B")
    assert "Choose g from 1, 2, 4, 8, 16, 32" in view.text


def test_kv_explorer_follows_the_contract():
    box = kv_explorer()
    assert "mhalib-explorer" in box._dom_classes
    sliders = [w for w in box.children[1].children if hasattr(w, "continuous_update")]
    assert {s.description for s in sliders} == {"context length", "g (KV heads)"}
    assert all(s.continuous_update is False for s in sliders)
    model = box.children[1].children[0]
    g_slider = next(s for s in sliders if s.description == "g (KV heads)")
    model.value = "Falcon-7B"
    assert list(g_slider.options) == [1, 71] and g_slider.value == 1
    message = box.children[2]
    assert "mhalib-explorer-message" in message._dom_classes and "Falcon-7B" in message.value
    assert "mhalib-explorer-output" in box.children[3]._dom_classes


# ------------------------------------------------------------------ GQA explorer

def test_group_of_is_repeat_interleave_order():
    for h in HEAD_OPTIONS:
        for g in divisors(h):
            want = np.repeat(np.arange(g), h // g)  # repeat_interleave, not tile
            assert np.array_equal(group_of(h, g), want)


@pytest.mark.parametrize("h", HEAD_OPTIONS)
def test_gqa_every_reachable_position_renders(h):
    for g in divisors(h):  # what the g slider offers
        view = render_gqa(h, g, 4096)
        assert view.ok, view.text
        assert np.array_equal(view.data["groups"], np.arange(h) // (h // g))
        assert view.data["cache_bytes"] == 2 * NUM_LAYERS * g * HEAD_DIM * 4096 * 2
        assert view.data["mha_bytes"] == view.data["cache_bytes"] * (h // g)
        assert view.data["query_projections"] == h and view.data["kv_projections"] == g
        fig = view.figure
        assert fig is not None and len(fig.axes) == 2
        kv_boxes = [p for p in fig.axes[0].patches if p.get_y() == 0.0]
        assert len(fig.axes[0].patches) == h + g and len(kv_boxes) == g
        fig.clear()


@pytest.mark.parametrize("n", GQA_CONTEXTS)
def test_gqa_every_context_draws(n):
    view = draws_a_png_and_leaves_no_pyplot_figure_open(render_gqa, 32, 8, n)
    assert view.data["context_length"] == n
    assert view.data["cache_bytes"] == 2 * NUM_LAYERS * 8 * HEAD_DIM * n * 2


def test_gqa_kinds_named():
    assert "MHA" in render_gqa(8, 8).text
    assert "MQA" in render_gqa(8, 1).text
    assert "GQA-2" in render_gqa(8, 2).text and "H / g = 4x smaller" in render_gqa(8, 2).text


@pytest.mark.parametrize("h", HEAD_OPTIONS)
def test_gqa_unreachable_g_explained(h):
    for g in range(1, 70):
        if h % g == 0:
            continue
        view = render_gqa(h, g)
        assert not view.ok and view.figure is None
        assert "Choose g from " + ", ".join(map(str, divisors(h))) in view.text


@pytest.mark.parametrize("args", [(0, 1), (8, 0), (8, 2.5), ("8", 2), (8, 2, -1)])
def test_gqa_bad_values_explained(args):
    view = render_gqa(*args)
    assert not view.ok and "Traceback" not in view.text


def test_gqa_explorer_restricts_g_to_divisors():
    box = gqa_explorer(8, 2)
    assert "mhalib-explorer" in box._dom_classes
    h_slider, g_slider, n_slider = box.children[1].children
    assert (h_slider.description, g_slider.description, n_slider.description) == (
        "H (heads)", "g (KV heads)", "context length")
    assert all(s.continuous_update is False for s in (h_slider, g_slider, n_slider))
    h_slider.value = 12
    assert list(g_slider.options) == divisors(12) and g_slider.value == 2
    h_slider.value = 1
    assert list(g_slider.options) == [1] and g_slider.value == 1
    message = box.children[2]
    assert "mhalib-explorer-message" in message._dom_classes and "MHA" in message.value


# ------------------------------------------------------------------ both: nothing drawn off the canvas

def _inside_canvas(fig):
    """Every Axes, with its tick labels, axis labels, title and legend, lies inside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    for ax in fig.axes:
        box = ax.get_tightbbox(renderer)
        assert box.x0 >= -1 and box.y0 >= -1 and box.x1 <= width + 1 and box.y1 <= height + 1, (
            f"{ax.get_title() or ax.get_xlabel()!r} reaches outside the {width:.0f} x {height:.0f} canvas: {box}")


@pytest.mark.parametrize("model", list(MODEL_CONFIGS))
def test_kv_figure_fits_its_canvas(model):
    # the longest labels: the largest batch in the y label, the largest context, g = 1 and g = H
    for g in (1, MODEL_CONFIGS[model]["num_heads"]):
        for dtype in DTYPE_BYTES:
            view = render_kv(CONTEXT_OPTIONS[-1], g, model, dtype, batch_size=64)
            assert view.ok, view.text
            _inside_canvas(view.figure)


@pytest.mark.parametrize("h", [1, 8, 16, 64])
def test_gqa_figure_fits_its_canvas(h):
    for g in (1, h):
        for n in (GQA_CONTEXTS[0], GQA_CONTEXTS[-1]):
            view = render_gqa(h, g, n)
            assert view.ok, view.text
            _inside_canvas(view.figure)
