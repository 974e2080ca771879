"""The online softmax and what is built on it: FlashAttention's tiles, flash-decoding's split.

* :func:`online_normalizer`: the maximum and the sum of a softmax in **one** pass over the
  scores, rescaling the running sum whenever the maximum grows (Milakov & Gimelshein 2018,
  *Online normalizer calculation for softmax*).
* :func:`tiled_attention`: attention over tiles of queries and keys, never forming the
  ``(N_q, N_k)`` score matrix, in either loop order of the FlashAttention papers:
  ``loop="fa2"`` (the default) keeps each tile of queries, with its running maximum, sum and
  unnormalised output, while the key/value tiles stream past, and divides by the sum once at
  the end (Dao 2023, *FlashAttention-2*, Algorithm 1); ``loop="fa1"`` streams the key/value
  tiles in the outer loop and, for each, visits every query tile, reading its normalised output
  and statistics from the large memory and writing them back rescaled (Dao et al. 2022,
  *FlashAttention*, Algorithm 1). Both give the same output; an :class:`HBMTraffic` counts what
  each moves between the large slow memory and the tile.
* :func:`hbm_traffic`: those counts in closed form, for any size and tile.
* :func:`split_attention` and :func:`merge_partials`: attention over separate chunks of the
  keys, each returning its output and its log-sum-exp, merged exactly afterwards
  (flash-decoding: the chunks of a long cache are read in parallel, then merged).

NumPy only; every function computes in the inputs' floating type (float32 stays float32),
float64 for anything else.
"""

from __future__ import annotations

import math

import numpy as np

from mhalib.validation import check_positive_int

__all__ = ["online_normalizer", "online_softmax", "HBMTraffic", "tiled_attention", "hbm_traffic",
           "split_attention", "merge_partials"]


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


class HBMTraffic:
    """Numbers moved between the large slow memory (a GPU's HBM) and the fast tile memory (its SRAM).

    Pass one to :func:`tiled_attention`; the loop adds the size of every array it loads from or
    stores to the large memory (Q, K, V and O tiles, and the per-row statistics a loop keeps
    there), as the papers' I/O analyses count them. Numbers, not bytes: multiply by the bytes
    per number.
    """

    def __init__(self):
        self.reads = 0
        self.writes = 0

    def __repr__(self):
        return f"HBMTraffic(reads={self.reads:,}, writes={self.writes:,})"

    def read(self, *arrays):
        """Count the numbers of ``arrays`` as loaded from the large memory into the tile."""
        self.reads += sum(int(np.size(a)) for a in arrays)

    def write(self, *arrays):
        """Count the numbers of ``arrays`` as stored from the tile to the large memory."""
        self.writes += sum(int(np.size(a)) for a in arrays)


LOOPS = ("fa2", "fa1")


def _scores(qi, kj, i0, j0, n_q, n_k, causal):
    """One ``(..., bq, bk)`` tile of scores (``qi`` already scaled), causal rows bottom-right aligned."""
    s = qi @ np.swapaxes(kj, -1, -2)  # (..., bq, bk)
    if causal:
        pos_q = np.arange(i0, i0 + qi.shape[-2])[:, None] + (n_k - n_q)  # (bq, 1)
        pos_k = np.arange(j0, j0 + kj.shape[-2])[None, :]  # (1, bk)
        s = np.where(pos_k <= pos_q, s, -np.inf)  # (..., bq, bk)
    return s


def tiled_attention(q, k, v, block_q=16, block_k=16, causal=False, *, loop="fa2", traffic=None):
    """Attention tile by tile (FlashAttention's loops, in NumPy), with the memory it needed.

    ``loop="fa2"`` (FlashAttention-2, Dao 2023, Algorithm 1): for each tile of ``block_q``
    queries, read once, the key and value tiles of ``block_k`` stream past; each query row keeps
    a running maximum ``m``, sum ``l`` and **unnormalised** output ``acc``, rescaled by
    ``exp(m_old - m_new)`` when the maximum grows, and divided by ``l`` once at the end. The
    output tile and its log-sum-exp are written once.

    ``loop="fa1"`` (FlashAttention, Dao et al. 2022, Algorithm 1): the **key/value** tiles are the
    outer loop, each read once; for each, every query tile is visited, and its output (kept
    **normalised**), ``l`` and ``m`` are read from the large memory, rescaled with the new tile's
    scores and written back: the output is rescaled at every step.

    Args:
        q: ``(..., N_q, d)``; k: ``(..., N_k, d)``; v: ``(..., N_k, d_v)``.
        block_q, block_k: tile sizes (the papers' B_r and B_c).
        causal: query i (at position ``N_k - N_q + i``) sees keys up to its own position.
        loop: ``"fa2"`` or ``"fa1"``; the same output either way.
        traffic: an :class:`HBMTraffic` to count the numbers each loop reads and writes (every
            tile is counted, also one a causal mask hides entirely, which a GPU kernel skips).

    Returns:
        ``(out, peak_bytes)``: ``out`` ``(..., N_q, d_v)`` and the bytes of the largest
        temporary array the loop created (a score tile, its exponentials, or a running output
        tile); the full score matrix would be ``N_q * N_k`` entries.
    """
    q, k, v = _check_qkv(q, k, v)
    block_q, block_k = check_positive_int(block_q, "block_q"), check_positive_int(block_k, "block_k")
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(map(repr, LOOPS))}; got loop={loop!r}")
    traffic = HBMTraffic() if traffic is None else traffic
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = q.dtype.type(1.0 / math.sqrt(d))  # in q's type: float32 stays float32
    out = np.zeros(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype)  # (..., N_q, d_v): O in the large memory
    peak = 0
    if loop == "fa2":
        for i0 in range(0, n_q, block_q):
            qi = q[..., i0:i0 + block_q, :]  # (..., bq, d): read once
            traffic.read(qi)
            qi = qi * scale
            m = np.full(qi.shape[:-1], -np.inf, dtype=q.dtype)  # (..., bq): running maximum, in the tile
            l = np.zeros(qi.shape[:-1], dtype=q.dtype)  # (..., bq): running sum  # noqa: E741
            acc = np.zeros(qi.shape[:-1] + (v.shape[-1],), dtype=q.dtype)  # (..., bq, d_v): unnormalised output
            for j0 in range(0, n_k, block_k):
                kj, vj = k[..., j0:j0 + block_k, :], v[..., j0:j0 + block_k, :]  # (..., bk, d), (..., bk, d_v)
                traffic.read(kj, vj)
                s = _scores(qi, kj, i0, j0, n_q, n_k, causal)  # (..., bq, bk): one score tile
                m_new = np.maximum(m, s.max(axis=-1))  # (..., bq)
                safe = np.where(np.isfinite(m_new), m_new, 0.0)  # rows that saw only masked keys
                p = np.exp(s - safe[..., None])  # (..., bq, bk)
                correction = np.exp(m - safe)  # (..., bq): rescale what was summed so far
                l = l * correction + p.sum(axis=-1)  # noqa: E741
                acc = acc * correction[..., None] + p @ vj  # (..., bq, d_v)
                m = m_new
                peak = max(peak, s.nbytes, p.nbytes, acc.nbytes)
            out[..., i0:i0 + qi.shape[-2], :] = acc / l[..., None]  # (..., bq, d_v): divided once
            traffic.write(acc, l)  # the output tile and its log-sum-exp m + log(l)
        return out, peak
    m_all = np.full(q.shape[:-1], -np.inf, dtype=q.dtype)  # (..., N_q): m in the large memory
    l_all = np.zeros(q.shape[:-1], dtype=q.dtype)  # (..., N_q): l in the large memory
    traffic.write(out, m_all, l_all)  # Algorithm 1 starts by writing O = 0, l = 0, m = -inf there
    for j0 in range(0, n_k, block_k):
        kj, vj = k[..., j0:j0 + block_k, :], v[..., j0:j0 + block_k, :]  # (..., bk, d), (..., bk, d_v): read once
        traffic.read(kj, vj)
        for i0 in range(0, n_q, block_q):
            rows = slice(i0, i0 + block_q)
            qi, oi = q[..., rows, :], out[..., rows, :]  # (..., bq, d), (..., bq, d_v)
            mi, li = m_all[..., rows], l_all[..., rows]  # (..., bq) each
            traffic.read(qi, oi, mi, li)
            s = _scores(qi * scale, kj, i0, j0, n_q, n_k, causal)  # (..., bq, bk)
            m_tile = s.max(axis=-1)  # (..., bq): this tile's maximum
            safe_tile = np.where(np.isfinite(m_tile), m_tile, 0.0)
            p = np.exp(s - safe_tile[..., None])  # (..., bq, bk)
            m_new = np.maximum(mi, m_tile)  # (..., bq)
            safe = np.where(np.isfinite(m_new), m_new, 0.0)
            old, new = np.exp(mi - safe), np.exp(m_tile - safe)  # (..., bq) each: weights of what was and what came
            l_new = old * li + new * p.sum(axis=-1)  # (..., bq)
            keep = np.where(l_new > 0, l_new, 1.0)  # a row that has seen only masked keys stays at 0
            o_new = ((old * li)[..., None] * oi + new[..., None] * (p @ vj)) / keep[..., None]  # (..., bq, d_v)
            out[..., rows, :], m_all[..., rows], l_all[..., rows] = o_new, m_new, l_new
            traffic.write(o_new, m_new, l_new)
            peak = max(peak, s.nbytes, p.nbytes, o_new.nbytes)
    return out, peak


def hbm_traffic(n_q, n_k, d, block_q, block_k, loop, d_v=None):
    """Numbers :func:`tiled_attention` reads from and writes to the large memory, in closed form.

    With ``T_r = ceil(N_q / B_r)`` query tiles and ``T_c = ceil(N_k / B_c)`` key tiles:

    * ``"fa2"``: Q once, K and V once per query tile; O and one log-sum-exp per row written once:
      reads ``N_q d + T_r N_k (d + d_v)``, writes ``N_q (d_v + 1)``;
    * ``"fa1"``: K and V once; Q, O, l and m once per key tile; O, l and m written once per key
      tile, after their first writing: reads ``N_k (d + d_v) + T_c N_q (d + d_v + 2)``, writes
      ``(T_c + 1) N_q (d_v + 2)``.

    The FlashAttention paper picks, for an on-chip memory of M numbers, key tiles of
    ``B_c = ceil(M / 4d)`` and query tiles of ``B_r = min(B_c, d)``: FA1 then reads each query
    and output row ``N / B_c`` times, ``Theta(N^2 d^2 / M)`` numbers (its Theorem 2, against
    ``Theta(N d + N^2)`` for attention that writes its score matrix out). FA2 reads K and V once
    per query tile, ``2 N^2 d / B_r``: the same order when its query tiles are as large,
    ``B_r`` about ``M / 4d``.

    Returns:
        ``{"reads": int, "writes": int}``.
    """
    n_q, n_k, d = check_positive_int(n_q, "n_q"), check_positive_int(n_k, "n_k"), check_positive_int(d, "d")
    d_v = d if d_v is None else check_positive_int(d_v, "d_v")
    block_q, block_k = check_positive_int(block_q, "block_q"), check_positive_int(block_k, "block_k")
    t_r, t_c = -(-n_q // block_q), -(-n_k // block_k)
    if loop == "fa2":
        return {"reads": n_q * d + t_r * n_k * (d + d_v), "writes": n_q * (d_v + 1)}
    if loop == "fa1":
        return {"reads": n_k * (d + d_v) + t_c * n_q * (d + d_v + 2), "writes": (t_c + 1) * n_q * (d_v + 2)}
    raise ValueError(f"loop must be one of {', '.join(map(repr, LOOPS))}; got loop={loop!r}")


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
    num_splits = check_positive_int(num_splits, "num_splits")
    if num_splits > n_k:
        raise ValueError(f"num_splits must be at most N_k={n_k} (one key per chunk); got num_splits={num_splits}")
    scale = q.dtype.type(1.0 / math.sqrt(q.shape[-1]))  # in q's type: float32 stays float32
    outputs, lses = [], []
    for idx in np.array_split(np.arange(n_k), num_splits):
        s = q @ np.swapaxes(k[..., idx, :], -1, -2) * scale  # (..., N_q, n_i)
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
