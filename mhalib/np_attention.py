"""Attention in plain NumPy: the reference the course teaches and the grader trusts.

Conventions (the same in every notebook and exercise):

* ``x`` is ``(N, d_model)`` or ``(B, N, d_model)``.
* Projection matrices use the ``x @ W`` convention: ``W`` is ``(d_in, d_out)``.
* ``num_heads`` is H, ``num_kv_heads`` is g, ``head_dim`` is d_k = d_model / H.
* Attention weights come back as ``(..., H, N, N)``: one row per query, summing to 1.
* Masks are *additive*: 0 where attention is allowed, ``-inf`` where it is not.
"""

from __future__ import annotations

import numpy as np

from mhalib.validation import check_divisible, check_mask_shape

__all__ = [
    "softmax",
    "causal_mask",
    "scaled_dot_product_attention",
    "split_heads",
    "merge_heads",
    "multi_head_attention",
    "grouped_query_attention",
]


def softmax(x, axis=-1):
    """Numerically stable softmax along ``axis``.

    Subtracting the row maximum leaves the result unchanged (softmax is shift
    invariant) but keeps ``exp`` from overflowing. Rows that are entirely ``-inf``
    (every position masked) return zeros instead of NaN.

    Args:
        x: array of any shape.
        axis: the axis that sums to 1.

    Returns:
        Array of the same shape as ``x``.
    """
    x = np.asarray(x, dtype=np.result_type(x, np.float32))
    x_max = np.max(x, axis=axis, keepdims=True)
    x_max = np.where(np.isfinite(x_max), x_max, 0.0)
    e = np.exp(x - x_max)
    total = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def causal_mask(n, dtype=np.float64):
    """Additive causal mask for ``n`` positions.

    Returns:
        ``(n, n)`` array with 0 on and below the diagonal and ``-inf`` above it, so
        query i may attend to keys 0..i. Added to the scores before the softmax, every
        row still sums to 1.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"causal_mask needs n >= 1 positions, got n={n}")
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    return np.where(upper, -np.inf, 0.0).astype(dtype)


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d_k) + mask) v.

    Args:
        q: ``(..., N_q, d_k)`` queries.
        k: ``(..., N_k, d_k)`` keys.
        v: ``(..., N_k, d_v)`` values.
        mask: optional additive mask that broadcasts to ``(..., N_q, N_k)``
            (0 = keep, ``-inf`` = block). A boolean mask is also accepted, with
            ``True`` meaning *keep* (the convention of ``torch``'s SDPA).

    Returns:
        ``(out, weights)``: ``out`` is ``(..., N_q, d_v)``, ``weights`` is
        ``(..., N_q, N_k)`` with rows summing to 1.
    """
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(
            f"q, k and v need at least 2 dimensions (..., N, d); got shapes "
            f"{q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share their last dimension d_k; got q {q.shape} and k {k.shape}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions; got k {k.shape} and v {v.shape}"
        )
    d_k = q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)  # (..., N_q, N_k)
    if mask is not None:
        mask = np.asarray(mask)
        check_mask_shape(mask.shape, scores.shape)
        if mask.dtype == bool:
            mask = np.where(mask, 0.0, -np.inf)
        scores = scores + mask
    weights = softmax(scores, axis=-1)  # (..., N_q, N_k)
    return weights @ v, weights  # (..., N_q, d_v)


def split_heads(x, num_heads):
    """Split the last dimension into heads: ``(..., N, d_model) -> (..., H, N, d_head)``.

    Reshape to ``(..., N, H, d_head)`` first, *then* move the head axis in front of N.
    Reshaping straight to ``(..., H, N, d_head)`` also runs, but mixes positions into
    heads: a silent bug the course shows in notebook 02.
    """
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"split_heads needs x of shape (..., N, d_model); got {x.shape}")
    *lead, n, d_model = x.shape
    check_divisible(d_model, num_heads, "d_model", "num_heads")
    head_dim = d_model // num_heads
    x = x.reshape(*lead, n, num_heads, head_dim)  # (..., N, H, d_head)
    return np.swapaxes(x, -3, -2)  # (..., H, N, d_head)


def merge_heads(x):
    """Inverse of :func:`split_heads`: ``(..., H, N, d_head) -> (..., N, H * d_head)``."""
    x = np.asarray(x)
    if x.ndim < 3:
        raise ValueError(f"merge_heads needs x of shape (..., H, N, d_head); got {x.shape}")
    *lead, h, n, d_head = x.shape
    x = np.swapaxes(x, -3, -2)  # (..., N, H, d_head)
    return x.reshape(*lead, n, h * d_head)  # (..., N, d_model)


def _check_x_and_weights(x, w_q, w_k, w_v, w_o, kv_dim):
    x = np.asarray(x)
    if x.ndim not in (2, 3):
        raise ValueError(
            f"x must be (N, d_model) or (B, N, d_model); got a {x.ndim}-D array of shape {x.shape}"
        )
    d_model = x.shape[-1]
    expected = {"w_q": (d_model, d_model), "w_k": (d_model, kv_dim),
                "w_v": (d_model, kv_dim), "w_o": (d_model, d_model)}
    for name, w in zip(expected, (w_q, w_k, w_v, w_o)):
        if np.shape(w) != expected[name]:
            raise ValueError(
                f"{name} must have shape {expected[name]} (x @ W convention, d_model={d_model}); "
                f"got {np.shape(w)}"
            )
    return x


def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):
    """Multi-head attention, vectorised over heads.

    Args:
        x: ``(N, d_model)`` or ``(B, N, d_model)``.
        w_q, w_k, w_v, w_o: ``(d_model, d_model)`` each (``x @ W`` convention).
        num_heads: H; must divide d_model.
        mask: optional additive mask broadcasting to ``(..., H, N, N)``; an ``(N, N)``
            mask applies to every batch element and head.

    Returns:
        ``(out, weights)``: ``out`` has the shape of ``x``; ``weights`` is
        ``(..., H, N, N)``.
    """
    x = np.asarray(x)
    d_model = x.shape[-1] if x.ndim else 0
    check_divisible(d_model, num_heads, "d_model", "num_heads")
    return grouped_query_attention(x, w_q, w_k, w_v, w_o, num_heads, num_heads, mask=mask)


def grouped_query_attention(x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads, mask=None):
    """Grouped-query attention: H query heads share g key/value heads.

    Query head h uses key/value head ``h // (H // g)``: consecutive query heads form a
    group (``repeat_interleave`` order, as in Hugging Face's ``repeat_kv``).
    ``num_kv_heads == num_heads`` is multi-head attention; ``num_kv_heads == 1`` is
    multi-query attention.

    Args:
        x: ``(N, d_model)`` or ``(B, N, d_model)``.
        w_q, w_o: ``(d_model, d_model)``.
        w_k, w_v: ``(d_model, num_kv_heads * head_dim)``.
        num_heads: H; must divide d_model.
        num_kv_heads: g; must divide H.
        mask: optional additive mask broadcasting to ``(..., H, N, N)``.

    Returns:
        ``(out, weights)``: ``out`` has the shape of ``x``; ``weights`` is
        ``(..., H, N, N)``.
    """
    x = np.asarray(x)
    if x.ndim not in (2, 3):
        raise ValueError(
            f"x must be (N, d_model) or (B, N, d_model); got a {x.ndim}-D array of shape {x.shape}"
        )
    d_model = x.shape[-1]
    check_divisible(d_model, num_heads, "d_model", "num_heads")
    check_divisible(num_heads, num_kv_heads, "num_heads", "num_kv_heads")
    head_dim = d_model // num_heads
    x = _check_x_and_weights(x, w_q, w_k, w_v, w_o, num_kv_heads * head_dim)

    q = split_heads(x @ w_q, num_heads)  # (..., H, N, d_head)
    k = split_heads(x @ w_k, num_kv_heads)  # (..., g, N, d_head)
    v = split_heads(x @ w_v, num_kv_heads)  # (..., g, N, d_head)
    group = num_heads // num_kv_heads
    k = np.repeat(k, group, axis=-3)  # (..., H, N, d_head), head h -> kv head h // group
    v = np.repeat(v, group, axis=-3)  # (..., H, N, d_head)
    n = x.shape[-2]
    if mask is not None:
        check_mask_shape(np.shape(mask), (*x.shape[:-2], num_heads, n, n))
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)  # (..., H, N, d_head)
    return merge_heads(out) @ w_o, weights  # (..., N, d_model), (..., H, N, N)
