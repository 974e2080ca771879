"""The decode-step bytes against Hugging Face's Llama module (its parameters counted on the meta
device, nothing allocated), and MLA's two forms run on small tensors with every product counted."""

import math

import numpy as np
import pytest
import torch

from mhalib.serving import (
    LLAMA_CONFIGS,
    absorb_crossover_queries,
    crossover_tokens,
    decode_step_bytes,
    llama_parameter_count,
    mla_attention_flops,
)


def hf_llama_parameters(c, num_kv_heads=None):
    """Parameter counts of Hugging Face's LlamaForCausalLM of this shape, by where a decode step reads them."""
    transformers = pytest.importorskip("transformers", reason="Hugging Face's Llama is the oracle of the byte count")
    cfg = transformers.LlamaConfig(
        hidden_size=c["d_model"], intermediate_size=c["d_ff"], num_hidden_layers=c["num_layers"],
        num_attention_heads=c["num_heads"], num_key_value_heads=num_kv_heads or c["num_kv_heads"],
        head_dim=c["head_dim"], vocab_size=c["vocab"], tie_word_embeddings=False)
    with torch.device("meta"):  # shapes only: a 7B model without its 13 GB
        model = transformers.LlamaForCausalLM(cfg)
    parts = {"embedding": 0, "attention": 0, "mlp": 0, "norms": 0, "lm_head": 0}
    for name, p in model.named_parameters():
        key = ("embedding" if "embed_tokens" in name else "attention" if "self_attn" in name else
               "mlp" if ".mlp." in name else "norms" if "norm" in name else "lm_head" if "lm_head" in name else name)
        parts[key] += p.numel()
    assert len(parts) == 5, f"parameters of no known kind: {sorted(parts)[5:]}"
    return parts


@pytest.mark.parametrize("name", sorted(LLAMA_CONFIGS))
def test_parameter_count_is_hugging_faces_and_lands_on_the_published_size(name):
    c = LLAMA_CONFIGS[name]
    hf = hf_llama_parameters(c)
    assert llama_parameter_count(**c) == sum(hf.values())
    assert round(sum(hf.values()) / 1e9, 1) == {"Llama-2-7B": 6.7, "Llama-3-8B": 8.0}[name]  # the model cards' sizes


@pytest.mark.parametrize("name, g", [("Llama-2-7B", None), ("Llama-2-7B", 8), ("Llama-2-7B", 1), ("Llama-3-8B", None)])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_step_reads_every_weight_but_only_the_embedding_rows_it_looks_up(name, g, batch):
    c = LLAMA_CONFIGS[name]
    hf = hf_llama_parameters(c, g)
    step = decode_step_bytes(c, batch, 100, num_kv_heads=g)
    assert step["embedding"] == 2 * batch * c["d_model"]  # a gather of B rows, not the table
    for part in ("attention", "mlp", "norms", "lm_head"):
        assert step[part] == 2 * hf[part], part  # everything else whole, fp16
    assert step["weights"] == 2 * (sum(hf.values()) - hf["embedding"] + batch * c["d_model"])
    assert step["cache"] == batch * 100 * 2 * c["num_layers"] * (g or c["num_kv_heads"]) * c["head_dim"] * 2
    assert step["total"] == step["weights"] + step["cache"]


def test_fewer_kv_heads_shrink_w_k_and_w_v_as_well_as_the_cache():
    c = LLAMA_CONFIGS["Llama-2-7B"]
    mha, gqa = hf_llama_parameters(c), hf_llama_parameters(c, 8)
    fewer = sum(mha.values()) - sum(gqa.values())
    assert fewer == 2 * c["num_layers"] * c["d_model"] * (32 - 8) * c["head_dim"]  # W_k and W_v
    assert llama_parameter_count(**c) - llama_parameter_count(**dict(c, num_kv_heads=8)) == fewer
    for batch, context in ((1, 1024), (64, 8192)):
        a, b = decode_step_bytes(c, batch, context), decode_step_bytes(c, batch, context, num_kv_heads=8)
        assert a["weights"] - b["weights"] == 2 * fewer
        assert a["cache"] == 4 * b["cache"]
    small = decode_step_bytes(c, 1, 1024)["total"] / decode_step_bytes(c, 1, 1024, num_kv_heads=8)["total"]
    cache_only = decode_step_bytes(c, 1, 1024)["total"] / (decode_step_bytes(c, 1, 1024)["weights"]
                                                          + decode_step_bytes(c, 1, 1024, num_kv_heads=8)["cache"])
    assert small > cache_only + 0.1  # the weights' share of the saving is larger than the cache's at one short sequence
    with pytest.raises(ValueError, match="num_heads=32 is not divisible by num_kv_heads=5"):
        decode_step_bytes(c, 1, 10, num_kv_heads=5)


@pytest.mark.parametrize("name", sorted(LLAMA_CONFIGS))
@pytest.mark.parametrize("batch", [1, 16])
def test_crossover_is_where_cache_bytes_equal_weight_bytes(name, batch):
    c = LLAMA_CONFIGS[name]
    x = crossover_tokens(c, batch_size=batch)
    hf = hf_llama_parameters(c)
    per_token = 2 * c["num_layers"] * c["num_kv_heads"] * c["head_dim"] * 2
    assert x == pytest.approx(2 * (sum(hf.values()) - hf["embedding"] + batch * c["d_model"]) / per_token, rel=1e-15)
    context = int(x) // batch  # cache of batch x context tokens just below the crossover, then just above
    below, above = decode_step_bytes(c, batch, context), decode_step_bytes(c, batch, context + 1)
    assert below["cache"] <= below["weights"] < above["cache"]
    # counting the whole embedding table would put it vocab x d_model / per-token-cache elements later
    whole = 2 * sum(hf.values()) / per_token
    assert whole - x == pytest.approx(2 * (c["vocab"] - batch) * c["d_model"] / per_token)


def test_batch_and_context_broadcast_and_bad_input_is_refused():
    c = LLAMA_CONFIGS["Llama-3-8B"]
    step = decode_step_bytes(c, np.array([1, 2, 4]), 10)
    one = [decode_step_bytes(c, b, 10) for b in (1, 2, 4)]
    for key in step:
        assert step[key].tolist() == [o[key] for o in one], key
    with pytest.raises(ValueError, match="batch_size=0"):
        decode_step_bytes(c, 0, 10)
    with pytest.raises(ValueError, match="must be integers"):
        decode_step_bytes(c, 1.5, 10)
    with pytest.raises(ValueError, match="missing vocab"):
        decode_step_bytes({k: v for k, v in c.items() if k != "vocab"}, 1, 10)


class Counted:
    """einsum that adds each product's multiply-adds: the size of the union of its index ranges."""

    def __init__(self):
        self.macs = 0

    def __call__(self, spec, *operands):
        ins, _ = spec.split("->")
        sizes = {}
        for letters, a in zip(ins.split(","), operands):
            sizes.update(zip(letters, a.shape))
        self.macs += math.prod(sizes.values())
        return np.einsum(spec, *operands)


def mla_both_forms(q_count, t_count, h, r, dn, dr, dv, seed=0, causal=False):
    """MLA's plain and absorbed forms on random tensors, every product counted.

    ``causal``: the queries are the last ``q_count`` of the ``t_count`` positions, and each one
    reads only the keys up to its own (run one query at a time, on its prefix of the cache)."""
    rng = np.random.default_rng(seed)
    q_nope, q_rope = rng.standard_normal((q_count, h, dn)), rng.standard_normal((q_count, h, dr))
    latents, rope_key = rng.standard_normal((t_count, r)), rng.standard_normal((t_count, dr))  # what MLA caches
    w_uk, w_uv = rng.standard_normal((h, dn, r)), rng.standard_normal((h, dv, r))  # kv_b_proj, split per head

    def softmax(s):
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    plain, absorbed = Counted(), Counted()
    k = plain("hnr,tr->thn", w_uk, latents)  # (T, H, d_n): every key rebuilt
    v = plain("hvr,tr->thv", w_uv, latents)  # (T, H, d_v)
    q_abs = absorbed("qhn,hnr->qhr", q_nope, w_uk)  # (Q, H, r): W_uk folded into the query
    if causal:
        outs, mixes = [], []
        for i in range(q_count):
            n = t_count - q_count + i + 1  # keys 0 .. n - 1: up to the query's own position
            s = plain("hn,thn->ht", q_nope[i], k[:n]) + plain("hd,td->ht", q_rope[i], rope_key[:n])  # (H, n)
            outs.append(plain("ht,thv->hv", softmax(s), v[:n]))  # (H, d_v)
            s = absorbed("hr,tr->ht", q_abs[i], latents[:n]) + absorbed("hd,td->ht", q_rope[i], rope_key[:n])
            mixes.append(absorbed("ht,tr->hr", softmax(s), latents[:n]))  # (H, r)
        out_plain, mixed = np.stack(outs), np.stack(mixes)  # (Q, H, d_v), (Q, H, r)
    else:
        s = plain("qhn,thn->hqt", q_nope, k) + plain("qhd,td->hqt", q_rope, rope_key)  # (H, Q, T)
        out_plain = plain("hqt,thv->qhv", softmax(s), v)  # (Q, H, d_v)
        s = absorbed("qhr,tr->hqt", q_abs, latents) + absorbed("qhd,td->hqt", q_rope, rope_key)  # (H, Q, T)
        mixed = absorbed("hqt,tr->qhr", softmax(s), latents)  # (Q, H, r): latents mixed first
    out_absorbed = absorbed("qhr,hvr->qhv", mixed, w_uv)  # (Q, H, d_v)
    return out_plain, out_absorbed, 2 * plain.macs, 2 * absorbed.macs


@pytest.mark.parametrize("q, t", [(1, 9), (5, 9), (9, 9), (20, 3)])
def test_mla_flops_are_the_products_the_two_forms_compute(q, t):
    shape = dict(num_heads=3, kv_lora_rank=7, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=5)
    out_plain, out_absorbed, plain, absorbed = mla_both_forms(q, t, 3, 7, 4, 2, 5)
    np.testing.assert_allclose(out_absorbed, out_plain, rtol=0, atol=1e-12)  # the same attention
    assert mla_attention_flops(q, t, **shape, absorb=False) == plain
    assert mla_attention_flops(q, t, **shape, absorb=True) == absorbed


@pytest.mark.parametrize("q, t", [(1, 9), (5, 9), (9, 9), (1, 1)])
def test_causal_mla_flops_count_each_query_against_the_keys_up_to_its_own(q, t):
    shape = dict(num_heads=3, kv_lora_rank=7, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=5)
    out_plain, out_absorbed, plain, absorbed = mla_both_forms(q, t, 3, 7, 4, 2, 5, causal=True)
    np.testing.assert_allclose(out_absorbed, out_plain, rtol=0, atol=1e-12)
    # the per-query loop is causal attention: the full scores with the bottom-right causal mask give it
    full_plain, _, every_plain, every_absorbed = mla_both_forms(q, t, 3, 7, 4, 2, 5)
    rng = np.random.default_rng(0)
    q_nope, q_rope = rng.standard_normal((q, 3, 4)), rng.standard_normal((q, 3, 2))
    latents, rope_key = rng.standard_normal((t, 7)), rng.standard_normal((t, 2))
    w_uk, w_uv = rng.standard_normal((3, 4, 7)), rng.standard_normal((3, 5, 7))
    s = np.einsum("qhn,hnr,tr->hqt", q_nope, w_uk, latents) + np.einsum("qhd,td->hqt", q_rope, rope_key)
    s = np.where(np.arange(t)[None, None, :] <= (t - q + np.arange(q))[None, :, None], s, -np.inf)  # (H, Q, T)
    w = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("hqt,hvr,tr->qhv", w / w.sum(-1, keepdims=True), w_uv, latents)
    np.testing.assert_allclose(out_plain, want, rtol=0, atol=1e-12)
    assert mla_attention_flops(q, t, **shape, absorb=False, causal=True) == plain
    assert mla_attention_flops(q, t, **shape, absorb=True, causal=True) == absorbed
    if q > 1:  # fewer (query, key) pairs than every query against every key
        assert plain < every_plain and absorbed < every_absorbed and not np.allclose(out_plain, full_plain)
    else:  # one decoding query reads every key either way
        assert (plain, absorbed) == (every_plain, every_absorbed)
    with pytest.raises(ValueError, match="num_queries=10, num_keys=9"):
        mla_attention_flops(10, 9, **shape, absorb=True, causal=True)


def test_absorbing_pays_in_decode_and_costs_in_prefill_with_a_crossover_in_queries_per_key():
    shape = dict(num_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)  # V3
    t = 4096
    q_star = absorb_crossover_queries(512, 128, 128, num_keys=t)
    below, above = math.floor(q_star), math.ceil(q_star)
    assert below < above
    assert mla_attention_flops(below, t, **shape, absorb=True) < mla_attention_flops(below, t, **shape, absorb=False)
    assert mla_attention_flops(above, t, **shape, absorb=True) > mla_attention_flops(above, t, **shape, absorb=False)
    many = absorb_crossover_queries(512, 128, 128)
    assert many == 512 * 256 / (1024 - 256)
    assert absorb_crossover_queries(512, 128, 128, num_keys=10**12) == pytest.approx(many, rel=1e-9)
    decode = mla_attention_flops(1, t, **shape, absorb=True) / mla_attention_flops(1, t, **shape, absorb=False)
    prefill = mla_attention_flops(t, t, **shape, absorb=True) / mla_attention_flops(t, t, **shape, absorb=False)
    assert decode < 0.01 and prefill > 3
    causal = (mla_attention_flops(t, t, **shape, absorb=True, causal=True)
              / mla_attention_flops(t, t, **shape, absorb=False, causal=True))
    assert 1 < causal < prefill  # half the pairs: the per-pair cost of absorbing weighs less
    assert absorb_crossover_queries(64, 64, 64) == math.inf  # 2 r <= d_n + d_v: absorbing never costs more
    with pytest.raises(ValueError, match="num_keys=0"):
        mla_attention_flops(1, 0, **shape, absorb=True)
