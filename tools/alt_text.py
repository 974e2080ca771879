"""Alternative text for every figure of the course: the table, and the tool that stores it.

A figure is an ``image/png`` output of a code cell, or the figure an explorer had drawn
into its ``Output`` widget when the notebook was saved (the site shows that still; see
``tools/build_site.py``). Each gets a sentence or two that say what the figure shows, kept
in the cell's metadata, one entry per figure in the order the cell shows them::

    "metadata": {"mhalib": {"alt": ["Heatmap of ...", "..."]}}

Cell metadata survives re-execution (``make notebooks``, JupyterLab's Run All); outputs do
not. The site writes each entry as its image's ``alt``; in JupyterLab, the course's extension
(``labextension/``) sets it on each image output, since JupyterLab's own image renderer sets
only the source, width and height whatever the metadata says.

The texts live in :data:`ALT` below, keyed by notebook and by the cell's id (stable across
re-execution and edits of the cell's code), so that they can be written again after a
notebook was re-executed from a copy that lacked them::

    python tools/alt_text.py            # write ALT into the notebooks (cell metadata only)
    python tools/alt_text.py --check    # list figures without text, and entries whose cell is gone

``tests/test_alt_text.py`` fails on any figure in ``notebooks/`` or ``solutions/`` without
alternative text, and on a cell whose number of texts differs from its number of figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

__all__ = ["ALT", "widget_models", "widget_images", "figures", "alt_texts", "missing", "apply"]


def widget_models(nb) -> dict:
    """The saved widget models of a notebook: ``{model_id: {"model_name", "state", ...}}``."""
    state = (nb.get("metadata", {}).get("widgets") or {}).get(WIDGET_STATE) or {}
    return state.get("state") or {}


def _model_ref(value):
    return value[len("IPY_MODEL_"):] if isinstance(value, str) and value.startswith("IPY_MODEL_") else None


def widget_images(model_id, models, _seen=None) -> list:
    """The ``image/png`` outputs held by the ``Output`` widgets of a widget tree, depth first.

    Children that are hidden (``layout.display == "none"``) count too: the site draws the
    tree as saved, and an Output's figure is shown whatever its siblings' layout.
    """
    seen = set() if _seen is None else _seen
    if model_id in seen or model_id not in models:
        return []
    seen.add(model_id)
    model = models[model_id]
    state = model.get("state", {})
    found = []
    if model.get("model_name") == "OutputModel":
        found += [o for o in state.get("outputs", []) if "image/png" in o.get("data", {})]
    for child in state.get("children", []) or []:
        ref = _model_ref(child)
        if ref:
            found += widget_images(ref, models, seen)
    return found


def figures(cell, models) -> list:
    """Every figure a code cell shows, in order: ``[(kind, output), ...]``.

    ``kind`` is ``"output"`` for an ``image/png`` output of the cell, ``"widget"`` for a
    figure inside one of its widgets' saved state (``models``: :func:`widget_models`).
    """
    found = []
    if cell.get("cell_type") != "code":
        return found
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "image/png" in data:
            found.append(("output", out))
        elif WIDGET_VIEW in data:
            found += [("widget", o) for o in widget_images(data[WIDGET_VIEW].get("model_id"), models)]
    return found


def alt_texts(cell) -> list:
    """The alternative texts stored in a cell's metadata (``[]`` when none)."""
    alt = (cell.get("metadata", {}).get("mhalib") or {}).get("alt") or []
    return [alt] if isinstance(alt, str) else list(alt)


def missing(nb) -> list:
    """``[(cell index, cell id, figures, texts)]`` for cells whose figures lack text.

    A cell is listed when it has more figures than non-empty texts, or texts for figures it
    does not have (a stale entry after its figures changed).
    """
    models = widget_models(nb)
    found = []
    for i, cell in enumerate(nb.get("cells", [])):
        figs = figures(cell, models)
        texts = [t for t in alt_texts(cell) if isinstance(t, str) and t.strip()]
        if len(texts) != len(figs) or len(alt_texts(cell)) != len(figs):
            found.append((i, cell.get("id"), len(figs), len(texts)))
    return found


# ----------------------------------------------------------------------------- the texts
# notebook -> cell id -> one text per figure of the cell, in the order the cell shows them.
ALT: dict[str, dict[str, list[str]]] = {
    "notebooks/01_single_head_attention.ipynb": {
        "774fa648": [
            "Two 3 by 3 heatmaps of causal attention weights over positions x1, x2, x3 (rows: query "
            "position, columns: key position), each cell labelled with its weight, colour from dark "
            "(0) to yellow (1). Head 1, A1, has rows 1, 0, 0; 0.33, 0.67, 0; 0.25, 0.25, 0.50. Head 2, "
            "A2, has rows 1, 0, 0; 0.33, 0.67, 0; 0.33, 0.33, 0.33. Above the diagonal every weight "
            "is 0: no position looks ahead."],
        "8040b839": [
            "Line chart of the mean softmax entropy in nats (vertical) against the head dimension d_k "
            "from 1 to 512 on a logarithmic axis. The scaled scores, QK^T divided by the square root "
            "of d_k (solid line, round markers), stay flat near 3.0 nats. The unscaled scores QK^T "
            "(dashed line, square markers) fall from 3.06 at d_k = 1 to below 0.2 at d_k = 512. A "
            "dotted line marks the uniform distribution over 32 keys, ln 32, about 3.47."],
        "42872d3c": [
            "Heatmap of one 11 by 11 attention matrix over the sentence 'The animal didn't cross the "
            "street because it was too tired' (rows: query token, columns: key token), colour from "
            "dark (0) to yellow (1). Each row puts all its weight on one token: 'cross' and 'street' "
            "look at 'street', 'the' at 'the', 'it' at 'animal', and the other tokens at themselves; "
            "the row of 'because' splits its weight in half between 'cross' and 'tired'. Three "
            "relations sit in one matrix."],
    },
    "notebooks/02_multi_head_attention.ipynb": {
        "b3fb1cb0": [
            "Block diagram of multi-head attention with H = 4 and d_model = 8. The input x, shape "
            "(N, 8), feeds four head boxes; each reads with its own W_q, W_k, W_v of shape (8, 2), "
            "computes softmax(Q K^T / square root of 2) V and outputs (N, 2). The four outputs join "
            "in a concat box, (N, 4 x 2 = 8), then W_o, (8, 8), then the output, (N, 8). The title "
            "says the head outputs are concatenated, not summed, then mixed by W_o."],
        "290f8b3d": [
            "Two 4 by 4 heatmaps, head 0 and head 1, of attention weights on 'The cat sat on' with "
            "d_model 8, H 2, d_k 4 (rows: query, columns: key), each cell labelled with its weight. "
            "The weights are spread out, none above 0.56: in head 0 'sat' puts 0.53 on 'The', and in "
            "head 1 'The' puts 0.56 on 'on'. The two heads' patterns differ."],
        "6a5f964e": [
            "Four 4 by 4 heatmaps, heads 0 to 3, of attention weights on 'I love deep learning' with "
            "d_model 8, H 4, d_k 2 (rows: query, columns: key), each cell labelled with its weight. "
            "Each head has its own pattern: head 0 sends 'deep' to 'learning' (0.84), head 2 sends "
            "'deep' to itself (0.69), head 3 sends 'I' to itself (0.69) and 'learning' to itself "
            "(0.73)."],
        "7f024713": [
            "Still of the explorer at d_model 8, H 2 on 'The cat sat on': two 4 by 4 heatmaps, head 0 "
            "and head 1, of attention weights, each cell labelled with its weight (rows: queries, "
            "columns: keys; colour from dark, 0, to yellow, 1). In head 0 'sat' puts 0.95 on 'on'; "
            "in head 1 'The' puts 0.65 on itself."],
        "488ea5d6": [
            "Eight heatmaps, heads 0 to 7, of random-projection attention with d_model 64 and H 8 on "
            "the 11 tokens of 'The animal didn't cross the street because it was too tired' (rows: "
            "queries, columns: keys; colour from dark, 0, to yellow, 1). Each head puts its weight on "
            "a few different tokens, in a pattern of its own; no two heads look alike."],
        "16ca04e1": [
            "Two rows of four heatmaps on the 12 tokens of '<bos> the king does not see mary because "
            "he is tired .' (rows: queries, columns: keys; causal, so the upper triangle is empty). "
            "Top row: the trained language model's layer 1, heads 0 to 3. Head 2 puts almost all the "
            "weight of 'because' and of the final '.' on 'king', and head 3 sends most rows to "
            "'<bos>'. Bottom row: random projections of the same sizes, whose weights are scattered "
            "with no such pattern."],
        "fe06b7d9": [
            "Still of the step-through explorer at its first step, 'input': one 4 by 8 matrix x of "
            "token embeddings for 'The cat sat on' (rows: tokens, columns: the 8 features), each cell "
            "labelled with its value, from -2.2 to 3.1."],
        "3dd14869": [
            "Two 6 by 4 matrices, head 0 and head 1, of the split queries Q_h for 'the cat sat on the "
            "mat' with d_model 8 and H 2 (rows: tokens, columns: the head's 4 dimensions), each cell "
            "labelled with its value: one (N, d_k) matrix per head."],
    },
    "notebooks/03_mha_in_pytorch.ipynb": {
        "dc7a81c5": [
            "Four 6 by 6 heatmaps, heads 0 to 3, of nn.MultiheadAttention's weights with a causal "
            "mask on 'The cat sat on the mat' (rows: query, columns: key; untrained weights), each "
            "cell labelled with its weight. Every weight above the diagonal is 0.00 and the first "
            "row is 1.00 on 'The' in every head; below the diagonal the weights are spread, "
            "different in each head."],
    },
    "notebooks/04_what_heads_learn.ipynb": {
        "6c39eb3d": [
            "Two line charts against training step, 0 to 1,500, for the 2-layer model on the "
            "variable-offset copy task. Left: the loss on copy positions starts at about 4.2 (the "
            "line 'uniform over vocabulary'), falls slowly to about 3.5 by step 450, then drops to "
            "near 0 by step 700, passing the dotted line 'uniform over tokens seen' on the way. "
            "Right: the accuracy creeps up to about 0.15 by step 450, then jumps to above 0.9 by "
            "about step 600 (dashed line 'accuracy 0.9') and to 1.0 by step 800. A slow plateau, then "
            "a cliff."],
        "50c80b22": [
            "Line chart against training step, 0 to 1,500: the loss on copy positions (solid black "
            "line, left axis, from about 4.2 to near 0, falling steeply between steps 450 and 650), "
            "the best previous-token score of layer 0 (dashed line, right axis, from about 0.1 to "
            "about 0.8) and the best induction score of layer 1 (solid teal line, right axis, from "
            "about 0.06 to about 1.0). Both scores rise during the fall of the loss."],
        "77347cb4": [
            "Eight heatmaps, layers 0 and 1 by heads 0 to 3, of the trained copy-task model's "
            "attention on one sequence with a repeated segment of length 10 (rows: query, columns: "
            "key; every other token labelled; colour from dark, 0, to yellow, 1). Each title gives "
            "the head's previous-token score and induction score. Layer 0, head 1 (previous-token "
            "score 0.82) is one bright line just below the diagonal: each token looks at the token "
            "before it. Layer 1, heads 1, 2 and 3 (induction scores 0.97, 0.93, 0.98) show a bright "
            "line offset by the segment length in the repeated part: each token looks at the token "
            "after its earlier copy."],
        "4d817277": [
            "Two line charts against training step for three runs. Left: loss on copy positions; "
            "right: accuracy. '2 layers, variable offset' (solid line) falls from about 4.2 to near "
            "0 after a plateau, with accuracy reaching 1.0 by step 800. '1 layer, variable offset' "
            "(dashed line) stays near a loss of 3.0 and an accuracy of about 0.2 through step "
            "1,000. '1 layer, fixed offset' (dotted line) drops to near 0 loss and 0.98 accuracy by "
            "step 200. One layer learns the fixed offset but not the variable one."],
        "aa1ace6f": [
            "Four heatmaps, heads 0 to 3, of the one-layer fixed-offset model on a sequence with no "
            "repeats (rows: query, columns: key; every other token labelled; colour from dark, 0, to "
            "yellow, 1). In every head one bright diagonal line runs 7 positions below the main "
            "diagonal: each token looks 7 back whatever the content. The titles give the weight "
            "7 back: 0.85, 0.82, 0.85, 0.83."],
    },
    "notebooks/05_heads_in_language.ipynb": {
        "b4b7cb9c": [
            "Eight heatmaps, layers 0 and 1 by heads 0 to 3, of the seed-0 language model's attention "
            "on the first 26 tokens of a fresh sequence (rows: query, columns: key; causal, so the "
            "upper triangle is empty; every other token labelled; colour from dark, 0, to yellow, 1). "
            "Each title gives the head's agreement and coreference scores. Layer 0's heads spread "
            "their weight over earlier tokens (scores at most 0.11). In layer 1, head 2 (agreement "
            "0.45, coreference 0.68) and head 3 (agreement 0.91) put bright single cells on a few "
            "earlier nouns such as 'paul'."],
        "e8366ae3": [
            "Four heatmaps, seed 0, layer 1, heads 0 to 3: three query rows, 'boxes (-> does)', "
            "'because (-> it)' and 'birds (-> greet-it)', against the 24 tokens of '<bos> near the "
            "cats the dog by the boxes does not cross the street because it is tired . the birds "
            "greet-it today .' (columns: key; colour from dark, 0, to yellow, 1). Head 0 puts the "
            "'boxes' row on 'boxes'. Head 2 puts the 'boxes' and 'because' rows on 'dog' and part of "
            "the 'birds' row on 'birds'. Head 3 puts part of the 'boxes' row on 'dog' and the "
            "'birds' row on 'birds'. Head 1 spreads its weight."],
        "a7db2001": [
            "Two charts against the number of heads H at d_model 64 (1, 2, 4, 8, 16; d_head 64 down "
            "to 4), means of 3 seeds with bars from lowest to highest. Left: the average loss falls "
            "from about 1.955 at H = 1 to about 1.941 at H = 8 and stays there at H = 16. Right: "
            "accuracy on the pronoun of a verb that carries one; 'two words, subject elsewhere' "
            "(solid black line, round markers, with bars) rises from about 0.82 at H = 1 to about "
            "0.99 at H = 8, and 'two words, subject = query' (dotted teal line, triangle markers) is "
            "about 0.85 at H = 1 and about 0.99 from H = 2 on."],
    },
    "notebooks/06_kv_cache.ipynb": {
        "636a4299": [
            "Log-log chart of the multiply-adds of one decoding step (vertical) against the tokens "
            "in the sequence n, from 64 to 1,024, with d_model 16 and H 4. Recomputing everything "
            "(round markers, 4nd^2 + 2n^2d) climbs from about 2 x 10^5 to about 3.5 x 10^7, along a "
            "dotted guide of slope 2 (n^2). The cached step (square markers, 4d^2 + 2nd) climbs from "
            "about 3 x 10^3 to about 3.4 x 10^4, along a dashed guide of slope 1 (n): the cache "
            "turns a quadratic step into a linear one."],
        "1f3fcfb9": [
            "Still of the KV-cache explorer: log-log chart of the KV cache in fp16/bf16 against the "
            "context length from 512 to 128k tokens, one straight line per released model (GPT-2 "
            "g = 12, Llama-2-7B g = 32, Llama-2-70B g = 8, Llama-3-8B g = 8, Mistral-7B g = 8, "
            "Falcon-7B g = 1), named in the legend. The chosen setting, Llama-2-7B with g = 32, is a "
            "thick dashed black line with a point at 4k tokens labelled 2 GiB; it lies on "
            "Llama-2-7B's own line, the highest, which reaches 64 GiB at 128k. Falcon-7B's single "
            "K/V head gives the lowest line, from 4 MiB at 512 tokens."],
        "cdf3f0b7": [
            "The KV-cache explorer's chart for Llama-2-7B with g = 8 instead of its 32: the same "
            "lines per released model, and the chosen setting as a thick dashed black line, now on "
            "the line of Llama-3-8B and Mistral-7B (g = 8), four times below Llama-2-7B's own, with "
            "a point at 4k tokens labelled 512 MiB."],
    },
    "notebooks/07_mqa_gqa.ipynb": {
        "fc9e8313": [
            "Log-log roofline chart: arithmetic intensity from 0.25 to 1,000 FLOP per byte of K and V "
            "on the horizontal axis, fraction of the multiply-add peak from 0.001 to 1 on the vertical."
            " A solid black roof for this CPU on one thread rises with slope 1 and turns flat at its "
            "ridge point, a few FLOP per byte; two gray roofs, dashed for the A100 and dotted for the "
            "H100 (published figures), turn flat only at 153 and 295 FLOP per byte. Blue circles mark "
            "the fused kernel at H = 32 for MHA (0.5 FLOP per byte), GQA-16, GQA-8, GQA-4, GQA-2 and "
            "MQA (16 FLOP per byte), each labelled, the MHA point near the CPU's sloped roof and the "
            "MQA point under its flat part; orange squares mark five released models' shapes, from 2.5 "
            "to 35.5 FLOP per byte (Falcon-7B labelled, the rightmost). Where each point lies depends "
            "on the machine that ran the notebook."],
        "9e85b58a": [
            "Still of the GQA explorer at H = 8, g = 2. Top: eight query-head boxes q0 to q7 above "
            "two K/V-head boxes; lines join q0 to q3 to KV0 and q4 to q7 to KV1, and each group has "
            "its own colour. Bottom: horizontal bars of the KV cache at 4,096 tokens, 32 layers, "
            "d_k 128, fp16: MHA (g = 8) 512 MiB, this setting (g = 2) 128 MiB, MQA (g = 1) 64 MiB."],
        "dd23fa3a": [
            "The GQA explorer's figure for H = 32, g = 8 (Llama-3-8B): 32 query-head boxes above "
            "eight K/V-head boxes KV0 to KV7, each K/V head joined by lines to four consecutive "
            "query heads and coloured like them. Bars of the KV cache at 4,096 tokens: MHA "
            "(g = 32) 2 GiB, this setting (g = 8) 512 MiB, MQA (g = 1) 64 MiB."],
    },
    "notebooks/08_mha_to_gqa.ipynb": {
        "91e0f732": [
            "Line chart of the evaluation loss on held-out sequences, on a logarithmic axis, against "
            "the uptraining step from 0 to 300, for six converted models: GQA-2 (solid lines) and "
            "MQA (dashed lines), each converted by mean, first or random K/V heads (a colour per "
            "method, named in the legend). A black line marks the original MHA model's loss, about "
            "0.013; dashed vertical lines mark 5% and 20% of the training steps. Mean-pooled models "
            "start lowest and come near the original's loss first, within about 100 steps; "
            "first-head models follow; random ones stay near 3 for 100 to 200 steps and are still "
            "the highest at step 300. Each curve has its own marker."],
    },
    "notebooks/10_choosing_a_variant.ipynb": {
        "n10-13": [
            "Two line charts of recall, the mean of 5 seeds, one line per attention variant (each with its own "
            "marker and dash). Left: recall against the number of key-value pairs, 4 to 32. MHA, GQA-4, GQA-2, "
            "MQA, MLA-16 and MLA-32 lie together at the top, between 0.99 and 1.0, at every count; the four "
            "windows lie near the bottom, from about 0.3 at 4 pairs down to about 0.1 at 32; a grey line marks "
            "chance, 1/16. Right: recall against the distance from the asked key back to its pair, in bands "
            "1-7, 8-15, 16-31 and 32-63 positions: the full-cache variants stay at 1.0 in every band, the "
            "windows between about 0.16 and 0.30 in every band, inside their window or not."],
        "n10-20": [
            "Three scatter charts, one point per variant at the mean of 5 seeds with a grey bar for the range of "
            "the seeds and a grey line through the frontier; hollow markers are the converted models. Left: "
            "recall against the cache of a 64-token sequence (log scale, 4 to 32 KiB): every full-cache variant "
            "sits near 1.0, the windows near 0.17 at 4 and 8 KiB; the frontier runs through MQA at 4 KiB, GQA-2 "
            "and GQA-4, and MHA at 32 KiB is off it. Middle: the grammar's loss against the same cache, every "
            "variant between about 1.987 and 1.997 with overlapping ranges; the frontier runs through MQA, "
            "MLA-16 and SWA-16+sink. Right: recall against the decode time of one step on a log scale, from "
            "about 40 microseconds for the windows to about 15 milliseconds for MHA and MLA-32; the frontier "
            "runs through the windows at the left, low, and MQA, GQA-2 and GQA-4 at the top."],
        "n10-26": [
            "Still of the trade-off explorer with g = 2: scatter of recall against cache bytes at 64 tokens "
            "for the 10 measured variants, the frontier drawn through GQA-4, GQA-2 and MQA, and GQA-2 ringed at "
            "8,192 bytes and recall 1.000, on the frontier."],
    },
    "notebooks/09_beyond_gqa.ipynb": {
        "5c8d564d": [
            "Log-log chart of the bytes read per decode step at batch 1 in GiB (fp16), against the "
            "tokens in flight (batch x context) from 100 to 1 million, from the published shapes of "
            "Llama-2-7B and Llama-3-8B. For each model, a solid line is weights plus cache and a "
            "dotted line the cache alone; a dashed horizontal line marks the weights a step reads, "
            "about 12.3 and 14 GiB. The weights dominate until the cache crosses them, marked by a "
            "vertical line: at 25,205 tokens for Llama-2-7B and at 114,516 tokens for Llama-3-8B, "
            "whose 8 K/V heads keep its cache four times smaller."],
        "3f7ff934": [
            "Still of the cache-kinds explorer at a context of 32k tokens and a window of 4,096: "
            "log-log chart of the KV cache in fp16/bf16 against the context length from 512 to 128k "
            "tokens, one line per design, named in the legend, with a point on each at 32k (dashed "
            "vertical line). Llama-2-7B (MHA, g = 32) is highest, 16 GiB at 32k; Llama-3-8B (GQA-8) "
            "four times lower, 4 GiB; DeepSeek-V3 (MLA, 61 layers) lower still, about 2.1 GiB; "
            "Mistral-7B (GQA-8 with a 4,096-token window) follows Llama-3-8B up to 4k tokens, then "
            "stays flat at 512 MiB."],
        "499db371": [
            "The cache-kinds explorer's chart at 32,768 tokens with a 4,096-token window: the same "
            "four lines as the explorer above, with points at 32k: Llama-2-7B (MHA) 16 GiB, "
            "Llama-3-8B (GQA-8) 4 GiB, DeepSeek-V3 (MLA) about 2.1 GiB, and Mistral-7B's windowed "
            "cache flat at 512 MiB from 4k tokens on."],
    },
}


def apply(paths=None, *, table=None, write=True) -> list[str]:
    """Write ``table`` (default :data:`ALT`) into the cells' metadata of the notebooks.

    Each notebook is read from disk just before and written back at once, and only the
    metadata of cells named in the table changes. Returns what was done, one line per
    notebook, and raises ``SystemExit`` naming a table entry whose cell is not there.
    """
    import nbformat

    table = ALT if table is None else table
    report = []
    for rel in (paths or sorted(table)):
        rel = str(Path(rel).resolve().relative_to(ROOT)) if Path(rel).is_absolute() else str(rel)
        if rel not in table:
            report.append(f"{rel}: no entries")
            continue
        path = ROOT / rel
        nb = nbformat.read(path, as_version=4)
        by_id = {c.get("id"): c for c in nb.cells}
        gone = sorted(set(table[rel]) - set(by_id))
        if gone:
            raise SystemExit(f"{rel}: no cell with id {', '.join(gone)}; the table in tools/alt_text.py "
                             "names cells by id: update it for the notebook as it is now")
        changed = 0
        for cell_id, texts in table[rel].items():
            meta = by_id[cell_id].metadata
            if (meta.get("mhalib") or {}).get("alt") != list(texts):
                meta.setdefault("mhalib", {})["alt"] = list(texts)
                changed += 1
        if changed and write:
            nbformat.write(nb, path)
        report.append(f"{rel}: {changed} cell(s) {'updated' if write else 'to update'}, "
                      f"{len(table[rel])} in the table")
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebooks to write (default: every one in the table)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; list figures without alternative text (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        import nbformat

        paths = args.notebooks or sorted(str(p.relative_to(ROOT)) for d in ("notebooks", "solutions")
                                         for p in (ROOT / d).glob("*.ipynb"))
        bad = 0
        for rel in paths:
            nb = nbformat.read(ROOT / rel, as_version=4)
            for i, cell_id, n_fig, n_alt in missing(nb):
                bad += 1
                print(f"{rel}: cell {i + 1} (id {cell_id}): {n_fig} figure(s), {n_alt} alternative text(s)")
        print(f"{bad} cell(s) without matching alternative text" if bad else "every figure has alternative text")
        return 1 if bad else 0
    for line in apply(args.notebooks or None):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
