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


def test_absorb_answer_counts_576_numbers():
    assert "576 numbers" in answer("09.absorb")
    assert DEEPSEEK_V3["kv_lora_rank"] + DEEPSEEK_V3["qk_rope_head_dim"] == 576


def test_crossover_answer_little_is_saved_below_the_crossover():
    assert answer("09.crossover").startswith("Little")
    params = llama_parameter_count(**LLAMA_CONFIGS["Llama-2-7B"])
    assert int(crossover_tokens(params, 32, 32, 128)) == 25_705
    w, mha = decode_step_bytes(params, 32, 32, 128, 1, 1024)
    _, gqa = decode_step_bytes(params, 32, 8, 128, 1, 1024)
    assert (w + mha) / (w + gqa) < 1.05  # far from the 4x of the wrong choice
    w, mha = decode_step_bytes(params, 32, 32, 128, 64, 8192)
    _, gqa = decode_step_bytes(params, 32, 8, 128, 64, 8192)
    assert (w + mha) / (w + gqa) > 3.5  # and not nothing at every batch size
