"""The online softmax and what is built on it: FlashAttention's tiles, flash-decoding's split.

* :func:`online_normalizer`: the maximum and the sum of a softmax in **one** pass over the
  scores, rescaling the running sum whenever the maximum grows (Milakov & Gimelshein 2018,
  *Online normalizer calculation for softmax*).
* :func:`tiled_attention`: attention over tiles of queries and keys, never forming the
  ``(N_q, N_k)`` score matrix: a running maximum, sum and output per query row (the loop of
  Dao et al. 2022, *FlashAttention*), with the bytes of its largest temporary.
* :func:`split_attention` and :func:`merge_partials`: attention over separate chunks of the
  keys, each returning its output and its log-sum-exp, merged exactly afterwards
  (flash-decoding: the chunks of a long cache are read in parallel, then merged).

NumPy only; float64 unless the inputs are float32.
"""

from __future__ import annotations

import numpy as np

__all__ = ["online_normalizer", "online_softmax", "tiled_attention", "split_attention", "merge_partials"]


def online_normalizer(x):
    """Running maximum ``m`` and sum ``s = sum(exp(x - m))`` along the last axis, in one pass.

    Each new score ``x_j`` updates ``m' = max(m, x_j)`` and ``s' = s * exp(m - m') + exp(x_j - m')``:
    the old sum is rescaled to the new maximum, so no ``exp`` ever overflows and the scores are
    read once (the two-pass softmax reads them once for the maximum, once for the sum).

    Args:
        x: ``(..., N)`` scores, N >= 1.

    Returns:
        ``(m, s)``, each ``(...)``; ``softmax(x) = exp(x - m) / s``, ``logsumexp(x) = m + log(s)``.
    """
    x = np.asarray(x, dtype=np.result_type(x, np.float32))
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must be (..., N) with N >= 1; got shape {x.shape}")
    m = np.full(x.shape[:-1], -np.inf, dtype=x.dtype)  # (...)
    s = np.zeros(x.shape[:-1], dtype=x.dtype)  # (...)
    for j in range(x.shape[-1]):  # one pass: each score read once
        xj = x[..., j]  # (...)
        m_new = np.maximum(m, xj)  # (...)
        safe = np.where(np.isfinite(m_new), m_new, 0.0)  # a row of -inf so far stays at s = 0
        s = s * np.exp(m - safe) + np.exp(xj - safe)  # (...): rescale, then add
        m = m_new
    return m, s


def online_softmax(x):
    """Softmax along the last axis from :func:`online_normalizer` (equal to the two-pass one)."""
    m, s = online_normalizer(x)
    x = np.asarray(x, dtype=m.dtype)
    return np.exp(x - m[..., None]) / s[..., None]  # (..., N)


def _check_qkv(q, k, v):
    q, k, v = (np.asarray(a) for a in (q, k, v))
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"q, k, v must be (..., N, d) with the same leading axes; got {q.shape}, {k.shape}, {v.shape}")
    if k.shape[:-1] != v.shape[:-1] or k.shape[-1] != q.shape[-1] or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q (..., N_q, d), k (..., N_k, d), v (..., N_k, d_v) do not fit: {q.shape}, {k.shape}, {v.shape}")
    dtype = np.result_type(q, k, v, np.float32)
    return q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False)


def _block(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {name}={value!r}")
    return int(value)


def tiled_attention(q, k, v, block_q=16, block_k=16, causal=False):
    """Attention tile by tile (FlashAttention's loop, in NumPy), with the memory it needed.

    For each tile of ``block_q`` queries, the keys and values are visited in tiles of
    ``block_k``; the scores of one tile are ``(..., block_q, block_k)`` and are folded into a
    running maximum ``m``, sum ``l`` and unnormalised output ``acc`` per query row, rescaled by
    ``exp(m_old - m_new)`` whenever the maximum grows. The output is ``acc / l``.

    Args:
        q: ``(..., N_q, d)``; k: ``(..., N_k, d)``; v: ``(..., N_k, d_v)``.
        block_q, block_k: tile sizes.
        causal: query i (at position ``N_k - N_q + i``) sees keys up to its own position.

    Returns:
        ``(out, peak_bytes)``: ``out`` ``(..., N_q, d_v)`` and the bytes of the largest
        temporary array the loop created (a score tile, its exponentials, or the running
        output of a query tile); the full score matrix would be ``N_q * N_k`` entries.
    """
    q, k, v = _check_qkv(q, k, v)
    block_q, block_k = _block(block_q, "block_q"), _block(block_k, "block_k")
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / np.sqrt(d)
    out = np.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)  # (..., N_q, d_v)
    peak = 0
    for i0 in range(0, n_q, block_q):
        qi = q[..., i0:i0 + block_q, :] * scale  # (..., bq, d)
        rows = qi.shape[-2]
        m = np.full(qi.shape[:-1], -np.inf, dtype=q.dtype)  # (..., bq): running maximum
        l = np.zeros(qi.shape[:-1], dtype=q.dtype)  # (..., bq): running sum  # noqa: E741
        acc = np.zeros(qi.shape[:-1] + (v.shape[-1],), dtype=q.dtype)  # (..., bq, d_v): running output
        for j0 in range(0, n_k, block_k):
            s = qi @ np.swapaxes(k[..., j0:j0 + block_k, :], -1, -2)  # (..., bq, bk): one score tile
            if causal:
                pos_q = np.arange(i0, i0 + rows)[:, None] + (n_k - n_q)  # (bq, 1)
                pos_k = np.arange(j0, j0 + s.shape[-1])[None, :]  # (1, bk)
                s = np.where(pos_k <= pos_q, s, -np.inf)  # (..., bq, bk)
            m_new = np.maximum(m, s.max(axis=-1))  # (..., bq)
            safe = np.where(np.isfinite(m_new), m_new, 0.0)  # rows that saw only masked keys
            p = np.exp(s - safe[..., None])  # (..., bq, bk)
            correction = np.exp(m - safe)  # (..., bq): rescale what was summed so far
            l = l * correction + p.sum(axis=-1)  # noqa: E741
            acc = acc * correction[..., None] + p @ v[..., j0:j0 + block_k, :]  # (..., bq, d_v)
            m = m_new
            peak = max(peak, s.nbytes, p.nbytes, acc.nbytes)
        out[..., i0:i0 + rows, :] = acc / l[..., None]  # (..., bq, d_v)
    return out, peak


def split_attention(q, k, v, num_splits):
    """Attention over ``num_splits`` chunks of the keys, each on its own (flash-decoding's split).

    Args:
        q: ``(..., N_q, d)``; k, v: ``(..., N_k, d)``, ``(..., N_k, d_v)``; no mask (decoding:
            the new query sees every cached key).
        num_splits: chunks of consecutive keys, 1 <= num_splits <= N_k.

    Returns:
        ``(outputs, log_sum_exps)``: ``(S, ..., N_q, d_v)``, each chunk's softmax-weighted values
        normalised within the chunk, and ``(S, ..., N_q)``, each chunk's log-sum-exp of the
        scaled scores. :func:`merge_partials` combines them into full attention.
    """
    q, k, v = _check_qkv(q, k, v)
    n_k = k.shape[-2]
    num_splits = _block(num_splits, "num_splits")
    if num_splits > n_k:
        raise ValueError(f"num_splits must be at most N_k={n_k} (one key per chunk); got num_splits={num_splits}")
    outputs, lses = [], []
    for idx in np.array_split(np.arange(n_k), num_splits):
        s = q @ np.swapaxes(k[..., idx, :], -1, -2) / np.sqrt(q.shape[-1])  # (..., N_q, n_i)
        m = s.max(axis=-1, keepdims=True)  # (..., N_q, 1)
        e = np.exp(s - m)  # (..., N_q, n_i)
        total = e.sum(axis=-1, keepdims=True)  # (..., N_q, 1)
        outputs.append(e @ v[..., idx, :] / total)  # (..., N_q, d_v)
        lses.append((m + np.log(total))[..., 0])  # (..., N_q)
    return np.stack(outputs), np.stack(lses)  # (S, ..., N_q, d_v), (S, ..., N_q)


def merge_partials(outputs, log_sum_exps):
    """Merge attention computed over disjoint chunks of the keys into attention over all of them.

    Chunk i's output is normalised by its own sum ``exp(lse_i)``; the full softmax weighs it by
    ``exp(lse_i) / sum_j exp(lse_j)``. Written with the largest ``lse`` subtracted first, so that
    no ``exp`` overflows (the same trick as the softmax itself):
    ``w_i = exp(lse_i - max_j lse_j)``, ``out = sum_i w_i out_i / sum_i w_i``,
    ``lse = max_j lse_j + log(sum_i w_i)``. A chunk whose keys were all masked has
    ``lse = -inf`` and weight 0.

    Args:
        outputs: ``(S, ..., d_v)``: S partial outputs.
        log_sum_exps: ``(S, ...)``: their log-sum-exps.

    Returns:
        ``(out, lse)``: ``(..., d_v)`` and ``(...)``; the merged lse lets merges nest.
    """
    outputs = np.asarray(outputs)
    lse = np.asarray(log_sum_exps)
    if outputs.ndim < 2 or lse.shape != outputs.shape[:-1]:
        raise ValueError(f"outputs must be (S, ..., d_v) and log_sum_exps (S, ...) with the same leading axes; "
                         f"got {outputs.shape} and {lse.shape}")
    dtype = np.result_type(outputs, lse, np.float32)
    outputs, lse = outputs.astype(dtype, copy=False), lse.astype(dtype, copy=False)
    top = lse.max(axis=0)  # (...): the largest log-sum-exp
    safe = np.where(np.isfinite(top), top, 0.0)  # (...)
    w = np.exp(lse - safe)  # (S, ...): at most 1, no overflow
    total = w.sum(axis=0)  # (...)
    weighted = np.where(w[..., None] > 0, w[..., None] * outputs, 0.0)  # (S, ..., d_v): masked chunks add 0
    out = weighted.sum(axis=0) / np.where(total > 0, total, 1.0)[..., None]  # (..., d_v)
    with np.errstate(divide="ignore"):
        merged = safe + np.log(total)  # (...)
    return out, merged
