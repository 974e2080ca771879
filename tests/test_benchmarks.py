"""The benchmarks still run and still check what they time: tiny sizes, no timing asserted.

``make bench`` is not part of ``make test`` (its numbers need a quiet machine), so these
tests keep the decode benchmark's methods and variants honest: each must agree with
SDPA before it is timed, and a wrong one must be refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_decode  # noqa: E402
from tolerance import float_tol

SIZES = dict(num_tokens=256, num_heads=8, head_dim=16, kv_heads=(8, 2, 1), repeat=1)


@pytest.fixture(autouse=True)
def small_flush(monkeypatch):
    monkeypatch.setattr(bench_decode, "FLUSH_BYTES", 2**20)
    monkeypatch.setattr(bench_decode, "make_flush",
                        lambda nbytes=2**20, device="cpu": (lambda: None))


@pytest.mark.parametrize("name", list(bench_decode.variants()))
@pytest.mark.parametrize("g", [8, 2, 1])
def test_every_variant_equals_sdpa(name, g):
    torch.manual_seed(1)
    q = torch.randn(2, 8, 1, 16, dtype=torch.float64)  # (B, H, 1, d)
    k = torch.randn(2, g, 256, 16, dtype=torch.float64)  # (B, g, n, d)
    v = torch.randn(2, g, 256, 16, dtype=torch.float64)
    fn = bench_decode.variants()[name]
    blocked = fn in (bench_decode.key_blocks, bench_decode.batched_blocks, bench_decode.flash_decoding)
    out = fn(q, k, v, block=64) if blocked else fn(q, k, v)  # 4 blocks of 64 keys
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)


def test_key_blocks_take_a_cache_that_is_not_whole_blocks():
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 8, 1, 16), torch.randn(1, 2, 1000, 16), torch.randn(1, 2, 1000, 16)
    torch.testing.assert_close(bench_decode.key_blocks(q, k, v, block=256),
                               F.scaled_dot_product_attention(q, k, v, enable_gqa=True), **float_tol(torch.float32, 16 + 2 * 1000))


def test_flash_decoding_survives_scores_that_overflow_one_softmax():
    # Blocks whose maxima differ by more than exp can span: the merge must rescale, not add.
    q = torch.zeros(1, 2, 1, 4)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, 128, 4)
    k[0, 0, :64, 0] = -400.0  # the first block's scores are -200, the second's 0
    v = torch.randn(1, 1, 128, 4)
    out = bench_decode.flash_decoding(q, k, v, block=64)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref)


def test_block_variants_refuse_a_cache_that_is_not_whole_blocks():
    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 100, 8)
    with pytest.raises(ValueError, match="100 is not a multiple of the block of 64"):
        bench_decode.batched_blocks(q, k, k, block=64)


def test_run_times_every_method_and_the_read_for_every_g():
    rows = bench_decode.run(**SIZES)
    reads = {bench_decode.READ, bench_decode.NUMPY_READ, bench_decode.NUMBA_READ}
    names = set(bench_decode.methods()) | reads
    assert bench_decode.FUSED in names
    assert {(name, g) for name, g, _ in rows} == {(name, g) for name in names for g in (8, 2, 1)}
    assert all(seconds > 0 for _, _, seconds in rows)
    times = {(name, g): s for name, g, s in rows}
    for g in (8, 2, 1):  # the reference is the faster of the two reads
        assert times[(bench_decode.READ, g)] == min(times[(bench_decode.NUMPY_READ, g)],
                                                   times[(bench_decode.NUMBA_READ, g)])


@pytest.mark.parametrize("g", [8, 2, 1])
@pytest.mark.parametrize("n", [1, 100, 256])
def test_every_decode_method_equals_sdpa(g, n):
    # The methods the benchmark times, the fused kernel among them, in float32 as timed.
    torch.manual_seed(2)
    q = torch.randn(2, 8, 1, 16)  # (B, H, 1, d)
    k = torch.randn(2, g, n, 16)  # (B, g, n, d)
    v = torch.randn(2, g, n, 16)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    for name, fn in bench_decode.methods().items():
        torch.testing.assert_close(fn(q, k, v), ref, **float_tol(torch.float32, 16 + 2 * n), msg=lambda m, name=name: f"{name}: {m}")


def test_fused_block_sizes_each_equal_sdpa_in_the_run():
    rows = bench_decode.run(**SIZES, fns=bench_decode.fused_blocks((16, 100, 256)))
    assert {name for name, _, _ in rows} >= {"fused_decode, block 16", "fused_decode, block 100"}


def test_run_refuses_a_method_that_disagrees_with_sdpa():
    wrong = {"forgets the scale": lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, enable_gqa=True, scale=1.0)}
    with pytest.raises(AssertionError, match="forgets the scale, g = 8"):
        bench_decode.run(**SIZES, fns=wrong)


def test_reports_print_their_tables(capsys):
    bench_decode.report(256, 8, 16, [8, 2, 1], 1)
    bench_decode.report_variants(2048, 8, 16, [8, 2, 1], 1)  # two blocks of 1,024 keys
    out = capsys.readouterr().out
    assert "mhalib MHA reads K and V at" in out
    assert "fused_decode MHA reads K and V at" in out and "fused_decode GQA-8" not in out  # H = 8: no GQA-8
    assert "read: Numba rows" in out and "read: NumPy sum" in out
    assert "flash-decoding (block softmax + LSE)" in out and "speed vs mhalib" in out


def test_main_names_the_processor_the_blas_and_the_compile_time(capsys):
    bench_decode.main(["--tokens", "64", "--heads", "16", "--head-dim", "8", "--repeat", "1", "--threads", "1"])
    out = capsys.readouterr().out
    assert f"processor: {bench_decode.processor()}" in out and "BLAS: " in out
    assert "first call (compiling the kernels" in out and "kept out of the timings" in out
    assert "fused_decode GQA-8 reads K and V at" in out and "fused_decode GQA-8 speedup over its MHA" in out


def test_variants_need_whole_blocks_on_the_command_line(capsys):
    with pytest.raises(SystemExit):
        bench_decode.main(["--variants", "--tokens", "1000"])
    assert "--tokens must be a multiple of 1024" in capsys.readouterr().err
