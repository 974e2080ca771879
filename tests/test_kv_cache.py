"""The KV cache: the bytes formula on real model configurations, the cache buffer, and the
NumPy decode step against full causal attention recomputed from scratch by torch's SDPA."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mhalib.kv_cache import (
    MODEL_CONFIGS,
    KVCache,
    decode_step,
    format_bytes,
    kv_cache_bytes,
    model_kv_bytes,
)

KiB, GiB = 2**10, 2**30


@pytest.mark.parametrize("name, per_token", [
    ("Llama-2-7B", 512 * KiB),
    ("Llama-2-70B", 320 * KiB),
    ("Llama-3-8B", 128 * KiB),
    ("Mistral-7B", 128 * KiB),
    ("Falcon-7B", 8 * KiB),
    ("GPT-2", 36 * KiB),
])
def test_real_configs_fp16_bytes_per_token(name, per_token):
    c = MODEL_CONFIGS[name]
    got = kv_cache_bytes(c["num_layers"], c["num_kv_heads"], c["head_dim"], 1)
    assert got == per_token
    assert model_kv_bytes(name) == per_token


def test_llama2_7b_at_4k_tokens_is_2_gib_and_explicit_numbers():
    assert kv_cache_bytes(32, 32, 128, 4096) == 2 * GiB
    assert kv_cache_bytes(80, 8, 128, 1) == 320 * KiB
    assert kv_cache_bytes(32, 8, 128, 1) == 128 * KiB
    assert kv_cache_bytes(32, 1, 64, 1) == 8 * KiB
    assert model_kv_bytes("Llama-2-7B", 4096) == 2 * GiB


def test_bytes_formula_scales_and_is_an_exact_int():
    base = kv_cache_bytes(2, 3, 5, 7)
    assert type(base) is int and base == 2 * 2 * 3 * 5 * 7 * 2
    assert kv_cache_bytes(2, 3, 5, 7, batch_size=4) == 4 * base
    assert kv_cache_bytes(2, 3, 5, 7, bytes_per_element=4) == 2 * base
    assert kv_cache_bytes(2, 3, 5, 0) == 0
    huge = kv_cache_bytes(80, 8, 128, 10**7, batch_size=64, bytes_per_element=4)
    assert huge == 2 * 80 * 8 * 128 * 10**7 * 64 * 4  # no overflow
    assert kv_cache_bytes(np.int64(2), 3, 5, 7) == base


@pytest.mark.parametrize("args", [
    (0, 8, 128, 1), (32, 0, 128, 1), (32, 8, -1, 1), (32, 8, 128, -5), (32, 8, 128.0, 1),
    (True, 8, 128, 1), (32, 8, 128, 1, 0), (32, 8, 128, 1, 1, 0), ("32", 8, 128, 1),
])
def test_bytes_bad_input_raises_value_error_naming_it(args):
    with pytest.raises(ValueError, match="must be"):
        kv_cache_bytes(*args)


def test_model_configs_are_consistent_and_sourced():
    assert {"Llama-2-7B", "Llama-2-70B", "Llama-3-8B", "Mistral-7B", "Falcon-7B", "GPT-2"} <= set(MODEL_CONFIGS)
    for name, c in MODEL_CONFIGS.items():
        assert c["num_heads"] * c["head_dim"] == c["d_model"], name
        assert c["num_heads"] % c["num_kv_heads"] == 0, name
        kind = "MHA" if c["num_kv_heads"] == c["num_heads"] else ("MQA" if c["num_kv_heads"] == 1 else "GQA")
        assert c["attention"] == kind, name
        # the cited source states the sizes it is cited for, and is a paper or a model card
        numbers = set(re.findall(r"\d+", c["source"]))
        assert {str(c["num_layers"]), str(c["d_model"])} <= numbers, (name, c["source"])
        assert re.search(r"et al\. (19|20)\d\d|model card", c["source"]), (name, c["source"])
    with pytest.raises(ValueError, match="choose one of"):
        model_kv_bytes("Llama-9")


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1000, "1000 B"), (512 * KiB, "512 KiB"), (2 * GiB, "2 GiB"),
                                     (1536 * KiB, "1.5 MiB"), (8 * KiB, "8 KiB")])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_kv_cache_appends_reads_back_and_counts_bytes():
    torch.manual_seed(0)
    cache = KVCache(capacity=3)
    assert len(cache) == 0 and cache.nbytes == 0 and cache.keys is None
    ks, vs = [], []
    for n_new in (2, 1, 1, 1, 4):  # grows past the capacity twice
        k, v = torch.randn(2, 3, n_new, 4), torch.randn(2, 3, n_new, 4)
        ks.append(k)
        vs.append(v)
        k_all, v_all = cache.append(k, v)
        assert torch.equal(k_all, torch.cat(ks, dim=2))
        assert torch.equal(v_all, torch.cat(vs, dim=2))
    assert len(cache) == 9
    assert cache.nbytes == kv_cache_bytes(1, 3, 4, 9, batch_size=2, bytes_per_element=4)
    assert "tokens=9" in repr(cache)
    cache.reset()
    assert len(cache) == 0 and cache.nbytes == 0


def test_kv_cache_refuses_mismatched_steps():
    cache = KVCache()
    cache.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match="this cache holds"):
        cache.append(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    with pytest.raises(ValueError):
        cache.append(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 2, 4))
    with pytest.raises(ValueError):
        cache.append(np.zeros((1, 2, 1, 4)), np.zeros((1, 2, 1, 4)))
    with pytest.raises(ValueError):
        KVCache(capacity=0)


def weights(rng, d_model, kv_dim):
    return [rng.standard_normal(s) / np.sqrt(d_model) for s in
            ((d_model, d_model), (d_model, kv_dim), (d_model, kv_dim), (d_model, d_model))]


def heads(a, num_heads):
    """(B, N, num_heads * d_head) -> (B, num_heads, N, d_head) as a torch tensor."""
    b, n, width = a.shape
    return torch.from_numpy(a).view(b, n, num_heads, width // num_heads).transpose(1, 2)


def causal_attention_by_sdpa(x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads):
    """Full causal (grouped-query) attention over every position, by torch's fused SDPA."""
    b, n, d_model = x.shape
    q = heads(x @ w_q, num_heads)  # (B, H, N, d_head)
    k, v = heads(x @ w_k, num_kv_heads), heads(x @ w_v, num_kv_heads)  # (B, g, N, d_head)
    z = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=num_kv_heads != num_heads)
    return z.transpose(1, 2).reshape(b, n, d_model).numpy() @ w_o  # (B, N, d_model)


@pytest.mark.parametrize("b, h", [(1, 1), (2, 4), (3, 2)])
def test_decode_step_equals_full_causal_recomputation(b, h):
    rng = np.random.default_rng(0)
    d_model, n = 8, 7
    w_q, w_k, w_v, w_o = weights(rng, d_model, d_model)
    x = rng.standard_normal((b, n, d_model))
    full = causal_attention_by_sdpa(x, w_q, w_k, w_v, w_o, h, h)  # (B, N, d_model)
    k_cache = np.zeros((b, h, 0, d_model // h))
    v_cache = np.zeros((b, h, 0, d_model // h))
    for t in range(n):
        out, k_cache, v_cache = decode_step(x[:, t:t + 1], k_cache, v_cache, w_q, w_k, w_v, w_o, h)
        assert out.shape == (b, 1, d_model)
        assert k_cache.shape == v_cache.shape == (b, h, t + 1, d_model // h)
        np.testing.assert_allclose(out[:, 0], full[:, t], atol=1e-12)
    np.testing.assert_allclose(k_cache, heads(x @ w_k, h).numpy(), atol=1e-12)  # oldest first, none dropped
    np.testing.assert_allclose(v_cache, heads(x @ w_v, h).numpy(), atol=1e-12)


def test_decode_step_equals_torch_sdpa_on_the_last_position():
    rng = np.random.default_rng(1)
    b, h, t, d_model = 2, 4, 5, 16
    w_q, w_k, w_v, w_o = weights(rng, d_model, d_model)
    x = rng.standard_normal((b, 1, d_model))
    k_cache = rng.standard_normal((b, h, t, d_model // h))
    v_cache = rng.standard_normal((b, h, t, d_model // h))
    out, k_new, v_new = decode_step(x, k_cache, v_cache, w_q, w_k, w_v, w_o, h)
    np.testing.assert_array_equal(k_new[:, :, :t], k_cache)  # old entries kept, new one at the end
    np.testing.assert_array_equal(v_new[:, :, :t], v_cache)
    np.testing.assert_allclose(k_new[:, :, t:], heads(x @ w_k, h).numpy(), atol=1e-12)  # (B, H, 1, d_head)
    np.testing.assert_allclose(v_new[:, :, t:], heads(x @ w_v, h).numpy(), atol=1e-12)
    q = torch.from_numpy(x @ w_q).view(b, 1, h, -1).transpose(1, 2)  # (B, H, 1, d_head)
    z = torch.nn.functional.scaled_dot_product_attention(q, torch.from_numpy(k_new), torch.from_numpy(v_new))
    want = z.transpose(1, 2).reshape(b, 1, d_model).numpy() @ w_o
    np.testing.assert_allclose(out, want, atol=1e-12)


@pytest.mark.parametrize("h, g", [(4, 2), (8, 2), (8, 4), (4, 1)])
def test_decode_step_with_fewer_kv_heads_matches_grouped_query_attention(h, g):
    rng = np.random.default_rng(2)
    b, n, d_model = 2, 6, 16
    w_q, w_k, w_v, w_o = weights(rng, d_model, g * d_model // h)
    x = rng.standard_normal((b, n, d_model))
    full = causal_attention_by_sdpa(x, w_q, w_k, w_v, w_o, h, g)  # (B, N, d_model)
    k_cache = v_cache = np.zeros((b, g, 0, d_model // h))
    for t in range(n):
        out, k_cache, v_cache = decode_step(x[:, t:t + 1], k_cache, v_cache, w_q, w_k, w_v, w_o, h)
        np.testing.assert_allclose(out[:, 0], full[:, t], atol=1e-12)
    assert k_cache.shape == (b, g, n, d_model // h)
    np.testing.assert_allclose(k_cache, heads(x @ w_k, g).numpy(), atol=1e-12)


def test_decode_step_bad_input_raises_value_error():
    rng = np.random.default_rng(0)
    w = weights(rng, 8, 8)
    cache = np.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match="x_new"):
        decode_step(np.zeros((1, 2, 8)), cache, cache, *w, 2)
    with pytest.raises(ValueError, match="not divisible"):
        decode_step(np.zeros((1, 1, 8)), cache, cache, *w, 3)
    with pytest.raises(ValueError, match="k_cache"):
        decode_step(np.zeros((1, 1, 8)), np.zeros((1, 4, 3, 2)), cache, *w, 2)
    with pytest.raises(ValueError, match="w_q"):
        decode_step(np.zeros((1, 1, 8)), cache, cache, np.zeros((8, 4)), *w[1:], 2)
