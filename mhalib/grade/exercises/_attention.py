"""Judging attention outputs, shared by exercises 02 (multi-head) and 07 (grouped-query).

The weights an attention case draws, the known mistakes of multi-head and grouped-query
attention as variants to match, the judge of ``(out, weights)`` and the explanation of an
exception. Each exercise module keeps only what is its own (its cases and its graded list).
"""

from __future__ import annotations

import numpy as np

from mhalib.grade.exercises import _numpy_variants as wrong
from mhalib.grade.spec import check_array, check_pair, close, match_variant


def projection_weights(rng, d_model, kv_dim, dtype):
    """Random projection weights ``[w_q, w_k, w_v, w_o]`` for an attention case.

    Shapes ``(d_model, d_model)``, ``(d_model, kv_dim)`` twice, ``(d_model, d_model)``: standard
    normal times ``1.5 / sqrt(d_model)``, cast to ``dtype``.
    """
    s = 1 / np.sqrt(d_model)
    return [(rng.standard_normal(shape) * s * 1.5).astype(dtype)
            for shape in ((d_model, d_model), (d_model, kv_dim), (d_model, kv_dim), (d_model, d_model))]


def _heads(case, g=None):
    """``(H, g)`` of an attention case: query heads and key/value heads."""
    h = case.args[5]
    if g is None:
        g = case.args[6] if len(case.args) > 6 else h
    return h, g


def _axis_name(axis, ndim):
    names = {-1: "the keys", -2: "the queries", -3: "the heads"}
    return f"{names.get(axis, 'the batch')} (axis {axis if axis in names else axis + ndim})"


WRONG_AXIS = ("softmax over the wrong axis: the weights are normalised over {what}; normalise each "
              "head's scores over the keys (axis=-1), so that each query's row of weights sums to 1")
NOT_CONCATENATED = ("the heads were {how} instead of concatenated: {what}; merge them to "
                    "(..., N, H * d_head) = (..., N, d_model) with merge_heads, then multiply by w_o")


def mha_variants(case, g=None, which=1, tile=True):
    """Known mistakes of multi-head (or grouped-query) attention as ``(message, make)`` pairs.

    Args:
        case: an attention case; ``g`` overrides its number of key/value heads.
        which: 0 for the mistakes' ``out``, 1 for their ``weights`` (``out`` adds the
            output-projection and merging mistakes).
        tile: whether to include reading the wrong K/V head (``np.tile`` for ``np.repeat``).
    """
    x, wq, wk, wv, wo, *_ = case.args
    h, g = _heads(case, g)
    mask = case.kwargs.get("mask")
    frame = case.extra.get("frame", {})  # a variant's conventions: each mistake is made in them

    def f(*args, **mistake):
        return wrong.gqa(*args, **{**frame, **mistake})
    args = (x, wq, wk, wv, wo, h, g, mask)
    out = [
        ("the scores are scaled by sqrt(d_model); scale by sqrt(d_head) = sqrt(d_model / num_heads)",
         lambda: f(*args, scale="model")[which]),
        ("heads come out in the wrong order: check reshape before transpose (split to "
         "(..., N, H, d_head), then swap N and H)", lambda: f(*args, split_how="reshape_only")[which]),
        ("the mask is not applied: add it to every head's scores before the softmax",
         lambda: f(*args, use_mask=False)[which]),
    ]
    ndim = np.ndim(x) + 1  # the weights: (..., H, N, N) for x (..., N, d_model)
    for axis in range(-2, -ndim - 1, -1):
        out.append((WRONG_AXIS.format(what=_axis_name(axis, ndim)),
                    lambda axis=axis: f(*args, axis=axis)[which]))
    if tile and g not in (1, h) and not frame:  # in a variant, the other grouping is another variant
        out.insert(0, ("query heads read the wrong K/V head: head h must use K/V head h // (H // g) "
                       "(np.repeat along the head axis, not np.tile)",
                       lambda: f(*args, repeat="tile")[which]))
    if which == 0:
        out += [
            ("the output projection w_o is not applied (multiply the merged heads by w_o)",
             lambda: f(*args, use_wo=False)[0]),
            ("heads are merged in the wrong order: move H back next to d_head, (..., N, H, d_head), "
             "before reshaping", lambda: f(*args, merge_how="reshape_only")[0]),
            (NOT_CONCATENATED.format(how="summed", what="out is (..., N, d_head), and w_o is not applied"),
             lambda: f(*args, combine="sum", use_wo=False)[0]),
            (NOT_CONCATENATED.format(how="averaged", what="out is (..., N, d_head), and w_o is not applied"),
             lambda: f(*args, combine="mean", use_wo=False)[0]),
        ]
    return out


def _rows_sum_to_one(weights):
    w = weights.astype(np.float64)
    return bool(np.allclose(w.sum(axis=-1), 1.0, atol=1e-4))


UNBATCHED_MASK = ("{what} has shape {shape}, a leading axis of 1 that x {x_shape} has not: the mask gained axes "
                  "(e.g. mask[None, None]) and turned an x without a batch axis into a batch of one; add the "
                  "mask to the scores as it is: it broadcasts to (..., H, N, N)")


def other_variant(case, got, which):
    """The message when ``got`` (``which``: 0 for out, 1 for weights) is another variant's
    answer (the course's own exercise included), else ``None``."""
    mine = case.extra.get("variant")
    for variant, expected in case.extra.get("others", ()):
        if isinstance(got, np.ndarray) and got.shape == expected[which].shape and close(got, expected[which]):
            return (f"that is the answer of {variant.label} ({variant.short}); yours is {mine.label} ({mine.short}): "
                    f"variant(\"{case.extra.get('exercise', '')}\", STUDENT_ID) in the notebook says what it asks")
    return None


def judge_attention(case, got, g=None):
    """``None`` when ``(out, weights)`` is right, else a message naming the mistake.

    Checks the weights first (no head axis, or one map per K/V head instead of per query
    head, another variant's answer, the known mistakes of :func:`mha_variants`, rows not summing
    to 1), then ``out`` (the same mistakes, and heads summed or averaged instead of
    concatenated). ``g`` is the number of key/value heads when the case does not carry it.
    """
    msg = check_pair(got, ("out", "weights"))
    if msg:
        return msg
    out_exp, w_exp = case.expected
    out, weights = got
    x_shape = np.shape(case.args[0])
    for what, value, want in (("weights", weights, w_exp), ("out", out, out_exp)):
        if isinstance(value, np.ndarray) and value.shape == (1, *want.shape) and len(x_shape) == 2:
            return UNBATCHED_MASK.format(what=what, shape=value.shape, x_shape=x_shape)
    msg = check_array(weights, w_exp, "weights")
    if msg:
        known = other_variant(case, weights, 1)
        if known:
            return known
        if isinstance(weights, np.ndarray) and weights.shape == w_exp.shape[:-3] + w_exp.shape[-2:]:
            return (f"weights have shape {weights.shape}; return one map per head, "
                    f"{w_exp.shape} = (..., H, N, N)")
        kv_heads = case.args[6] if g is None and len(case.args) > 6 else g
        if (isinstance(weights, np.ndarray) and kv_heads and kv_heads != w_exp.shape[-3]
                and weights.shape == w_exp.shape[:-3] + (kv_heads,) + w_exp.shape[-2:]):
            return (f"weights have shape {weights.shape}, one map per K/V head; return one per query "
                    f"head, {w_exp.shape} = (..., H, N, N)")
        better = match_variant(weights, mha_variants(case, g, 1))
        if better:
            return better
        if (isinstance(weights, np.ndarray) and weights.shape == w_exp.shape and weights.dtype.kind == "f"
                and np.isfinite(weights).all() and not _rows_sum_to_one(weights)):
            return ("weights rows do not sum to 1: a softmax over the wrong axis, or no softmax at all; "
                    "normalise each head's scores over the keys (axis=-1)")
        return msg
    msg = check_array(out, out_exp, "out")
    if msg:
        better = other_variant(case, out, 0) or match_variant(out, mha_variants(case, g, 0))
        if better:
            return better
        h, _ = _heads(case, g)
        d_head = out_exp.shape[-1] // h
        if isinstance(out, np.ndarray) and h > 1 and out.shape == out_exp.shape[:-1] + (d_head,):
            return NOT_CONCATENATED.format(how="summed (or averaged)",
                                           what=f"out has shape {out.shape} = (..., N, d_head), one head wide")
        return msg
    return None


def explain_attention_error(case, error, call, g=None):
    """Name the mistake behind an exception: heads summed, averaged or never merged.

    Summing the heads' outputs leaves (..., N, d_head), which ``@ w_o`` refuses (w_o has
    d_model rows). To tell that from other shape errors, call the function once more
    with the first d_head rows of w_o: a function that sums the heads then runs, and
    its output is recognised.
    """
    if not error.startswith("ValueError"):
        return None
    x, wq, wk, wv, wo, *more = case.args
    h, g = _heads(case, g)
    d_head = wo.shape[0] // h
    if h < 2 or d_head * h != wo.shape[0]:
        return None
    short_wo = wo[:d_head]  # (d_head, d_model): fits a product with one head's width
    got = call((x, wq, wk, wv, short_wo, *more), case.kwargs)
    if not isinstance(got, tuple) or not got or not isinstance(got[0], np.ndarray):
        return None
    args = (x, wq, wk, wv, short_wo, h, g, case.kwargs.get("mask"))
    d_model = wo.shape[0]
    frame = case.extra.get("frame", {})

    def what(result):
        return (f"their {result} is (..., N, d_head) = (..., N, {d_head}), and w_o multiplies "
                f"(..., N, d_model) = (..., N, {d_model})")

    found = match_variant(got[0], [
        (NOT_CONCATENATED.format(how="summed", what=what("sum")),
         lambda: wrong.gqa(*args, combine="sum", **frame)[0]),
        (NOT_CONCATENATED.format(how="averaged", what=what("mean")),
         lambda: wrong.gqa(*args, combine="mean", **frame)[0]),
        ("the heads were never merged: (..., H, N, d_head) was multiplied by w_o; merge them to "
         "(..., N, H * d_head) = (..., N, d_model) with merge_heads first",
         lambda: wrong.gqa(*args, combine="none", **frame)[0]),
    ])
    return found
