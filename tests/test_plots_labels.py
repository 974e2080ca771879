"""Token labels of ``mhalib.plots.attention_grid`` are readable: big enough and apart.

Notebook 04 draws a 2 x 4 grid of 32-token heatmaps with ``cell_size=2.6`` at
matplotlib's default 100 dpi (what the notebook's inline figures use). A label is
readable here when its capital letters are at least 8 px tall in the saved image
(font size in points x dpi / 72 x the font's own cap-height ratio, read from the font
file) and its box does not overlap the next label's.
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib import font_manager, ft2font  # noqa: E402

from mhalib.plots import attention_grid  # noqa: E402

READABLE_CAP_PX = 8


def cap_height_px(label, dpi):
    """Height in pixels of a capital letter of ``label``'s font at its size."""
    font = ft2font.FT2Font(font_manager.findfont(label.get_fontproperties()))
    font.set_size(100, 72)  # a 100 px em
    cap_ratio = font.load_char(ord("H"), flags=ft2font.LoadFlags.NO_HINTING).height / 64 / 100
    return label.get_fontsize() * dpi / 72 * cap_ratio


def shown(labels):
    return [t for t in labels if t.get_visible() and t.get_text()]


def grid(n_tokens, *, layers=2, heads=4, cell_size=2.6, scores=True, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.random((layers, heads, n_tokens, n_tokens)) ** 8  # (L, H, N, N)
    w /= w.sum(-1, keepdims=True)
    tokens = [str(t) for t in rng.integers(0, 64, n_tokens)]  # like notebook 04's token ids
    s = {"prev": rng.random((layers, heads)), "ind": rng.random((layers, heads))} if scores else None
    with matplotlib.rc_context({"figure.dpi": 100}):
        fig = attention_grid(w, tokens=tokens, cell_size=cell_size, scores=s, suptitle="one sequence")
        fig.canvas.draw()
    return fig, tokens


def check_readable(fig, tokens):
    """Every shown label: big enough, the right token at its tick, not overlapping its neighbour.

    Returns:
        The step between labelled positions (1: every token).
    """
    renderer = fig.canvas.get_renderer()
    steps = set()
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    for ax in panels:
        for axis, labels, ticks in (("x", ax.get_xticklabels(), ax.get_xticks()),
                                    ("y", ax.get_yticklabels(), ax.get_yticks())):
            labels = shown(labels)
            if not labels:
                continue
            for label in labels:
                cap = cap_height_px(label, fig.dpi)
                assert cap >= READABLE_CAP_PX, f"{label.get_text()!r}: capitals {cap:.1f} px tall"
            positions = [int(round(v)) for v in ticks]
            assert [t.get_text() for t in labels] == [tokens[i] for i in positions]
            steps |= set(np.diff(positions).tolist())
            boxes = sorted((t.get_window_extent(renderer) for t in labels),
                           key=lambda b: b.x0 if axis == "x" else b.y0)
            for a, b in zip(boxes, boxes[1:]):
                gap = b.x0 - a.x1 if axis == "x" else b.y0 - a.y1
                assert gap >= 0, f"{axis} labels overlap by {-gap:.1f} px"
    assert len(steps) <= 1, f"uneven label spacing: {steps}"
    return steps.pop() if steps else 1


def test_notebook_04_grid_labels_are_readable():
    fig, tokens = grid(32)
    assert fig.dpi == 100
    step = check_readable(fig, tokens)
    assert step == 2  # 32 tokens do not fit in a 2.6-inch panel at a readable size; 16 do
    assert fig.get_suptitle() == "one sequence; every other token labelled"
    plt.close(fig)


def test_notebook_04_fixed_offset_grid_one_layer():
    fig, tokens = grid(32, layers=1, scores=True)
    assert check_readable(fig, tokens) == 2
    assert fig.get_suptitle().endswith("; every other token labelled")
    plt.close(fig)


@pytest.mark.parametrize("n_tokens,cell_size", [(4, 2.8), (6, 2.2), (11, 2.2), (16, 3.2)])
def test_short_sentences_label_every_token(n_tokens, cell_size):
    fig, tokens = grid(n_tokens, layers=1, heads=2, cell_size=cell_size, scores=False)
    assert check_readable(fig, tokens) == 1
    assert fig.get_suptitle() == "one sequence"
    plt.close(fig)


def test_the_check_catches_small_and_crowded_labels():
    """What notebook 04 used to do: 5-point labels; and 32 labels at the default size."""
    fig, tokens = grid(32)
    for ax in fig.axes[:-1]:
        ax.tick_params(labelsize=5)
    fig.canvas.draw()
    with pytest.raises(AssertionError, match="capitals"):
        check_readable(fig, tokens)
    plt.close(fig)
    fig, tokens = grid(32)
    for ax in fig.axes[:-1]:
        if shown(ax.get_yticklabels()):
            ax.set_yticks(range(32), labels=tokens)
    fig.canvas.draw()
    with pytest.raises(AssertionError, match="overlap"):
        check_readable(fig, tokens)
    plt.close(fig)
