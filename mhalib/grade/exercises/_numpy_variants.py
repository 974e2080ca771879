"""Known-wrong NumPy implementations, used to name a learner's mistake precisely.

Each function reproduces one common mistake; the judges compare a wrong answer with
these and, on a match, say which mistake it was. They are computed in the grader's
process (or in ``check()``), never sent anywhere.
"""

from __future__ import annotations

import numpy as np


def softmax(x, axis=-1):
    """Softmax along ``axis`` in float64, as the reference computes it.

    A row whose every entry is ``-inf`` comes out as zeros rather than NaN.
    """
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def causal_mask(n):
    """Additive causal mask ``(n, n)``: 0.0 on and below the diagonal, ``-inf`` above it."""
    return np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, 0.0)


def sdpa(q, k, v, mask=None, *, scale="sqrt_dk", axis=-1, use_mask=True, transpose="last_two"):
    """Scaled dot-product attention with one mistake switched on.

    ``transpose="all"``: ``k.T``, which reverses every axis of a batched ``k``.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    d_k, d_v = q.shape[-1], v.shape[-1]
    div = {"sqrt_dk": np.sqrt(d_k), "none": 1.0, "dk": float(d_k), "sqrt_dv": np.sqrt(d_v)}[scale]
    k_t = k.T if transpose == "all" else np.swapaxes(k, -1, -2)
    scores = q @ k_t / div
    if mask is not None and use_mask:
        scores = scores + np.asarray(mask, dtype=np.float64)
    w = softmax(scores, axis=axis)
    return w @ v, w


def split(x, h, how="right"):
    """Split ``(..., N, d_model)`` into heads, the right way or with one mistake.

    ``how``: ``"right"`` gives ``(..., H, N, d_head)``; ``"reshape_only"`` reshapes straight
    to ``(..., H, N, d_head)`` (mixing positions into heads); ``"no_transpose"`` stops at
    ``(..., N, H, d_head)``; ``"interleaved"`` is exercise 07's variant layout, where column c
    belongs to head ``c % H`` (head h owns columns h, h + H, h + 2H, ...).
    """
    *lead, n, d = x.shape
    if how == "right":
        return np.swapaxes(x.reshape(*lead, n, h, d // h), -3, -2)
    if how == "interleaved":  # (..., N, d_head, H): column c = j * H + h -> (..., H, N, d_head)
        return np.moveaxis(x.reshape(*lead, n, d // h, h), -1, -3)
    if how == "reshape_only":  # straight to (..., H, N, d_head): mixes positions into heads
        return x.reshape(*lead, h, n, d // h)
    if how == "no_transpose":
        return x.reshape(*lead, n, h, d // h)
    raise ValueError(how)


def merge(x, how="right"):
    """Merge ``(..., H, N, d_head)`` into ``(..., N, H * d_head)``, the right way or with one mistake.

    ``how``: ``"right"`` swaps H and N before the reshape; ``"reshape_only"`` reshapes
    without the swap, mixing positions and heads; ``"interleaved"``: column ``j * H + h`` is
    entry j of head h (the inverse of ``split(..., "interleaved")``).
    """
    *lead, h, n, d = x.shape
    if how == "right":
        return np.swapaxes(x, -3, -2).reshape(*lead, n, h * d)
    if how == "interleaved":  # (..., N, d_head, H) -> (..., N, d_head * H)
        return np.moveaxis(x, -3, -1).reshape(*lead, n, h * d)
    if how == "reshape_only":
        return x.reshape(*lead, n, h * d)
    raise ValueError(how)


def gqa(x, w_q, w_k, w_v, w_o, h, g, mask=None, *, scale="head", split_how="right",
        merge_how="right", use_wo=True, repeat="interleave", use_mask=True, axis=-1, combine="concat",
        columns="blocked"):
    """Grouped-query attention (g = H is MHA) with one mistake switched on.

    ``axis``: the axis of the softmax (-1, the keys, is right). ``combine``: how the heads'
    outputs ``(..., H, N, d_head)`` become one array: ``"concat"`` (right: merge to
    ``(..., N, H * d_head)``), ``"sum"`` or ``"mean"`` over the heads (``(..., N, d_head)``),
    or ``"none"`` (left as they are); ``w_o`` is applied afterwards when ``use_wo``.
    ``repeat="tile"`` and ``columns="interleaved"`` are also exercise 07's variants: query head
    h reads K/V head ``h % g``; each projection's column c belongs to head ``c % heads``.
    """
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    if columns == "interleaved":  # the variant's layout, unless a split or merge mistake is asked for
        split_how = "interleaved" if split_how == "right" else split_how
        merge_how = "interleaved" if merge_how == "right" else merge_how
    q = split(x @ w_q, h, split_how)
    k = split(x @ w_k, g, split_how)
    v = split(x @ w_v, g, split_how)
    rep = h // g
    if repeat == "interleave":
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    else:  # tile: head h reads kv head h % g, the classic grouping mistake
        reps = [1] * k.ndim
        reps[-3] = rep
        k, v = np.tile(k, reps), np.tile(v, reps)
    dh = d // h
    div = np.sqrt(d) if scale == "model" else np.sqrt(dh)
    scores = q @ np.swapaxes(k, -1, -2) / div
    if mask is not None and use_mask:
        scores = scores + mask
    w = softmax(scores, axis=axis)
    z = w @ v  # (..., H, N, d_head)
    if combine == "concat":
        merged = merge(z, merge_how)  # (..., N, d_model)
    elif combine in ("sum", "mean"):
        merged = getattr(z, combine)(axis=-3)  # (..., N, d_head)
    elif combine == "none":
        merged = z  # (..., H, N, d_head)
    else:
        raise ValueError(combine)
    return (merged @ np.asarray(w_o, dtype=np.float64) if use_wo else merged), w
