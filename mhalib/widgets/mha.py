"""Multi-head attention explorers: the H / d_model explorer and the step-through view.

* :func:`render_mha` (plain function) and :func:`mha_explorer` (the sliders): choose
  d_model, H and a sentence; see the shape trace, d_head, the parameter count and one
  attention heatmap per head.
* :func:`render_step` and :func:`step_explorer`: walk one sentence through
  project -> split -> scores -> mask -> softmax -> weighted sum -> concat -> W_o and
  see every intermediate matrix with its shape and values.

The inputs are fixed, seeded token embeddings and seeded random projections
(:mod:`mhalib.sentences`): the maps show the mechanics, not learned meaning. For a given
d_model the projection matrices are the same whatever H is: changing H only regroups
their columns into heads. :func:`render_trained` (the explorer's "trained" switch) puts
the heads of notebook 05's trained language model beside random heads of the same sizes
on the same sentence: what training adds to the same mechanics.

Render functions never raise: an impossible combination (H not dividing d_model)
returns a :class:`~mhalib.widgets.common.View` whose text says why in plain words.
"""

from __future__ import annotations

import html

import numpy as np

from mhalib.np_attention import causal_mask, softmax
from mhalib.sentences import SENTENCES, demo_weights, embed, tokens_of
from mhalib.validation import divisors
from mhalib.widgets.common import (
    Panel,
    View,
    choice_slider,
    connect,
    explorer_box,
    matrix_mosaic,
    message,
    safe_render,
    show_view,
    slider,
)

__all__ = [
    "D_MODEL_OPTIONS",
    "MAX_HEADS",
    "STEPS",
    "STEP_D_MODEL_OPTIONS",
    "STEP_MAX_HEADS",
    "STEP_SENTENCES",
    "parameter_count",
    "forward_steps",
    "TRAINED_SENTENCES",
    "render_mha",
    "render_trained",
    "render_step",
    "mha_explorer",
    "step_explorer",
]

#: The d_model values the explorer's slider offers.
D_MODEL_OPTIONS = (8, 12, 16, 24, 32, 48, 64, 96, 128)
#: The H slider runs from 1 to this.
MAX_HEADS = 16
#: The stages of the step-through view, in order.
STEPS = ("input", "project", "split", "scores", "mask", "softmax", "weighted sum", "concat", "W_o")
#: Small sizes for the step-through, so that every value fits in its cell.
STEP_D_MODEL_OPTIONS = (4, 8, 12, 16)
STEP_MAX_HEADS = 8
STEP_SENTENCES = tuple(k for k, v in SENTENCES.items() if len(v) <= 6)
#: Sentences of notebook 05's grammar for the trained model (``<bos>`` is added in front).
TRAINED_SENTENCES = (
    "the king does not see mary because he is tired .",
    "the key near the cabinets is old .",
    "the dog that the cats chase sleeps .",
    "mary sees the king . she greets-him again .",
)


def parameter_count(d_model, num_heads):
    """Weights of one multi-head attention block without bias.

    Returns:
        dict with ``per_head`` (d_model x d_head for one head's W_q), ``per_projection``
        (d_model^2: H heads of d_model x d_head), ``total`` (Q, K, V and O: 4 d_model^2).
        The total does not depend on H.
    """
    d_head = d_model // num_heads
    return {"per_head": d_model * d_head, "per_projection": num_heads * d_model * d_head,
            "total": 4 * d_model * d_model}


def _not_divisible(d_model, num_heads):
    choices = ", ".join(str(h) for h in divisors(d_model) if h <= MAX_HEADS)
    return message(
        f"H = {num_heads} heads cannot share d_model = {d_model} equally: "
        f"{d_model} / {num_heads} = {d_model / num_heads:.3g} is not a whole number of "
        f"dimensions per head. With d_model = {d_model}, choose H from {choices}.",
        d_model=d_model, num_heads=num_heads,
    )


def _whole(value, name):
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive whole number; got {value!r}.") from None
    if not f.is_integer():
        raise ValueError(f"{name} must be a positive whole number; got {value!r}.")
    return int(f)


def _check_sizes(d_model, num_heads):
    d_model, num_heads = _whole(d_model, "d_model"), _whole(num_heads, "H")
    if d_model < 1 or num_heads < 1:
        return d_model, num_heads, message(
            f"d_model and H must be positive whole numbers; got d_model = {d_model}, H = {num_heads}.")
    if d_model % num_heads:
        return d_model, num_heads, _not_divisible(d_model, num_heads)
    return d_model, num_heads, None


def forward_steps(sentence, d_model, num_heads, *, causal=False, seed=0):
    """Every intermediate of multi-head attention on one sentence, for display.

    Returns:
        dict with ``tokens`` and the arrays ``x`` (N, d_model), ``q``, ``k``, ``v``
        (N, d_model), ``q_h``, ``k_h``, ``v_h`` (H, N, d_head), ``scores`` (H, N, N) (before
        the mask), ``masked`` (H, N, N), ``weights`` (H, N, N), ``heads`` (H, N, d_head),
        ``concat`` (N, d_model) and ``out`` (N, d_model).
    """
    tokens = tokens_of(sentence)
    x = embed(tokens, d_model)  # (N, d_model)
    w_q, w_k, w_v, w_o = demo_weights(d_model, seed=seed)
    n, d_head = len(tokens), d_model // num_heads
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # (N, d_model) each
    q_h = q.reshape(n, num_heads, d_head).transpose(1, 0, 2)  # (H, N, d_head)
    k_h = k.reshape(n, num_heads, d_head).transpose(1, 0, 2)  # (H, N, d_head)
    v_h = v.reshape(n, num_heads, d_head).transpose(1, 0, 2)  # (H, N, d_head)
    scores = q_h @ k_h.transpose(0, 2, 1) / np.sqrt(d_head)  # (H, N, N)
    masked = scores + causal_mask(n) if causal else scores  # (H, N, N)
    weights = softmax(masked, axis=-1)  # (H, N, N)
    heads = weights @ v_h  # (H, N, d_head)
    concat = heads.transpose(1, 0, 2).reshape(n, d_model)  # (N, d_model)
    out = concat @ w_o  # (N, d_model)
    return dict(tokens=tokens, x=x, q=q, k=k, v=v, q_h=q_h, k_h=k_h, v_h=v_h, scores=scores,
                masked=masked, weights=weights, heads=heads, concat=concat, out=out)


def _shape_trace(n, d_model, num_heads):
    d_head = d_model // num_heads
    rows = [
        ("x", "(N, d_model)", (n, d_model)),
        ("Q = x W_q", "(N, d_model)", (n, d_model)),
        ("reshape", "(N, H, d_head)", (n, num_heads, d_head)),
        ("Q_h = transpose", "(H, N, d_head)", (num_heads, n, d_head)),
        ("scores = Q_h K_h^T / sqrt(d_head)", "(H, N, N)", (num_heads, n, n)),
        ("weights = softmax(scores)", "(H, N, N)", (num_heads, n, n)),
        ("heads = weights V_h", "(H, N, d_head)", (num_heads, n, d_head)),
        ("concat (merge heads)", "(N, H * d_head)", (n, num_heads * d_head)),
        ("out = concat W_o", "(N, d_model)", (n, d_model)),
    ]
    lines = [f"{name:<35} {sym:<16} {shape}" for name, sym, shape in rows]
    return rows, "\n".join(lines)


def _render_mha(d_model, num_heads, sentence):
    d_model, num_heads, problem = _check_sizes(d_model, num_heads)
    if problem:
        return problem
    f = forward_steps(sentence, d_model, num_heads)
    tokens, n, d_head = f["tokens"], len(f["tokens"]), d_model // num_heads
    params = parameter_count(d_model, num_heads)
    rows, trace = _shape_trace(n, d_model, num_heads)
    summary = (
        f"<p><b>d_head = d_model / H = {d_model} / {num_heads} = {d_head}</b>. "
        f"Parameters (no bias): {params['per_projection']:,} per projection "
        f"(H x d_model x d_head = {num_heads} x {d_model} x {d_head}), "
        f"{params['total']:,} for W_q, W_k, W_v and W_o together: the same for every H.</p>"
        f"<pre>{html.escape(trace)}</pre>"
    )
    many = n > 6 or num_heads > 8
    panels = [Panel(f["weights"][h], f"head {h}", tokens, tokens, vmin=0.0, vmax=1.0,
                    annotate=not many and n <= 4 and num_heads <= 4)
              for h in range(num_heads)]
    annotated = panels[0].annotate
    # 12 px labels (a capital letter 9 px tall) need a cell of at least 16 px per token;
    # matrix_mosaic puts fewer heads in a row when 8 would be wider than a notebook shows
    fig = matrix_mosaic(panels, cols=8, cell_px=34 if annotated else (16 if n > 6 else 24),
                        fontsize=12, share_labels=True,
                        caption="rows: queries, columns: keys; colour: attention weight, 0 dark to 1 yellow")
    data = dict(d_model=d_model, num_heads=num_heads, d_head=d_head, tokens=tokens, params=params,
                num_heatmaps=fig.mhalib_panels, shapes={name: shape for name, _, shape in rows},
                weights=f["weights"])
    alt = (f"{num_heads} heatmap{'s' if num_heads > 1 else ''} of attention weights, one per head, "
           f"d_model {d_model}, d_head {d_head}, on the {n} tokens '{' '.join(map(str, tokens))}' (rows: "
           f"queries, columns: keys; dark 0 to yellow 1). Each head's strongest weight: "
           + _strongest(f["weights"], tokens, "head") + ".")
    return View(html=summary, figure=fig, ok=True, data=data, alt=alt)


def _strongest(weights, tokens, name, first=0):
    """'head 0: 'sat' on 'on' 0.95; ...': each map's largest weight, in words (for alt text)."""
    parts = []
    for h, w in enumerate(np.asarray(weights)):
        q, k = np.unravel_index(int(np.argmax(w)), w.shape)
        parts.append(f"{name} {h + first}: '{tokens[q]}' on '{tokens[k]}' {w[q, k]:.2f}")
    return "; ".join(parts)


def render_mha(d_model, num_heads, sentence="The cat sat on"):
    """What the explorer shows for one slider position. Never raises.

    Args:
        d_model: model width.
        num_heads: H.
        sentence: a key of :data:`mhalib.sentences.SENTENCES` or a list of tokens.

    Returns:
        A :class:`~mhalib.widgets.common.View`: the d_head, parameter count and shape
        trace as HTML, and a figure with one attention heatmap per head (token labels on
        both axes). ``view.data`` holds ``d_head``, ``params``, ``shapes``,
        ``num_heatmaps`` and the ``weights`` (H, N, N). If H does not divide d_model,
        ``view.ok`` is false and the text says which H would work.
    """
    return safe_render(_render_mha, d_model, num_heads, sentence)


def mha_explorer(d_model=8, num_heads=2, sentence="The cat sat on"):
    """Sliders for d_model, H and the sentence, redrawing :func:`render_mha`.

    A switch shows the trained heads of notebook 05's language model instead
    (:func:`render_trained`): then a layer slider and the grammar's sentences replace
    d_model, H and the demo sentences, which the trained model fixes.

    Returns:
        An ipywidgets ``VBox`` (class ``mhalib-explorer``).
    """
    import ipywidgets as w

    d_slider = choice_slider("d_model", D_MODEL_OPTIONS, d_model)
    h_slider = slider("H (heads)", num_heads, 1, MAX_HEADS)
    s_pick = w.Dropdown(options=list(SENTENCES), value=sentence, description="sentence",
                        style={"description_width": "initial"}, layout=w.Layout(width="420px"))
    # short labels: a toggle button is about 150 px wide and cuts longer text off
    mode = w.ToggleButtons(options=["random weights", "trained model"], value="random weights",
                           tooltips=["random projections, the sizes you choose",
                                     "notebook 05's language model, its own sizes"],
                           description="heads", style={"description_width": "initial"})
    layer = slider("layer", 1, 0, 1)
    t_pick = w.Dropdown(options=list(TRAINED_SENTENCES), value=TRAINED_SENTENCES[0], description="sentence",
                        style={"description_width": "initial"}, layout=w.Layout(width="420px"))
    controls = [mode, d_slider, h_slider, s_pick, layer, t_pick]
    box, msg, out = explorer_box(controls, title="Multi-head attention: d_model and H")

    def redraw():
        trained = mode.value != "random weights"
        for c in (d_slider, h_slider, s_pick):
            c.layout.display = "none" if trained else ""
        for c in (layer, t_pick):
            c.layout.display = "" if trained else "none"
        if trained:
            view = render_trained(layer.value, t_pick.value)
            if view.ok:
                layer.max = _language_model().num_layers - 1
        else:
            view = render_mha(d_slider.value, h_slider.value, s_pick.value)
        show_view(view, msg, out)

    connect(controls, redraw)
    return box


# ------------------------------------------------------------------ trained heads

_LANGUAGE_MODEL = []  # loaded once, on first use


def _language_model():
    if not _LANGUAGE_MODEL:
        from mhalib.language import load_language_model
        _LANGUAGE_MODEL.append(load_language_model())
    return _LANGUAGE_MODEL[0]


def _random_causal_weights(tokens, d_model, num_heads):
    f = forward_steps(tokens, d_model, num_heads, causal=True)
    return f["weights"]  # (H, N, N)


def _render_trained(layer, sentence):
    from mhalib.interpret import attention_weights
    from mhalib.language import encode

    model = _language_model()
    layer = _whole(layer, "layer")
    if not 0 <= layer < model.num_layers:
        return message(f"The trained model has layers 0 to {model.num_layers - 1}; got layer = {layer}.")
    words = ["<bos>"] + str(sentence).split()
    try:
        ids = encode(words)
    except ValueError as error:
        return message(f"The trained model only knows its grammar's words: {error}")
    trained = attention_weights(model, [ids])[0, layer]  # (H, N, N)
    d_model, num_heads = model.config.d_model, model.num_heads
    rand = _random_causal_weights(words, d_model, num_heads)  # (H, N, N)
    panels = [Panel(trained[h], f"trained L{layer} H{h}", words, words, vmin=0.0, vmax=1.0)
              for h in range(num_heads)]
    panels += [Panel(rand[h], f"random H{h}", words, words, vmin=0.0, vmax=1.0) for h in range(num_heads)]
    fig = matrix_mosaic(panels, cols=num_heads, cell_px=16, fontsize=12, share_labels=True,
                        caption="top: the trained model's heads; bottom: random projections of the same "
                                "sizes; rows: queries, columns: keys")
    summary = (f"<p><b>Trained</b> (notebook 05's language model, layer {layer}; its {model.num_layers} "
               f"layers are numbered 0 to {model.num_layers - 1}, as in the code): "
               f"d_model = {d_model}, H = {num_heads}, d_head = {d_model // num_heads}, causal. "
               "Below each trained head, a head with random projections of the same sizes on the "
               "same tokens: the mechanics are the same, the patterns come from training.</p>")
    data = dict(layer=layer, tokens=words, trained=trained, random=rand, num_heatmaps=fig.mhalib_panels,
                d_model=d_model, num_heads=num_heads)
    last = len(words) - 1
    alt = (f"Two rows of {num_heads} causal attention heatmaps on '{' '.join(words)}' (rows: queries, "
           f"columns: keys; dark 0 to yellow 1): top, the trained model's layer {layer}; bottom, random "
           f"projections of the same sizes. Where the last token '{words[last]}' looks most, trained: "
           + "; ".join(f"H{h} '{words[int(np.argmax(trained[h, last]))]}' {float(trained[h, last].max()):.2f}"
                       for h in range(num_heads))
           + "; random: "
           + "; ".join(f"H{h} '{words[int(np.argmax(rand[h, last]))]}' {float(rand[h, last].max()):.2f}"
                       for h in range(num_heads)) + ".")
    return View(html=summary, figure=fig, ok=True, data=data, alt=alt)


def render_trained(layer=1, sentence=TRAINED_SENTENCES[0]):
    """The trained language model's heads beside random ones, for one layer. Never raises.

    Args:
        layer: which layer of notebook 05's model (:func:`mhalib.language.load_language_model`).
        sentence: words of the grammar separated by spaces (``<bos>`` is added in front),
            e.g. one of :data:`TRAINED_SENTENCES`.

    Returns:
        A :class:`~mhalib.widgets.common.View` with one row of heatmaps for the trained
        heads and one for random projections of the same d_model and H; ``view.data``
        holds ``trained`` and ``random``, each ``(H, N, N)``. A word the grammar does not
        have, or a layer out of range, gives ``view.ok`` false and a sentence saying why.
    """
    return safe_render(_render_trained, layer, sentence)


# ------------------------------------------------------------------ step-through

_STEP_TEXT = {
    "input": "Each token is a vector of d_model numbers (a fixed embedding plus a position code).",
    "project": "One matrix product per projection computes every head's queries, keys and values at once.",
    "split": "Reshape (N, d_model) to (N, H, d_head), then transpose to (H, N, d_head): "
             "head h owns columns h*d_head to (h+1)*d_head - 1. Shown: Q_h (K and V split the same way).",
    "scores": "Each head compares its queries with its keys: Q_h K_h^T / sqrt(d_head), one (N, N) matrix per head.",
    "mask": "The causal mask adds -inf above the diagonal, so a token cannot look at later tokens.",
    "softmax": "Softmax along each row turns scores into weights that are positive and sum to 1.",
    "weighted sum": "Each head mixes its value vectors with its own weights: weights V_h, (N, d_head) per head.",
    "concat": "Transpose back and reshape: the H head outputs sit side by side, (N, H * d_head) = (N, d_model).",
    "W_o": "W_o (d_model x d_model) mixes the heads: every output column reads every head.",
}


def _step_panels(step, f, num_heads, causal, annotate):
    tokens = f["tokens"]
    fmt = "{:.1f}"

    def per_head(name, arr, weights=False, keys_are_tokens=False):
        # columns are key positions only for the (N, N) steps; otherwise they are features
        return [Panel(arr[h], f"head {h}: {name} {arr[h].shape}", tokens,
                      tokens if keys_are_tokens else None,
                      vmin=0.0 if weights else None, vmax=1.0 if weights else None,
                      annotate=annotate, fmt="{:.2f}" if weights else fmt)
                for h in range(num_heads)]

    if step == "input":
        return [Panel(f["x"], f"x {f['x'].shape}", tokens, annotate=annotate, fmt=fmt)]
    if step == "project":
        return [Panel(f[k], f"{k.upper()} = x W_{k} {f[k].shape}", tokens, annotate=annotate, fmt=fmt)
                for k in ("q", "k", "v")]
    if step == "split":
        return per_head("Q_h", f["q_h"])
    if step == "scores":
        return per_head("scores", f["scores"], keys_are_tokens=True)
    if step == "mask":
        return per_head("masked scores" if causal else "scores (no mask)", f["masked"], keys_are_tokens=True)
    if step == "softmax":
        return per_head("weights", f["weights"], weights=True, keys_are_tokens=True)
    if step == "weighted sum":
        return per_head("out_h", f["heads"])
    if step == "concat":
        return [Panel(f["concat"], f"concat {f['concat'].shape}", tokens, annotate=annotate, fmt=fmt)]
    return [Panel(f["out"], f"out = concat W_o {f['out'].shape}", tokens, annotate=annotate, fmt=fmt)]


def _render_step(step, d_model, num_heads, sentence, causal):
    if isinstance(step, (int, np.integer)):
        if not 0 <= step < len(STEPS):
            return message(f"step must be 0 to {len(STEPS) - 1}; got {step}.")
        step = STEPS[step]
    if step not in STEPS:
        return message(f"unknown step {step!r}; the steps are {', '.join(STEPS)}.")
    d_model, num_heads, problem = _check_sizes(d_model, num_heads)
    if problem:
        return problem
    f = forward_steps(sentence, d_model, num_heads, causal=causal)
    n = len(f["tokens"])
    panels = _step_panels(step, f, num_heads, causal, annotate=True)
    shapes = [tuple(np.shape(p.matrix)) for p in panels]
    if step in ("split", "scores", "mask", "softmax", "weighted sum"):
        shape_text = f"({num_heads}, {', '.join(map(str, shapes[0]))}): {num_heads} matrices of {shapes[0]}"
    elif step == "project":
        shape_text = f"3 matrices of {shapes[0]}"
    else:
        shape_text = str(shapes[0])
    index = STEPS.index(step)
    text = _STEP_TEXT[step]
    if step == "mask" and not causal:
        text = "No mask chosen: the scores pass through unchanged (tick 'causal mask' to block later tokens)."
    path = " -> ".join(f"<b>{s}</b>" if s == step else s for s in STEPS)
    summary = (f"<p>{path}</p><p>Step {index + 1} of {len(STEPS)}, <b>{step}</b>: shape {shape_text}. "
               f"{html.escape(text)}</p>")
    wide = max(s[1] for s in shapes)
    cols = 3 if step == "project" else (4 if wide > 4 else 8)
    fig = matrix_mosaic(panels, cols=cols, cell_px=36, fontsize=12)
    data = dict(step=step, index=index, shapes=shapes, num_panels=fig.mhalib_panels, n=n,
                d_model=d_model, num_heads=num_heads, causal=causal,
                matrices=[np.asarray(p.matrix) for p in panels])
    values = np.concatenate([np.asarray(p.matrix, dtype=float).ravel() for p in panels])
    finite = values[np.isfinite(values)]
    alt = (f"Step {index + 1} of {len(STEPS)}, {step}, on '{' '.join(f['tokens'])}': "
           + "; ".join(f"{p.title}" for p in panels)
           + f"; rows are tokens, each cell shows its value, from {finite.min():.2f} to {finite.max():.2f}"
           + (", with -inf above the diagonal (masked)" if not np.isfinite(values).all() else "") + ".")
    return View(html=summary, figure=fig, ok=True, data=data, alt=alt)


def render_step(step, d_model=8, num_heads=2, sentence="The cat sat on", causal=True):
    """One stage of multi-head attention on one sentence, with shapes and values. Never raises.

    Args:
        step: a name from :data:`STEPS` or its index (0 = "input" ... 8 = "W_o").
        d_model, num_heads: sizes (H must divide d_model; otherwise a message).
        sentence: a key of :data:`mhalib.sentences.SENTENCES` or a list of tokens.
        causal: apply the causal mask at the "mask" step.

    Returns:
        A :class:`~mhalib.widgets.common.View`: where the step sits in the pipeline, the
        shape, and a figure of the matrices with their values written in the cells.
        ``view.data["shapes"]`` lists the shape of each matrix drawn.
    """
    return safe_render(_render_step, step, d_model, num_heads, sentence, causal)


def step_explorer(d_model=8, num_heads=2, sentence="The cat sat on", causal=True):
    """A step slider (and sizes, sentence, mask) walking one input through the block.

    Returns:
        An ipywidgets ``VBox`` (class ``mhalib-explorer``).
    """
    import ipywidgets as w

    step = choice_slider("step", STEPS, STEPS[0])
    back = w.Button(description="previous", icon="arrow-left", layout=w.Layout(width="110px"))
    forward = w.Button(description="next", icon="arrow-right", layout=w.Layout(width="110px"))
    d_slider = choice_slider("d_model", STEP_D_MODEL_OPTIONS, d_model)
    h_slider = slider("H (heads)", num_heads, 1, STEP_MAX_HEADS)
    s_pick = w.Dropdown(options=list(STEP_SENTENCES), value=sentence, description="sentence",
                        style={"description_width": "initial"})
    mask = w.Checkbox(value=causal, description="causal mask", indent=False)
    controls = [step, d_slider, h_slider, s_pick, mask]
    box, msg, out = explorer_box([w.HBox([back, step, forward]), w.HBox([d_slider, h_slider]),
                                  w.HBox([s_pick, mask])],
                                 title="Multi-head attention, one step at a time")

    def move(delta):
        i = min(max(STEPS.index(step.value) + delta, 0), len(STEPS) - 1)
        step.value = STEPS[i]

    back.on_click(lambda _b: move(-1))
    forward.on_click(lambda _b: move(+1))

    def redraw():
        show_view(render_step(step.value, d_slider.value, h_slider.value, s_pick.value, mask.value),
                  msg, out)

    connect(controls, redraw)
    return box
