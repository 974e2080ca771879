"""The course's modules against Hugging Face's own classes, on the same weights, in float64.

Each test builds a Hugging Face attention layer from a small configuration (random weights,
nothing downloaded), loads its state dict strictly into the course's module and compares:

* Llama: ``LlamaAttention`` against ``mhalib.rope.RotaryGroupedQueryAttention`` (grouped-query
  attention with RoPE), prefill and cached decode, where ``mhalib.kv_cache.KVCache`` is held
  against ``DynamicCache`` (outputs and what each cache holds);
* Mistral: ``MistralAttention`` with ``sliding_window`` against ``mhalib.sliding_window``
  (the band mask for prefill, ``RollingKVCache`` for cached decode against Hugging Face's
  sliding cache, which keeps W - 1 positions where the course's keeps W);
* RoPE: ``rotate_half`` (Llama), the interleaved pairs of DeepSeek-V3 and the complex form of
  DeepSeek-V2 against ``mhalib.rope.apply_rope``, and the rotary modules' cos/sin;
* MLA: ``DeepseekV3Attention`` with ``rope_interleave`` True (the default) and False against
  ``mhalib.mla.MultiHeadLatentAttention`` built by ``from_config``: plain, absorbed, cached
  (and the cached latent and rotary key against Hugging Face's cache).

Where Hugging Face computes in float32 whatever the input (its rotary modules, DeepSeek's
RMSNorm, the softmax of the eager path), the test says so and works around it: the cos/sin
come from the rotary formula written here in float64 (checked against Hugging Face's module to
float32 rounding), the attention runs on the ``sdpa`` path (float64 throughout), and the MLA
tests give DeepSeek's RMSNorm its formula without the cast to float32 (its float32 result is
checked against the course's apart).

Tolerance: two correct float64 computations of a sum of n terms differ by at most
2 n u sum|x_i| with u = 2^-53 = 1.1e-16 (Higham, section 3.1). The longest chain here is under
200 terms (a projection over d_model = 32, a latent of 12, scores over 10 dimensions, weights
over at most 11 keys, the output over 32), so correct results agree to about 5e-14 of the
values' size; ``F64`` asks for 1e-10 of it, a margin of 2000 for the softmax's exponentials.
A wrong pairing, mask, scale or position is off by 1e-2 or more, which the tests also show.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: every model comes from a config

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config, LlamaConfig, MistralConfig  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask  # noqa: E402
from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf_deepseek_v2  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_deepseek_v3  # noqa: E402
from transformers.models.llama import modeling_llama as hf_llama  # noqa: E402
from transformers.models.mistral import modeling_mistral as hf_mistral  # noqa: E402

from mhalib.kv_cache import KVCache  # noqa: E402
from mhalib.mla import MLACache, MultiHeadLatentAttention, RMSNorm  # noqa: E402
from mhalib.rope import RotaryGroupedQueryAttention, apply_rope, interleaved_to_half, rope_angles  # noqa: E402
from mhalib.sliding_window import RollingKVCache, sliding_window_mask  # noqa: E402

F64 = 1e-10  # relative to the largest value compared (see the module's docstring)
U32 = torch.finfo(torch.float32).eps / 2  # float32's unit roundoff, 6e-8
BASE = 500.0  # a rotary base other than the default, so that a base read wrongly shows
D_MODEL, HEADS, KV_HEADS, HEAD_DIM = 32, 8, 2, 4
MLA_SHAPES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=12, qk_nope_head_dim=6,
                  qk_rope_head_dim=4, v_head_dim=5)


def assert_f64_close(got, want):
    """``got`` equals ``want`` to ``F64`` of the largest ``|want|``."""
    torch.testing.assert_close(got, want, rtol=0, atol=F64 * want.abs().max().item())


def max_diff(a, b):
    return (a - b).abs().max().item()


def position_embeddings(positions, dim, base=BASE):
    """Hugging Face's ``(cos, sin)``, each ``(1, N, dim)``: the angles ``p * base^(-2i/dim)``
    repeated for the two halves (``cat(freqs, freqs)``), computed here in float64."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    freqs = torch.as_tensor(np.asarray(positions), dtype=torch.float64)[:, None] * inv_freq  # (N, dim/2)
    emb = torch.cat([freqs, freqs], dim=-1)[None]  # (1, N, dim)
    return emb.cos(), emb.sin()


def randomize(module, seed, scale=0.3):
    """Weights drawn from N(0, scale^2) (norm weights around 1), float64."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * scale + (1.0 if p.dim() == 1 else 0.0))
    return module.eval()


def inputs(batch, n, seed):
    return torch.randn(batch, n, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def sdpa(config):
    """Hugging Face's ``sdpa`` path: float64 throughout (the eager path takes the softmax in float32)."""
    config._attn_implementation = "sdpa"
    return config


def llama_config(**changes):
    return sdpa(LlamaConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                            head_dim=HEAD_DIM, num_hidden_layers=1, rope_theta=BASE, **changes))


# --- RoPE ---------------------------------------------------------------------------------

def test_the_cos_sin_written_here_are_hugging_faces_rotary_modules_to_float32_rounding():
    """Hugging Face's rotary modules compute the angles in float32 whatever the dtype asked for;
    the float64 formula the other tests feed to the attention classes agrees with them to that
    rounding (angle p * theta within a few float32 ulps, so the bound grows with p), and so do
    the course's angles."""
    positions = torch.arange(40)[None]  # (1, 40)
    deepseek = DeepseekV3Config(**MLA_SHAPES, rope_parameters={"rope_type": "default", "rope_theta": BASE})
    for module, dim in ((hf_llama.LlamaRotaryEmbedding(llama_config()), HEAD_DIM),
                        (hf_deepseek_v3.DeepseekV3RotaryEmbedding(deepseek), MLA_SHAPES["qk_rope_head_dim"])):
        cos, sin = module(torch.zeros(1, dtype=torch.float64), positions)  # float32 numbers, cast to float64
        want_cos, want_sin = position_embeddings(range(40), dim)
        bound = 4 * U32 * (40 + 1)  # the largest angle is 39 rad (theta_0 = 1)
        assert max_diff(cos, want_cos) < bound and max_diff(sin, want_sin) < bound
        ours = torch.from_numpy(rope_angles(np.arange(40), dim, BASE))  # (40, dim/2), float64
        assert_f64_close(torch.cat([ours.cos(), ours.cos()], -1), want_cos[0])
        assert_f64_close(torch.cat([ours.sin(), ours.sin()], -1), want_sin[0])


def test_rotate_half_is_llamas_apply_rotary_pos_emb():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 7, 16, dtype=torch.float64, generator=g)  # (B, H, N, d)
    k = torch.randn(2, 2, 7, 16, dtype=torch.float64, generator=g)  # (B, g, N, d)
    positions = np.arange(3, 10)
    cos, sin = position_embeddings(positions, 16)
    hf_q, hf_k = hf_llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert_f64_close(apply_rope(q, positions, BASE), hf_q)
    assert_f64_close(apply_rope(k, positions, BASE), hf_k)
    assert max_diff(apply_rope(q, positions, BASE, convention="interleaved"), hf_q) > 1e-2


def test_interleaved_pairs_are_deepseek_v3s_apply_rotary_pos_emb_interleave():
    """DeepSeek-V3's function rotates the pairs (2i, 2i + 1) and returns them even entries first:
    the course's interleaved rotation permuted by ``interleaved_to_half``."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 7, 16, dtype=torch.float64, generator=g)  # (B, H, N, d)
    k = torch.randn(2, 1, 7, 16, dtype=torch.float64, generator=g)  # (B, g, N, d)
    positions = np.arange(5, 12)
    perm = torch.as_tensor(interleaved_to_half(16))
    hf_q, hf_k = hf_deepseek_v3.apply_rotary_pos_emb_interleave(q, k, *position_embeddings(positions, 16))
    assert_f64_close(apply_rope(q, positions, BASE, convention="interleaved")[..., perm], hf_q)
    assert_f64_close(apply_rope(k, positions, BASE, convention="interleaved")[..., perm], hf_k)
    assert max_diff(apply_rope(q, positions, BASE)[..., perm], hf_q) > 1e-2


def test_interleaved_pairs_are_the_complex_form_of_deepseek_v2():
    """DeepSeek-V2's ``apply_rotary_emb`` (Meta's form: pairs as complex numbers times e^(i p theta))
    computes in float32 whatever it is given, so the comparison is in float32: a complex product
    rounds each part at most twice, as the course's x cos - y sin does."""
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 7, 16, generator=g), torch.randn(2, 1, 7, 16, generator=g)  # (B, H, N, d), float32
    positions = np.arange(7)
    theta = 1.0 / BASE ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)  # (d/2,)
    angles = torch.as_tensor(positions, dtype=torch.float64)[:, None] * theta  # (N, d/2)
    freqs_cis = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)[None]  # (1, N, d/2): e^(i p theta)
    hf_q, hf_k = hf_deepseek_v2.apply_rotary_emb(q, k, freqs_cis)  # (B, H, N, d) each
    for x, theirs in ((q, hf_q), (k, hf_k)):
        ours = apply_rope(x, positions, BASE, convention="interleaved")
        torch.testing.assert_close(ours, theirs, rtol=0, atol=4 * U32 * x.abs().max().item())
        assert max_diff(apply_rope(x, positions, BASE), theirs) > 1e-2


# --- Llama: grouped-query attention, and the KV cache against DynamicCache -----------------

@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("bias", [False, True])
def test_llama_attention_equals_rotary_grouped_query_attention(bias, kernel):
    config = llama_config(attention_bias=bias)
    hf = randomize(hf_llama.LlamaAttention(config, layer_idx=0).double(), seed=0)
    ours = RotaryGroupedQueryAttention(D_MODEL, HEADS, KV_HEADS, bias=bias, rope_base=BASE).double().eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    ours.attn_implementation = kernel
    x = inputs(2, 9, seed=1)
    with torch.no_grad():
        mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=None, past_key_values=None,
                                  position_ids=torch.arange(9)[None])
        want, _ = hf(x, position_embeddings(range(9), HEAD_DIM), mask)
        assert_f64_close(ours(x, causal=True), want)
        assert max_diff(ours(x, causal=False), want) > 1e-2  # the mask matters on these weights


def test_llama_cached_decoding_and_kv_cache_equal_hugging_faces_dynamic_cache():
    """Prefill 5 tokens, then steps of 1, 2 and 1: every step's output, and what the caches hold
    after each step (rotated keys, values), are Hugging Face's; the course's cache starts with
    room for 2 positions, so its buffers grow on the way."""
    config = llama_config()
    hf = randomize(hf_llama.LlamaAttention(config, layer_idx=0).double(), seed=2)
    ours = RotaryGroupedQueryAttention(D_MODEL, HEADS, KV_HEADS, rope_base=BASE).double().eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    x = inputs(2, 9, seed=3)
    hf_cache, kv_cache = DynamicCache(config=config), KVCache(capacity=2)
    start = 0
    with torch.no_grad():
        full = ours(x, causal=True)
        for n in (5, 1, 2, 1):
            step = x[:, start:start + n]
            mask = create_causal_mask(config=config, inputs_embeds=step, attention_mask=None,
                                      past_key_values=hf_cache, position_ids=torch.arange(start, start + n)[None])
            want, _ = hf(step, position_embeddings(range(start, start + n), HEAD_DIM), mask, past_key_values=hf_cache)
            got = ours(step, causal=True, kv_cache=kv_cache)
            assert_f64_close(got, want)
            assert_f64_close(full[:, start:start + n], want)
            start += n
            assert len(kv_cache) == hf_cache.get_seq_length() == start
            assert_f64_close(kv_cache.keys, hf_cache.layers[0].keys)
            assert_f64_close(kv_cache.values, hf_cache.layers[0].values)


# --- Mistral: sliding windows -----------------------------------------------------------------

WINDOW = 4


def mistral_pair(seed):
    config = sdpa(MistralConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                head_dim=HEAD_DIM, num_hidden_layers=1, rope_theta=BASE, sliding_window=WINDOW))
    hf = randomize(hf_mistral.MistralAttention(config, layer_idx=0).double(), seed=seed)
    ours = RotaryGroupedQueryAttention(D_MODEL, HEADS, KV_HEADS, rope_base=BASE).double().eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return config, hf, ours


def test_mistral_sliding_window_prefill_equals_the_band_mask():
    config, hf, ours = mistral_pair(seed=4)
    n = 11
    x = inputs(2, n, seed=5)
    with torch.no_grad():
        mask = create_sliding_window_causal_mask(config=config, inputs_embeds=x, attention_mask=None,
                                                 past_key_values=None, position_ids=torch.arange(n)[None])
        assert mask.dtype == torch.bool and torch.equal(mask[0, 0], sliding_window_mask(n, WINDOW))
        want, _ = hf(x, position_embeddings(range(n), HEAD_DIM), mask)
        assert_f64_close(ours(x, causal=True, attn_mask=sliding_window_mask(n, WINDOW)), want)
        assert max_diff(ours(x, causal=True), want) > 1e-2  # without the window: other outputs
        assert max_diff(ours(x, causal=True, attn_mask=sliding_window_mask(n, WINDOW + 1)), want) > 1e-2


def test_mistral_cached_decoding_equals_the_rolling_buffer():
    """Prefill 6 tokens (more than the window), then steps of 1, 1, 2 and 1, through Hugging
    Face's sliding cache and mask, and through ``RollingKVCache.attend`` on the same rotated
    queries and keys; Hugging Face's cache holds W - 1 = 3 positions between steps, the course's
    W = 4 slots."""
    config, hf, ours = mistral_pair(seed=6)
    x = inputs(2, 11, seed=7)
    hf_cache, rolling = DynamicCache(config=config), RollingKVCache(WINDOW)
    start = 0
    with torch.no_grad():
        for n in (6, 1, 1, 2, 1):
            step, positions = x[:, start:start + n], np.arange(start, start + n)
            mask = create_sliding_window_causal_mask(config=config, inputs_embeds=step, attention_mask=None,
                                                     past_key_values=hf_cache,
                                                     position_ids=torch.as_tensor(positions)[None])
            want, _ = hf(step, position_embeddings(positions, HEAD_DIM), mask, past_key_values=hf_cache)
            q, k, v = ours.project(step)  # (B, H, n, d), (B, g, n, d), (B, g, n, d)
            z = rolling.attend(apply_rope(q, positions, BASE), apply_rope(k, positions, BASE), v)  # (B, H, n, d)
            got = ours.o_proj(z.transpose(1, 2).reshape(2, n, D_MODEL))  # (B, n, d_model)
            assert_f64_close(got, want)
            start += n
        assert hf_cache.layers[0].keys.shape[2] == WINDOW - 1 and rolling.keys.shape[2] == WINDOW


# --- MLA: DeepseekV3Attention --------------------------------------------------------------

def deepseek_config(q_lora_rank, **changes):
    return sdpa(DeepseekV3Config(**MLA_SHAPES, q_lora_rank=q_lora_rank, num_hidden_layers=1,
                                 rope_parameters={"rope_type": "default", "rope_theta": BASE}, **changes))


def norm_in_input_dtype(self, hidden_states):
    """``DeepseekV3RMSNorm.forward`` without its cast to float32 (which rounds float64 inputs)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def deepseek_attention(config, seed, float64_norms=True):
    hf = randomize(hf_deepseek_v3.DeepseekV3Attention(config, layer_idx=0).double(), seed=seed)
    if float64_norms:
        for norm in (m for m in hf.modules() if isinstance(m, hf_deepseek_v3.DeepseekV3RMSNorm)):
            norm.forward = norm_in_input_dtype.__get__(norm)
    return hf


def test_rmsnorm_is_deepseeks_and_deepseeks_computes_float64_in_float32():
    """On float32 inputs both norms compute in float32 and agree to its rounding; on float64
    inputs Hugging Face's still computes in float32 (the course's stays in float64), which is
    why the other MLA tests give it its formula without that cast."""
    hf, ours = hf_deepseek_v3.DeepseekV3RMSNorm(12), RMSNorm(12)
    with torch.no_grad():
        hf.weight.copy_(torch.linspace(0.5, 2.0, 12))
        ours.weight.copy_(hf.weight)
        x = torch.randn(3, 5, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(8)) * 10
        want = hf(x.float())
        torch.testing.assert_close(ours(x.float()), want, rtol=0, atol=8 * U32 * want.abs().max().item())
        float64_gap = max_diff(hf(x), ours(x))
        assert F64 * want.abs().max().item() < float64_gap < 8 * U32 * want.abs().max().item()
        assert_f64_close(ours(x), norm_in_input_dtype(hf, x))  # the formula the MLA tests give it


@pytest.mark.parametrize("rope_interleave", [True, False])
@pytest.mark.parametrize("q_lora_rank", [None, 10])
def test_mla_equals_deepseek_v3_attention_plain_and_absorbed(q_lora_rank, rope_interleave):
    config = deepseek_config(q_lora_rank, rope_interleave=rope_interleave)
    hf = deepseek_attention(config, seed=9)
    ours = MultiHeadLatentAttention.from_config(config).double().eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    assert ours.rope_interleave is rope_interleave
    x = inputs(2, 9, seed=10)
    with torch.no_grad():
        mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=None, past_key_values=None,
                                  position_ids=torch.arange(9)[None])
        want, _ = hf(x, position_embeddings(range(9), MLA_SHAPES["qk_rope_head_dim"]), mask)
        assert_f64_close(ours(x), want)
        assert_f64_close(ours(x, absorb=True), want)
        other = MultiHeadLatentAttention.from_config(dict(config.to_dict(), rope_interleave=not rope_interleave))
        other.double().load_state_dict(hf.state_dict(), strict=True)  # loads: names and shapes agree
        assert max_diff(other(x), want) > 1e-2  # and computes something else


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("rope_interleave", [True, False])
def test_mla_cached_decoding_equals_deepseek_v3_with_dynamic_cache(rope_interleave, absorb):
    """Prefill 5, then steps of 1, 2 and 1: outputs, and the caches, which hold the same numbers:
    the normalised latent, and the rotated shared key (Hugging Face keeps an interleaved one
    even entries first)."""
    config = deepseek_config(10, rope_interleave=rope_interleave)
    hf = deepseek_attention(config, seed=11)
    ours = MultiHeadLatentAttention.from_config(config).double().eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    x = inputs(2, 9, seed=12)
    d_rope = MLA_SHAPES["qk_rope_head_dim"]
    layout = torch.as_tensor(interleaved_to_half(d_rope) if rope_interleave else np.arange(d_rope))
    hf_cache, cache = DynamicCache(config=config), MLACache()
    start = 0
    with torch.no_grad():
        for n in (5, 1, 2, 1):
            step = x[:, start:start + n]
            mask = create_causal_mask(config=config, inputs_embeds=step, attention_mask=None,
                                      past_key_values=hf_cache, position_ids=torch.arange(start, start + n)[None])
            want, _ = hf(step, position_embeddings(range(start, start + n), d_rope), mask, past_key_values=hf_cache)
            assert_f64_close(ours(step, cache=cache, absorb=absorb), want)
            start += n
            assert len(cache) == hf_cache.get_seq_length() == start
            assert_f64_close(cache.latent, hf_cache.layers[0].keys[:, 0])  # (B, T, r)
            assert_f64_close(cache.rope_key[..., layout], hf_cache.layers[0].values[:, 0])  # (B, T, d_rope)


def test_a_default_deepseek_v3_layer_loads_into_the_default_module_and_computes_the_same():
    """The finding this guards: Hugging Face's DeepSeek-V3 layer, with its configuration's
    defaults (``rope_interleave=True``) and Hugging Face's own RMSNorm, loads strictly into the
    module built with the course's defaults and computes what it computes: to the precision of
    that RMSNorm, which rounds float64 to float32 (a relative 2^-24 on the latents, carried
    linearly and through the softmax; bound: 2^-24 times 64)."""
    config = deepseek_config(10)
    assert config.rope_interleave is True and DeepseekV3Config().rope_interleave is True
    hf = deepseek_attention(config, seed=13, float64_norms=False)
    shapes = dict(d_model=32, num_heads=4, q_lora_rank=10, kv_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4,
                  v_head_dim=5, rope_base=BASE)
    ours = MultiHeadLatentAttention(**shapes).double().eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    x = inputs(2, 9, seed=14)
    with torch.no_grad():
        want, _ = hf(x, position_embeddings(range(9), 4), None)  # no mask: sdpa's is_causal
        torch.testing.assert_close(ours(x), want, rtol=0, atol=64 * 2 * U32 * want.abs().max().item())
        halves = MultiHeadLatentAttention(**shapes, rope_interleave=False).double()
        halves.load_state_dict(hf.state_dict(), strict=True)
        assert max_diff(halves(x), want) > 1e-2


def test_from_config_refuses_deepseek_v3s_yarn_scaling():
    """DeepSeek-V3 ships with YaRN (``rope_scaling`` type ``yarn``, factor 40): its frequencies and
    its softmax factor (mscale) are not what this module computes, so it refuses the config."""
    yarn = {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
            "original_max_position_embeddings": 4096}
    config = DeepseekV3Config(**MLA_SHAPES, q_lora_rank=10, rope_scaling=yarn, rope_theta=10000.0,
                              max_position_embeddings=40 * 4096)
    with pytest.raises(ValueError, match=r"rope_parameters=.*'yarn'.*not implemented"):
        MultiHeadLatentAttention.from_config(config)
    with pytest.raises(ValueError, match=r"attention_bias=True"):
        MultiHeadLatentAttention.from_config(deepseek_config(10, attention_bias=True))
