"""Grouped-query attention: grouped_attention against PyTorch's SDPA, MHA and MQA as its
special cases, and decoding with a KV cache against full recomputation.

Oracles: ``F.scaled_dot_product_attention(..., enable_gqa=True)``, ``nn.MultiheadAttention``
holding repeated K/V weights copied in by the test, and an explicit loop over query heads
(``tests/oracles.py``, which imports nothing from mhalib).
"""

import pytest
import torch
import torch.nn.functional as F

import mhalib.attention as attention
from mhalib.attention import (
    GroupedQueryAttention,
    grouped_attention,
    repeat_kv,
)
from mhalib.kv_cache import KVCache, kv_cache_bytes
from oracles import allowed_by_loop, blocked_future, loop_attention, torch_mha_holding
from tolerance import float_tol

H = 8


def qkv(b, g, n_q, n_k, d=16, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, H, n_q, d, generator=gen, dtype=dtype)  # (B, H, N_q, d)
    k = torch.randn(b, g, n_k, d, generator=gen, dtype=dtype)  # (B, g, N_k, d)
    v = torch.randn(b, g, n_k, d, generator=gen, dtype=dtype)  # (B, g, N_k, d)
    return q, k, v


@pytest.mark.parametrize("g", [1, 2, 4, 8])
@pytest.mark.parametrize("n_q, n_k", [(1, 1), (1, 13), (13, 13), (4, 13)])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_attention_equals_sdpa_enable_gqa(g, n_q, n_k, causal):
    q, k, v = qkv(2, g, n_q, n_k)
    got = grouped_attention(q, k, v, causal=causal)
    assert got.shape == (2, H, n_q, 16)
    if causal and n_q != n_k:
        # SDPA's is_causal is aligned to the top left; decoding needs bottom right.
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed_by_loop(n_q, n_k), enable_gqa=True)
    else:
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(got, loop_attention(q, k, v, allowed_by_loop(n_q, n_k) if causal else None)[0],
                               atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("g", [1, 4, 8])
def test_grouped_attention_float32_decode_size(g):
    q, k, v = qkv(1, g, 1, 300, d=32, dtype=torch.float32)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(grouped_attention(q, k, v), want, **float_tol(torch.float32, 32 + 2 * 300))


@pytest.mark.parametrize("g", [1, 2, 8])
@pytest.mark.parametrize("n_q, causal", [(1, False), (3, True)])
def test_grouped_attention_over_a_long_cache_equals_sdpa(g, n_q, causal):
    """A cache of 2,085 keys (longer than the key blocks of the benchmark's blocked variants)."""
    n_k = 2085
    q, k, v = qkv(1, g, n_q, n_k, d=8)
    mask = allowed_by_loop(n_q, n_k) if causal else None  # (N_q, N_k), bottom-right aligned
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got, weights = grouped_attention(q, k, v, causal=causal, need_weights=True)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, H, n_q, dtype=q.dtype))


@pytest.mark.parametrize("mask_shape", [(5, 9), (2, 1, 5, 9), (1, H, 5, 9), (2, H, 5, 9)])
def test_grouped_attention_additive_mask_equals_sdpa(mask_shape):
    q, k, v = qkv(2, 2, 5, 9)
    gen = torch.Generator().manual_seed(1)
    mask = torch.randn(*mask_shape, generator=gen, dtype=torch.float64)
    mask = mask.masked_fill(torch.rand(*mask_shape, generator=gen) < 0.3, float("-inf"))
    mask[..., 0] = 0.0  # every row keeps at least one key
    got = grouped_attention(q, k, v, attn_mask=mask)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_grouped_attention_weights_rows_sum_to_one_and_match_repeated_kv():
    q, k, v = qkv(2, 2, 4, 7)
    out, w = grouped_attention(q, k, v, causal=True, need_weights=True)
    assert w.shape == (2, H, 4, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 4, dtype=torch.float64))
    kr = k.repeat_interleave(H // 2, dim=1)  # (B, H, N_k, d)
    s = q @ kr.transpose(-1, -2) / 16 ** 0.5
    s = s.masked_fill(~allowed_by_loop(4, 7), float("-inf"))
    torch.testing.assert_close(w, torch.softmax(s, -1))
    torch.testing.assert_close(out, w @ v.repeat_interleave(H // 2, dim=1))


def test_grouped_attention_never_repeats_kv(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("grouped_attention must not repeat K/V")

    q, k, v = qkv(1, 2, 1, 50)  # one decoding query against 50 cached positions
    want, _ = loop_attention(q, k, v)  # (B, H, 1, d); the last query sees every key
    monkeypatch.setattr(attention, "repeat_kv", refuse)
    monkeypatch.setattr(torch, "repeat_interleave", refuse)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", refuse)
    monkeypatch.setattr(torch.Tensor, "repeat", refuse)
    monkeypatch.setattr(torch.Tensor, "expand", refuse)
    out = grouped_attention(q, k, v, causal=True)
    assert out.shape == (1, H, 1, 16)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("bad", [
    dict(q=(1, 8, 3, 4), k=(1, 3, 3, 4), v=(1, 3, 3, 4)),   # g = 3 does not divide H = 8
    dict(q=(1, 8, 3, 4), k=(1, 2, 3, 4), v=(1, 2, 5, 4)),   # k and v differ
    dict(q=(1, 8, 3, 4), k=(1, 2, 3, 5), v=(1, 2, 3, 5)),   # head_dim differs
    dict(q=(8, 3, 4), k=(1, 2, 3, 4), v=(1, 2, 3, 4)),      # q is 3-D
])
def test_grouped_attention_bad_shapes_raise_value_error(bad):
    with pytest.raises(ValueError):
        grouped_attention(torch.zeros(bad["q"]), torch.zeros(bad["k"]), torch.zeros(bad["v"]))


def test_repeat_kv_is_repeat_interleave_not_tile():
    x = torch.arange(2 * 4 * 3 * 2, dtype=torch.float32).reshape(2, 4, 3, 2)  # (B, g, N, d)
    assert torch.equal(repeat_kv(x, 3), x.repeat_interleave(3, dim=1))
    assert repeat_kv(x, 3)[0, :, 0, 0].tolist() == [0, 0, 0, 6, 6, 6, 12, 12, 12, 18, 18, 18]  # head j first
    assert not torch.equal(repeat_kv(x, 3), x.repeat(1, 3, 1, 1))  # tiling groups the wrong heads
    assert repeat_kv(x, 1) is x


@pytest.mark.parametrize("g", [8, 4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_module_equals_nn_multihead_with_repeated_kv(g, causal):
    torch.manual_seed(0)
    layer = GroupedQueryAttention(32, H, g).double()
    x = torch.randn(3, 6, 32, dtype=torch.float64)
    ref = torch_mha_holding(layer, H, g)  # query head h holds K/V head h // (H / g)
    mask = blocked_future(6) if causal else None  # True = blocked in nn.MHA
    want, want_w = ref(x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False)
    got = layer(x, causal=causal)
    got2, got_w = layer(x, causal=causal, need_weights=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got2, want)
    torch.testing.assert_close(got_w, want_w)


@pytest.mark.parametrize("g", [8, 2, 1])
@pytest.mark.parametrize("prompt", [1, 4])
def test_cached_decoding_equals_full_recomputation(g, prompt):
    torch.manual_seed(0)
    layer = GroupedQueryAttention(32, H, g)
    x = torch.randn(2, 12, 32)
    with torch.no_grad():  # (B, N, d_model), every position recomputed by torch's own attention
        full = torch_mha_holding(layer, H, g)(x, x, x, attn_mask=blocked_future(12))[0]
    cache = KVCache(capacity=2)  # small, so the buffer must grow
    steps = [layer(x[:, :prompt], causal=True, kv_cache=cache)]
    for t in range(prompt, 9):
        steps.append(layer(x[:, t:t + 1], causal=True, kv_cache=cache))  # one token at a time
    steps.append(layer(x[:, 9:], causal=True, kv_cache=cache))  # three tokens at once
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **float_tol(torch.float32, 3 * 32 + 2 * 12))
    assert len(cache) == 12
    assert cache.keys.shape == (2, g, 12, 32 // H)
    assert cache.nbytes == kv_cache_bytes(1, g, 32 // H, 12, batch_size=2, bytes_per_element=4)
    k_full = layer.k_proj(x).view(2, 12, g, 32 // H).transpose(1, 2)  # (B, g, N, d)
    torch.testing.assert_close(cache.keys, k_full)


def test_cached_decode_step_weights_cover_the_whole_cache():
    torch.manual_seed(0)
    layer = GroupedQueryAttention(16, 4, 2)
    x = torch.randn(1, 6, 16)
    cache = KVCache()
    layer(x[:, :5], causal=True, kv_cache=cache)
    out, w = layer(x[:, 5:], causal=True, kv_cache=cache, need_weights=True)
    assert w.shape == (1, 4, 1, 6)
    with torch.no_grad():
        want, w_full = torch_mha_holding(layer, 4, 2)(x, x, x, attn_mask=blocked_future(6),
                                                      average_attn_weights=False)  # (B, N, d), (B, H, N, N)
    torch.testing.assert_close(w[:, :, 0], w_full[:, :, -1], **float_tol(torch.float32, 2 * 16 + 6))
    torch.testing.assert_close(out[:, 0], want[:, -1], **float_tol(torch.float32, 3 * 16 + 2 * 6))


def test_cache_with_more_queries_than_keys_is_refused():
    layer = GroupedQueryAttention(16, 4, 2)
    q = torch.zeros(1, 4, 5, 4)
    k = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError):
        layer.attend(q, k, k, causal=True)


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_attention_gradients_equal_sdpa(causal):
    q, k, v = (t.requires_grad_() for t in qkv(2, 2, 5, 5))
    grouped_attention(q, k, v, causal=causal).square().sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True).square().sum().backward()
    for a, t in zip(ours, (q, k, v)):
        torch.testing.assert_close(a, t.grad)


def test_attend_sends_one_decoding_query_to_grouped_attention_and_prompts_to_sdpa(monkeypatch):
    calls = []
    real_sdpa, real_grouped = F.scaled_dot_product_attention, attention.grouped_attention

    def spy_sdpa(*args, **kwargs):
        calls.append("sdpa")
        return real_sdpa(*args, **kwargs)

    def spy_grouped(*args, **kwargs):
        calls.append("grouped")
        return real_grouped(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy_sdpa)
    monkeypatch.setattr(attention, "grouped_attention", spy_grouped)
    layer = GroupedQueryAttention(16, 4, 2)
    cache = KVCache()
    layer(torch.randn(1, 5, 16), causal=True, kv_cache=cache)  # the prompt
    layer(torch.randn(1, 1, 16), causal=True, kv_cache=cache)  # one decoding step
    layer(torch.randn(1, 3, 16), causal=True, need_weights=True)
    assert calls == ["sdpa", "grouped", "grouped"]
