"""How live do the explorers feel? Kernel-side redraw time.

One redraw is what a slider move costs in the kernel: the render function (attention
for the chosen sizes, the text, the figure) plus encoding the figure to PNG bytes, as
the explorer's Output shows it. Sending the bytes to the browser is not counted.

Goal: median redraw under 100 ms for every d_model <= 128 and H <= 16 on 2 cores.
Reported: median milliseconds per setting and the ratio to the goal (below 1 meets
it), and, side by side in the same run, two obvious ways that are slower: drawing the
same heads with one matplotlib Axes per head (``mhalib.plots.attention_grid``), and
the same explorer figure with its text drawn by matplotlib (``Figure.text``, one per
title, label and value, at the same places) instead of the explorers' cached glyphs.
The KV-cache explorer (notebook 06) and the GQA explorer (notebook 07) are held to
the same goal: every model at its smallest, released and largest g, and every H
with its smallest, middle and largest g.

Usage: python benchmarks/bench_widgets.py
"""

from __future__ import annotations

import io
import statistics

import matplotlib

matplotlib.use("Agg")

from common import median_time, print_table  # noqa: E402

from mhalib.sentences import SENTENCES  # noqa: E402
from mhalib.kv_cache import MODEL_CONFIGS  # noqa: E402
from mhalib.validation import divisors  # noqa: E402
from mhalib.widgets.common import figure_png  # noqa: E402
from mhalib.widgets.gqa import HEAD_OPTIONS, render_gqa  # noqa: E402
from mhalib.widgets.kv import render_kv  # noqa: E402
from mhalib.widgets.mha import (  # noqa: E402
    D_MODEL_OPTIONS,
    MAX_HEADS,
    STEP_D_MODEL_OPTIONS,
    STEP_MAX_HEADS,
    STEPS,
    render_mha,
    render_step,
)

GOAL_MS = 100.0
SHORT, LONG = "The cat sat on", max(SENTENCES, key=lambda s: len(SENTENCES[s]))


def redraw(render, *args):
    view = render(*args)
    assert view.ok, view.text
    return figure_png(view.figure)


def text_redraw(render, *args):
    """The same figure with matplotlib's text: every glyph stamp becomes a ``Figure.text``.

    ``matrix_mosaic`` draws all its text through ``common._stamp``; here that call only
    records what and where, the cells go in as one ``figimage`` and matplotlib draws
    the text and encodes the PNG.
    """
    from mhalib.widgets import common

    stamps = []
    stamp, common._stamp = common._stamp, lambda img, *a, **k: stamps.append((a, k))
    try:
        view = render(*args)
    finally:
        common._stamp = stamp
    assert view.ok, view.text
    fig = view.figure
    height, width, _ = fig.mhalib_image.shape
    for (text, x, y, size), k in stamps:
        ha, colour = k.get("ha", "center"), "white" if k.get("colour", (0, 0, 0))[0] else "black"
        rotated = k.get("rotated", False)
        va = "top" if k.get("va") == "top" and not rotated else "center_baseline"
        fig.text(x / width, 1 - y / height, str(text), fontsize=size, color=colour, parse_math=False,
                 ha="right" if rotated else ha, va=va, rotation=90 if rotated else 0, rotation_mode="anchor")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi, pil_kwargs={"compress_level": 3})
    return buf.getvalue()


def side_by_side(settings, render, repeat):
    """Median ms of the explorer and of its matplotlib-text twin for each setting, same run."""
    ours, text = [], []
    for args in settings:
        ours.append(median_time(lambda: redraw(render, *args), repeat=repeat, warmup=1) * 1e3)
        text.append(median_time(lambda: text_redraw(render, *args), repeat=repeat, warmup=1) * 1e3)
    return ours, text


def summarise(name, settings, ours, text):
    print(f"\n{name}, {len(settings)} settings: glyphs vs matplotlib text (render + PNG, same run)")
    ratios = [t / o for o, t in zip(ours, text)]
    rows = []
    for label, times in (("glyphs", ours), ("matplotlib text", text)):
        worst = max(range(len(times)), key=times.__getitem__)
        rows.append([label, f"{statistics.median(times):.1f}", f"{times[worst]:.1f}", str(settings[worst]),
                     f"{sum(t < GOAL_MS for t in times)} of {len(times)}"])
    print_table(["text", "median ms", "worst ms", "worst at", "under goal"], rows)
    print(f"matplotlib text / glyphs: median {statistics.median(ratios):.1f}x, largest {max(ratios):.1f}x")


def grid_redraw(d_model, num_heads, sentence):
    """The same heads drawn with one Axes each (constrained layout), then PNG."""
    import matplotlib.pyplot as plt

    from mhalib.plots import attention_grid

    view = render_mha(d_model, num_heads, sentence)
    fig = attention_grid(view.data["weights"], view.data["tokens"])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def main():
    print(f"explorer redraw (render + PNG), median of 5; goal {GOAL_MS:.0f} ms; "
          "'mpl text': the same figure with matplotlib's text")
    settings = [(d_model, h, sentence) for d_model in D_MODEL_OPTIONS
                for h in [h for h in divisors(d_model) if h <= MAX_HEADS] for sentence in (SHORT, LONG)]
    medians, text_medians = side_by_side(settings, render_mha, repeat=5)
    rows = [[d_model, h, len(SENTENCES[sentence]), f"{t:.1f}", f"{t / GOAL_MS:.2f}", f"{m:.1f}"]
            for (d_model, h, sentence), t, m in zip(settings, medians, text_medians)]
    print_table(["d_model", "H", "tokens", "median ms", "/ goal", "mpl text ms"], rows)
    worst = max(medians)
    print(f"\nall {len(medians)} settings: median {statistics.median(medians):.1f} ms "
          f"({statistics.median(medians) / GOAL_MS:.2f} of the goal), worst {worst:.1f} ms "
          f"({worst / GOAL_MS:.2f}); {sum(m < GOAL_MS for m in medians)} of {len(medians)} under the goal")
    summarise("H / d_model explorer", [(d, h, len(SENTENCES[s])) for d, h, s in settings], medians, text_medians)

    print("\nstep-through redraw (render + PNG), median over steps of the median of 3")
    sizes = [(d_model, h) for d_model in STEP_D_MODEL_OPTIONS for h in divisors(d_model) if h <= STEP_MAX_HEADS]
    step_settings = [(s, d_model, h, "the cat sat on the mat", True) for d_model, h in sizes for s in STEPS]
    step_medians, step_text = side_by_side(step_settings, render_step, repeat=3)
    rows = []
    for i, (d_model, h) in enumerate(sizes):
        per_step = step_medians[i * len(STEPS):(i + 1) * len(STEPS)]
        per_step_text = step_text[i * len(STEPS):(i + 1) * len(STEPS)]
        rows.append([d_model, h, f"{statistics.median(per_step):.1f}", f"{max(per_step):.1f}",
                     f"{max(per_step) / GOAL_MS:.2f}", f"{max(per_step_text):.1f}"])
    print_table(["d_model", "H", "median ms", "slowest step ms", "slowest / goal", "mpl text slowest ms"], rows)
    print(f"\nall steps: median {statistics.median(step_medians):.1f} ms, worst {max(step_medians):.1f} ms")
    summarise("step-through", [(d, h, s) for s, d, h, _, _ in step_settings], step_medians, step_text)

    print("\nside by side: one image for all heads vs one matplotlib Axes per head (same run)")
    rows = []
    for d_model, h in [(8, 2), (64, 8), (128, 16)]:
        ours = median_time(lambda: redraw(render_mha, d_model, h, LONG), repeat=3, warmup=1) * 1e3
        axes = median_time(lambda: grid_redraw(d_model, h, LONG), repeat=3, warmup=1) * 1e3
        rows.append([d_model, h, f"{ours:.1f}", f"{axes:.1f}", f"{axes / ours:.1f}x"])
    print_table(["d_model", "H", "explorer ms", "Axes per head ms", "explorer faster by"], rows)

    bench_kv()
    bench_gqa()


def bench_kv():
    """KV-cache explorer: each model at its smallest, released and largest g."""
    print("\nKV-cache explorer (notebook 06) redraw (render + PNG), median of 5, 4,096 tokens, fp16")
    rows, kv_medians = [], []
    for model, c in MODEL_CONFIGS.items():
        options = divisors(c["num_heads"])
        for g in sorted({options[0], c["num_kv_heads"], options[-1]}):
            t = median_time(lambda: redraw(render_kv, 4096, g, model), repeat=5, warmup=1) * 1e3
            kv_medians.append(t)
            rows.append([model, c["num_heads"], g, f"{t:.1f}", f"{t / GOAL_MS:.2f}"])
    print_table(["model", "H", "g", "median ms", "/ goal"], rows)
    print(f"\nall {len(kv_medians)}: median {statistics.median(kv_medians):.1f} ms, worst {max(kv_medians):.1f} ms "
          f"({max(kv_medians) / GOAL_MS:.2f} of the goal)")


def bench_gqa():
    """GQA explorer: each H at its smallest, middle and largest g."""
    print("\nGQA explorer (notebook 07) redraw (render + PNG), median of 5, 4,096 tokens")
    rows, gqa_medians = [], []
    for h in HEAD_OPTIONS:
        options = divisors(h)
        for g in sorted({options[0], options[len(options) // 2], options[-1]}):
            t = median_time(lambda: redraw(render_gqa, h, g, 4096), repeat=5, warmup=1) * 1e3
            gqa_medians.append(t)
            rows.append([h, g, f"{t:.1f}", f"{t / GOAL_MS:.2f}"])
    print_table(["H", "g", "median ms", "/ goal"], rows)
    print(f"\nall {len(gqa_medians)}: median {statistics.median(gqa_medians):.1f} ms, worst {max(gqa_medians):.1f} ms "
          f"({max(gqa_medians) / GOAL_MS:.2f} of the goal)")


if __name__ == "__main__":
    main()
