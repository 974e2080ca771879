"""RoPE against independent oracles: complex multiplication, an explicit rotation per pair,
full causal passes, and the NumPy decode step against a plain loop over heads."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mhalib.kv_cache import KVCache
from mhalib.rope import (RotaryGroupedQueryAttention, apply_rope, interleaved_to_half, permute_heads_for_half,
                         rope_angles, rope_decode_step)


def complex_rope_interleaved(x, positions, base=10000.0):
    """Pairs (x[2i], x[2i+1]) as complex numbers times exp(1j * p * base**(-2i/d))."""
    d = x.shape[-1]
    z = x[..., 0::2] + 1j * x[..., 1::2]  # (..., N, d/2)
    theta = np.array([base ** (-2 * i / d) for i in range(d // 2)])
    z = z * np.exp(1j * np.asarray(positions)[:, None] * theta[None, :])
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def loop_rope_half(x, positions, base=10000.0):
    """Pair i is (x[i], x[i + d/2]), rotated by a 2x2 matrix, one pair at a time."""
    d = x.shape[-1]
    out = np.empty_like(x)
    for n, p in enumerate(positions):
        for i in range(d // 2):
            a = p * base ** (-2 * i / d)
            rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
            pair = np.stack([x[..., n, i], x[..., n, i + d // 2]], axis=-1)  # (..., 2)
            r = pair @ rot.T
            out[..., n, i], out[..., n, i + d // 2] = r[..., 0], r[..., 1]
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_both_conventions_match_their_definitions(rng):
    x = rng.standard_normal((2, 3, 7, 8))
    positions = np.array([0, 1, 2, 5, 9, 100, 4095])
    np.testing.assert_allclose(apply_rope(x, positions, convention="interleaved"),
                               complex_rope_interleaved(x, positions), atol=1e-12)
    np.testing.assert_allclose(apply_rope(x, positions), loop_rope_half(x, positions), atol=1e-12)
    assert not np.allclose(apply_rope(x, positions), apply_rope(x, positions, convention="interleaved"))


def test_torch_and_numpy_agree_and_position_zero_is_the_identity(rng):
    x = rng.standard_normal((2, 4, 6))
    p = np.arange(4)
    got = apply_rope(torch.tensor(x), p)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), apply_rope(x, p), atol=1e-14)
    np.testing.assert_array_equal(apply_rope(x, np.zeros(4, dtype=int)), x)
    np.testing.assert_allclose(np.linalg.norm(apply_rope(x, p), axis=-1), np.linalg.norm(x, axis=-1))


def test_scores_depend_only_on_the_offset(rng):
    q, k = rng.standard_normal((2, 16))
    def score(m, n):
        return float(apply_rope(q[None], [m])[0] @ apply_rope(k[None], [n])[0])
    for offset in (0, 1, 7):
        base = score(offset, 0)
        assert all(abs(score(m + offset, m) - base) < 1e-9 for m in (3, 50, 1000))
    assert abs(score(5, 0) - score(0, 0)) > 1e-3  # and the offset does matter


def test_the_row_permutation_turns_interleaved_weights_into_half_weights(rng):
    h, d, d_model, n = 3, 8, 12, 6
    w_q = torch.tensor(rng.standard_normal((h * d, d_model)))
    w_k = torch.tensor(rng.standard_normal((h * d, d_model)))
    x = torch.tensor(rng.standard_normal((n, d_model)))
    pos = np.arange(n)
    def scores(wq, wk, convention):
        q = (x @ wq.T).view(n, h, d).transpose(0, 1)  # (H, N, d)
        k = (x @ wk.T).view(n, h, d).transpose(0, 1)
        return apply_rope(q, pos, convention=convention) @ apply_rope(k, pos, convention=convention).transpose(-1, -2)
    want = scores(w_q, w_k, "interleaved")
    got = scores(permute_heads_for_half(w_q, h), permute_heads_for_half(w_k, h), "half")
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    assert (scores(w_q, w_k, "half") - want).abs().max() > 1e-3  # without the permutation: different
    assert interleaved_to_half(6).tolist() == [0, 2, 4, 1, 3, 5]
    np.testing.assert_array_equal(permute_heads_for_half(w_q.numpy(), h), permute_heads_for_half(w_q, h).numpy())


def test_rotary_gqa_prefill_then_decode_equals_one_full_pass_and_sdpa():
    torch.manual_seed(0)
    layer = RotaryGroupedQueryAttention(32, 8, 2).double().eval()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)
        cache = KVCache()
        parts = [layer(x[:, :5], kv_cache=cache)] + [layer(x[:, t:t + 1], kv_cache=cache) for t in range(5, 11)]
        q, k, v = layer.project(x)
        pos = np.arange(11)
        z = F.scaled_dot_product_attention(apply_rope(q, pos), apply_rope(k, pos), v, is_causal=True, enable_gqa=True)
        want = layer.o_proj(z.transpose(1, 2).reshape(2, 11, 32))
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-12, rtol=0)
    torch.testing.assert_close(full, want, atol=1e-12, rtol=0)
    assert cache.keys.shape == (2, 2, 11, 4)  # one rotated K head per group
    torch.testing.assert_close(cache.keys, apply_rope(k, pos), atol=1e-12, rtol=0)  # rotated before caching


def _loop_reference(x, w_q, w_k, w_v, w_o, h, g):
    """Full causal GQA with RoPE over the whole sequence, one query head and one position at a time."""
    b, n, d_model = x.shape
    dh = d_model // h
    out = np.zeros((b, n, d_model))
    for bi in range(b):
        heads = []
        for hi in range(h):
            kv = hi // (h // g)
            q = loop_rope_half((x[bi] @ w_q[:, hi * dh:(hi + 1) * dh])[None], range(n))[0]
            k = loop_rope_half((x[bi] @ w_k[:, kv * dh:(kv + 1) * dh])[None], range(n))[0]
            v = x[bi] @ w_v[:, kv * dh:(kv + 1) * dh]
            z = np.zeros((n, dh))
            for i in range(n):
                s = np.array([q[i] @ k[j] / math.sqrt(dh) for j in range(i + 1)])
                w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
                z[i] = w @ v[: i + 1]
            heads.append(z)
        out[bi] = np.concatenate(heads, axis=-1) @ w_o
    return out


@pytest.mark.parametrize("h, g", [(4, 4), (4, 2), (4, 1)])
def test_numpy_decode_step_token_by_token_equals_the_loop(h, g, rng):
    b, n, d_model = 2, 6, 16
    dh = d_model // h
    w_q, w_o = (rng.standard_normal((d_model, d_model)) / 4 for _ in range(2))
    w_k, w_v = (rng.standard_normal((d_model, g * dh)) / 4 for _ in range(2))
    x = rng.standard_normal((b, n, d_model))
    k_cache = v_cache = np.zeros((b, g, 0, dh))
    outs = []
    for t in range(n):
        out, k_cache, v_cache = rope_decode_step(x[:, t:t + 1], k_cache, v_cache, w_q, w_k, w_v, w_o, h)
        outs.append(out)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), _loop_reference(x, w_q, w_k, w_v, w_o, h, g), atol=1e-12)
    assert k_cache.shape == (b, g, n, dh)


def test_bad_input_is_refused_with_what_was_given():
    with pytest.raises(ValueError, match="head_dim=7"):
        rope_angles([0, 1], 7)
    with pytest.raises(ValueError, match="'spiral'"):
        apply_rope(np.zeros((2, 4)), [0, 1], convention="spiral")
    with pytest.raises(ValueError, match=r"\(3,\)"):
        apply_rope(np.zeros((3, 4)), [0, 1])
    with pytest.raises(ValueError, match="num_heads=5"):
        permute_heads_for_half(np.zeros((12, 4)), 5)
    with pytest.raises(ValueError, match=r"\(2, 3, 8\)"):
        rope_decode_step(np.zeros((2, 3, 8)), np.zeros((2, 2, 0, 4)), np.zeros((2, 2, 0, 4)),
                         *[np.zeros((8, 8))] * 4, 2)
