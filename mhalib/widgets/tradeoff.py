"""Trade-off explorer (notebook 10): where one attention configuration sits among the measured ones.

* :func:`render_tradeoff` (plain function): the number of K/V heads g, the latent size and
  the window pick one configuration; the view draws every measured variant (mean over its
  seeds) as quality against cache bytes, the frontier through them, and the chosen one
  ringed, with its numbers. Nothing is trained or measured live: a configuration that was
  not trained gets a message naming the ones that were.
* :func:`tradeoff_explorer`: the sliders.

Render functions never raise.
"""

from __future__ import annotations

import html

import numpy as np

from mhalib.widgets.common import View, choice_slider, connect, explorer_box, message, safe_render, show_view

__all__ = ["KV_OPTIONS", "LATENT_OPTIONS", "WINDOW_OPTIONS", "METRICS", "configuration_name", "render_tradeoff",
           "tradeoff_explorer"]

KV_OPTIONS = (8, 4, 2, 1)
LATENT_OPTIONS = ("none", 16, 32)
WINDOW_OPTIONS = ("none", 8, 16, "8 + sink", "16 + sink")
#: What the vertical axis can show: (key in the measurements, label, higher is better).
METRICS = {"recall": ("recall", "recall (all pairs)", True), "loss": ("loss", "grammar loss (nats/token)", False),
           "coreference": ("coreference", "coreference probe", True)}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")


def configuration_name(num_kv_heads, latent, window):
    """The measured variant's name for these slider values, or ``None`` with a reason.

    Returns:
        ``(name, None)`` or ``(None, why)``.
    """
    if latent != "none" and window != "none":
        return None, (f"latent attention with a window (MLA-{latent} with a window of {window}) was not trained: "
                      f"choose a latent size or a window, not both")
    if latent != "none":
        if num_kv_heads != 8:
            return None, (f"latent attention caches one latent for all 8 heads: it has no K/V heads to group "
                          f"(g = {num_kv_heads}); set g back to 8 for MLA-{latent}")
        return f"MLA-{latent}", None
    if window != "none":
        if num_kv_heads != 8:
            return None, (f"the windows were trained with 8 K/V heads; g = {num_kv_heads} with a window of {window} "
                          f"was not trained")
        w = str(window).replace(" + sink", "")
        return f"SWA-{w}" + ("+sink" if "sink" in str(window) else ""), None
    return {8: "MHA", 4: "GQA-4", 2: "GQA-2", 1: "MQA"}.get(num_kv_heads), None


def _load_results():
    import json

    from mhalib.data import DATA_DIR

    return json.loads((DATA_DIR / "variants.json").read_text())


def _render(num_kv_heads, latent, window, metric, results):
    from matplotlib.figure import Figure

    from mhalib.variants.compare import pareto_front, summarize
    from mhalib.variants.model import FIXED_WIDTH

    if metric not in METRICS:
        return message(f"Unknown quantity {metric!r}; choose one of {', '.join(METRICS)}.")
    for label, value, options in (("g", num_kv_heads, KV_OPTIONS), ("latent size", latent, LATENT_OPTIONS),
                                  ("window", window, WINDOW_OPTIONS)):
        if value not in options:
            return message(f"The {label} must be one of {', '.join(map(str, options))}; got {value!r}.")
    name, why = configuration_name(num_kv_heads, latent, window)
    measured = [v for v in FIXED_WIDTH if v in results["runs"]]
    if name is None or name not in results["runs"]:
        chosen = f"g = {num_kv_heads}, latent {latent}, window {window}, showing {metric}: "
        return message(chosen + (why or f"{name} was not trained") + ". Measured: " + ", ".join(measured) + ".")
    key, label, higher = METRICS[metric]
    table = summarize({v: results["runs"][v] for v in measured}, key)
    costs = np.array([results["shapes"][v]["cache_bytes_64"] for v in measured], dtype=float)
    quality = np.array([table[v]["mean"] for v in measured])
    front = pareto_front(costs, quality if higher else -quality)
    fig = Figure(figsize=(7.0, 4.2), layout="constrained")
    ax = fig.subplots()
    order = np.argsort(costs[front])
    ax.plot(costs[front][order], quality[front][order], "-", color="0.6", zorder=1, label="frontier")
    for i, v in enumerate(measured):
        spread = [table[v]["min"], table[v]["max"]]
        ax.plot([costs[i]] * 2, spread, "-", color="0.75", zorder=1)
        ax.scatter(costs[i], quality[i], marker=MARKERS[i % len(MARKERS)], s=40, zorder=2, label=v)
    i = measured.index(name)
    ax.scatter(costs[i], quality[i], s=260, facecolors="none", edgecolors="black", linewidths=2, zorder=3)
    ax.annotate(name, (costs[i], quality[i]), textcoords="offset points", xytext=(10, -14), fontweight="bold")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cache of one 64-token sequence, 2 layers, fp16 (bytes)")
    ax.set_ylabel(label + (" (higher is better)" if higher else " (lower is better)"))
    ax.legend(fontsize=7, ncol=2, loc="best")
    on = "on the frontier" if front[i] else ("off the frontier (another variant costs no more and is at least as good, "
                                             "better in one)")
    n = table[name]["n"]
    text = (f"<p><b>{html.escape(name)}</b>: cache {int(costs[i]):,} bytes at 64 tokens "
            f"({costs[i] / results['shapes']['MHA']['cache_bytes_64']:.3g} of MHA's); {html.escape(label)} "
            f"{table[name]['mean']:.3f} (mean of {n} seeds, {table[name]['min']:.3f} to {table[name]['max']:.3f}); "
            f"{on}.</p>")
    alt = (f"Scatter of {label} against cache bytes for {len(measured)} measured attention variants, the frontier "
           f"drawn through {int(front.sum())} of them; {name} is ringed at {int(costs[i]):,} bytes and "
           f"{table[name]['mean']:.3f}, {on}.")
    return View(html=text, figure=fig, ok=True, alt=alt,
                data={"name": name, "cost": float(costs[i]), "quality": float(quality[i]), "on_front": bool(front[i]),
                      "frontier": [v for v, f in zip(measured, front) if f]})


def render_tradeoff(num_kv_heads=8, latent="none", window="none", metric="recall", results=None):
    """The view for one slider position (never raises).

    Args:
        num_kv_heads: g, one of :data:`KV_OPTIONS`.
        latent: ``"none"`` or a latent size of :data:`LATENT_OPTIONS`.
        window: ``"none"`` or one of :data:`WINDOW_OPTIONS`.
        metric: a key of :data:`METRICS`.
        results: the measurements (default: ``mhalib/data/variants.json``).
    """
    def run():
        return _render(num_kv_heads, latent, window, metric, _load_results() if results is None else results)

    return safe_render(run)


def tradeoff_explorer(num_kv_heads=8, latent="none", window="none", metric="recall"):
    """Sliders for g, the latent size and the window, and a choice of quality, redrawing :func:`render_tradeoff`.

    Returns:
        An ipywidgets ``VBox`` (class ``mhalib-explorer``).
    """
    import ipywidgets as w

    g_slider = choice_slider("g (K/V heads)", KV_OPTIONS, num_kv_heads)
    latent_slider = choice_slider("latent size", LATENT_OPTIONS, latent)
    window_slider = choice_slider("window", WINDOW_OPTIONS, window)
    what = choice_slider("quality", tuple(METRICS), metric)
    controls = [w.HBox([g_slider, latent_slider]), w.HBox([window_slider, what])]
    box, msg, out = explorer_box(controls, title="Where a configuration sits: quality against cache")
    def redraw():
        show_view(render_tradeoff(g_slider.value, latent_slider.value, window_slider.value, what.value), msg, out)

    connect([g_slider, latent_slider, window_slider, what], redraw)
    return box
