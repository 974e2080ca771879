"""Multi-head latent attention against oracles written here: a per-head loop that rebuilds
every key and value (RoPE in both pairings, written here too), strict loading of Hugging Face's
key names, the pairing a configuration names, and the bytes formula. Hugging Face's own
``DeepseekV3Attention`` is the oracle in tests/test_hf_oracles.py."""

import math

import numpy as np
import pytest
import torch

from mhalib.mla import DEEPSEEK_V3, MLACache, MultiHeadLatentAttention, RMSNorm, mla_cache_bytes

SHAPES = dict(d_model=32, num_heads=4, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5)


def rms(x, w, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rotate(x, pos, interleave, base=10000.0):
    """RoPE of x (..., N, d) written here: interleaved pairs as complex numbers times e^(i p theta)
    (DeepSeek's and Meta's form), or the halves with rotate_half (Hugging Face's Llama)."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = torch.as_tensor(pos, dtype=torch.float64)[:, None] * theta  # (N, d/2)
    if interleave:
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())  # (..., N, d/2)
        return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).reshape(x.shape)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)  # (N, d)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def loop_mla(sd, x, cfg, q_lora_rank, interleave=True):
    """Causal MLA from the state dict alone, one batch element, head and query at a time."""
    b, n, _ = x.shape
    h, r, dn, dr, dv = (cfg[k] for k in ("num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                          "v_head_dim"))
    pos = np.arange(n)
    if q_lora_rank is None:
        q = x @ sd["q_proj.weight"].T
    else:
        q = rms(x @ sd["q_a_proj.weight"].T, sd["q_a_layernorm.weight"]) @ sd["q_b_proj.weight"].T
    ckv = x @ sd["kv_a_proj_with_mqa.weight"].T  # (B, N, r + dr)
    c = rms(ckv[..., :r], sd["kv_a_layernorm.weight"])
    k_rope = rotate(ckv[..., r:], pos, interleave)  # (B, N, dr)
    kv = c @ sd["kv_b_proj.weight"].T  # (B, N, H (dn + dv))
    out = torch.zeros(b, n, h * dv, dtype=x.dtype)
    for bi in range(b):
        for hi in range(h):
            qh = q[bi, :, hi * (dn + dr):(hi + 1) * (dn + dr)]
            qh = torch.cat([qh[:, :dn], rotate(qh[:, dn:], pos, interleave)], -1)
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


@pytest.mark.parametrize("rope_interleave", [True, False])
@pytest.mark.parametrize("q_lora_rank", [None, 10])
def test_hugging_face_names_load_strictly_and_the_module_equals_the_loop(q_lora_rank, rope_interleave):
    sd = random_state_dict(q_lora_rank)
    m = MultiHeadLatentAttention(**SHAPES, q_lora_rank=q_lora_rank, rope_interleave=rope_interleave).double()
    m.load_state_dict(sd, strict=True)
    x = torch.randn(2, 6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = loop_mla(sd, x, SHAPES, q_lora_rank, interleave=rope_interleave)
        torch.testing.assert_close(m(x), want, atol=1e-12, rtol=0)
        torch.testing.assert_close(m(x, absorb=True), want, atol=1e-12, rtol=0)


def rotary_rows_to_halves(sd, q_lora_rank):
    """The state dict with every rotary row reordered from interleaved pairs to halves (even
    entries first, then odd): each head's last d_rope rows of the query projection and the last
    d_rope rows of kv_a_proj_with_mqa."""
    h, r, dn, dr = (SHAPES[k] for k in ("num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"))
    perm = list(range(0, dr, 2)) + list(range(1, dr, 2))
    q_rows = [hi * (dn + dr) + j for hi in range(h) for j in list(range(dn)) + [dn + p for p in perm]]
    kv_rows = list(range(r)) + [r + p for p in perm]
    q_name = "q_proj.weight" if q_lora_rank is None else "q_b_proj.weight"
    kv_name = "kv_a_proj_with_mqa.weight"
    return dict(sd, **{q_name: sd[q_name][q_rows], kv_name: sd[kv_name][kv_rows]})


@pytest.mark.parametrize("q_lora_rank", [None, 10])
def test_the_pairing_is_part_of_what_the_weights_mean(q_lora_rank):
    """Weights written for interleaved pairs load strictly into either pairing; only the
    interleaved module (the default) computes what they mean, and the halves compute it once
    the rotary rows are permuted."""
    sd = random_state_dict(q_lora_rank)
    x = torch.randn(2, 6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    default, halves = (MultiHeadLatentAttention(**SHAPES, q_lora_rank=q_lora_rank, **kw).double()
                       for kw in ({}, {"rope_interleave": False}))
    assert default.rope_interleave is True and "rope_interleave=True" in repr(default)
    default.load_state_dict(sd, strict=True)
    halves.load_state_dict(sd, strict=True)  # loads, and computes something else
    with torch.no_grad():
        want = loop_mla(sd, x, SHAPES, q_lora_rank, interleave=True)
        torch.testing.assert_close(default(x), want, atol=1e-12, rtol=0)
        assert (halves(x) - want).abs().max() > 1e-2
        halves.load_state_dict(rotary_rows_to_halves(sd, q_lora_rank), strict=True)
        torch.testing.assert_close(halves(x), want, atol=1e-12, rtol=0)


def small_config(**changes):
    """A DeepSeek-V3 configuration as its config.json spells it (transformers 4's rotary fields)."""
    config = dict(hidden_size=32, num_attention_heads=4, q_lora_rank=10, kv_lora_rank=12, qk_nope_head_dim=6,
                  qk_rope_head_dim=4, v_head_dim=5, rope_theta=500.0, rope_scaling=None, attention_bias=False)
    config.update(changes)
    return config


def test_from_config_reads_the_shapes_the_base_and_the_pairing():
    m = MultiHeadLatentAttention.from_config(small_config())
    assert (m.d_model, m.num_heads, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
            m.v_head_dim, m.rope_base) == (32, 4, 10, 12, 6, 4, 5, 500.0)
    assert m.rope_interleave is True  # absent: Hugging Face's default
    assert MultiHeadLatentAttention.from_config(small_config(rope_interleave=False)).rope_interleave is False
    assert MultiHeadLatentAttention.from_config(small_config(rope_interleave=None)).rope_interleave is False
    new_format = small_config(rope_parameters={"rope_type": "default", "rope_theta": 50.0}, rope_theta=None)
    assert MultiHeadLatentAttention.from_config(new_format).rope_base == 50.0
    assert MultiHeadLatentAttention.from_config(small_config(q_lora_rank=None)).q_lora_rank is None


YARN = {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
        "original_max_position_embeddings": 4096}


@pytest.mark.parametrize("changes, match", [
    (dict(rope_scaling=YARN), r"rope_scaling=.*rope_type 'yarn' is not implemented"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
     r"rope_parameters=.*rope_type 'yarn' is not implemented.*mscale"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), r"rope_type 'linear' is not implemented"),
    (dict(attention_bias=True), r"attention_bias=True.*allowed: attention_bias=False"),
    (dict(rope_interleave="yes"), r"rope_interleave must be True, False or None.*'yes'"),
    (dict(rope_parameters="yarn"), r"rope_parameters must be a mapping"),
])
def test_from_config_refuses_what_the_module_does_not_compute(changes, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadLatentAttention.from_config(small_config(**changes))


def test_from_config_names_a_missing_field():
    config = small_config()
    del config["kv_lora_rank"]
    with pytest.raises(ValueError, match="the configuration has no 'kv_lora_rank'"):
        MultiHeadLatentAttention.from_config(config)


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
    with pytest.raises(ValueError, match=r"rope_interleave must be True .* or False .*got rope_interleave='half'"):
        MultiHeadLatentAttention(**SHAPES, rope_interleave="half")
    with pytest.raises(ValueError, match="kv_lora_rank=0"):
        mla_cache_bytes(61, 0, 64)
