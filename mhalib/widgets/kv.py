"""KV-cache explorer: how many bytes decoding keeps, for real models, context lengths and KV heads.

* :func:`render_kv` (plain function): a model from :data:`mhalib.kv_cache.MODEL_CONFIGS`,
  a context length and a number of KV heads g give the cache size per token and per
  sequence, and a plot of cache size against context length for every model.
* :func:`kv_explorer`: the sliders.
* :func:`render_cache_kinds`, :func:`cache_kinds_explorer` (notebook 09): MHA, GQA-8, GQA-8
  with a sliding window (a rolling buffer) and multi-head latent attention side by side.

The number of KV heads may differ from the model's own: "what if Llama-2-7B used
GQA-8?" g must divide the model's H query heads; any other value gets a message that
says which values work. Render functions never raise.
"""

from __future__ import annotations

import html

import numpy as np

from mhalib.kv_cache import MODEL_CONFIGS, format_bytes, kv_cache_bytes
from mhalib.validation import divisors
from mhalib.widgets.common import View, choice_slider, connect, explorer_box, message, safe_render, show_view

__all__ = ["CONTEXT_OPTIONS", "DTYPE_BYTES", "render_kv", "kv_explorer", "WINDOW_OPTIONS", "render_cache_kinds",
           "cache_kinds_explorer"]

#: The context lengths the slider offers (tokens).
CONTEXT_OPTIONS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
#: Bytes per element of the cache for each storage type.
DTYPE_BYTES = {"fp32": 4, "fp16 / bf16": 2, "int8": 1}
#: Markers and dash patterns that tell the lines apart without their colour.
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", ":")


def _cache_axes(ax, ns, dtype, b):
    """Log-log axes for cache bytes against context length ``ns``, labelled in bytes and tokens."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_locator(LogLocator(base=4))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: format_bytes(y * 2**30)))
    ax.set_xticks(ns, [f"{int(x) // 1024}k" if x >= 1024 else str(int(x)) for x in ns])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(f"KV cache ({dtype}" + (f", batch {b})" if b > 1 else ")"))


def _render_kv(context_length, num_kv_heads, model="Llama-2-7B", dtype="fp16 / bf16", batch_size=1):
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    if model not in MODEL_CONFIGS:
        return message(f"Unknown model {model!r}; choose one of {', '.join(MODEL_CONFIGS)}.")
    if dtype not in DTYPE_BYTES:
        return message(f"Unknown storage type {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}.")
    c = MODEL_CONFIGS[model]
    h = c["num_heads"]
    for name, value in (("context length", context_length), ("KV heads", num_kv_heads), ("batch", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            return message(f"The {name} must be a whole number of at least 1; got {value!r}.")
    g, n, b = int(num_kv_heads), int(context_length), int(batch_size)
    if h % g:
        return message(
            f"{model} has H = {h} query heads, which cannot be split into g = {g} equal groups: "
            f"each KV head serves H / g query heads, so g must divide H. "
            f"Choose g from {', '.join(map(str, divisors(h)))}.", model=model, num_heads=h, num_kv_heads=g)
    bpe = DTYPE_BYTES[dtype]
    per_token = kv_cache_bytes(c["num_layers"], g, c["head_dim"], 1, bytes_per_element=bpe)
    total = kv_cache_bytes(c["num_layers"], g, c["head_dim"], n, batch_size=b, bytes_per_element=bpe)
    own = kv_cache_bytes(c["num_layers"], c["num_kv_heads"], c["head_dim"], n, batch_size=b, bytes_per_element=bpe)
    kind = "MHA" if g == h else ("MQA" if g == 1 else f"GQA-{g}")
    text = (
        f"<p><b>{html.escape(model)}</b> ({c['num_layers']} layers, H = {h}, d_k = {c['head_dim']}) "
        f"with <b>g = {g}</b> KV head{'s' if g > 1 else ''} ({kind}; the released model has g = {c['num_kv_heads']}).<br>"
        f"Cache = 2 x layers x g x d_k x bytes = 2 x {c['num_layers']} x {g} x {c['head_dim']} x {bpe} "
        f"= <b>{format_bytes(per_token)} per token</b>; at {n:,} tokens"
        + (f" x batch {b}" if b > 1 else "")
        + f": <b>{format_bytes(total)}</b>"
        + ("" if g == c["num_kv_heads"] else f" (the released g = {c['num_kv_heads']}: {format_bytes(own)})")
        + f".<br>Compared with MHA (g = H = {h}) the cache is {h // g}x smaller.</p>"
    )

    # fixed margins, not a layout engine: a redraw then costs about half as much
    fig = Figure(figsize=(7.0, 3.6), dpi=80)
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.13, top=0.92)
    ax = fig.add_subplot()
    ns = np.array(CONTEXT_OPTIONS, dtype=float)
    names = list(MODEL_CONFIGS)
    colours = [colormaps["viridis"](i / max(len(names) - 1, 1)) for i in range(len(names))]
    for i, (name, colour) in enumerate(zip(names, colours)):
        m = MODEL_CONFIGS[name]
        per = kv_cache_bytes(m["num_layers"], m["num_kv_heads"], m["head_dim"], 1, batch_size=b,
                             bytes_per_element=bpe)
        # a marker of its own beside the colour: the legend does not rest on colour alone
        ax.plot(ns, ns * per / 2**30, color=colour, lw=1.2, alpha=0.8, marker=MARKERS[i % len(MARKERS)],
                markersize=4, label=f"{name} (g = {m['num_kv_heads']})")
    ax.plot(ns, ns * per_token * b / 2**30, color="black", lw=2.5, ls="--",
            label=f"{model} with g = {g}")
    ax.plot([n], [total / 2**30], "o", color="black", ms=8)
    right_end = n >= CONTEXT_OPTIONS[-3]  # near the right edge the label goes to the left of the point
    ax.annotate(format_bytes(total), (n, total / 2**30), textcoords="offset points",
                xytext=(-8, 4) if right_end else (6, -12), ha="right" if right_end else "left")
    _cache_axes(ax, ns, dtype, b)
    ax.set_title("KV-cache size grows linearly with context; fewer KV heads shift the line down")
    ax.title.set_fontsize(10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    data = dict(model=model, num_heads=h, num_kv_heads=g, context_length=n, batch_size=b,
                bytes_per_element=bpe, bytes_per_token=per_token, total_bytes=total, released_bytes=own,
                reduction=h // g)
    released = ", ".join(f"{k} g = {v['num_kv_heads']}" for k, v in MODEL_CONFIGS.items())
    alt = (f"Log-log chart of the KV cache ({dtype}" + (f", batch {b}" if b > 1 else "") + ") against the "
           f"context length, {CONTEXT_OPTIONS[0]} to {CONTEXT_OPTIONS[-1] // 1024}k tokens: a straight line per "
           f"released model ({released}), "
           f"and {model} with g = {g} as a thick dashed black line, {format_bytes(total)} at {n:,} tokens.")
    return View(html=text, figure=fig, ok=True, data=data, alt=alt)


def render_kv(context_length, num_kv_heads, model="Llama-2-7B", dtype="fp16 / bf16", batch_size=1):
    """What the KV-cache explorer shows for one slider position. Never raises.

    Args:
        context_length: tokens in the cache.
        num_kv_heads: g; must divide the model's H (else the view explains which g work).
        model: a key of :data:`mhalib.kv_cache.MODEL_CONFIGS`.
        dtype: a key of :data:`DTYPE_BYTES`.
        batch_size: sequences decoded together.

    Returns:
        A :class:`~mhalib.widgets.common.View`; ``view.data`` has ``bytes_per_token``,
        ``total_bytes`` and ``reduction`` (H / g).
    """
    return safe_render(_render_kv, context_length, num_kv_heads, model, dtype, batch_size)


def _g_options(model):
    return divisors(MODEL_CONFIGS[model]["num_heads"])


def kv_explorer(model="Llama-2-7B", context_length=4096, num_kv_heads=None):
    """Sliders for the model, the context length, g and the storage type, redrawing :func:`render_kv`.

    The g slider offers only the divisors of the chosen model's H.

    Returns:
        An ipywidgets ``VBox`` (class ``mhalib-explorer``).
    """
    import ipywidgets as w

    g0 = MODEL_CONFIGS[model]["num_kv_heads"] if num_kv_heads is None else num_kv_heads
    m_pick = w.Dropdown(options=list(MODEL_CONFIGS), value=model, description="model",
                        style={"description_width": "initial"})
    n_slider = choice_slider("context length", CONTEXT_OPTIONS, context_length)
    g_slider = choice_slider("g (KV heads)", _g_options(model), g0)
    t_pick = w.Dropdown(options=list(DTYPE_BYTES), value="fp16 / bf16", description="storage",
                        style={"description_width": "initial"})
    controls = [m_pick, n_slider, g_slider, t_pick]
    box, msg, out = explorer_box(controls, title="KV cache: context length and KV heads")

    state = {"busy": False}

    def redraw():
        if not state["busy"]:
            show_view(render_kv(n_slider.value, g_slider.value, m_pick.value, t_pick.value), msg, out)

    def on_model(change):
        state["busy"] = True  # one redraw for the new model, not one per slider update
        try:
            g_slider.options = _g_options(change["new"])
            g_slider.value = MODEL_CONFIGS[change["new"]]["num_kv_heads"]
        finally:
            state["busy"] = False
        redraw()

    m_pick.observe(on_model, names="value")
    connect([n_slider, g_slider, t_pick], redraw)
    return box


# ------------------------------------------------------------------ beyond GQA (notebook 09)
#: The sliding windows the cache-kinds explorer offers (tokens).
WINDOW_OPTIONS = (1024, 2048, 4096, 8192, 16384)


def _cache_kinds(window):
    """``[(label, bytes per cached token in fp16/bf16, tokens held at most or None)]``, published shapes."""
    from mhalib.mla import DEEPSEEK_V3, mla_cache_bytes

    llama2, llama3, mistral = (MODEL_CONFIGS[m] for m in ("Llama-2-7B", "Llama-3-8B", "Mistral-7B"))
    ds = DEEPSEEK_V3
    return [
        ("Llama-2-7B (MHA, g = 32)", kv_cache_bytes(llama2["num_layers"], 32, 128, 1), None),
        ("Llama-3-8B (GQA-8)", kv_cache_bytes(llama3["num_layers"], 8, 128, 1), None),
        (f"Mistral-7B (GQA-8, window {window:,})", kv_cache_bytes(mistral["num_layers"], 8, 128, 1), window),
        ("DeepSeek-V3 (MLA, 61 layers)", mla_cache_bytes(ds["num_layers"], ds["kv_lora_rank"], ds["qk_rope_head_dim"]),
         None),
    ]


def _render_cache_kinds(context_length, window=4096, batch_size=1):
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    for name, value in (("context length", context_length), ("window", window), ("batch", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            return message(f"The {name} must be a whole number of at least 1; got {value!r}.")
    n, w, b = int(context_length), int(window), int(batch_size)
    kinds = _cache_kinds(w)
    totals = {label: per * min(n, cap or n) * b for label, per, cap in kinds}
    rows = "".join(f"<li>{html.escape(label)}: {format_bytes(per)} per token, <b>{format_bytes(totals[label])}</b>"
                   f"{' (capped at the window)' if cap and n > cap else ''}</li>" for label, per, cap in kinds)
    text = (f"<p>Cache at <b>{n:,} tokens</b>" + (f" x batch {b}" if b > 1 else "") + " in fp16/bf16, published "
            f"shapes:</p><ul>{rows}</ul>")

    fig = Figure(figsize=(7.0, 3.6), dpi=80)
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.13, top=0.92)
    ax = fig.add_subplot()
    ns = np.array(CONTEXT_OPTIONS, dtype=float)
    for i, (label, per, cap) in enumerate(kinds):
        colour = colormaps["viridis"](i / (len(kinds) - 1))
        held = np.minimum(ns, cap) if cap else ns
        # a marker and a dash pattern of its own: the legend does not rest on colour alone
        style = dict(color=colour, marker=MARKERS[i % len(MARKERS)], linestyle=LINESTYLES[i % len(LINESTYLES)])
        ax.plot(ns, held * per * b / 2**30, lw=2, markersize=5, label=label, **style)
        ax.plot([n], [totals[label] / 2**30], color=colour, marker=style["marker"], ms=9, linestyle="none")
    ax.axvline(n, color="black", lw=0.8, ls="--")
    _cache_axes(ax, ns, "fp16 / bf16", b)
    ax.set_title("Fewer K/V heads shift the line down, a latent shifts it further, a window flattens it")
    ax.title.set_fontsize(10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    data = dict(context_length=n, window=w, batch_size=b,
                bytes_per_token={label: per for label, per, _ in kinds}, total_bytes=totals)
    alt = (f"Log-log chart of the KV cache in fp16/bf16" + (f", batch {b}," if b > 1 else "") + " against the "
           f"context length, one line per design, with a point at {n:,} tokens (dashed vertical line): "
           + "; ".join(f"{label} {format_bytes(totals[label])}"
                       + (f", flat from {cap:,} tokens on" if cap else "") for label, per, cap in kinds) + ".")
    return View(html=text, figure=fig, ok=True, data=data, alt=alt)


def render_cache_kinds(context_length, window=4096, batch_size=1):
    """Cache bytes of MHA, GQA-8, GQA-8 with a sliding window and MLA at one context length. Never raises.

    Args:
        context_length: tokens per sequence.
        window: the sliding window of the Mistral-7B row (its rolling buffer holds that many tokens).
        batch_size: sequences decoded together.

    Returns:
        A :class:`~mhalib.widgets.common.View`; ``view.data`` has ``bytes_per_token`` and
        ``total_bytes``, each a dict keyed by the row's label.
    """
    return safe_render(_render_cache_kinds, context_length, window, batch_size)


def cache_kinds_explorer(context_length=32768, window=4096):
    """Sliders for the context length and the window, redrawing :func:`render_cache_kinds`.

    Returns:
        An ipywidgets ``VBox`` (class ``mhalib-explorer``).
    """
    n_slider = choice_slider("context length", CONTEXT_OPTIONS, context_length)
    w_slider = choice_slider("window (Mistral-7B row)", WINDOW_OPTIONS, window)
    box, msg, out = explorer_box([n_slider, w_slider], title="KV cache: heads, windows and latents")

    def redraw():
        show_view(render_cache_kinds(n_slider.value, w_slider.value), msg, out)

    connect([n_slider, w_slider], redraw)
    return box
