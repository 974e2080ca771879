"""Plots shared by the notebooks: attention heatmaps with token labels.

Colour map: ``cividis`` by default, readable in grey and by colour-blind readers.
This module imports matplotlib; nothing in the attention core imports it.
"""

from __future__ import annotations

import numpy as np
import matplotlib.pyplot as plt

__all__ = ["CMAP", "heatmap", "attention_grid"]

CMAP = "cividis"


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


def attention_grid(weights, tokens=None, *, row_label="layer", col_label="head", scores=None,
                   cell_size=2.2, suptitle=None):
    """A grid of attention heatmaps: rows are layers (or anything), columns are heads.

    Args:
        weights: ``(H, N, N)`` for one row of heads, or ``(L, H, N, N)``.
        tokens: labels for the N positions (shown on the outer axes only).
        row_label, col_label: used in the panel titles ("layer 0, head 2").
        scores: optional dict name -> array ``(L, H)`` (or ``(H,)``) printed under each title.
        cell_size: inches per panel.
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
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(cell_size * n_cols + 0.8, cell_size * n_rows + 0.6),
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
    return fig
