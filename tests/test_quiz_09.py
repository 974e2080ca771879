"""Notebook 09's quiz: each marked answer recomputed, and each wrong choice shown to be wrong."""

import numpy as np
import torch

from mhalib.kv_cache import KVCache, kv_cache_bytes
from mhalib.mla import DEEPSEEK_V3
from mhalib.online_softmax import merge_partials
from mhalib.quiz import QUESTIONS
from mhalib.rope import RotaryGroupedQueryAttention, apply_rope
from mhalib.serving import LLAMA_CONFIGS, crossover_tokens, decode_step_bytes, llama_parameter_count


def answer(qid):
    q = QUESTIONS[qid]
    return q.choices[q.answer].text


def test_rope_cache_only_rotating_the_new_key_by_the_cache_length_matches_the_full_pass():
    assert answer("09.rope_cache").startswith("Rotate it by position 12")
    torch.manual_seed(0)
    layer = RotaryGroupedQueryAttention(16, 4, 2).double().eval()
    x = torch.randn(1, 13, 16, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)[:, -1]
        cache = KVCache()
        layer(x[:, :12], kv_cache=cache)
        right = layer(x[:, 12:], kv_cache=cache)[:, 0]
        q, k, v = layer.project(x)
        for p_new, keys in ((0, torch.cat([cache.keys[:, :, :12], k[:, :, 12:]], 2)),  # restart at 0
                            (12, apply_rope(k, np.full(13, 12)))):  # unrotated, all turned by 12
            z = torch.nn.functional.scaled_dot_product_attention(apply_rope(q[:, :, 12:], [p_new]), keys, v,
                                                                 enable_gqa=True)
            wrong = layer.o_proj(z.transpose(1, 2).reshape(1, 1, 16))[:, 0]
            assert (wrong - full).abs().max() > 1e-3
    torch.testing.assert_close(right, full, atol=1e-12, rtol=0)


def test_window_bytes_answer_and_the_miscounts():
    q = QUESTIONS["09.window_bytes"]
    counts = {"4 GiB": kv_cache_bytes(32, 8, 128, 32768), "512 MiB": kv_cache_bytes(32, 8, 128, 4096),
              "128 KiB": kv_cache_bytes(32, 8, 128, 1), "2 GiB": kv_cache_bytes(32, 32, 128, 4096)}
    units = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}
    for c in q.choices:
        value, unit = c.text.split()
        assert counts[c.text] == int(value) * units[unit]
    assert answer("09.window_bytes") == "512 MiB"


def test_merge_answer_weights_and_the_two_wrong_merges():
    outs = np.array([[1.0, 0.0], [0.0, 1.0]])
    lses = np.array([1000.0, 1000.0 + np.log(3.0)])
    out, _ = merge_partials(outs, lses)
    np.testing.assert_allclose(out, [0.25, 0.75], atol=1e-12)
    assert answer("09.merge") == "0.25 o1 + 0.75 o2"
    assert not np.allclose(outs.mean(0), out)
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isnan((np.exp(lses)[:, None] * outs).sum(0) / np.exp(lses).sum()).all()


def test_absorb_answer_counts_576_numbers_and_the_reason_for_the_separate_rotary_key():
    assert "576 numbers" in answer("09.absorb")
    assert DEEPSEEK_V3["kv_lora_rank"] + DEEPSEEK_V3["qk_rope_head_dim"] == 576
    why = QUESTIONS["09.absorb"].choices[2].why
    assert "between W^Q and W^UK" in why
    assert "folded query must be turned by the query's position too" in why and "turned back" in why
    rng = np.random.default_rng(0)
    w_uk, w_uv = rng.standard_normal((8, 16)), rng.standard_normal((8, 16))  # (d_nope, r), (d_v, r)
    latents, q = rng.standard_normal((6, 16)), rng.standard_normal(8)
    q_m = apply_rope(q[None], [5])[0]
    scores = apply_rope(latents @ w_uk.T, np.arange(6)) @ q_m  # RoPE on the up-projected keys and the query
    assert np.abs(latents @ (w_uk.T @ q_m) - scores).max() > 1e-3  # one fold no longer gives the scores

    def latent_score(m, n, turn):  # the latent rotated by its position n, W_uk folded into the query once
        folded = w_uk.T @ q
        folded = apply_rope(folded[None], [m])[0] if turn else folded
        return apply_rope(latents[:1], [n])[0] @ folded

    same_offset = [(5, 0), (15, 10), (105, 100)]
    turned = [latent_score(m, n, True) for m, n in same_offset]
    unturned = [latent_score(m, n, False) for m, n in same_offset]
    assert max(turned) - min(turned) < 1e-9  # the folded query turned by m: the offset alone counts
    assert max(unturned) - min(unturned) > 1e-3  # left unturned: the key's position counts
    assert abs(latent_score(5, 0, False) - latent_score(50, 0, False)) < 1e-12  # ... and the query's does not
    weights = np.full(6, 1 / 6)
    rotated = apply_rope(latents, np.arange(6))  # what a cache of rotated latents holds
    want = w_uv @ (weights @ latents)  # the values W_uv c_t, mixed
    assert np.abs(w_uv @ (weights @ rotated) - want).max() > 1e-3  # the values carry the rotation
    np.testing.assert_allclose(w_uv @ (weights @ apply_rope(rotated, -np.arange(6))), want, rtol=0, atol=1e-12)


def test_crossover_answer_the_smaller_w_k_and_w_v_save_more_than_the_cache_at_one_short_sequence():
    assert answer("09.crossover").startswith("1.17x, mostly from the smaller W_k and W_v")
    c = LLAMA_CONFIGS["Llama-2-7B"]
    assert llama_parameter_count(**c) - llama_parameter_count(**dict(c, num_kv_heads=8)) == 805_306_368
    a, b = decode_step_bytes(c, 1, 1024), decode_step_bytes(c, 1, 1024, num_kv_heads=8)
    assert f"{a['total'] / b['total']:.2f}" == "1.17"
    weights_saved, cache_saved = a["weights"] - b["weights"], a["cache"] - b["cache"]
    assert weights_saved == 2 * 805_306_368 == 1.5 * 2**30 and cache_saved == 384 * 2**20
    assert weights_saved > cache_saved > 0  # mostly W_k and W_v, some cache: "nothing" is wrong
    assert a["cache"] == 4 * b["cache"] and a["total"] / b["total"] < 2  # the 4x of the cache is not the step's
    assert f"{a['total'] / (a['weights'] + b['cache']):.2f}" == "1.03"  # the wrong choice: only the cache shrinks
    assert int(crossover_tokens(c)) == 25_205 > 1024
    big = decode_step_bytes(c, 128, 4096)["total"] / decode_step_bytes(c, 128, 4096, num_kv_heads=8)["total"]
    assert f"{big:.2f}" == "3.59" and "batch 128 x 4,096 tokens" in QUESTIONS["09.crossover"].choices[1].why
