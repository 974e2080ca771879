"""The fused decode kernel (mhalib.fused_decode) against PyTorch's SDPA with enable_gqa.

Every group size H/g the kernel may meet (each path of its register blocks: eight queries at a
time, four, the one-query remainder, and their mixtures), caches of odd lengths that end inside a
tile of either length (64 keys at d_head 128, 128 at d_head 64 and below), and batches of several
sequences; its exponential and its power of two against float64. No
timing is asserted here: speed is for benchmarks/bench_decode.py.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("numba")

from mhalib import fused_decode as fd  # noqa: E402
from mhalib.fused_decode import KEY_BLOCK, fused_decode, tile_keys  # noqa: E402
from tolerance import float_tol

H, D = 8, 16
#: (H, g, d_head): the benchmark's sweep at H = 32, real models' shapes (Qwen2-7B, Qwen2.5-14B,
#: Llama-2-70B, Falcon-40B, Falcon-7B), every remainder of H/g modulo 4 on its own, and the mixtures
#: of the value pass's blocks: 8 + 1 (R = 9), 8 + 4 (12), 8 + 4 + 1 (13), 8 + 8 + 1 (17), 8 + 8 + 4 (20).
SHAPES = ([(32, g, 128) for g in (32, 16, 8, 4, 2, 1)]
          + [(28, 4, 128), (40, 8, 128), (64, 8, 128), (128, 8, 64), (71, 1, 64)]
          + [(2, 1, 16), (3, 1, 16), (6, 1, 16), (7, 1, 16), (9, 1, 16), (12, 1, 16), (13, 1, 16), (17, 1, 16),
             (20, 1, 16)])


def inputs(batch, g, n, seed=0, h=H, d=D):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, h, 1, d, generator=gen)  # (B, H, 1, d)
    k = torch.randn(batch, g, n, d, generator=gen)  # (B, g, n, d)
    v = torch.randn(batch, g, n, d, generator=gen)  # (B, g, n, d)
    return q, k, v


@pytest.mark.parametrize("g", [8, 4, 2, 1], ids=["MHA", "GQA-4", "GQA-2", "MQA"])
@pytest.mark.parametrize("n", [1, 7, KEY_BLOCK, KEY_BLOCK + 1, 5000])
@pytest.mark.parametrize("batch", [1, 3])
def test_fused_decode_equals_sdpa_enable_gqa(g, n, batch):
    q, k, v = inputs(batch, g, n, seed=n + g)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    got = fused_decode(q, k, v)
    assert got.shape == (batch, H, 1, D) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, **float_tol(torch.float32, D + 2 * n))


@pytest.mark.parametrize("h, g, d", SHAPES, ids=[f"H{h}-g{g}-d{d}" for h, g, d in SHAPES])
@pytest.mark.parametrize("n", [1, 3, 69, 2 * KEY_BLOCK + 37])
def test_every_group_size_equals_sdpa(h, g, d, n):
    # Two sequences; a cache that ends inside a tile, inside a group of four keys, after one key.
    q, k, v = inputs(2, g, n, seed=h + g + n, h=h, d=d)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    got = fused_decode(q, k, v)
    assert got.shape == (2, h, 1, d)
    torch.testing.assert_close(got, want, **float_tol(torch.float32, d + 2 * n))


def test_a_tile_holds_32_kib_of_key_rows_and_32_to_128_keys():
    assert [tile_keys(d) for d in (512, 256, 128, 64, 32, 16, 8)] == [32, 32, 64, 128, 128, 128, 128]
    assert all(tile_keys(d) * d * 4 == fd.TILE_BYTES for d in (256, 128, 64))


@pytest.mark.parametrize("tail", list(range(-3, 5)) + [33, 34, 35])
@pytest.mark.parametrize("h", [5, 7, 13])
@pytest.mark.parametrize("d", [16, 128])
def test_tiles_that_are_not_whole_groups_of_keys(tail, h, d):
    # Pairs of keys in the scores, fours in the values: every tail of a tile (128 keys at d = 16,
    # 64 at d = 128), with every query path: 4 + 1 (H/g = 5), 8 (7, padded), 8 + 4 + 1 (13).
    tile = tile_keys(d)
    n = tile + tail if tail < 33 else 2 * tile + tail - 32
    q, k, v = inputs(3, 1, n, seed=n, h=h, d=d)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(fused_decode(q, k, v, block=2 * tile), want, **float_tol(torch.float32, d + 2 * n))


@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_a_running_maximum_that_moves_in_every_tile(direction):
    # Scores that grow along the cache make every tile rescale what it summed before; scores
    # that fall make none do so. Both must give the softmax over all keys.
    d = 16
    n = 5 * tile_keys(d) + 3
    q = torch.zeros(2, 8, 1, d)
    q[..., 0] = 4.0  # times 1 / sqrt(16): the score of key t is k[t, 0]
    k = torch.randn(2, 2, n, d)
    k[..., 0] = direction * torch.linspace(-30.0, 30.0, n)
    v = torch.randn(2, 2, n, d)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(fused_decode(q, k, v, block=2 * tile_keys(d)), want,
                               **float_tol(torch.float32, d + 2 * n))


@contextlib.contextmanager
def plain_python():
    """Bind the kernel's helpers (and prange) to their plain Python versions, then back to the compiled ones."""
    fd.compile_kernels()
    saved = {name: getattr(fd, name) for name in fd.PLAIN_PYTHON}
    try:
        for name, plain in fd.PLAIN_PYTHON.items():
            setattr(fd, name, plain)
        yield
    finally:
        for name, compiled in saved.items():
            setattr(fd, name, compiled)


def _compiled_loop(fn):
    """An njit loop applying ``fn`` (a compiled helper of the kernel) to every element of an array."""
    import numba

    @numba.njit(fastmath=True)
    def loop(x, out):
        for i in range(x.shape[0]):
            out[i] = fn(x[i])

    return loop


def test_two_or_three_queries_left_over_are_padded_to_a_block_of_four():
    assert [fd.padded_group(r) for r in range(1, 10)] == [1, 4, 4, 4, 5, 8, 8, 8, 9]
    assert [fd.padded_group(r) for r in (16, 32, 71)] == [16, 32, 72]


def test_exp_neg_is_within_two_units_in_the_last_place():
    fd.compile_kernels()
    x = -np.concatenate([np.linspace(0.0, 87.0, 200_001), np.geomspace(1e-8, 1.0, 1001)]).astype(np.float32)
    want = np.exp(x.astype(np.float64))
    eps = float(np.finfo(np.float32).eps)  # one unit in the last place of a float32 in [1, 2)
    got = np.empty_like(x)
    _compiled_loop(fd.exp_neg)(x, got)
    assert np.max(np.abs(got - want) / want) <= 2 * eps
    with plain_python():  # the same source, in Python
        plain = np.array([fd.exp_neg(value) for value in x[::997]], np.float32)
    assert np.max(np.abs(plain - want[::997]) / want[::997]) <= 2 * eps
    # Below -87 it stays at e ** -87: no underflow to a subnormal, no garbage from the bits of 2 ** k.
    low = np.array([-87.0, -88.0, -200.0, -3.0e38], np.float32)
    out = np.empty_like(low)
    _compiled_loop(fd.exp_neg)(low, out)
    assert np.all(out == out[0]) and abs(out[0] / np.exp(-87.0) - 1) <= 2 * eps


def test_pow2_builds_every_normal_power_of_two_from_its_bits():
    fd.compile_kernels()
    k = np.arange(-126, 128, dtype=np.int32)
    want = np.ldexp(np.float32(1.0), k)
    got = np.empty(k.shape, np.float32)
    _compiled_loop(fd.pow2)(k, got)
    assert np.array_equal(got, want)
    with plain_python():
        assert all(fd.pow2(kk) == w for kk, w in zip(k, want))


@pytest.mark.parametrize("block", [1, 3, 64, 10_000])
def test_any_block_size_gives_the_same_output(block):
    q, k, v = inputs(2, 2, 300)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(fused_decode(q, k, v, block=block), want, **float_tol(torch.float32, D + 2 * 300))


def test_merge_by_log_sum_exp_equals_one_block():
    # Several blocks merged by their log-sum-exp give the statistics of a single block.
    q, k, v = inputs(2, 2, 1000)
    b, h, _, d = q.shape
    g, n, rep = k.shape[1], k.shape[2], H // 2
    partials, merge = fd.compile_kernels()
    qg = (q * (1.0 / math.sqrt(d))).reshape(b, g, rep, d).numpy()  # (B, g, R, d)

    def through_blocks(block):
        blocks = -(-n // block)
        m = np.empty((b, g, blocks, rep), np.float32)
        l = np.empty_like(m)
        acc = np.empty((b, g, blocks, rep, d), np.float32)
        out = np.empty((b, g, rep, d), np.float32)
        partials(qg, k.numpy(), v.numpy(), block, m, l, acc)
        merge(m, l, acc, out)
        return m, l, acc, out

    m1, l1, acc1, one = through_blocks(n)  # a single block: no merge needed
    np.testing.assert_allclose(one, acc1[:, :, 0] / l1[:, :, 0, :, None], **float_tol(np.float32, 1))
    m, l, acc, merged = through_blocks(128)  # 8 blocks
    assert m.shape[2] == 8
    np.testing.assert_allclose(merged, one, **float_tol(np.float32, 2 * n))
    # The blocks' log-sum-exps combine into the log-sum-exp of all the scores.
    top = m.max(axis=2)  # (B, g, R)
    lse_blocks = top + np.log((np.exp(m - top[:, :, None]) * l).sum(axis=2))  # (B, g, R)
    np.testing.assert_allclose(lse_blocks, m1[:, :, 0] + np.log(l1[:, :, 0]), **float_tol(np.float32, d + n))


def test_merge_survives_blocks_whose_scores_are_far_apart():
    # The first block's scores are -200, the second's 0: exp(-200) underflows in float32,
    # so only a merge that rescales to the largest maximum gets the weights right.
    q = torch.zeros(1, 2, 1, 4)
    q[..., 0] = 2.0  # times 1 / sqrt(4): scores are k[:, 0]
    k = torch.zeros(1, 1, 128, 4)
    k[0, 0, :64, 0] = -200.0
    v = torch.randn(1, 1, 128, 4)
    got = fused_decode(q, k, v, block=64)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def test_fused_decode_with_a_cache_view_and_two_threads():
    # A view into a larger buffer (as KVCache returns) is read correctly; threads change nothing.
    q, k, v = inputs(2, 4, 900)
    buf_k = torch.zeros(2, 4, 1500, D)
    buf_k[:, :, :900] = k
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    for threads in (1, 2):
        got = fused_decode(q, buf_k[:, :, :900], v, block=128, num_threads=threads)
        torch.testing.assert_close(got, want, **float_tol(torch.float32, D + 2 * 900))


@pytest.mark.parametrize("rep", [7, 13])
def test_plain_python_kernel_equals_the_compiled_one(rep):
    # The same source runs without Numba (prange = range, no prefetch, Python helpers): slow,
    # and the same numbers. H/g = 7 runs as 8 (two blocks of four queries in the scores, one of
    # eight in the values); 13 takes every path: 8 + 4 + 1. 134 keys in blocks of 128: a tile
    # of 128 (a whole block), then a block of 6 keys.
    n, d = 134, 8
    assert tile_keys(d) == 128
    q, k, v = inputs(1, 2, n, h=2 * rep, d=d)
    padded = fd.padded_group(rep)
    qg = np.zeros((1, 2, padded, d), np.float32)  # (B, g, R', d)
    qg[:, :, :rep] = (q / math.sqrt(d)).reshape(1, 2, rep, d).numpy()
    m = np.empty((1, 2, 2, padded), np.float32)
    l, acc = np.empty_like(m), np.empty((1, 2, 2, padded, d), np.float32)
    out = np.empty((1, 2, padded, d), np.float32)
    with plain_python():
        fd.block_partials(qg, k.numpy(), v.numpy(), 128, m, l, acc)
        fd.merge_blocks(m, l, acc, out)
    assert fd.score_tile is not fd.PLAIN_PYTHON["score_tile"]  # the compiled helpers are back
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    got = torch.from_numpy(np.ascontiguousarray(out[:, :, :rep])).view(1, 2 * rep, 1, d)
    torch.testing.assert_close(got, want, **float_tol(torch.float32, d + 2 * n))


@pytest.mark.parametrize("bad, match", [
    (dict(q=(1, 8, 2, 16)), "one decoding query"),
    (dict(q=(8, 1, 16)), "4-D"),
    (dict(k=(1, 3, 10, 16), v=(1, 3, 10, 16)), "num_heads=8 is not divisible by num_kv_heads=3"),
    (dict(k=(1, 2, 10, 8)), "k and v must both be"),
    (dict(k=(2, 2, 10, 16), v=(2, 2, 10, 16)), "k and v must both be"),
    (dict(k=(1, 2, 0, 16), v=(1, 2, 0, 16)), "n >= 1"),
    (dict(dtype=torch.float64), "float32"),
    (dict(dtype=torch.float16), "float32"),
    (dict(block=0), "block must be a positive integer"),
])
def test_bad_inputs_raise_value_error(bad, match):
    shapes = dict(q=(1, 8, 1, 16), k=(1, 2, 10, 16), v=(1, 2, 10, 16))
    shapes.update({key: value for key, value in bad.items() if key in shapes})
    dtype = bad.get("dtype", torch.float32)
    q, k, v = (torch.zeros(shapes[name], dtype=dtype) for name in ("q", "k", "v"))
    with pytest.raises(ValueError, match=match):
        fused_decode(q, k, v, block=bad.get("block", KEY_BLOCK))


def test_numpy_arrays_are_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        fused_decode(np.zeros((1, 8, 1, 16), np.float32), torch.zeros(1, 2, 4, 16), torch.zeros(1, 2, 4, 16))


def test_streaming_read_reads_every_number():
    k = torch.arange(2 * 3 * 700 * 8, dtype=torch.float32).reshape(2, 3, 700, 8) % 7
    v = torch.ones(2, 3, 700, 8)
    assert fd.streaming_read(k, v) == pytest.approx(float(k.sum() + v.sum()), rel=1e-6)


def test_import_mhalib_loads_no_numba_and_the_kernel_names_the_install_without_it():
    code = (
        "import sys\n"
        "import mhalib, mhalib.fused_decode as fd\n"
        "assert 'numba' not in sys.modules, 'importing the module loaded numba'\n"
        "sys.modules['numba'] = None  # as if Numba were not installed\n"
        "import torch\n"
        "try:\n"
        "    fd.fused_decode(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4))\n"
        "except ImportError as error:\n"
        "    assert 'pip install numba' in str(error), error\n"
        "else:\n"
        "    raise AssertionError('no ImportError without numba')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("rep, d", [(1, 128), (5, 128), (7, 128), (8, 64), (13, 16), (16, 64), (71, 64)])
def test_the_timed_loop_is_the_kernel_and_gives_attention(rep, d):
    # What time_passes times: passes_loop with all three passes, once, over one block of 300 keys
    # (tiles of 64 or 128 keys, the last not full). It leaves what block_partials (the kernel)
    # leaves for that block, the same maxima, sums and outputs, and acc / l is SDPA's attention.
    partials = fd.compile_kernels()[0]
    n, padded = 300, fd.padded_group(rep)
    gen = torch.Generator().manual_seed(rep + d)
    q = torch.randn(1, rep, 1, d, generator=gen)  # (1, R, 1, d): one K/V head
    k, v = torch.randn(1, 1, n, d, generator=gen), torch.randn(1, 1, n, d, generator=gen)  # (1, 1, n, d)
    qg = np.zeros((1, 1, padded, d), np.float32)  # (1, 1, R', d): scaled, padded with zero queries
    qg[0, 0, :rep] = (q[0, :, 0] / math.sqrt(d)).numpy()
    m, l = np.empty((1, 1, 1, padded), np.float32), np.empty((1, 1, 1, padded), np.float32)
    acc = np.empty((1, 1, 1, padded, d), np.float32)
    partials(qg, k.numpy(), v.numpy(), n, m, l, acc)  # the kernel: one block of all n keys
    s = np.zeros((padded, tile_keys(d) + 3), np.float32)
    top, l2 = np.zeros(padded, np.float32), np.zeros(padded, np.float32)
    m2, acc2 = np.full(padded, -3.0e38, np.float32), np.zeros((padded, d), np.float32)
    fd._compiled["passes"](qg[0, 0], k[0, 0].numpy(), v[0, 0].numpy(), 1, fd.PASSES["all three"], s, top, m2, l2, acc2)
    np.testing.assert_array_equal(m2, m[0, 0, 0])  # the maxima are exact
    np.testing.assert_allclose(l2, l[0, 0, 0], rtol=4 * np.finfo(np.float32).eps)
    torch.testing.assert_close(torch.from_numpy(acc2), torch.from_numpy(acc[0, 0, 0]),
                               **float_tol(torch.float32, d + 2 * n))
    got = torch.from_numpy(acc2[:rep] / l2[:rep, None]).view(1, rep, 1, d)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(got, want, **float_tol(torch.float32, d + 2 * n))


def test_time_passes_times_every_pass_and_refuses_bad_sizes():
    seconds = fd.time_passes(4, 32, keys=64, repeats=2, rounds=1)
    assert set(seconds) == set(fd.PASSES) and all(0 < x < 1 for x in seconds.values())
    for bad in (dict(rep=0), dict(d=-1), dict(keys=True), dict(repeats=2.5)):
        args = dict(rep=4, d=32) | bad
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be a positive integer"):
            fd.time_passes(args.pop("rep"), args.pop("d"), **args)


@pytest.mark.parametrize("rep", [1, 4, 5, 8, 12, 16, 72])
@pytest.mark.parametrize("tn, stop", [(64, 200), (64, 150), (37, 101), (37, 200)],
                         ids=["full-tile", "cache-ends-in-next-tile", "last-tile-of-cache", "short-tile-then-block"])
def test_each_pass_asks_for_every_row_of_the_next_pass_once_over_the_whole_pass(rep, tn, stop):
    # In plain Python, record the rows each pass asks the memory for: the scores pass every
    # value row of its tile; the values pass the key rows after the tile, as many as the tile
    # has keys (the next tile's, or the next block's first), none at or past ``stop`` (the
    # end of the cache); each exactly once. A tile of 64 keys from key 64, full or of 37 keys.
    # Both passes spread their requests over their blocks of queries (a burst in the first
    # block was slower): when the first block ends, it has asked for about its share only.
    asked, first_block_asked = [], {}

    class Recorded(np.ndarray):  # the tile's maxima and the outputs: note how much was asked by then
        def __setitem__(self, index, value):
            row = index[0] if isinstance(index, tuple) else index
            if self.shape == (rep,):  # the maxima, stored at the end of each block of four
                first_block_asked.setdefault("scores", len(asked))
            if self.ndim == 2 and row >= 8:  # the outputs of the second block of eight
                first_block_asked.setdefault("values", len(asked))
            super().__setitem__(index, value)

    d, n, t0 = 8, 200, 64
    gen = np.random.default_rng(rep)
    q = gen.standard_normal((rep, d)).astype(np.float32)
    k, v = (gen.standard_normal((n, d)).astype(np.float32) for _ in range(2))
    s, top = np.zeros((rep, 64 + 3), np.float32), np.zeros(rep, np.float32).view(Recorded)
    acc = np.zeros((rep, d), np.float32).view(Recorded)
    with plain_python():
        fd.prefetch_row = lambda x, t: asked.append(("k" if x is k else "v", t))
        fd.score_tile(q, k, t0, tn, s, top, v)
        scores_asked, asked[:] = list(asked), []
        fd.value_tile(s, v, t0, tn, acc, k, stop)
    assert sorted(scores_asked) == [("v", t) for t in range(t0, t0 + tn)]
    assert sorted(asked) == [("k", t) for t in range(t0 + tn, min(t0 + 2 * tn, stop))]
    if rep // 4 >= 2:
        assert first_block_asked["scores"] <= -(-tn // (rep // 4)) + 1 < tn
    if rep // 8 >= 2 and stop >= t0 + 2 * tn:  # (then the first write of the second block of eight)
        assert first_block_asked["values"] <= -(-tn // (rep // 8)) + 3 < tn
