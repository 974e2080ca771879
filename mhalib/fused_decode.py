"""A fused grouped-query decode kernel in Numba: one pass over the KV cache, all queries at once.

Decoding adds one query token per sequence and attends to the whole cache. With g key/value
heads shared by H query heads, each K/V head must be read **once** for the R = H/g queries
of its group, and the arithmetic must happen *while* the rows stream in, not after. How much
arithmetic there is per byte depends on R: one query (MHA) does half a FLOP per byte of fp32
cache, 32 queries (MQA at H = 32) sixteen. So the kernel must be fast at both ends: reading
at the speed of memory when R is small, and doing its multiply-adds near the processor's
peak when R is large. This module writes it in plain loops a reader can follow:

1. :func:`block_partials`: the keys of every (sequence, K/V head) pair are cut into blocks,
   and the blocks are shared out over the cores (``prange``). A block is walked a *tile* of
   keys at a time (:func:`tile_keys`: 32 KiB of key rows, 64 keys at d = 128, 128 at d = 64),
   in three passes:

   * :func:`score_tile`: every query of the group scores every key of the tile, four queries
     and two keys at a time, so that each number loaded into a register serves several
     multiply-adds (a *register block*); a query left over when R is not a multiple of four
     takes a one-query path (two or three left over are padded to a block of four with zero
     queries: :func:`padded_group`);
   * :func:`softmax_tile`: the *online softmax*: each query keeps a running maximum and a
     running sum; the tile's scores become weights through :func:`exp_neg`, an exponential
     written in arithmetic the compiler turns into vector instructions;
   * :func:`value_tile`: the weighted values are added to each query's output, eight queries
     and four keys at a time (then a block of four queries, then one query at a time, for
     what is left over).

   While one pass works, it asks the memory system for the rows the next pass will read
   (a software prefetch into the L2 cache), evenly over the pass: the scoring pass for the
   tile's value rows, the value pass for the next tile's key rows. So the reads and the
   arithmetic can overlap instead of taking turns.
2. :func:`merge_blocks`: the blocks' partial results are merged by their log-sum-exp
   (rescaled to the largest maximum), which gives the exact softmax over all keys.

:func:`fused_decode` checks the inputs and runs both on torch tensors; it equals
``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` for one query token
(``tests/test_fused_decode.py``). ``benchmarks/bench_decode.py`` measures it against a
streaming read of the same bytes and against the multiply-add peak of the processor
(``benchmarks/fma_peak.py``), for g from H down to 1 and for real models' shapes.
:func:`time_passes` times each pass alone on a block of keys held in a core's caches: the
kernel's time without waits on main memory, a best case for a step of that shape.

Numba is imported on the first call, not with this module: ``import mhalib`` stays fast,
and without Numba only this kernel is unavailable. Every function is also plain Python
(``prange`` is ``range``, :func:`prefetch` does nothing, until :func:`compile_kernels`
binds the compiled versions), so the same code runs, slowly, without Numba.

Shapes: B batch, H query heads, g key/value heads, R = H/g queries per K/V head,
n cached tokens, d = head_dim.
"""

from __future__ import annotations

import math

import numpy as np

from mhalib.validation import check_divisible, check_positive_int

__all__ = ["KEY_BLOCK", "TILE_BYTES", "tile_keys", "exp_neg", "score_tile", "softmax_tile", "value_tile",
           "block_partials", "merge_blocks", "padded_group", "fused_decode", "compile_kernels", "streaming_read",
           "PASSES", "passes_loop", "time_passes"]

#: Keys per block: the unit of work one core takes (``benchmarks/bench_decode.py --fused-blocks``
#: times others); much smaller blocks add merge work, much larger ones leave a core idle at the
#: end of a short cache.
KEY_BLOCK = 512

#: Bytes of key rows per tile (see :func:`tile_keys`).
TILE_BYTES = 32 * 1024

#: A finite stand-in for minus infinity: the compiled kernel assumes no infinities (fastmath).
_LOWEST = np.float32(-3.0e38)

prange = range  # numba.prange once the kernels are compiled (see compile_kernels)


def tile_keys(d):
    """Keys per tile for rows of ``d`` float32: ``TILE_BYTES`` of key rows, at least 32 keys and at most 128.

    A tile's keys are scored together, then weighed, then added; 32 KiB of K rows (and as
    many of V) stay in a core's L2 cache between the three passes: 64 keys at d = 128, 128
    at d = 64. A longer tile gives each pass's fixed costs (a loop's start, a query's
    exponentials, its rescaling) more keys to share, and the memory more time to bring the
    rows each pass asks for ahead of the next (see :func:`score_tile`). Measured against
    tiles of 16 KiB (AMD EPYC, n = 32,768, caches flushed, interleaved, each kernel timed
    first in one run and last in the other): at two threads 2 to 8% faster for GQA-8 of
    H = 32, Falcon-40B and Falcon-7B, 0 to 2% for Llama-2-70B and Qwen2-7B; at one thread
    0 to 6% faster, MHA included.
    """
    return max(32, min(128, TILE_BYTES // (4 * d)))


def prefetch(address):
    """Ask the memory system for the 64-byte line at ``address`` now, to be used soon.

    A hint that changes no value: in plain Python it does nothing; compiled, it is LLVM's
    ``llvm.prefetch`` (:func:`_compiled_prefetch`), which brings the line into the L2 cache.
    """
    return None


def prefetch_row(x, t):
    """Ask for every 64-byte line of row ``t`` of the float32 array ``x`` ``(rows, d)``."""
    at = x.ctypes.data + t * x.shape[1] * 4
    for line in range(0, x.shape[1] * 4, 64):
        prefetch(at + line)


def pow2(k):
    """``2.0 ** k`` as a float32, for an integer ``-126 <= k <= 127``, built from its bits.

    A float32 is ``2 ** (e - 127) * 1.m`` with the exponent e in bits 23 to 30; ``1.0 * 2**k``
    has ``e = k + 127`` and ``m = 0``. Compiled, it is one shift, one add and a bit cast
    (:func:`_compiled_pow2`), which vectorise.
    """
    return np.int32((int(k) + 127) << 23).view(np.float32)


def exp_neg(x):
    """``e ** x`` in float32 for ``x <= 0`` (within 2 units in the last place), in arithmetic alone.

    ``e ** x = 2 ** z`` with ``z = x log2(e)``. Split ``z`` into an integer ``k`` and a rest:
    ``e ** x = 2 ** k * e ** r`` with ``r = x - k ln 2`` and ``|r| <= ln(2) / 2``. On so short a
    range a degree-7 polynomial gives ``e ** r`` to float32 precision (Cephes' ``expf``
    coefficients), and ``2 ** k`` is :func:`pow2`. No table, no branch, no library call: in a
    loop over a tile of scores, the compiler evaluates 8 or 16 of them per instruction.
    Below ``x = -87`` the result is ``e ** -87``, about 1.6e-38 (the smallest normal float32
    is 1.2e-38): a weight that small adds nothing next to the largest, which is 1.
    """
    x = max(x, np.float32(-87.0))
    z = x * np.float32(1.4426950408889634)  # x log2(e), <= 0
    k = np.int32(z - np.float32(0.5))  # z rounded to the nearest integer (truncation of z - 1/2, for z <= 0)
    kf = np.float32(k)
    r = x - kf * np.float32(0.693359375) + kf * np.float32(2.12194440e-4)  # x - k ln 2, ln 2 in two parts
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)  # e ** r
    return p * pow2(k)


def score_tile(q, k, t0, tn, s, top, v):
    """The scores of one tile: ``s[r, t] = q[r] . k[t0 + t]`` for ``t < tn``, and each query's largest.

    Four queries and two keys at a time: eight dot products in one loop over d, so each
    number of a key row is loaded once for four multiply-adds and each number of a query
    row once for two. Meanwhile the blocks of four ask for the tile's value rows, so that
    they are on their way before :func:`value_tile` needs them, evenly over the whole pass:
    with B blocks of four, one row every B/2 pairs of keys, instead of every row in the
    first block. A burst of requests at the start of the pass likely fills the core's
    queue of outstanding memory requests, so that the pass's own loads wait behind them.
    Measured (AMD EPYC, two threads, n = 32,768, caches flushed, interleaved with the
    burst, three runs, the two timed in both orders): Llama-2-70B (R = 8) 7 to 10% faster,
    Qwen2-7B 3 to 5%, the other shapes of the benchmark within 3% either way.

    A query left over after the blocks (R % 4 == 1) scores four keys at a time;
    MHA's lone query (R = 1) one key at a time, asking for each value row as it goes: with
    four keys at a time, MHA read its cache at 69% of the streaming read instead of 92%
    (AMD EPYC, one thread). A tile that is not a whole number of pairs (or fours) of keys
    scores its last key again (the copies land in columns ``tn`` to ``tn + 2``, past the
    tile, and are never used).

    Args:
        q: ``(R, d)`` float32, the group's queries (scaled by ``1 / sqrt(d)``).
        k, v: ``(n, d)`` float32, the group's keys and values.
        t0, tn: the tile's first key and its number of keys (``1 <= tn <= tile``).
        s: ``(R, tile + 3)`` float32, filled with the scores in columns ``0 .. tn - 1``.
        top: ``(R,)`` float32, filled with each query's largest score in the tile (kept here,
            as the scores are made: a loop for the maximum alone is not vectorised).
    """
    rep, d = q.shape
    last = t0 + tn - 1
    four = rep - rep % 4
    blocks = max(1, four // 4)  # blocks of four queries: the tile's value rows are asked for over all of them
    for r in range(0, four, 4):  # four queries ...
        top0 = top1 = top2 = top3 = _LOWEST
        for t in range(0, tn, 2):  # ... against two keys
            ka, kb = t0 + t, min(t0 + t + 1, last)
            step = (r // 4) * tn + t  # the place of these two keys in the pass: 0 ... blocks * tn - 1
            if step % blocks == 0:  # every value row once, evenly over the pass
                prefetch_row(v, t0 + step // blocks)
            if (step + 1) % blocks == 0 and t + 1 < tn:
                prefetch_row(v, t0 + (step + 1) // blocks)
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
            for c in range(d):  # the loop the compiler vectorises: 8 or 16 floats per instruction
                x, y = k[ka, c], k[kb, c]
                s0 += q[r, c] * x
                s1 += q[r + 1, c] * x
                s2 += q[r + 2, c] * x
                s3 += q[r + 3, c] * x
                s4 += q[r, c] * y
                s5 += q[r + 1, c] * y
                s6 += q[r + 2, c] * y
                s7 += q[r + 3, c] * y
            s[r, t], s[r + 1, t], s[r + 2, t], s[r + 3, t] = s0, s1, s2, s3
            s[r, t + 1], s[r + 1, t + 1], s[r + 2, t + 1], s[r + 3, t + 1] = s4, s5, s6, s7
            top0, top1, top2, top3 = max(top0, s0, s4), max(top1, s1, s5), max(top2, s2, s6), max(top3, s3, s7)
        top[r], top[r + 1], top[r + 2], top[r + 3] = top0, top1, top2, top3
    for r in range(four, rep):  # a query left over (R % 4 == 1), or MHA's only query
        top0 = _LOWEST
        if four == 0:  # MHA: one key at a time, and this loop asks for the value rows
            for t in range(tn):
                prefetch_row(v, t0 + t)
                s0 = np.float32(0.0)
                for c in range(d):
                    s0 += q[r, c] * k[t0 + t, c]
                s[r, t] = s0
                top0 = max(top0, s0)
        else:  # after the blocks: four keys at a time
            for t in range(0, tn, 4):
                y0, y1, y2, y3 = t0 + t, min(t0 + t + 1, last), min(t0 + t + 2, last), min(t0 + t + 3, last)
                s0 = s1 = s2 = s3 = np.float32(0.0)
                for c in range(d):
                    x = q[r, c]
                    s0 += x * k[y0, c]
                    s1 += x * k[y1, c]
                    s2 += x * k[y2, c]
                    s3 += x * k[y3, c]
                s[r, t], s[r, t + 1], s[r, t + 2], s[r, t + 3] = s0, s1, s2, s3
                top0 = max(top0, s0, s1, s2, s3)
        top[r] = top0


def softmax_tile(s, tn, top, m, l, acc):
    """The online softmax's step for one tile: scores become weights, in place.

    For each query r: if the tile's largest score ``top[r]`` beats the running maximum
    ``m[r]``, what was summed so far (``l[r]``, ``acc[r]``) is rescaled by
    ``e ** (m_old - m_new)``; then ``s[r, t] = e ** (s[r, t] - m[r])`` (:func:`exp_neg`,
    vectorised over the tile) and ``l[r]`` grows by their sum. Columns ``tn`` to ``tn + 2``
    get weight 0, so that :func:`value_tile` may take keys four at a time past the tile's end.

    Args:
        s: ``(R, tile + 3)`` float32, the scores from :func:`score_tile`; the weights on return.
        tn: the tile's number of keys.
        top: ``(R,)`` float32, each query's largest score in the tile.
        m, l: ``(R,)`` float32, each query's running maximum and running sum of weights.
        acc: ``(R, d)`` float32, each query's running sum of weighted values.
    """
    rep, d = acc.shape
    for r in range(rep):
        if top[r] > m[r]:  # a new running maximum: rescale what was summed so far
            shrink = exp_neg(m[r] - top[r])
            l[r] *= shrink
            for c in range(d):
                acc[r, c] *= shrink
            m[r] = top[r]
        high = m[r]
        total = np.float32(0.0)
        for t in range(tn):  # vectorised, exponential included
            p = exp_neg(s[r, t] - high)
            s[r, t] = p
            total += p
        l[r] += total
        for t in range(tn, tn + 3):
            s[r, t] = 0.0


def value_tile(s, v, t0, tn, acc, k, stop):
    """Add the tile's weighted values: ``acc[r] += sum_t s[r, t] * v[t0 + t]``.

    Eight queries and four keys at a time: each number of the four value rows is loaded once
    for eight multiply-adds, and each query's output row is loaded and stored once for four
    keys. Queries left over go four at a time (when R % 8 is 4 or more), then one at a
    time, four keys at a time (MHA's lone query one key at a time, as in
    :func:`score_tile`). A block of eight measured 4 to 9% faster than two blocks of
    four at d = 128 and R = 8 to 71, within 3% at d = 64 (AMD EPYC, one thread, the cache
    in L2): more multiply-adds per number loaded, and half as many loops to start. Past the tile's end the weights are 0
    (see :func:`softmax_tile`) and the row read is the tile's last, so no row outside the
    cache is touched. Meanwhile the blocks of eight ask for the next tile's key rows, evenly
    over the pass as in :func:`score_tile` (with no block of eight, the block of four or
    the single query does).

    Args:
        s: ``(R, tile + 3)`` float32, the weights from :func:`softmax_tile`.
        v, k: ``(n, d)`` float32, the group's values and keys.
        t0, tn: the tile's first key and its number of keys.
        acc: ``(R, d)`` float32, each query's running sum of weighted values.
        stop: the end of the group's cache (no key row past it is asked for). The tile asks
            for as many rows after its own as it has keys; a block's last tile asks for the
            first rows of the next block: ``prange`` gives each thread a run of consecutive
            tasks, so the same core usually takes that block next.
            Measured (AMD EPYC, two threads, n = 32,768, interleaved, both orders) against
            stopping at the block's end: 4 to 10% faster for MHA, GQA-8 of H = 32, Qwen2-7B
            and Llama-2-70B, within 2% for the others.
    """
    rep, d = acc.shape
    ahead = t0 + tn  # the next tile's first key (in this block, or the next block's first)
    last = t0 + tn - 1
    eight, four = rep - rep % 8, rep - rep % 4
    blocks = max(1, eight // 8)  # blocks of eight queries: the next tile's key rows are asked for over all of them
    for r in range(0, eight, 8):  # eight queries ...
        for t in range(0, tn, 4):  # ... and four keys
            y0, y1, y2, y3 = t0 + t, min(t0 + t + 1, last), min(t0 + t + 2, last), min(t0 + t + 3, last)
            for i in range(4):  # the next tile's key rows: each once, evenly over the pass
                step = (r // 8) * tn + t + i
                if step % blocks == 0 and t + i < tn and ahead + step // blocks < stop:
                    prefetch_row(k, ahead + step // blocks)
            p00, p01, p02, p03 = s[r, t], s[r, t + 1], s[r, t + 2], s[r, t + 3]
            p10, p11, p12, p13 = s[r + 1, t], s[r + 1, t + 1], s[r + 1, t + 2], s[r + 1, t + 3]
            p20, p21, p22, p23 = s[r + 2, t], s[r + 2, t + 1], s[r + 2, t + 2], s[r + 2, t + 3]
            p30, p31, p32, p33 = s[r + 3, t], s[r + 3, t + 1], s[r + 3, t + 2], s[r + 3, t + 3]
            p40, p41, p42, p43 = s[r + 4, t], s[r + 4, t + 1], s[r + 4, t + 2], s[r + 4, t + 3]
            p50, p51, p52, p53 = s[r + 5, t], s[r + 5, t + 1], s[r + 5, t + 2], s[r + 5, t + 3]
            p60, p61, p62, p63 = s[r + 6, t], s[r + 6, t + 1], s[r + 6, t + 2], s[r + 6, t + 3]
            p70, p71, p72, p73 = s[r + 7, t], s[r + 7, t + 1], s[r + 7, t + 2], s[r + 7, t + 3]
            for c in range(d):  # vectorised: 8 or 16 floats of each row per instruction
                x0, x1, x2, x3 = v[y0, c], v[y1, c], v[y2, c], v[y3, c]
                acc[r, c] += p00 * x0 + p01 * x1 + p02 * x2 + p03 * x3
                acc[r + 1, c] += p10 * x0 + p11 * x1 + p12 * x2 + p13 * x3
                acc[r + 2, c] += p20 * x0 + p21 * x1 + p22 * x2 + p23 * x3
                acc[r + 3, c] += p30 * x0 + p31 * x1 + p32 * x2 + p33 * x3
                acc[r + 4, c] += p40 * x0 + p41 * x1 + p42 * x2 + p43 * x3
                acc[r + 5, c] += p50 * x0 + p51 * x1 + p52 * x2 + p53 * x3
                acc[r + 6, c] += p60 * x0 + p61 * x1 + p62 * x2 + p63 * x3
                acc[r + 7, c] += p70 * x0 + p71 * x1 + p72 * x2 + p73 * x3
    for r in range(eight, four, 4):  # four queries left over (one block at most) ...
        for t in range(0, tn, 4):  # ... and four keys
            y0, y1, y2, y3 = t0 + t, min(t0 + t + 1, last), min(t0 + t + 2, last), min(t0 + t + 3, last)
            if r == 0:  # no block of eight: this block asks for the next tile's key rows
                for u in range(ahead + t, min(ahead + t + 4, ahead + tn, stop)):
                    prefetch_row(k, u)
            p00, p01, p02, p03 = s[r, t], s[r, t + 1], s[r, t + 2], s[r, t + 3]
            p10, p11, p12, p13 = s[r + 1, t], s[r + 1, t + 1], s[r + 1, t + 2], s[r + 1, t + 3]
            p20, p21, p22, p23 = s[r + 2, t], s[r + 2, t + 1], s[r + 2, t + 2], s[r + 2, t + 3]
            p30, p31, p32, p33 = s[r + 3, t], s[r + 3, t + 1], s[r + 3, t + 2], s[r + 3, t + 3]
            for c in range(d):
                x0, x1, x2, x3 = v[y0, c], v[y1, c], v[y2, c], v[y3, c]
                acc[r, c] += p00 * x0 + p01 * x1 + p02 * x2 + p03 * x3
                acc[r + 1, c] += p10 * x0 + p11 * x1 + p12 * x2 + p13 * x3
                acc[r + 2, c] += p20 * x0 + p21 * x1 + p22 * x2 + p23 * x3
                acc[r + 3, c] += p30 * x0 + p31 * x1 + p32 * x2 + p33 * x3
    for r in range(four, rep):  # a query left over (R % 4 == 1), or MHA's only query
        if four == 0:  # MHA: one key at a time, and this loop asks for the next tile's key rows
            for t in range(tn):
                if ahead + t < stop:
                    prefetch_row(k, ahead + t)
                p = s[r, t]
                for c in range(d):
                    acc[r, c] += p * v[t0 + t, c]
        else:  # after the blocks: four keys at a time
            for t in range(0, tn, 4):
                y0, y1, y2, y3 = t0 + t, min(t0 + t + 1, last), min(t0 + t + 2, last), min(t0 + t + 3, last)
                p0, p1, p2, p3 = s[r, t], s[r, t + 1], s[r, t + 2], s[r, t + 3]
                for c in range(d):
                    acc[r, c] += p0 * v[y0, c] + p1 * v[y1, c] + p2 * v[y2, c] + p3 * v[y3, c]


def block_partials(q, k, v, block, m, l, acc):
    """Each key block's softmax statistics and unnormalised output, for every query of its group.

    Args:
        q: ``(B, g, R, d)`` float32, the queries already multiplied by ``1 / sqrt(d)``.
        k, v: ``(B, g, n, d)`` float32, the cache (rows contiguous).
        block: keys per block.
        m, l: ``(B, g, blocks, R)`` float32, filled with each block's maximum score and
            its sum of ``exp(score - maximum)``.
        acc: ``(B, g, blocks, R, d)`` float32, filled with each block's
            ``sum_t exp(score_t - maximum) * v_t``.
    """
    batch, groups, rep, d = q.shape
    n = k.shape[2]
    blocks = m.shape[2]
    for task in prange(batch * groups * blocks):  # (sequence, K/V head, key block): shared out over the cores
        b, h, j = task // (groups * blocks), task // blocks % groups, task % blocks
        qh, kh, vh = q[b, h], k[b, h], v[b, h]  # (R, d), (n, d), (n, d)
        mj, lj, accj = m[b, h, j], l[b, h, j], acc[b, h, j]  # (R,), (R,), (R, d): this block's results
        mj[:] = _LOWEST
        lj[:] = 0.0
        accj[:] = 0.0
        tile = tile_keys(d)
        s = np.empty((rep, tile + 3), np.float32)  # (R, tile + 3): a tile's scores, then its weights
        top = np.empty(rep, np.float32)  # (R,): each query's largest score in the tile
        end = min((j + 1) * block, n)
        for t0 in range(j * block, end, tile):
            tn = min(tile, end - t0)
            score_tile(qh, kh, t0, tn, s, top, vh)
            softmax_tile(s, tn, top, mj, lj, accj)
            value_tile(s, vh, t0, tn, accj, kh, n)  # may ask for the next block's first key rows


def merge_blocks(m, l, acc, out):
    """Merge the blocks' partial results by their log-sum-exp into the attention output.

    Block j holds ``l_j = sum exp(s - m_j)`` and ``acc_j = sum exp(s - m_j) v`` over its
    keys. With ``M = max_j m_j``, ``w_j = exp(m_j - M)``, the softmax over all keys gives
    ``out = sum_j w_j acc_j / sum_j w_j l_j``: exact, and no ``exp`` can overflow.

    Args:
        m, l: ``(B, g, blocks, R)``; acc: ``(B, g, blocks, R, d)`` from :func:`block_partials`.
        out: ``(B, g, R, d)`` float32, filled with the output.
    """
    batch, groups, blocks, rep = m.shape
    for task in prange(batch * groups):  # (sequence, K/V head)
        b, h = task // groups, task % groups
        for r in range(rep):
            top = m[b, h, 0, r]
            for j in range(1, blocks):
                top = max(top, m[b, h, j, r])  # M: the largest block maximum
            total = np.float32(0.0)
            out[b, h, r, :] = 0.0
            for j in range(blocks):
                w = math.exp(m[b, h, j, r] - top)  # w_j <= 1
                total += w * l[b, h, j, r]
                for c in range(out.shape[3]):
                    out[b, h, r, c] += w * acc[b, h, j, r, c]
            for c in range(out.shape[3]):
                out[b, h, r, c] /= total


def read_rows(k, v):
    """A streaming read of K and V as the kernel reads them: row by row, both at once.

    The yardstick for the kernel: its time is the least a pass over these bytes costs on
    this machine. Each block of rows is summed into ``d`` lanes (independent sums that
    the compiler keeps in vector registers), so the loop waits on memory, not on additions.

    Args:
        k, v: ``(rows, d)`` float32.

    Returns:
        The sum of all their numbers (only so that the read cannot be skipped).
    """
    rows, d = k.shape
    chunk = 512
    total = 0.0
    for part in prange(-(-rows // chunk)):  # blocks of rows, shared out over the cores
        lanes = np.zeros(d, np.float32)  # (d,)
        for t in range(part * chunk, min((part + 1) * chunk, rows)):
            for c in range(d):
                lanes[c] += k[t, c] + v[t, c]
        total += lanes.sum()
    return total


#: The passes :func:`time_passes` times, by name: what each call of :func:`passes_loop` runs.
PASSES = {"scores": 1, "softmax": 2, "values": 4, "all three": 7}


def passes_loop(q, k, v, repeats, passes, s, top, m, l, acc):
    """Run the passes of :func:`block_partials` over the keys of ``k`` and ``v``, ``repeats`` times.

    ``passes`` adds up the passes to run (:data:`PASSES`: 1 scores, 2 softmax, 4 values, 7 all
    three), so that each can be timed alone. With all three and ``repeats = 1``, from
    ``m = lowest``, ``l = 0`` and ``acc = 0``, it leaves the block's results as
    :func:`block_partials` does: ``acc / l`` is the attention output of the group's queries.

    Args:
        q: ``(R, d)`` float32, the group's queries (scaled, padded as :func:`padded_group` says).
        k, v: ``(n, d)`` float32.
        repeats: passes over all n keys.
        passes: which passes (see :data:`PASSES`).
        s, top, m, l, acc: the kernel's work arrays, ``(R, tile + 3)``, ``(R,)``, ``(R,)``,
            ``(R,)`` and ``(R, d)`` float32.
    """
    n, d = k.shape
    tile = tile_keys(d)
    for _ in range(repeats):
        for t0 in range(0, n, tile):
            tn = min(tile, n - t0)
            if passes & 1:
                score_tile(q, k, t0, tn, s, top, v)
            if passes & 2:
                softmax_tile(s, tn, top, m, l, acc)
            if passes & 4:
                value_tile(s, v, t0, tn, acc, k, n)
    return acc[0, 0]


def time_passes(rep, d, *, keys=KEY_BLOCK, repeats=200, rounds=5, seed=0):
    """Seconds per key of each pass of the kernel, its rows already in the core's caches.

    One thread runs :func:`passes_loop`, the kernel's own three pass functions, on ``keys``
    keys (512 keys of ``d`` = 128 are 512 KiB of K and V: in the L2 cache of a core that has
    1 MiB of it, as on AMD Zen 4), ``repeats`` times a call, for each entry of
    :data:`PASSES`, and keeps the best of ``rounds`` calls. Without waits on main memory, each
    pass's time is close to its arithmetic: ``2 R d`` FLOPs per key for the scores and as
    many for the values, to set against the multiply-add peak (``benchmarks/fma_peak.py``).
    It is a best case for the kernel: its loads come from L1 and L2, its requests for the
    next rows find them already there, it leaves out each block's set-up and the merge, and
    after the first call no running maximum moves.

    Args:
        rep: queries per K/V head (R = H / g); the kernel runs :func:`padded_group` rows.
        d: head_dim.

    Returns:
        ``{pass name: seconds per key}`` for every name of :data:`PASSES`.
    """
    import time

    for name, value in (("rep", rep), ("d", d), ("keys", keys), ("repeats", repeats), ("rounds", rounds)):
        check_positive_int(value, name)
    compile_kernels()
    rows = padded_group(rep)
    rng = np.random.default_rng(seed)
    q = np.zeros((rows, d), np.float32)  # (R', d): zero rows after the R queries, as the kernel pads them
    q[:rep] = rng.standard_normal((rep, d), dtype=np.float32) / np.float32(math.sqrt(d))
    k = rng.standard_normal((keys, d), dtype=np.float32)  # (n, d)
    v = rng.standard_normal((keys, d), dtype=np.float32)  # (n, d)
    s = np.zeros((rows, tile_keys(d) + 3), np.float32)
    top, m, l, acc = (np.zeros(rows, np.float32), np.full(rows, _LOWEST, np.float32), np.zeros(rows, np.float32),
                      np.zeros((rows, d), np.float32))
    loop = _compiled["passes"]
    seconds = {}
    for name, passes in PASSES.items():
        loop(q, k, v, 1, passes, s, top, m, l, acc)  # warm the caches
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            loop(q, k, v, repeats, passes, s, top, m, l, acc)
            best = min(best, time.perf_counter() - start)
        seconds[name] = best / (repeats * keys)
    return seconds


#: The names :func:`compile_kernels` binds to compiled code, and the plain Python each stands for.
PLAIN_PYTHON = {"prange": range, "prefetch": prefetch, "prefetch_row": prefetch_row, "pow2": pow2,
                "exp_neg": exp_neg, "tile_keys": tile_keys, "score_tile": score_tile, "softmax_tile": softmax_tile,
                "value_tile": value_tile}

_compiled = {}


def compile_kernels():
    """Compile :func:`block_partials` and :func:`merge_blocks` with Numba (once per process).

    The helpers they call (:data:`PLAIN_PYTHON`) are bound to compiled versions first, and
    inlined into the kernel. Returns the two compiled functions (:func:`read_rows` is
    compiled too, for :func:`streaming_read`). Numba keeps the machine code on disk
    (``cache=True``), so a later process loads it instead of compiling again. Raises
    ``ImportError`` naming ``pip install numba`` when Numba is missing.
    """
    if not _compiled:
        try:
            import numba
        except ImportError as error:
            raise ImportError("mhalib.fused_decode needs Numba: pip install numba "
                              "(the course pins it in requirements/lock.txt)") from error
        inline = numba.njit(fastmath=True, cache=True, inline="always")
        globals().update(prange=numba.prange, prefetch=_compiled_prefetch(), pow2=_compiled_pow2(),
                         **{name: inline(PLAIN_PYTHON[name])
                            for name in ("prefetch_row", "exp_neg", "tile_keys", "score_tile", "softmax_tile",
                                      "value_tile")})
        jit = numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
        _compiled["partials"] = jit(block_partials)
        _compiled["merge"] = jit(merge_blocks)
        _compiled["read"] = jit(read_rows)
        _compiled["passes"] = numba.njit(fastmath=True, cache=True, nogil=True)(passes_loop)
    return _compiled["partials"], _compiled["merge"]


def _compiled_prefetch():
    """:func:`prefetch` for compiled code: LLVM's ``llvm.prefetch`` on the address, through
    Numba's ``intrinsic``: a read, with locality 2 (x86 ``prefetcht1``: into the L2 cache).

    Not into L1 (locality 3): a core tracks only a few dozen outstanding L1 misses, and a
    prefetch that waits for one holds up the loads behind it. Measured (AMD EPYC, one
    thread, H = 32, GQA-8, n = 32,768): 29.0 ms with L1 prefetches, 19.0 ms with L2 ones,
    against 12.6 ms for a streaming read of the same bytes.
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def prefetch_line(typingctx, address):
        def codegen(context, builder, signature, args):
            pointer = builder.inttoptr(args[0], ir.IntType(8).as_pointer())
            i32 = ir.IntType(32)
            hint = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [pointer.type, i32, i32, i32]), "llvm.prefetch.p0")
            read, level_2, data = ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)
            builder.call(hint, [pointer, read, level_2, data])
            return context.get_dummy_value()

        return types.void(types.intp), codegen

    return prefetch_line


def _compiled_pow2():
    """:func:`pow2` for compiled code: ``(k + 127) << 23`` reinterpreted as a float32 (LLVM's
    ``bitcast``), through Numba's ``intrinsic``."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def pow2_bits(typingctx, k):
        if not isinstance(k, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            exponent = context.cast(builder, args[0], signature.args[0], types.int32)
            bits = builder.shl(builder.add(exponent, ir.Constant(i32, 127)), ir.Constant(i32, 23))
            return builder.bitcast(bits, ir.FloatType())

        return types.float32(k), codegen

    return pow2_bits


def _check(q, k, v, block):
    """Raise ValueError unless q (B, H, 1, d), k and v (B, g, n, d) are float32 on the CPU."""
    import torch

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"fused_decode works on float32 CPU tensors; got {name} of dtype {x.dtype} "
                             f"on {x.device} (use .float().cpu())")
        if x.dim() != 4:
            raise ValueError(f"fused_decode needs 4-D q (B, H, 1, d) and k, v (B, g, n, d); "
                             f"got {name} of shape {tuple(x.shape)}")
    b, h, n_q, d = q.shape
    if n_q != 1:
        raise ValueError(f"fused_decode attends one decoding query per head: q must be (B, H, 1, d); "
                         f"got N_q = {n_q} (use grouped_attention or SDPA for several queries)")
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d or k.shape[2] < 1:
        raise ValueError(f"k and v must both be (B={b}, g, n >= 1, d={d}); got k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    check_divisible(h, k.shape[1], "num_heads", "num_kv_heads")
    check_positive_int(block, "block")


def fused_decode(q, k, v, *, block=KEY_BLOCK, num_threads=None):
    """One decoding step of grouped-query attention, fused: each K/V head read once.

    Equivalent to ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` with one
    query token (no mask: a decoding query sees the whole cache), to float32 rounding.

    Args:
        q: ``(B, H, 1, d)`` float32.
        k, v: ``(B, g, n, d)`` float32 with g dividing H (a cache that is not contiguous
            is copied first).
        block: keys per block (the unit of work of one core).
        num_threads: Numba threads for this call (default: Numba's current setting).

    Returns:
        ``(B, H, 1, d)`` float32 tensor.
    """
    import torch

    _check(q, k, v, block)
    partials, merge = compile_kernels()
    b, h, _, d = q.shape
    g, n = k.shape[1], k.shape[2]
    rep, blocks = padded_group(h // g), -(-n // block)
    qg = np.zeros((b, g, rep, d), np.float32)  # (B, g, R', d): the group's queries, zero rows after them
    qg[:, :, :h // g] = (q.detach() * (1.0 / math.sqrt(d))).reshape(b, g, h // g, d).numpy()  # (B, g, R, d)
    kc = np.ascontiguousarray(k.detach().numpy())  # (B, g, n, d): no copy when contiguous
    vc = np.ascontiguousarray(v.detach().numpy())  # (B, g, n, d)
    m = np.empty((b, g, blocks, rep), np.float32)  # (B, g, blocks, R): each block's maximum
    l = np.empty((b, g, blocks, rep), np.float32)  # (B, g, blocks, R): each block's sum of weights
    acc = np.empty((b, g, blocks, rep, d), np.float32)  # (B, g, blocks, R, d): each block's weighted V
    out = np.empty((b, g, rep, d), np.float32)  # (B, g, R, d)
    if num_threads is not None:
        import numba

        before = numba.get_num_threads()
        numba.set_num_threads(num_threads)
    try:
        partials(qg, kc, vc, block, m, l, acc)
        merge(m, l, acc, out)
    finally:
        if num_threads is not None:
            numba.set_num_threads(before)
    return torch.from_numpy(np.ascontiguousarray(out[:, :, :h // g])).view(b, h, 1, d)  # (B, H, 1, d)


def padded_group(rep):
    """The number of query rows the kernel runs for R queries per K/V head.

    Two or three queries left over after the blocks of four go into one more block, filled
    with zero queries whose outputs are dropped: a block of four costs less than two or
    three single queries (measured: about 42 ns per key for a block of four, 25 to 29 for
    one query alone; AMD EPYC, one thread, d = 128, the cache in L2). One left over stays
    alone. So R = 2, 3, 6, 7, 71 run as 4, 4, 8, 8, 72 rows; R = 1, 4, 5, 32 as they are.
    """
    return rep + (-rep) % 4 if rep % 4 >= 2 else rep


def streaming_read(k, v):
    """Read every number of two equal float32 CPU tensors ``(..., d)`` once (compiled :func:`read_rows`)."""
    compile_kernels()
    d = k.shape[-1]
    return _compiled["read"](k.detach().numpy().reshape(-1, d), v.detach().numpy().reshape(-1, d))  # (rows, d) each
