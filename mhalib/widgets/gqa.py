"""GQA explorer: H query heads in g groups, which query heads share which K/V head, and the cache.

* :func:`render_gqa` (plain function): H, g and a context length give a diagram of the
  H query heads (top row) coloured by the K/V head they read (bottom row: g K/V heads),
  the counts of query and K/V projections, and the KV-cache bytes next to MHA's and MQA's.
* :func:`gqa_explorer`: the sliders. The g slider offers only the divisors of H; the
  render function explains any other value in plain words. It never raises.

The cache sizes use a Llama-2-7B-like stack (32 layers, d_k 128, fp16), so the numbers
can be compared with notebook 06.
"""

from __future__ import annotations

import numpy as np

from mhalib.kv_cache import format_bytes, kv_cache_bytes
from mhalib.validation import divisors
from mhalib.widgets.common import View, choice_slider, connect, explorer_box, message, safe_render, show_view

__all__ = ["HEAD_OPTIONS", "CONTEXT_OPTIONS", "NUM_LAYERS", "HEAD_DIM", "group_of", "render_gqa", "gqa_explorer"]

#: The H values the slider offers.
HEAD_OPTIONS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: The context lengths the slider offers.
CONTEXT_OPTIONS = (1024, 4096, 8192, 32768, 131072)
#: The stack the cache sizes assume (Llama-2-7B-like), stored in fp16.
NUM_LAYERS, HEAD_DIM, BYTES_PER_ELEMENT = 32, 128, 2


def group_of(num_heads, num_kv_heads):
    """K/V head read by each query head: ``h // (H // g)`` (consecutive query heads share).

    Returns:
        ``(H,)`` int array.
    """
    return np.arange(num_heads) // (num_heads // num_kv_heads)


def _whole(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        return f"{name} must be a whole number of at least 1; got {value!r}."
    return None


def _ink(rgba):
    """Black on light colours, white on dark ones."""
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _render_gqa(num_heads, num_kv_heads, context_length=4096):
    from matplotlib import colormaps
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    for value, name in ((num_heads, "H (query heads)"), (num_kv_heads, "g (KV heads)"),
                        (context_length, "The context length")):
        problem = _whole(value, name)
        if problem:
            return message(problem)
    h, g, n = int(num_heads), int(num_kv_heads), int(context_length)
    if g > h:
        return message(f"g = {g} KV heads is more than H = {h} query heads: every K/V head must serve at "
                       f"least one query head. Choose g from {', '.join(map(str, divisors(h)))}.",
                       num_heads=h, num_kv_heads=g)
    if h % g:
        return message(f"H = {h} query heads cannot be split into g = {g} equal groups (H / g must be a "
                       f"whole number). Choose g from {', '.join(map(str, divisors(h)))}.",
                       num_heads=h, num_kv_heads=g)
    rep = h // g
    kind = "MHA (g = H)" if g == h else ("MQA (g = 1)" if g == 1 else f"GQA-{g}")
    groups = group_of(h, g)

    def cache(kv):
        return kv_cache_bytes(NUM_LAYERS, kv, HEAD_DIM, n, bytes_per_element=BYTES_PER_ELEMENT)

    per_layer = kv_cache_bytes(1, g, HEAD_DIM, n, bytes_per_element=BYTES_PER_ELEMENT)
    total, mha, mqa = cache(g), cache(h), cache(1)
    text = (
        f"<p><b>{kind}</b>: H = {h} query heads in g = {g} group{'s' if g > 1 else ''} of H / g = {rep}; "
        f"query head h reads K/V head h // {rep}.<br>"
        f"Projections: {h} query head{'s' if h > 1 else ''} (W_q {h * HEAD_DIM} columns), "
        f"{g} key and {g} value head{'s' if g > 1 else ''} (W_k, W_v {g * HEAD_DIM} columns each).<br>"
        f"KV cache per layer = 2 x g x d_k x n x 2 bytes = 2 x {g} x {HEAD_DIM} x {n:,} x 2 = "
        f"{format_bytes(per_layer)}; x {NUM_LAYERS} layers = <b>{format_bytes(total)}</b> "
        f"(MHA {format_bytes(mha)}, MQA {format_bytes(mqa)}): H / g = {rep}x smaller than MHA.</p>"
    )

    cmap = colormaps["viridis"]
    colours = [cmap(0.9 * j / max(g - 1, 1)) for j in range(g)]
    # fixed margins, not a layout engine: a redraw then costs about a third less
    fig = Figure(figsize=(8.0, 3.4), dpi=80)
    ax, bx = fig.subplots(2, 1, height_ratios=[2.2, 1.0],
                          gridspec_kw=dict(left=0.16, right=0.97, top=0.92, bottom=0.14, hspace=0.5))
    width = 0.8
    for i in range(h):
        ax.add_patch(Rectangle((i - width / 2, 1.0), width, 0.5, color=colours[groups[i]], ec="black", lw=0.5))
    kv_x = np.array([groups.tolist().index(j) + (rep - 1) / 2 for j in range(g)])  # centre of each group
    kv_w = min(max(rep - 0.2, width), 6.0)
    for j in range(g):
        ax.add_patch(Rectangle((kv_x[j] - kv_w / 2, 0.0), kv_w, 0.5, color=colours[j], ec="black", lw=0.8))
    segments = [((i, 1.0), (kv_x[groups[i]], 0.5)) for i in range(h)]
    ax.add_collection(LineCollection(segments, colors=[colours[j] for j in groups], linewidths=1.0))
    if h <= 16:
        for i in range(h):
            ax.text(i, 1.25, f"q{i}", ha="center", va="center", fontsize=8,
                    color=_ink(colours[groups[i]]))
    if g <= 16:
        for j in range(g):
            ax.text(kv_x[j], 0.25, f"KV{j}", ha="center", va="center", fontsize=8,
                    color=_ink(colours[j]))
    ax.set_xlim(-0.7, max(h - 0.3, 2.0))
    ax.set_ylim(-0.1, 1.6)
    ax.set_yticks([0.25, 1.25], ["K/V heads (g)", "query heads (H)"])
    ax.set_xticks([])
    ax.set_xlabel("heads, in order; a colour is one group sharing one K and one V")
    ax.set_title(f"{kind}: which query heads share which K/V head", fontsize=10)
    for spine in ax.spines.values():
        spine.set_visible(False)

    labels = ["MQA (g = 1)", f"this (g = {g})", f"MHA (g = {h})"]
    values = np.array([mqa, total, mha], dtype=float) / 2**30
    bx.barh(labels, values, color=[cmap(0.9), cmap(0.5), cmap(0.1)])
    for y, (value, nbytes) in enumerate(zip(values, (mqa, total, mha))):
        bx.text(value, y, " " + format_bytes(nbytes), va="center", fontsize=8)
    bx.set_xlim(0, values.max() * 1.3)
    bx.set_xlabel(f"KV cache at {n:,} tokens, {NUM_LAYERS} layers, d_k {HEAD_DIM}, fp16 (GiB)")
    bx.tick_params(labelsize=8)
    data = dict(num_heads=h, num_kv_heads=g, group_size=rep, groups=groups, context_length=n,
                cache_bytes=total, mha_bytes=mha, mqa_bytes=mqa, per_layer_bytes=per_layer,
                query_projections=h, kv_projections=g)
    joins = (f"lines joining each run of {rep} consecutive query heads to the K/V head they share" if rep > 1
             else "a line joining each query head to a K/V head of its own")
    alt = (f"Diagram of {kind}: {h} query head{'s' if h > 1 else ''} in a row above {g} K/V "
           f"head{'s' if g > 1 else ''}, {joins}, one colour per group. Below, bars of the KV cache "
           f"at {n:,} tokens: MHA (g = {h}) {format_bytes(mha)}, this setting (g = {g}) "
           f"{format_bytes(total)}, MQA (g = 1) {format_bytes(mqa)}.")
    return View(html=text, figure=fig, ok=True, data=data, alt=alt)


def render_gqa(num_heads, num_kv_heads, context_length=4096):
    """What the GQA explorer shows for one slider position. Never raises.

    Args:
        num_heads: H query heads.
        num_kv_heads: g K/V heads; must divide H (else the view explains which g work).
        context_length: tokens in the cache.

    Returns:
        A :class:`~mhalib.widgets.common.View`; ``view.data`` has ``groups`` (the K/V head
        of each query head), ``cache_bytes``, ``mha_bytes``, ``mqa_bytes``.
    """
    return safe_render(_render_gqa, num_heads, num_kv_heads, context_length)


def gqa_explorer(num_heads=8, num_kv_heads=2, context_length=4096):
    """Sliders for H, g and the context length, redrawing :func:`render_gqa`.

    Returns:
        An ipywidgets ``VBox`` (class ``mhalib-explorer``).
    """
    h_slider = choice_slider("H (heads)", HEAD_OPTIONS, num_heads)
    g_slider = choice_slider("g (KV heads)", divisors(num_heads), num_kv_heads)
    n_slider = choice_slider("context length", CONTEXT_OPTIONS, context_length)
    controls = [h_slider, g_slider, n_slider]
    box, msg, out = explorer_box(controls, title="Grouped-query attention: H and g")
    state = {"busy": False}

    def redraw():
        if not state["busy"]:
            show_view(render_gqa(h_slider.value, g_slider.value, n_slider.value), msg, out)

    def on_heads(change):
        old_g, options = g_slider.value, divisors(change["new"])
        state["busy"] = True
        try:
            g_slider.options = options
            g_slider.value = max(d for d in options if d <= old_g)
        finally:
            state["busy"] = False
        redraw()

    h_slider.observe(on_heads, names="value")
    connect([g_slider, n_slider], redraw)
    return box
