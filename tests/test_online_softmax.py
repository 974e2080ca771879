"""The online softmax, tiles and the split-K merge against the two-pass softmax and plain attention."""

import numpy as np
import pytest

from mhalib.online_softmax import (
    HBMTraffic,
    hbm_traffic,
    merge_partials,
    online_normalizer,
    online_softmax,
    split_attention,
    tiled_attention,
)
from tolerance import float_tol


def two_pass_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def plain_attention(q, k, v, causal=False):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        s = np.where(np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + n_k - n_q, s, -np.inf)
    return two_pass_softmax(s) @ v


def test_one_pass_equals_two_passes_even_for_large_scores():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 37)) * 30 + np.array([[0], [700], [-700], [5], [1000]])
    np.testing.assert_allclose(online_softmax(x), two_pass_softmax(x), rtol=0, atol=1e-12)
    m, s = online_normalizer(x)
    np.testing.assert_array_equal(m, x.max(axis=-1))
    np.testing.assert_allclose(m + np.log(s), np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1))


@pytest.mark.parametrize("loop", ["fa2", "fa1"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq, bk", [(1, 1), (4, 5), (16, 64), (64, 3)])
def test_tiles_equal_plain_attention_and_need_less_memory(causal, bq, bk, loop):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 20, 8))
    k = rng.standard_normal((2, 33, 8))
    v = rng.standard_normal((2, 33, 6))
    out, peak = tiled_attention(q, k, v, bq, bk, causal=causal, loop=loop)
    np.testing.assert_allclose(out, plain_attention(q, k, v, causal), atol=1e-12)
    rows, cols = min(bq, 20), min(bk, 33)
    assert peak == 8 * 2 * rows * max(cols, 6)  # a score tile or the running output, float64
    assert peak < q.shape[0] * 20 * 33 * 8 or (bq >= 20 and bk >= 33)


@pytest.mark.parametrize("n_q, n_k, bq, bk", [(20, 33, 4, 5), (20, 33, 64, 3), (7, 7, 7, 7), (1, 50, 1, 16)])
@pytest.mark.parametrize("loop", ["fa2", "fa1"])
def test_the_traffic_each_loop_counts_is_the_closed_form(n_q, n_k, bq, bk, loop):
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((n_q, 8)), rng.standard_normal((n_k, 8)), rng.standard_normal((n_k, 6))
    traffic = HBMTraffic()
    tiled_attention(q, k, v, bq, bk, loop=loop, traffic=traffic)
    assert {"reads": traffic.reads, "writes": traffic.writes} == hbm_traffic(n_q, n_k, 8, bq, bk, loop, d_v=6)


def test_fa1_reads_the_keys_once_and_fa2_the_queries_once_and_both_scale_as_n2_d2_over_m():
    n, d = 4096, 64
    fa1, fa2 = hbm_traffic(n, n, d, 64, 64, "fa1"), hbm_traffic(n, n, d, 64, 64, "fa2")
    t = n // 64
    assert fa1["reads"] - t * n * (2 * d + 2) == 2 * n * d  # K and V once, everything else per key tile
    assert fa2["reads"] - t * n * 2 * d == n * d  # Q once, K and V per query tile
    assert fa2["writes"] == n * (d + 1) < fa1["writes"] / t  # FA2 writes O once; FA1 once per key tile

    def tiles(m, d, loop):  # FA1's Algorithm 1: B_c = ceil(M / 4d), B_r = min(B_c, d); FA2: query tiles as large
        b_c = -(-m // (4 * d))
        return (min(b_c, d) if loop == "fa1" else b_c), b_c

    m = 48 * 1024
    for loop in ("fa1", "fa2"):
        base = sum(hbm_traffic(n, n, d, *tiles(m, d, loop), loop).values())
        longer = sum(hbm_traffic(2 * n, 2 * n, d, *tiles(m, d, loop), loop).values())
        wider = sum(hbm_traffic(n, n, 2 * d, *tiles(m, 2 * d, loop), loop).values())
        smaller = sum(hbm_traffic(n, n, d, *tiles(m // 2, d, loop), loop).values())
        assert 3.8 < longer / base < 4.2, loop  # N^2
        assert 3.5 < wider / base < 4.5, loop  # d^2 (plus the N d terms)
        assert 1.8 < smaller / base < 2.2, loop  # 1 / M
    b_r = min(-(-m // (4 * d)), d)  # FA1's query tile: capped at d
    capped = hbm_traffic(n, n, d, b_r, b_r, "fa2")["reads"]
    assert capped == n * d + (n // b_r) * n * 2 * d  # FA2 with FA1's query tile: 2 N^2 reads, whatever M


def test_float32_stays_float32_and_is_computed_in_float32():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 9, 8)).astype(np.float32)
    v = rng.standard_normal((2, 9, 8)).astype(np.float32)
    want = plain_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    tol = float_tol(np.float32, 2 * 8 + 9)
    for loop in ("fa2", "fa1"):
        out, peak = tiled_attention(q, k, v, 2, 4, loop=loop)
        assert out.dtype == np.float32
        assert peak == 4 * 2 * 2 * 8  # the largest temporary holds 4-byte numbers: nothing was computed in float64
        np.testing.assert_allclose(out, want, **tol)
    outs, lses = split_attention(q, k, v, 3)
    assert outs.dtype == lses.dtype == np.float32
    merged, lse = merge_partials(outs, lses)
    assert merged.dtype == lse.dtype == np.float32
    np.testing.assert_allclose(merged, want, **tol)
    assert online_softmax(q).dtype == np.float32


def test_split_and_merge_equal_one_softmax_and_merges_nest():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, 1, 16))
    k = rng.standard_normal((3, 50, 16)) * 4
    v = rng.standard_normal((3, 50, 16))
    want = plain_attention(q, k, v)
    for splits in (1, 2, 7, 50):
        outs, lses = split_attention(q, k, v, splits)
        assert outs.shape == (splits, 3, 1, 16) and lses.shape == (splits, 3, 1)
        out, lse = merge_partials(outs, lses)
        np.testing.assert_allclose(out, want, atol=1e-12)
        s = q @ np.swapaxes(k, -1, -2) / 4
        np.testing.assert_allclose(lse, s.max(-1) + np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)), atol=1e-12)
    outs, lses = split_attention(q, k, v, 4)
    a = merge_partials(outs[:2], lses[:2])
    b = merge_partials(outs[2:], lses[2:])
    nested, _ = merge_partials(np.stack([a[0], b[0]]), np.stack([a[1], b[1]]))
    np.testing.assert_allclose(nested, want, atol=1e-12)


def test_merge_survives_huge_log_sum_exps_and_empty_chunks():
    outs = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[np.nan, np.nan]]])  # (3, 1, 2): the last chunk saw no key
    lses = np.array([[1000.0], [1000.0 + np.log(3.0)], [-np.inf]])
    out, lse = merge_partials(outs, lses)
    np.testing.assert_allclose(out, [[0.25, 0.75]], atol=1e-12)
    np.testing.assert_allclose(lse, [1000.0 + np.log(4.0)], atol=1e-9)
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.exp(lses[:2])  # what a merge without the max computes: inf / inf
        assert np.isnan((w[..., None] * outs[:2]).sum(0) / w.sum(0)).all()


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) and \(3, 3\)"):
        merge_partials(np.zeros((2, 3, 4)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="num_splits=9"):
        split_attention(np.zeros((1, 4)), np.zeros((5, 4)), np.zeros((5, 4)), 9)
    with pytest.raises(ValueError, match="block_k=0"):
        tiled_attention(np.zeros((1, 4)), np.zeros((5, 4)), np.zeros((5, 4)), 2, 0)
    with pytest.raises(ValueError, match="loop='fa3'"):
        tiled_attention(np.zeros((1, 4)), np.zeros((5, 4)), np.zeros((5, 4)), loop="fa3")
