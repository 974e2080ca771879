"""Multi-head latent attention against oracles written here: a per-head loop that rebuilds
every key and value, strict loading of Hugging Face's key names, and the bytes formula."""

import math

import numpy as np
import pytest
import torch

from mhalib.mla import DEEPSEEK_V3, MLACache, MultiHeadLatentAttention, RMSNorm, mla_cache_bytes
from mhalib.rope import apply_rope

SHAPES = dict(d_model=32, num_heads=4, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)


def rms(x, w, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def loop_mla(sd, x, cfg, q_lora_rank):
    """Causal MLA from the state dict alone, one batch element, head and query at a time."""
    b, n, _ = x.shape
    h, r, dn, dr, dv = (cfg[k] for k in ("num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    pos = np.arange(n)
    if q_lora_rank is None:
        q = x @ sd["q_proj.weight"].T
    else:
        q = rms(x @ sd["q_a_proj.weight"].T, sd["q_a_layernorm.weight"]) @ sd["q_b_proj.weight"].T
    ckv = x @ sd["kv_a_proj_with_mqa.weight"].T  # (B, N, r + dr)
    c = rms(ckv[..., :r], sd["kv_a_layernorm.weight"])
    k_rope = apply_rope(ckv[..., r:], pos)  # (B, N, dr)
    kv = c @ sd["kv_b_proj.weight"].T  # (B, N, H (dn + dv))
    out = torch.zeros(b, n, h * dv, dtype=x.dtype)
    for bi in range(b):
        for hi in range(h):
            qh = q[bi, :, hi * (dn + dr):(hi + 1) * (dn + dr)]
            qh = torch.cat([qh[:, :dn], apply_rope(qh[:, dn:], pos)], -1)
            kvh = kv[bi, :, hi * (dn + dv):(hi + 1) * (dn + dv)]
            kh = torch.cat([kvh[:, :dn], k_rope[bi]], -1)  # (N, dn + dr): the rotary key is shared
            vh = kvh[:, dn:]
            for i in range(n):
                s = torch.stack([qh[i] @ kh[j] for j in range(i + 1)]) / math.sqrt(dn + dr)
                out[bi, i, hi * dv:(hi + 1) * dv] = torch.softmax(s, 0) @ vh[: i + 1]
    return out @ sd["o_proj.weight"].T


def random_state_dict(q_lora_rank, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, d, r, dn, dr, dv = (SHAPES[k] for k in ("num_heads", "d_model", "kv_lora_rank", "qk_nope_head_dim",
                                                 "qk_rope_head_dim", "v_head_dim"))
    shapes = {"kv_a_proj_with_mqa.weight": (r + dr, d), "kv_a_layernorm.weight": (r,),
              "kv_b_proj.weight": (h * (dn + dv), r), "o_proj.weight": (d, h * dv)}
    if q_lora_rank is None:
        shapes["q_proj.weight"] = (h * (dn + dr), d)
    else:
        shapes.update({"q_a_proj.weight": (q_lora_rank, d), "q_a_layernorm.weight": (q_lora_rank,),
                       "q_b_proj.weight": (h * (dn + dr), q_lora_rank)})
    return {k: torch.randn(*s, generator=g, dtype=torch.float64) * (1.0 if len(s) == 1 else 0.3)
            for k, s in shapes.items()}


@pytest.mark.parametrize("q_lora_rank", [None, 10])
def test_hugging_face_names_load_strictly_and_the_module_equals_the_loop(q_lora_rank):
    sd = random_state_dict(q_lora_rank)
    m = MultiHeadLatentAttention(**SHAPES, q_lora_rank=q_lora_rank).double()
    m.load_state_dict(sd, strict=True)
    x = torch.randn(2, 6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = loop_mla(sd, x, SHAPES, q_lora_rank)
        torch.testing.assert_close(m(x), want, atol=1e-12, rtol=0)
        torch.testing.assert_close(m(x, absorb=True), want, atol=1e-12, rtol=0)


def test_a_state_dict_missing_a_name_does_not_load():
    sd = random_state_dict(None)
    sd["k_proj.weight"] = sd.pop("kv_b_proj.weight")
    with pytest.raises(RuntimeError, match="kv_b_proj.weight"):
        MultiHeadLatentAttention(**SHAPES).double().load_state_dict(sd, strict=True)


@pytest.mark.parametrize("absorb", [False, True])
def test_cache_holds_only_the_latent_and_the_rotary_key_and_decoding_equals_the_full_pass(absorb):
    torch.manual_seed(0)
    m = MultiHeadLatentAttention(**SHAPES, q_lora_rank=10).double()
    x = torch.randn(3, 9, 32, dtype=torch.float64)
    with torch.no_grad():
        full = m(x)
        cache = MLACache()
        parts = [m(x[:, :4], cache=cache, absorb=absorb)] + [m(x[:, t:t + 1], cache=cache, absorb=absorb)
                                                               for t in range(4, 9)]
        latent, k_rope = m.latents(x, np.arange(9))
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-12, rtol=0)
    assert cache.latent.shape == (3, 9, 12) and cache.rope_key.shape == (3, 9, 4)
    torch.testing.assert_close(cache.latent, latent, atol=1e-12, rtol=0)
    torch.testing.assert_close(cache.rope_key, k_rope, atol=1e-12, rtol=0)
    assert cache.nbytes == mla_cache_bytes(1, 12, 4, 9, batch_size=3, bytes_per_element=8)


def test_rmsnorm_equals_the_formula_and_is_computed_in_float32():
    x = torch.randn(4, 7, dtype=torch.float64) * 100
    norm = RMSNorm(7)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2, 7))
    torch.testing.assert_close(norm(x), rms(x.float(), norm.weight).double(), atol=1e-5, rtol=1e-6)
    assert norm(x.half()).dtype == torch.float32  # weight (float32) times the result cast back


def test_deepseek_v3_cache_bytes_against_mha_gqa_and_mqa():
    c = DEEPSEEK_V3
    per_layer = mla_cache_bytes(1, c["kv_lora_rank"], c["qk_rope_head_dim"])
    assert (c["kv_lora_rank"] + c["qk_rope_head_dim"]) == 576 and per_layer == 1152
    per_token = mla_cache_bytes(c["num_layers"], c["kv_lora_rank"], c["qk_rope_head_dim"])
    assert per_token == 70_272 and round(per_token / 1024) == 69
    mha = 2 * 61 * 128 * 128 * 2
    assert mha // per_token == 56 and 2 * 61 * 8 * 128 * 2 > per_token > 2 * 61 * 1 * 128 * 2


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        MultiHeadLatentAttention(32, 4, 12, 6, 3, 5)
    with pytest.raises(ValueError, match="kv_lora_rank=0"):
        mla_cache_bytes(61, 0, 64)
