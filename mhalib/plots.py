"""Plots shared by the notebooks: attention heatmaps with token labels.

Colour map: ``cividis`` by default, readable in grey and by colour-blind readers. Lines
of one plot differ by dash pattern or marker as well as by colour, and carry labels.
This module imports matplotlib; nothing in the attention core imports it.
"""

from __future__ import annotations

import numpy as np
import matplotlib.pyplot as plt

__all__ = ["CMAP", "MIN_LABEL_PX", "LINESTYLES", "MARKERS", "heatmap", "attention_grid"]

CMAP = "cividis"
#: Smallest token label the heatmap grids draw, as a font size in pixels of the saved
#: image: DejaVu Sans capitals are 0.73 of the font size, so they are 8 px tall.
#: At matplotlib's default 100 dpi that is 7.9 points.
MIN_LABEL_PX = 11
#: A label's line height over its font size, with a small gap to the next label.
_LINE = 1.25
#: Dash patterns and markers that tell the lines of one plot apart without their colour
#: (for readers who do not see the difference between two colours).
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def heatmap(ax, matrix, *, xlabels=None, ylabels=None, title=None, vmin=0.0, vmax=1.0,
            annotate=None, fmt="{:.2f}", cmap=CMAP, xlabel="key position", ylabel="query position"):
    """Draw one matrix (e.g. attention weights, rows = queries) on ``ax``.

    Args:
        ax: a matplotlib Axes.
        matrix: ``(N_q, N_k)`` array.
        xlabels, ylabels: tick labels (tokens) for keys and queries.
        title: axes title.
        vmin, vmax: colour scale; ``None`` lets matplotlib choose.
        annotate: write the values in the cells; default when the matrix is at most 8 x 8.
        fmt: format of the annotations.

    Returns:
        The image artist (for a colour bar).
    """
    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix; got shape {m.shape}")
    im = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    n_q, n_k = m.shape
    if xlabels is not None:
        ax.set_xticks(range(n_k), labels=list(xlabels), rotation=90 if n_k > 6 else 0)
    if ylabels is not None:
        ax.set_yticks(range(n_q), labels=list(ylabels))
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if annotate is None:
        annotate = n_q <= 8 and n_k <= 8
    if annotate:
        lo = np.nanmin(m[np.isfinite(m)]) if np.isfinite(m).any() else 0.0
        hi = np.nanmax(m[np.isfinite(m)]) if np.isfinite(m).any() else 1.0
        lo = lo if vmin is None else vmin
        hi = hi if vmax is None else vmax
        mid = (lo + hi) / 2
        for i in range(n_q):
            for j in range(n_k):
                ax.text(j, i, fmt.format(m[i, j]), ha="center", va="center", fontsize=8,
                        color="black" if m[i, j] > mid else "white")
    return im


def _ordinal(k):
    return f"{k}{'nd' if k % 10 == 2 and k % 100 != 12 else 'rd' if k % 10 == 3 and k % 100 != 13 else 'th'}"


def _fit_token_labels(fig, axes, tokens):
    """Token labels on the outer axes at a size the panels have room for.

    Every token at matplotlib's tick label size when they fit; otherwise smaller, but
    never below :data:`MIN_LABEL_PX`; and if even that does not fit, every k-th token.

    Returns:
        k: 1 when every token is labelled.
    """
    from matplotlib.font_manager import FontProperties

    n = len(tokens)
    n_rows, n_cols = axes.shape
    px_per_pt = fig.dpi / 72
    default_pt = FontProperties(size=plt.rcParams["ytick.labelsize"]).get_size_in_points()
    cell_px = min(fig.get_size_inches()[0] / n_cols, fig.get_size_inches()[1] / n_rows) * fig.dpi
    if n * _LINE * default_pt * px_per_pt <= 0.5 * cell_px:
        return 1  # fits in half a panel's share of the figure: no need to lay it out first
    fig.draw_without_rendering()  # lay the figure out: the panels' size in pixels
    box = axes[0, 0].get_window_extent()
    pitch = min(box.width, box.height) / n  # pixels per token, along either axis
    if pitch >= _LINE * default_pt * px_per_pt:
        return 1
    size_pt = max(MIN_LABEL_PX / px_per_pt, pitch / (_LINE * px_per_pt))
    stride = int(np.ceil(_LINE * size_pt * px_per_pt / pitch - 1e-9))
    ticks = list(range(0, n, stride))
    labels = [tokens[i] for i in ticks]
    for c in range(n_cols):
        axes[-1, c].set_xticks(ticks, labels=labels, fontsize=size_pt, rotation=90 if n > 6 else 0)
    for r in range(n_rows):
        axes[r, 0].set_yticks(ticks, labels=labels, fontsize=size_pt)
    return stride


def attention_grid(weights, tokens=None, *, row_label="layer", col_label="head", scores=None,
                   cell_size=2.2, suptitle=None):
    """A grid of attention heatmaps: rows are layers (or anything), columns are heads.

    Args:
        weights: ``(H, N, N)`` for one row of heads, or ``(L, H, N, N)``.
        tokens: labels for the N positions (shown on the outer axes only), at
            matplotlib's tick label size when they fit, never smaller than
            :data:`MIN_LABEL_PX`; when even that does not fit (32 tokens in a 2.6-inch
            panel), every other (or every k-th) token is labelled and the figure title
            says so.
        row_label, col_label: used in the panel titles ("layer 0, head 2").
        scores: optional dict name -> array ``(L, H)`` (or ``(H,)``) printed under each title.
        cell_size: inches per panel (each row is a little taller when ``scores`` adds a
            second title line, so the panel itself keeps its size).
        suptitle: figure title.

    Returns:
        The matplotlib Figure.
    """
    w = np.asarray(weights, dtype=float)
    if w.ndim == 3:
        w = w[None]
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"attention_grid needs weights (H, N, N) or (L, H, N, N); got {np.shape(weights)}")
    n_rows, n_cols, n, _ = w.shape
    title_room = 0.25 * n_rows if scores else 0.0  # inches for the second title line
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(cell_size * n_cols + 0.8, cell_size * n_rows + 0.6 + title_room),
                             squeeze=False, constrained_layout=True)
    score_arrays = {k: np.asarray(v, dtype=float).reshape(n_rows, n_cols) for k, v in (scores or {}).items()}
    im = None
    for r in range(n_rows):
        for c in range(n_cols):
            ax = axes[r, c]
            title = f"{row_label} {r}, {col_label} {c}" if n_rows > 1 else f"{col_label} {c}"
            if score_arrays:
                title += "\n" + " ".join(f"{k} {v[r, c]:.2f}" for k, v in score_arrays.items())
            im = heatmap(ax, w[r, c], xlabels=tokens if r == n_rows - 1 else None,
                         ylabels=tokens if c == 0 else None, title=title, annotate=n <= 6,
                         xlabel="key" if r == n_rows - 1 else None, ylabel="query" if c == 0 else None)
            if tokens is None or r != n_rows - 1:
                ax.set_xticks([])
            if tokens is None or c != 0:
                ax.set_yticks([])
            ax.title.set_fontsize(9)
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight")
    if suptitle:
        fig.suptitle(suptitle)
    if tokens is not None:
        stride = _fit_token_labels(fig, axes, [str(t) for t in tokens])
        if stride > 1:
            note = f"every {'other' if stride == 2 else _ordinal(stride)} token labelled"
            fig.suptitle(f"{suptitle}; {note}" if suptitle else note)
    return fig


def mha_diagram(num_heads=3, d_model=None, *, ax=None):
    """A block diagram of multi-head attention: input -> H heads -> concat -> W_o -> output.

    Args:
        num_heads: H; more than 4 heads are drawn as the first two, a gap and the last.
        d_model: if given, the boxes show the sizes (d_k = d_model / H); must be divisible by H.
        ax: an Axes to draw on; by default a new figure.

    Returns:
        The matplotlib Figure.
    """
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from mhalib.validation import check_divisible

    if d_model is not None:
        check_divisible(d_model, num_heads, "d_model", "num_heads")
    d = "d_model" if d_model is None else str(d_model)
    dk = "d_k" if d_model is None else str(d_model // num_heads)
    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 4.2))
    fig = ax.figure
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 6)
    ax.set_axis_off()
    cmap = plt.get_cmap("viridis")

    def box(x, y, w, h, text, colour):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                                    facecolor=colour, edgecolor="black", linewidth=1))
        ax.text(x, y, text, ha="center", va="center", fontsize=9)

    def arrow(x0, y0, x1, y1):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=12,
                                     color="0.3", linewidth=1))

    shown = list(range(num_heads)) if num_heads <= 4 else [0, 1, None, num_heads - 1]
    ys = [5.2 - i * (4.4 / max(len(shown) - 1, 1)) for i in range(len(shown))] if len(shown) > 1 else [3.0]
    box(0.9, 3.0, 1.5, 1.0, f"input x\n(N, {d})", "0.92")
    for i, (h, y) in enumerate(zip(shown, ys)):
        if h is None:
            ax.text(4.3, y, "...", ha="center", va="center", fontsize=14)
            continue
        colour = cmap(0.25 + 0.6 * h / max(num_heads - 1, 1))
        box(4.3, y, 3.6, 0.8, f"head {h}: softmax(Q{h} K{h}\u1d40 / \u221a{dk}) V{h}\n"
                              f"own W_q, W_k, W_v, ({d}, {dk}) each; out (N, {dk})", (*colour[:3], 0.45))
        arrow(1.65, 3.0, 2.45, y)
        arrow(6.15, y, 6.75, 3.0)
    box(7.2, 3.0, 0.9, 1.6, f"concat\n(N, {num_heads}x{dk}\n= {d})" if d_model else "concat\n(N, H d_k\n= d_model)",
        "0.92")
    box(8.25, 3.0, 0.75, 1.0, f"W_o\n({d},\n{d})", "0.85")
    box(9.35, 3.0, 0.9, 1.0, f"output\n(N, {d})", "0.92")
    arrow(7.65, 3.0, 7.87, 3.0)
    arrow(8.63, 3.0, 8.9, 3.0)
    ax.set_title(f"Multi-head attention, H = {num_heads}: every head reads all of x through its own "
                 "projections;\nthe head outputs are concatenated (not summed), then mixed by W_o", fontsize=10)
    return fig


__all__ += ["mha_diagram"]


def _running_mean(values, window):
    v = np.asarray(values, dtype=float)
    if window <= 1 or len(v) < window:
        return np.arange(1, len(v) + 1), v
    kernel = np.ones(window) / window
    return np.arange(window, len(v) + 1), np.convolve(v, kernel, mode="valid")


def training_curves(histories, *, window=20, marks=None, title=None):
    """Loss and accuracy against training step, one line per run.

    Args:
        histories: dict label -> history (``{"loss": [...], "accuracy": [...]}``, one
            value per step, as returned by ``mhalib.copytask.training.train``), or one history.
        window: running-mean window in steps (the raw per-batch values are noisy).
        marks: optional dict label -> step, drawn as dashed vertical lines.
        title: figure title.

    Returns:
        The matplotlib Figure (loss on the left, accuracy on the right).
    """
    if "loss" in histories and "accuracy" in histories:
        histories = {"": histories}
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.85, max(len(histories), 1)))
    for i, (colour, (label, hist)) in enumerate(zip(colours, histories.items())):
        for ax, key in ((ax_loss, "loss"), (ax_acc, "accuracy")):
            steps, values = _running_mean(hist[key], window)
            # each run its own dash pattern too: the legend does not rest on colour alone
            ax.plot(steps, values, color=colour, linestyle=LINESTYLES[i % len(LINESTYLES)], label=label or None)
    for label, step in (marks or {}).items():
        for ax in (ax_loss, ax_acc):
            ax.axvline(step, color="grey", linestyle="--", linewidth=1)
        ax_acc.annotate(label, (step, 0.05), rotation=90, fontsize=8, ha="right", color="grey")
    ax_loss.set_xlabel("training step")
    ax_loss.set_ylabel(f"loss on copy positions ({window}-step mean)")
    ax_acc.set_xlabel("training step")
    ax_acc.set_ylabel(f"accuracy on copy positions ({window}-step mean)")
    ax_acc.set_ylim(0, 1.02)
    if len(histories) > 1:
        ax_loss.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig


def uptraining_curves(curves, *, reference=None, marks=None, title=None, ylabel="evaluation loss",
                      styles=None, log=True):
    """Evaluation loss against uptraining step, one line per converted model.

    Args:
        curves: dict label -> ``(steps, losses)`` (two equal-length sequences).
        reference: optional loss of the original model, drawn as a horizontal line.
        marks: optional dict label -> step, drawn as dashed vertical lines (e.g. "5%").
        title: axes title.
        styles: optional dict label -> matplotlib line keywords (``color``, ``linestyle``);
            by default colours follow ``viridis`` in the order of ``curves``.
        log: logarithmic loss axis (losses span several orders of magnitude).

    Returns:
        The matplotlib Figure.
    """
    fig, ax = plt.subplots(figsize=(8.5, 4.4), constrained_layout=True)
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, max(len(curves), 1)))
    for i, (colour, (label, (steps, losses))) in enumerate(zip(colours, curves.items())):
        # each curve its own marker too: the legend does not rest on colour alone
        style = {"color": colour, "marker": MARKERS[i % len(MARKERS)], **((styles or {}).get(label, {}))}
        ax.plot(steps, losses, label=label, markersize=4, **style)
    if reference is not None:
        ax.axhline(reference, color="black", linewidth=1, label="original MHA model")
    if log:
        ax.set_yscale("log")
    for label, step in (marks or {}).items():
        ax.axvline(step, color="grey", linestyle="--", linewidth=1)
        ax.annotate(label, (step, 1.0), xycoords=("data", "axes fraction"), fontsize=8, ha="left",
                    va="top", color="grey")
    ax.set_xlabel("uptraining step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    if title:
        ax.set_title(title)
    return fig


__all__ += ["training_curves", "uptraining_curves"]
