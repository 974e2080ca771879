"""Helpers shared by the explorers: what a render returns, safe calls, showing figures.

Every explorer follows one pattern:

* a plain ``render_*(...)`` function takes the slider values and returns a
  :class:`View` (HTML text and/or a matplotlib Figure). It never raises: wrap the
  body with :func:`safe_render` so that an unexpected error becomes a plain message;
* an ``*_explorer()`` function builds the sliders with :func:`slider` /
  :func:`choice_slider`, lays them out with :func:`explorer_box` and redraws with
  :func:`show_view` whenever a value changes (:func:`connect`).

CSS classes (used by the browser tests): the container has ``mhalib-explorer``, the
figure area ``mhalib-explorer-output``, the text area ``mhalib-explorer-message``.

Figures are built with ``matplotlib.figure.Figure`` directly (not ``pyplot``), so that
a render never leaves an open pyplot figure behind and a notebook cell that calls a
render function does not show the figure twice.

A redraw sets the widgets' values and nothing else: the figure goes into the ``Output``
widget as its ``outputs`` value, never by capturing a display inside ``with out:``
(see :func:`show_view` for why).
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

__all__ = [
    "View",
    "message",
    "safe_render",
    "figure_png",
    "figure_output",
    "slider",
    "choice_slider",
    "explorer_box",
    "labelled_vbox",
    "ACCESSIBLE_NAMES_JS",
    "FIGURE_ALT_CLASS",
    "SLIDER_NAMES_CLASS",
    "show_view",
    "connect",
    "Panel",
    "matrix_mosaic",
    "MAX_WIDTH_PX",
]


@dataclass
class View:
    """What one render produces.

    Attributes:
        html: text to show above the figure (HTML; may be empty).
        figure: a matplotlib Figure, or ``None`` when there is nothing to draw.
        ok: ``False`` when the slider combination is impossible and ``html`` explains why.
        data: the numbers behind the view (shapes, counts), for tests and for the curious.
        alt: what the figure shows, in words: its alternative text for a reader who cannot
            see it (the explorer puts it on the figure; see :data:`ACCESSIBLE_NAMES_JS`).
    """

    html: str = ""
    figure: Any = None
    ok: bool = True
    data: dict = field(default_factory=dict)
    alt: str = ""

    @property
    def text(self) -> str:
        """The HTML with the tags removed: what a reader sees, as plain text."""
        import re

        return html.unescape(re.sub(r"<[^>]+>", " ", self.html)).replace("  ", " ").strip()

    def _ipython_display_(self):
        """Shown in a notebook cell: the text as HTML, then the figure as a PNG image."""
        from IPython.display import HTML, Image, display

        if self.html:
            display(HTML(self.html))
        if self.figure is not None:
            display(Image(data=figure_png(self.figure), format="png"))


def message(text: str, **data) -> View:
    """A view that only says something in plain words (an impossible combination)."""
    return View(html=f"<p>{html.escape(text)}</p>", figure=None, ok=False, data=dict(data))


def safe_render(fn: Callable[..., View], *args, **kwargs) -> View:
    """Call ``fn(*args, **kwargs)``; turn any exception into a plain message.

    A ``ValueError`` is the library explaining bad input: its text is shown as is.
    Anything else is a bug, reported in one sentence rather than as a traceback.
    """
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        return message(str(exc), error=type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - a widget must never show a traceback
        return message(
            f"This view could not be drawn for these settings ({type(exc).__name__}: {exc}). "
            "Move a slider to try another combination.",
            error=type(exc).__name__,
        )


def figure_png(fig) -> bytes:
    """The PNG bytes of a figure, as a notebook would display it.

    A figure made by :func:`matrix_mosaic` is one image at its own pixel size; its
    pixels are encoded directly (the same picture, without matplotlib's resampling).
    """
    buf = io.BytesIO()
    pixels = getattr(fig, "mhalib_image", None)
    if pixels is not None:
        from PIL import Image

        Image.fromarray(pixels).save(buf, format="png", compress_level=3)
    else:
        fig.savefig(buf, format="png")
    return buf.getvalue()


def _named(description, kind):
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"a {kind} needs a description, its accessible name (what a screen reader "
                         f"announces); got {description!r}")
    return description


def slider(description, value, min, max, step=1, **kwargs):
    """An ``IntSlider`` that redraws on release (``continuous_update=False``).

    ``description`` is its visible label and its accessible name, as plain text
    (``description_allow_html=False``); see :data:`ACCESSIBLE_NAMES_JS`.
    """
    import ipywidgets as w

    return w.IntSlider(value=value, min=min, max=max, step=step, description=_named(description, "slider"),
                       description_allow_html=False, continuous_update=False,
                       style={"description_width": "initial"}, **kwargs)


def choice_slider(description, options, value, **kwargs):
    """A ``SelectionSlider`` over ``options`` that redraws on release (named like :func:`slider`)."""
    import ipywidgets as w

    return w.SelectionSlider(options=list(options), value=value, description=_named(description, "slider"),
                             description_allow_html=False, continuous_update=False,
                             style={"description_width": "initial"}, **kwargs)


#: Class of the hidden element, inside an explorer's message, that holds its figure's alt text.
FIGURE_ALT_CLASS = "mhalib-figure-alt"
#: Class of the script element that :data:`ACCESSIBLE_NAMES_JS` is shown in.
SLIDER_NAMES_CLASS = "mhalib-slider-names"

#: Gives each explorer slider in the page its accessible name and its value in words.
#: ipywidgets 8 (8.1.9, measured in JupyterLab 4.6) draws a slider as a noUiSlider handle:
#: a ``div`` with role "slider", reachable with Tab and moved with the arrow keys, Home and
#: End, with aria-valuemin, -max and -now. But nothing names it: the description is a
#: ``<label>`` tied to no control (a drop-down's is tied to its ``<select>``), so a screen
#: reader says "slider 2" and axe reports it (aria-input-field-name, serious); and a
#: SelectionSlider's aria-valuetext is the option's index ("3.00"), not the option ("24").
#: The readout beside it is an editable field (type a value, press Enter) with no name
#: either. And JupyterLab draws the figure of an Output widget as an image without alt.
#: ipywidgets has no option for any of these, so the explorer adds this script beside
#: itself (:meth:`LabelledVBox._ipython_display_`): it points each handle's and readout's
#: aria-labelledby at the slider's label, keeps aria-valuetext equal to the readout, and
#: tells which of a row of toggle buttons is on (aria-pressed; ipywidgets shows it by
#: colour alone), gives the figure the alt text of its view (:attr:`View.alt`, carried hidden in the
#: message, class :data:`FIGURE_ALT_CLASS`), also after a move or a redraw. JupyterLab runs it in outputs of the running
#: session (trusted) only.
ACCESSIBLE_NAMES_JS = """
(function () {
  const name = (root) => {
    root.querySelectorAll('.mhalib-explorer .widget-slider').forEach((s, i) => {
      const label = s.querySelector('.widget-label');
      const handle = s.querySelector('.noUi-handle');
      if (!label || !handle) return;
      if (!label.id) label.id = 'mhalib-slider-label-' + Math.random().toString(36).slice(2);
      if (handle.getAttribute('aria-labelledby') !== label.id) handle.setAttribute('aria-labelledby', label.id);
      const readout = s.querySelector('.widget-readout');
      const text = readout ? (readout.innerText || readout.textContent || '').trim() : '';
      if (text && handle.getAttribute('aria-valuetext') !== text) handle.setAttribute('aria-valuetext', text);
      if (readout && readout.getAttribute('aria-labelledby') !== label.id) {
        readout.setAttribute('aria-labelledby', label.id);
        if (readout.isContentEditable) readout.setAttribute('role', 'textbox');
      }
    });
    root.querySelectorAll('.mhalib-explorer .widget-toggle-buttons').forEach((group) => {
      const label = group.querySelector('.widget-label');
      if (label && label.textContent.trim()) {
        if (!label.id) label.id = 'mhalib-group-label-' + Math.random().toString(36).slice(2);
        group.setAttribute('role', 'group');
        group.setAttribute('aria-labelledby', label.id);
      }
      group.querySelectorAll('button').forEach((b) => {
        const pressed = String(b.classList.contains('mod-active'));
        if (b.getAttribute('aria-pressed') !== pressed) b.setAttribute('aria-pressed', pressed);
      });
    });
    root.querySelectorAll('.mhalib-explorer').forEach((box) => {
      const text = box.querySelector('.mhalib-figure-alt');
      const alt = text ? text.textContent : '';
      box.querySelectorAll('.mhalib-explorer-output img').forEach((img) => { if (img.alt !== alt) img.alt = alt; });
    });
  };
  name(document);
  if (!window.mhalibSliderNames) {
    window.mhalibSliderNames = new MutationObserver(() => name(document));
    window.mhalibSliderNames.observe(document.body, {subtree: true, childList: true, characterData: true,
                                                     attributes: true, attributeFilter: ['aria-valuenow', 'class']});
  }
})();
"""


@lru_cache(maxsize=None)
def _labelled_vbox_class():
    import ipywidgets as w

    class LabelledVBox(w.VBox):
        """A ``VBox`` whose plain-text form is a short label.

        A notebook viewer that cannot draw widgets (a saved notebook on a code-hosting
        site, a terminal) shows a widget's plain text; ipywidgets' default is the
        ``repr`` of every child, a long ``VBox(children=(HTML(...`` line.
        """

        def __init__(self, children, label, name_sliders=False):
            super().__init__(children)
            self._label = label
            self._name_sliders = name_sliders

        def __repr__(self):
            return self._label

        def _ipython_display_(self):
            """The widget, then (for an explorer) the script that names its sliders."""
            from IPython.display import display

            display(self._repr_mimebundle_(), raw=True)
            if self._name_sliders:  # no plain text: a viewer without HTML shows nothing for it
                display({"text/html": f'<script class="{SLIDER_NAMES_CLASS}">{ACCESSIBLE_NAMES_JS}</script>',
                         "text/plain": ""}, raw=True)

    return LabelledVBox


def labelled_vbox(children, label, *, name_sliders=False):
    """An ipywidgets ``VBox`` of ``children`` whose plain-text form is ``label``.

    ``name_sliders``: when shown in a notebook, also output :data:`ACCESSIBLE_NAMES_JS`.
    """
    return _labelled_vbox_class()(children, label, name_sliders)


def explorer_box(controls, *, title=None):
    """The standard explorer layout.

    Returns:
        ``(box, message_widget, output)``: a ``VBox`` (class ``mhalib-explorer``) holding an
        optional title, the controls (in one row when there are at most three plain
        controls; otherwise one row per item, so pass ``HBox`` rows), an ``HTML`` widget for text (class
        ``mhalib-explorer-message``) and an ``Output`` for the figure (class
        ``mhalib-explorer-output``).
    """
    import ipywidgets as w

    msg = w.HTML()
    msg.add_class("mhalib-explorer-message")
    out = w.Output()
    out.add_class("mhalib-explorer-output")
    children = [w.HTML(f"<b>{html.escape(title)}</b>")] if title else []
    controls = list(controls)
    one_row = len(controls) <= 3 and not any(isinstance(c, w.Box) for c in controls)
    children += [w.HBox(controls) if one_row else w.VBox(controls), msg, out]
    name = f"explorer: {title}" if title else "explorer"
    box = labelled_vbox(children, f"[{name}; run the notebook to use the sliders]", name_sliders=True)
    box.add_class("mhalib-explorer")
    return box, msg, out


def figure_output(fig) -> dict:
    """A figure as one notebook output: a ``display_data`` holding its PNG (base64).

    This is what an ``Output`` widget stores for ``display(Image(png))`` and what a
    saved notebook keeps in the widget's state.
    """
    png = base64.b64encode(figure_png(fig)).decode("ascii")
    return {"output_type": "display_data", "data": {"image/png": png}, "metadata": {}}


def show_view(view: View, msg, out) -> None:
    """Put a view on screen: its text in ``msg``, its figure as a PNG in ``out``.

    ``out.outputs`` is set in one assignment: the new figure, or nothing when the view
    is only a message (the previous figure must not stay under it). The figure is not
    displayed inside ``with out:``. A front end that captures into an ``Output`` widget
    sends the captured output back to the kernel on the shell channel, while the cell
    that drew it is still running; nbclient (behind nbconvert, papermill and
    ``tools/run_notebooks.py``) does so on the socket it is waiting on for that cell's
    reply, and the reply can then go unnoticed until the wait times out: with
    nbconvert's default of no timeout, the notebook hangs with the kernel idle. A value
    set in the kernel travels one way, kernel to front end, like any other slider or
    text, and the redraw is synchronous: when the call returns, everything is sent.
    """
    # The figure's text rides, hidden, with the message; ACCESSIBLE_NAMES_JS copies it to the
    # image's alt. (Not as the Output's tooltip: ipywidgets 8.1.9's OutputView fails to draw
    # with one, reading the description an Output does not have.)
    alt = (f'<span class="{FIGURE_ALT_CLASS}" hidden>{html.escape(view.alt)}</span>'
           if view.figure is not None and view.alt else "")
    msg.value = view.html + alt
    out.outputs = (figure_output(view.figure),) if view.figure is not None else ()
    if view.figure is not None and getattr(view.figure.canvas, "manager", None) is not None:
        import matplotlib.pyplot as plt  # a pyplot figure: close it, or pyplot keeps it

        plt.close(view.figure)


def connect(controls, redraw: Callable[[], None]) -> Callable[[], None]:
    """Call ``redraw()`` now and whenever one of ``controls`` changes value.

    ``redraw`` should itself never raise; as a last line of defence any exception is
    turned into nothing at all here (the view keeps its previous state) instead of a
    traceback in the notebook.
    """

    def on_change(_change=None):
        try:
            redraw()
        except Exception:  # noqa: BLE001
            pass

    for c in controls:
        c.observe(on_change, names="value")
    on_change()
    return on_change


# ------------------------------------------------------------------ fast matrix panels

@dataclass
class Panel:
    """One matrix to draw: rows top to bottom, columns left to right.

    Attributes:
        matrix: 2-D array; ``-inf`` cells (masked scores) are drawn light grey.
        title: shown above the panel.
        row_labels, col_labels: tick labels (tokens), or ``None``.
        vmin, vmax: colour range; ``None`` uses the symmetric range +-max|finite value|
            (or 0..1 when ``weights`` is true).
        annotate: write each value in its cell.
        fmt: format of the annotations.
    """

    matrix: Any
    title: str = ""
    row_labels: Any = None
    col_labels: Any = None
    vmin: float | None = None
    vmax: float | None = None
    annotate: bool = False
    fmt: str = "{:.2f}"


#: Widest figure the explorers draw, in pixels. A notebook shows a wider PNG scaled down
#: to its output area (about 1,090 px wide in JupyterLab in a 1,280 px window), and its
#: text shrinks with it; up to this width every label keeps the size it is drawn at.
MAX_WIDTH_PX = 960


# Text is rasterised here, glyph by glyph with matplotlib's FreeType wrapper, instead of
# with ``Figure.text``: measured, matplotlib's text cannot keep every redraw under 100 ms.
# benchmarks/bench_widgets.py draws each figure both ways in one run (same layout, same
# places; render + PNG; 2 cores):
#   H / d_model explorer, 106 settings: these glyphs median 8.9 ms, worst 38.2 ms;
#     Figure.text median 62.4 ms, worst 198.6 ms (H = 16, 11 tokens), 86 of 106 under 100 ms.
#   step-through, 144 settings: these glyphs median 8.9 ms, worst 39.6 ms;
#     Figure.text median 83.8 ms, worst 379.8 ms (H = 8, 6 x 6 values each), 91 of 144.
# Drawing the text on its own layer and blending it onto the cells (no figimage) still
# took up to 142 ms and 324 ms. The cost is the text itself, about 1 ms per Text object,
# and a step-through figure holds up to 400 of them.
@lru_cache(maxsize=1)
def _font():
    from matplotlib import font_manager, ft2font

    return ft2font.FT2Font(font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans")))


@lru_cache(maxsize=4096)
def _glyphs(text, fontsize):
    """Anti-aliased coverage bitmap of ``text`` (uint8 rows x cols) and its baseline row."""
    import numpy as np

    font = _font()
    font.clear()
    font.set_size(fontsize, 72)
    font.set_text(text, 0.0)
    font.draw_glyphs_to_bitmap(antialiased=True)
    bitmap = np.asarray(font.get_image()).copy()
    descent = int(round(font.get_descent() / 64))
    bitmap.setflags(write=False)
    return bitmap, bitmap.shape[0] - descent


def _text_size(text, fontsize, rotated=False):
    bitmap, _ = _glyphs(str(text), fontsize)
    h, w = bitmap.shape
    return (h, w) if not rotated else (w, h)


def _stamp(img, text, x, y, fontsize, *, ha="center", va="center", rotated=False, colour=(0, 0, 0)):
    """Draw ``text`` into the RGBA float image ``img`` at pixel (x, y) (column, row).

    ``ha``/``va`` say which point of the text sits at (x, y): left/center/right and
    top/center. Vertical centring uses the cap height, so labels line up whatever their
    descenders. ``rotated`` draws it reading bottom to top (column labels).
    """
    import numpy as np

    bitmap, baseline = _glyphs(str(text), fontsize)
    cap = 0.73 * fontsize
    if rotated:
        bitmap = np.rot90(bitmap)  # baseline row becomes column `baseline`
        h, w = bitmap.shape
        left = x - baseline + cap / 2 if ha == "center" else (x - w if ha == "right" else x)
        top = y if va == "top" else y - h / 2
    else:
        h, w = bitmap.shape
        left = x - w / 2 if ha == "center" else (x - w if ha == "right" else x)
        top = y - baseline + cap / 2 if va == "center" else y
    left, top = int(round(left)), int(round(top))
    r0, c0 = max(top, 0), max(left, 0)
    r1, c1 = min(top + h, img.shape[0]), min(left + w, img.shape[1])
    if r0 >= r1 or c0 >= c1:
        return
    alpha = bitmap[r0 - top:r1 - top, c0 - left:c1 - left, None] / 255.0
    region = img[r0:r1, c0:c1, :3]
    img[r0:r1, c0:c1, :3] = region * (1 - alpha) + np.asarray(colour, dtype=float) * alpha


def _fmt(value, fmt):
    import math

    if not math.isfinite(value):
        return "-inf" if value < 0 else ("inf" if value > 0 else "nan")
    s = fmt.format(value)
    if s.startswith("-") and float(s) == 0:
        s = s[1:]
    return s


def _grid_layout(panels, shapes, cols, cell_px, fontsize, share_labels):
    """Pixel positions of the panels in a grid of ``cols`` panels per row.

    Returns:
        ``(xs, ys, width, height, title_h)``: the left edge of the cells in each grid
        column, the top edge of the cells in each grid row, the size of the whole grid
        and the height of a title line.
    """
    rows = -(-len(panels) // cols)
    grid = [(i // cols, i % cols) for i in range(len(panels))]
    title_fs = fontsize + 1

    def in_col(j):
        return [(p, s) for p, s, (_, c) in zip(panels, shapes, grid) if c == j]

    def in_row(i):
        return [(p, s) for p, s, (r, _) in zip(panels, shapes, grid) if r == i]

    def row_lab_w(p):
        if p.row_labels is None:
            return 0
        return max((_text_size(t, fontsize)[1] for t in p.row_labels), default=0) + 4

    def col_lab_h(p):
        if p.col_labels is None:
            return 0
        return max((_text_size(t, fontsize, rotated=True)[0] for t in p.col_labels), default=0) + 4

    col_w = [max(max(s[1] * cell_px, _text_size(p.title, title_fs)[1] - 6) if p.title else s[1] * cell_px
                 for p, s in in_col(j)) for j in range(cols)]
    row_h = [max(s[0] for _, s in in_row(i)) * cell_px for i in range(rows)]
    lab_w = [max([row_lab_w(p) for p, _ in in_col(j)] + [2]) for j in range(cols)]
    lab_h = [max([col_lab_h(p) for p, _ in in_row(i)] + [2]) for i in range(rows)]
    if share_labels:
        lab_w = [lab_w[0]] + [2] * (cols - 1)
        lab_h = [4] * (rows - 1) + [max(lab_h)]
    title_h = title_fs + 6
    xs, x = [], 4
    for j in range(cols):
        x += lab_w[j]
        xs.append(x)
        x += col_w[j] + 10
    ys, y = [], 2
    for i in range(rows):
        y += title_h
        ys.append(y)
        y += row_h[i] + lab_h[i] + 2
    return xs, ys, x, y, title_h


def matrix_mosaic(panels, *, cols=8, cell_px=16, fontsize=12, dpi=72, caption=None,
                  share_labels=False, cmap="cividis", max_width=MAX_WIDTH_PX):
    """Draw matrices side by side as one pixel-exact image with text labels.

    This is the fast path behind the explorers: the cells, titles, labels and values
    are composed into one RGBA array (text bitmaps are cached), shown with a single
    ``figimage``. A figure of 16 heatmaps draws and encodes to PNG in a few tens of
    milliseconds, where one Axes per matrix takes several hundred.

    Args:
        panels: list of :class:`Panel`.
        cols: panels per row of the grid, at most: fewer when the grid would be wider
            than ``max_width``, and then balanced (16 panels that fit 5 to a row are
            drawn as 4 rows of 4), so that labels keep their size instead of the notebook
            scaling the whole image down.
        cell_px: size of one matrix cell in pixels; at least the label's line height
            (about 1.2 x ``fontsize``) where rows or columns carry labels.
        fontsize: label size in points (at 72 dpi, one point is one pixel); titles are
            one point larger, values in cells one point smaller.
        share_labels: draw row labels only in the first grid column and column labels
            only in the last grid row (all panels have the same labels).
        caption: one line of text under the figure.
        max_width: the widest image, in pixels, that several panels per row may make
            (default :data:`MAX_WIDTH_PX`); a single panel wider than this is drawn whole.

    Returns:
        A ``matplotlib.figure.Figure`` (not registered with pyplot). Its attribute
        ``mhalib_panels`` is the number of matrices drawn, ``mhalib_cols`` the panels per
        grid row, ``mhalib_texts`` the list of every text written (titles, labels, values,
        caption) and ``mhalib_image`` the ``(height, width, 3)`` uint8 pixels (what
        :func:`figure_png` encodes).
    """
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    if not panels:
        raise ValueError("matrix_mosaic needs at least one panel")
    cm = colormaps[cmap]
    mats = [np.asarray(p.matrix, dtype=float) for p in panels]
    for m in mats:
        if m.ndim != 2:
            raise ValueError(f"each panel needs a 2-D matrix; got shape {m.shape}")
    shapes = [m.shape for m in mats]
    cols = max(1, min(cols, len(panels)))
    while cols > 1 and _grid_layout(panels, shapes, cols, cell_px, fontsize, share_labels)[2] > max_width:
        cols -= 1
    rows = -(-len(panels) // cols)
    cols = -(-len(panels) // rows)  # the same number of rows, as even as they go
    xs, ys, width, height, title_h = _grid_layout(panels, shapes, cols, cell_px, fontsize, share_labels)
    grid = [(i // cols, i % cols) for i in range(len(panels))]
    title_fs = fontsize + 1
    caption_h = fontsize + 10 if caption else 0
    width = max(width, (_text_size(caption, fontsize)[1] + 12) if caption else 0)
    height += caption_h

    img = np.ones((height, width, 4), dtype=np.float32)
    texts = []
    for p, m, (r, c) in zip(panels, mats, grid):
        x0, y0 = xs[c], ys[r]
        n_r, n_c = m.shape
        finite = np.isfinite(m)
        lo, hi = p.vmin, p.vmax
        if lo is None or hi is None:
            amax = float(np.abs(m[finite]).max()) if finite.any() else 1.0
            amax = amax or 1.0
            lo = -amax if lo is None else lo
            hi = amax if hi is None else hi
        z = np.clip((np.where(finite, m, lo) - lo) / ((hi - lo) or 1.0), 0, 1)
        rgba = cm(z)  # (n_r, n_c, 4)
        rgba[~finite] = (0.88, 0.88, 0.88, 1.0)
        img[y0:y0 + n_r * cell_px, x0:x0 + n_c * cell_px] = np.repeat(np.repeat(rgba, cell_px, 0), cell_px, 1)
        if p.title:
            _stamp(img, p.title, x0 + n_c * cell_px / 2, y0 - title_h + 2, title_fs, va="top")
            texts.append(p.title)
        if p.row_labels is not None and (c == 0 or not share_labels):
            for i, t in enumerate(p.row_labels):
                _stamp(img, t, x0 - 3, y0 + (i + 0.5) * cell_px, fontsize, ha="right")
                texts.append(str(t))
        if p.col_labels is not None and (r == rows - 1 or not share_labels):
            for j, t in enumerate(p.col_labels):
                _stamp(img, t, x0 + (j + 0.5) * cell_px, y0 + n_r * cell_px + 3, fontsize, va="top",
                       rotated=True)
                texts.append(str(t))
        if p.annotate:
            for i in range(n_r):
                for j in range(n_c):
                    v = float(m[i, j])
                    t = _fmt(v, p.fmt)
                    colour = (0, 0, 0) if (not np.isfinite(v) or z[i, j] > 0.55) else (1, 1, 1)
                    _stamp(img, t, x0 + (j + 0.5) * cell_px, y0 + (i + 0.5) * cell_px, fontsize - 1,
                           colour=colour)
                    texts.append(t)
    if caption:
        _stamp(img, caption, 6, height - caption_h / 2 - 1, fontsize, ha="left")
        texts.append(caption)
    pixels = np.round(img[..., :3] * 255).astype(np.uint8)  # (height, width, 3)
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    fig.figimage(pixels, 0, 0, origin="upper")
    fig.mhalib_image = pixels
    fig.mhalib_panels = len(panels)
    fig.mhalib_cols = cols
    fig.mhalib_texts = texts
    return fig
