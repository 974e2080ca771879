"""The benchmarks still run and still check what they time: tiny sizes, no timing asserted.

``make bench`` is not part of ``make test`` (its numbers need a quiet machine), so these
tests keep the decode benchmark's methods and variants honest: each must agree with
SDPA before it is timed, and a wrong one must be refused; the multiply-add loop must do
the arithmetic it is credited with; the sweep's goals must be judged as stated.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_decode  # noqa: E402
import fma_peak  # noqa: E402
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
    assert "mhalib MHA reads K and V at" in out and "mhalib GQA-8" not in out  # H = 8: no GQA-8
    assert "fused_decode MHA / mhalib MHA time" in out
    assert "read: Numba rows" in out and "read: NumPy sum" in out
    assert "flash-decoding (block softmax + LSE)" in out and "speed vs mhalib" in out


def test_main_names_the_processor_the_blas_and_the_compile_time(capsys):
    bench_decode.main(["--tokens", "64", "--heads", "16", "--head-dim", "8", "--repeat", "1", "--threads", "1",
                       "--no-real"])
    out = capsys.readouterr().out
    assert f"processor: {bench_decode.processor()}" in out and "BLAS: " in out
    assert "first call (compiling the kernels" in out and "kept out of the timings" in out
    sweep = out[out.index("fused_decode sweep"):out.index("\ndecode: ")]
    assert "1 Numba thread(s)" in sweep and "GFLOP/s" in sweep and "of FMA peak" in sweep
    assert [line.split()[0] for line in sweep.splitlines() if re.match(r"\s*(MHA|GQA-\d+|MQA)\s", line)] == [
        "MHA", "GQA-8", "GQA-4", "GQA-2", "MQA"]  # g = 16, 8, 4, 2, 1
    assert "g = 8 takes" in sweep and "MQA is" in sweep and "GQA-8 reads K and V at" in sweep
    assert "Falcon" not in sweep  # --no-real
    assert "mhalib GQA-8 reads K and V at" in out
    assert "pass by pass" in out and "Falcon" not in out[out.index("pass by pass"):]  # the passes, --no-real


def test_passes_prints_each_pass_of_every_group_size(capsys):
    bench_decode.main(["--passes", "--heads", "8", "--head-dim", "16", "--no-real"])
    out = capsys.readouterr().out
    table = out[out.index("pass by pass"):]
    assert "FMA peak, one thread" in table and "scores of peak" in table and "softmax ns" in table
    rows = [line.split() for line in table.splitlines() if re.match(r"\s*(MHA|GQA-\d+|MQA)\s", line)]
    assert [row[0] for row in rows] == ["MHA", "GQA-4", "GQA-2", "MQA"]  # g = 8, 4, 2, 1 at H = 8
    assert [int(row[1]) for row in rows] == [1, 2, 4, 8] and [int(row[2]) for row in rows] == [1, 4, 4, 8]
    assert all(float(x) > 0 for row in rows for x in row[4:8])  # ns per key of each pass
    assert "fused_decode sweep" not in out and "Falcon" not in out  # --passes alone; --no-real


def test_variants_need_whole_blocks_on_the_command_line(capsys):
    with pytest.raises(SystemExit):
        bench_decode.main(["--variants", "--tokens", "1000"])
    assert "--tokens must be a multiple of 1024" in capsys.readouterr().err


# The multiply-add peak and the sweep of the fused kernel.

def test_fma_loop_does_the_multiply_adds_it_is_credited_with():
    # Each worker's 8 sums are reps * sum(a) * x_i: the loop really runs over all of a, reps times.
    rng = np.random.default_rng(0)
    a = rng.random(fma_peak.LANES, dtype=np.float32)
    x = rng.random((2, 8), dtype=np.float32)
    out = np.empty((2, 8), np.float32)
    fma_peak.fma_loop()(a, x, 3, out)
    want = 3 * a.astype(np.float64).sum() * x.astype(np.float64)
    np.testing.assert_allclose(out, want, **float_tol(np.float32, 3 * fma_peak.LANES, scale=float(want.max())))
    assert fma_peak.flops(2, 3) == 2 * 8 * fma_peak.LANES * 3 * 2
    assert fma_peak.peak(1, rounds=2, reps=10) > 0


def test_real_shapes_are_the_published_ones():
    # d_head is hidden_size / num_attention_heads of the configuration each source names, g divides H,
    # and the two models the course's table also holds agree with it.
    from mhalib.kv_cache import MODEL_CONFIGS

    for name, h, g, d, source in bench_decode.REAL_SHAPES:
        hidden = int(re.search(r"hidden_size (\d+)", source).group(1))
        assert hidden == h * d and h % g == 0, name
        assert "config.json" in source and f" {h}," in source, name
        if name in MODEL_CONFIGS:
            cfg = MODEL_CONFIGS[name]
            assert (cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"]) == (h, g, d), name
    ratios = {h // g for _, h, g, _, _ in bench_decode.REAL_SHAPES}
    assert ratios == {7, 5, 8, 16, 71}  # none of them a power of two below 8, two not a power of two at all


def test_sweep_groups_put_each_models_mha_first():
    groups = bench_decode.sweep_groups()
    assert groups[0][1] == [(bench_decode.label(g, 32), 32, g, 128) for g in (32, 16, 8, 4, 2, 1)]
    for (name, shapes), (real, h, g, d, _) in zip(groups[1:], bench_decode.REAL_SHAPES):
        assert name == real
        assert shapes == [(f"{real} as MHA", h, h, d), (f"{real} ({bench_decode.label(g, h)})", h, g, d)]


def test_run_sweep_times_every_shape_against_its_read_and_the_peak():
    groups = bench_decode.sweep_groups(8, 16, (8, 4, 2, 1))  # the real shapes too, at n = 64
    rows, peak = bench_decode.run_sweep(groups, num_tokens=64, repeat=1)
    assert [row for _, row, *_ in rows] == [row for _, shapes in groups for row, *_ in shapes]
    assert all(seconds > 0 and read > 0 for *_, seconds, read in rows) and peak > 0
    table, numbers = bench_decode.sweep_table(rows, peak, 64)
    assert len(table) == len(rows) and numbers["MHA"]["speedup"] == 1.0
    falcon = numbers["Falcon-7B (MQA)"]
    assert falcon["rate"] == bench_decode.decode_flops(71, 64, 64) / falcon["seconds"]


def test_run_sweep_refuses_a_kernel_that_disagrees_with_sdpa(monkeypatch):
    from mhalib import fused_decode as fd

    monkeypatch.setattr(fd, "fused_decode", lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, enable_gqa=True, scale=1.0))  # forgets the 1 / sqrt(d) scale
    with pytest.raises(AssertionError, match="H 8, g 2, d 16"):
        bench_decode.run_sweep([("H = 8", [("GQA-2", 8, 2, 16)])], num_tokens=64, repeat=1)


def _rows(times, reads, n=1024, d=128, h=32, extra=()):
    """Sweep rows from times and reads by g, at H = 32, plus ``extra`` rows (group, row, h, g, d, s, read)."""
    return [("H = 32", bench_decode.label(g, h), h, g, d, times[g], reads[g]) for g in times] + list(extra)


def test_sweep_goals_are_judged_as_stated():
    n, d = 1024, 128
    times = {32: 10.0, 16: 5.0, 8: 2.5, 4: 2.0, 2: 2.09, 1: 2.2}  # g = 1: 1.05x of g = 2 (missed: 2.2 / 2.09 > 1.05)
    reads = {32: 9.0, 16: 4.5, 8: 2.0, 4: 1.0, 2: 0.5, 1: 0.25}
    peak = bench_decode.decode_flops(32, n, d) / 0.5  # the arithmetic of every H = 32 row takes 0.5 at the peak
    # A real shape that is compute-bound (read 0.1 < arithmetic 1.0 at the peak) at 1.0 / 2.25 = 44% of the peak,
    # and one that is memory-bound (read 3.0 > arithmetic 0.25 at the peak) at 3.0 / 4.5 = 67% of the read.
    heavy = [("X", "X as MHA", 128, 128, 64, 20.0, 18.0), ("X", "X (GQA-8)", 128, 8, 64, 2.25, 0.1)]
    light = [("Y", "Y as MHA", 16, 16, 128, 8.0, 7.0), ("Y", "Y (GQA-4)", 16, 4, 128, 4.5, 3.0)]
    goals = dict(bench_decode.sweep_goals(_rows(times, reads, n, d, extra=heavy + light), peak, n))
    assert goals["g = 16 takes 0.50 of the time of g = 32 (goal <= 1.05)"]
    assert goals["g = 2 takes 1.04 of the time of g = 4 (goal <= 1.05)"]
    assert not goals["g = 1 takes 1.05 of the time of g = 2 (goal <= 1.05)"]
    assert not goals["MQA is 4.55x faster than MHA (goal >= 5x; bytes 32x)"]
    assert goals["MHA reads K and V at 90% of the streaming read (goal >= 90%)"]
    assert goals["GQA-8 reads K and V at 80% of the streaming read (goal >= 75%)"]
    assert goals["X (GQA-8), compute-bound: 44% of the FMA peak (goal >= 40%)"]
    assert not goals["Y (GQA-4), memory-bound: 67% of the streaming read (goal >= 75%)"]
    assert len(goals) == 5 + 1 + 2 + 2  # no goal for a model's MHA row
