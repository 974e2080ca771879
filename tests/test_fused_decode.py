"""The fused decode kernel (mhalib.fused_decode) against PyTorch's SDPA with enable_gqa.

No timing is asserted here: speed is for benchmarks/bench_decode.py.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("numba")

from mhalib import fused_decode as fd  # noqa: E402
from mhalib.fused_decode import KEY_BLOCK, fused_decode  # noqa: E402
from tolerance import float_tol

H, D = 8, 16


def inputs(batch, g, n, seed=0, h=H, d=D):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, h, 1, d, generator=gen)  # (B, H, 1, d)
    k = torch.randn(batch, g, n, d, generator=gen)  # (B, g, n, d)
    v = torch.randn(batch, g, n, d, generator=gen)  # (B, g, n, d)
    return q, k, v


@pytest.mark.parametrize("g", [8, 4, 1], ids=["MHA", "GQA-2", "MQA"])
@pytest.mark.parametrize("n", [1, 7, KEY_BLOCK, KEY_BLOCK + 1, 5000])
@pytest.mark.parametrize("batch", [1, 3])
def test_fused_decode_equals_sdpa_enable_gqa(g, n, batch):
    q, k, v = inputs(batch, g, n, seed=n + g)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    got = fused_decode(q, k, v)
    assert got.shape == (batch, H, 1, D) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, **float_tol(torch.float32, D + 2 * n))


@pytest.mark.parametrize("n", [1, 7, 64, 65, 3000])
def test_fused_decode_gqa_8_at_head_dim_128_equals_sdpa(n):
    # H = 32 query heads over g = 8 K/V heads (4 queries each), the benchmark's head_dim
    q, k, v = inputs(2, 8, n, seed=n, h=32, d=128)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(fused_decode(q, k, v, block=64), want, **float_tol(torch.float32, 128 + 2 * n))


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


def test_plain_python_kernel_equals_the_compiled_one():
    # The same source runs without Numba (prange = range there): slow, and the same numbers.
    q, k, v = inputs(1, 2, 10)
    b, h, _, d = q.shape
    qg = (q / math.sqrt(d)).reshape(1, 2, 4, d).numpy()  # (B, g, R, d)
    m = np.empty((1, 2, 3, 4), np.float32)
    l, acc, out = np.empty_like(m), np.empty((1, 2, 3, 4, d), np.float32), np.empty((1, 2, 4, d), np.float32)
    fd.compile_kernels()
    saved = fd.prange, fd.prefetch, fd.weigh  # the names compile_kernels rebinds to Numba's
    try:
        fd.prange, fd.prefetch, fd.weigh = range, fd.python_prefetch, fd.python_weigh
        fd.block_partials(qg, k.numpy(), v.numpy(), 4, m, l, acc)
        fd.merge_blocks(m, l, acc, out)
    finally:
        fd.prange, fd.prefetch, fd.weigh = saved
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(torch.from_numpy(out).view(1, 8, 1, d), want, **float_tol(torch.float32, d + 2 * 10))


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
