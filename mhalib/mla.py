"""Multi-head latent attention (MLA; DeepSeek-AI 2024, *DeepSeek-V2*; used again in DeepSeek-V3).

Keys and values are not cached per head. Each token's input is projected **down** to one
latent vector ``c_kv`` of ``kv_lora_rank`` numbers (normalised by an RMSNorm), and every
head's key and value are projected **up** from it. The heads' keys carry no rotary positions:
RoPE applied, as in other models, to an up-projected key ``W_uk c`` and to the query puts a
rotation that depends on the query's and the key's positions between ``W^Q`` and ``W^UK``, so
the key up-projection could no longer be folded into the query once for all keys (DeepSeek-V2,
section 2.1.3, "Decoupled Rotary Position Embedding"). Rotating the latent itself before caching,
which the paper does not discuss, would fold, but the scores would depend on the offset between
positions only if the folded query ``W_uk^T q`` were rotated by the query's position too (left
unrotated, they depend on the key's position alone); and since the same latent makes the values,
``W_uv sum_t w_t R_t c_t`` would carry each key's rotation unless every cached latent were rotated
back at every step, or cached a second time unrotated. So a small extra key of ``qk_rope_head_dim``
numbers, shared by all heads and rotated before caching, carries the positions ("decoupled
RoPE"), with a rotated query part per head, and the latent stays unrotated. The cache holds
``kv_lora_rank + qk_rope_head_dim`` numbers per token and layer.

At decode time the up-projections need not run at all ("absorbed" form): the key
up-projection folds into the query (``q . (W_uk c) = (W_uk^T q) . c``) and the value
up-projection into the output (``sum_t w_t W_uv c_t = W_uv sum_t w_t c_t``), so attention reads
the latents directly. :meth:`MultiHeadLatentAttention.forward` computes both forms. The absorbed
form costs far less per decoding step and more in a long prefill
(``mhalib.serving.mla_attention_flops``).

The attribute names are Hugging Face's ``DeepseekV3Attention``'s (``q_proj`` or ``q_a_proj``,
``q_a_layernorm``, ``q_b_proj``; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``;
``o_proj``), and so are the configuration's (``q_lora_rank``, ``kv_lora_rank``,
``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``, ``rope_interleave``): a state dict
with those keys loads strictly.

A strict load checks names and shapes, not meaning: the rotary rows of the query projection
(``q_proj`` or ``q_b_proj``) and of ``kv_a_proj_with_mqa`` are written for one pairing of RoPE
(:mod:`mhalib.rope`), and the same tensors load into a module of the other pairing and compute
other scores. DeepSeek's checkpoints use interleaved pairs ``(2i, 2i + 1)`` (the complex form
of DeepSeek's inference code), as Hugging Face's ``DeepseekV3Config`` does by default
(``rope_interleave=True``), and so does this module by default; ``rope_interleave=False``
pairs the halves (``rotate_half``). For a checkpoint, build the module with
:meth:`MultiHeadLatentAttention.from_config` from its configuration: it reads the pairing and
refuses what this module does not compute (YaRN's rescaled frequencies and its softmax factor
``mscale``; biases).

Shapes: B batch, N new tokens, T cached tokens, H heads, r = kv_lora_rank, d_nope, d_rope, d_v.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from mhalib.rope import apply_rope

__all__ = ["RMSNorm", "MultiHeadLatentAttention", "MLACache", "mla_cache_bytes", "DEEPSEEK_V3"]

# Published configuration: the model's config.json on its model card.
DEEPSEEK_V3 = dict(
    num_layers=61, num_heads=128, d_model=7168, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    source="config.json of deepseek-ai/DeepSeek-V3 on its model card (num_hidden_layers 61, "
           "num_attention_heads 128, hidden_size 7168, q_lora_rank 1536, kv_lora_rank 512, "
           "qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128)",
)


_REQUIRED = object()  # a configuration field without a default
_CONFIG_FIELDS = ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                  "qk_rope_head_dim", "v_head_dim")


def _positive_int(value, name, *, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer; got {value!r}")
    if value < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '>= 1'}; got {name}={value}")
    return int(value)


def mla_cache_bytes(num_layers, kv_lora_rank, qk_rope_head_dim, num_tokens=1, batch_size=1, bytes_per_element=2):
    """Bytes of an MLA cache: ``(kv_lora_rank + qk_rope_head_dim)`` numbers per token and layer.

    One latent and one shared rotary key per token; no factor 2 (keys and values share the
    latent) and no factor of heads. DeepSeek-V3 (61 layers, 512 + 64) in bf16:
    ``mla_cache_bytes(61, 512, 64) == 70_272`` bytes per token.

    Returns:
        ``int``.
    """
    parts = [_positive_int(num_layers, "num_layers"), _positive_int(kv_lora_rank, "kv_lora_rank"),
             _positive_int(qk_rope_head_dim, "qk_rope_head_dim", allow_zero=True),
             _positive_int(num_tokens, "num_tokens", allow_zero=True), _positive_int(batch_size, "batch_size"),
             _positive_int(bytes_per_element, "bytes_per_element")]
    layers, rank, rope, tokens, batch, size = parts
    return layers * (rank + rope) * tokens * batch * size


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis, in float32 at least.

    Hugging Face's ``DeepseekV3RMSNorm`` computes in float32 whatever the input, float64 too;
    this one keeps float64 (on float16, bfloat16 and float32 inputs the two compute alike).

    Attributes:
        weight: ``(dim,)``, ones at first.
    """

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(_positive_int(dim, "dim")))
        self.eps = float(eps)

    def forward(self, x):
        """``x (..., dim)`` normalised over the last axis and scaled by ``weight``, in the dtype of ``x``."""
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))  # fp16/bf16 -> fp32; fp64 stays
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., dim)
        return self.weight * x32.to(x.dtype)


class MLACache:
    """What MLA caches per layer: the normalised latent and the rotated shared key, per token.

    Attributes:
        latent: ``(B, T, kv_lora_rank)``; rope_key: ``(B, T, qk_rope_head_dim)`` (``None`` while empty).
    """

    def __init__(self):
        self.latent = self.rope_key = None

    def __len__(self):
        return 0 if self.latent is None else self.latent.shape[1]

    def __repr__(self):
        shape = None if self.latent is None else (tuple(self.latent.shape), tuple(self.rope_key.shape))
        return f"MLACache(tokens={len(self)}, shapes={shape}, nbytes={self.nbytes})"

    def append(self, latent, rope_key):
        """Append ``(B, N, r)`` and ``(B, N, d_rope)``; return everything cached so far."""
        if latent.dim() != 3 or rope_key.dim() != 3 or latent.shape[:2] != rope_key.shape[:2]:
            raise ValueError(f"latent must be (B, N, r) and rope_key (B, N, d_rope); got "
                             f"{tuple(latent.shape)} and {tuple(rope_key.shape)}")
        if self.latent is None:
            self.latent, self.rope_key = latent, rope_key
        else:
            self.latent = torch.cat([self.latent, latent], dim=1)  # (B, T + N, r)
            self.rope_key = torch.cat([self.rope_key, rope_key], dim=1)  # (B, T + N, d_rope)
        return self.latent, self.rope_key

    @property
    def nbytes(self):
        """Bytes held: what :func:`mla_cache_bytes` predicts for one layer."""
        if self.latent is None:
            return 0
        return self.latent.numel() * self.latent.element_size() + self.rope_key.numel() * self.rope_key.element_size()


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention with Hugging Face's DeepSeek-V3 names.

    Args:
        d_model: width of the input (``hidden_size``).
        num_heads: H.
        kv_lora_rank: r, the width of the cached latent.
        qk_nope_head_dim: the part of each query/key head without positions (from the latent).
        qk_rope_head_dim: the rotated part; the key's is shared by all heads.
        v_head_dim: each head's value width.
        q_lora_rank: ``None`` for one ``q_proj``; else queries go through a latent of this width too
            (``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``).
        rope_base: base of the rotary frequencies (``rope_theta``).
        rope_interleave: ``True`` (the default, as Hugging Face's ``DeepseekV3Config`` and
            DeepSeek's checkpoints): rotary pairs ``(2i, 2i + 1)``; ``False``: pairs
            ``(i, i + d_rope / 2)`` (``rotate_half``). See :func:`mhalib.rope.apply_rope`.

    Attributes:
        q_proj ``(H * (d_nope + d_rope), d_model)`` or q_a_proj ``(q_lora_rank, d_model)``,
        q_a_layernorm, q_b_proj ``(H * (d_nope + d_rope), q_lora_rank)``;
        kv_a_proj_with_mqa ``(r + d_rope, d_model)``; kv_a_layernorm ``RMSNorm(r)``;
        kv_b_proj ``(H * (d_nope + d_v), r)``; o_proj ``(d_model, H * d_v)``. No biases.
    """

    def __init__(self, d_model, num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                 q_lora_rank=None, rope_base=10000.0, rope_interleave=True):
        super().__init__()
        self.d_model = _positive_int(d_model, "d_model")
        self.num_heads = _positive_int(num_heads, "num_heads")
        self.kv_lora_rank = _positive_int(kv_lora_rank, "kv_lora_rank")
        self.qk_nope_head_dim = _positive_int(qk_nope_head_dim, "qk_nope_head_dim")
        self.qk_rope_head_dim = _positive_int(qk_rope_head_dim, "qk_rope_head_dim")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs); got {qk_rope_head_dim}")
        self.v_head_dim = _positive_int(v_head_dim, "v_head_dim")
        self.q_lora_rank = None if q_lora_rank is None else _positive_int(q_lora_rank, "q_lora_rank")
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.rope_base = float(rope_base)
        if not isinstance(rope_interleave, (bool, np.bool_)):
            raise ValueError(f"rope_interleave must be True (pairs 2i, 2i + 1: DeepSeek's checkpoints) or False "
                             f"(pairs i, i + d/2: rotate_half); got rope_interleave={rope_interleave!r}")
        self.rope_interleave = bool(rope_interleave)
        self.rope_convention = "interleaved" if self.rope_interleave else "half"  # mhalib.rope's name
        h = self.num_heads
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(self.d_model, h * self.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(self.d_model, self.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank)
            self.q_b_proj = nn.Linear(self.q_lora_rank, h * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(self.d_model, self.kv_lora_rank + self.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, h * (self.qk_nope_head_dim + self.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * self.v_head_dim, self.d_model, bias=False)

    def extra_repr(self):
        """The sizes shown in the module's repr."""
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, q_lora_rank={self.q_lora_rank}, "
                f"kv_lora_rank={self.kv_lora_rank}, qk_nope_head_dim={self.qk_nope_head_dim}, "
                f"qk_rope_head_dim={self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}, "
                f"rope_base={self.rope_base:g}, rope_interleave={self.rope_interleave}")

    @classmethod
    def from_config(cls, config):
        """The attention layer that a Hugging Face DeepSeek-V3 configuration describes.

        Reads ``hidden_size``, ``num_attention_heads``, ``q_lora_rank``, ``kv_lora_rank``,
        ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``, ``rope_interleave`` (absent:
        ``True``, Hugging Face's default; ``None`` counts as ``False``, as there) and the rotary
        settings: ``rope_parameters`` (transformers 5) or ``rope_theta`` and ``rope_scaling``
        (a checkpoint's ``config.json``). Refuses, with a ``ValueError`` naming the field, what
        this module does not compute, so that loading the checkpoint's weights afterwards never
        computes something else: any rotary type but ``"default"`` (DeepSeek-V3 ships with
        ``"yarn"``: rescaled frequencies and a softmax factor ``mscale``), and
        ``attention_bias=True``.

        Args:
            config: a ``transformers`` ``DeepseekV3Config`` (or any object with those
                attributes), or a mapping such as the parsed ``config.json``.

        Returns:
            A new :class:`MultiHeadLatentAttention` (random weights; load the checkpoint's
            state dict into it).
        """
        def field(name, default=_REQUIRED):
            value = config.get(name, default) if isinstance(config, Mapping) else getattr(config, name, default)
            if value is _REQUIRED:
                raise ValueError(f"the configuration has no {name!r}; a DeepSeek-V3 configuration names "
                                 f"{', '.join(_CONFIG_FIELDS)}")
            return value

        rope, rope_field = field("rope_parameters", None), "rope_parameters"
        if not rope:  # a config.json of transformers 4's format: rope_theta and rope_scaling apart
            rope_field = "rope_scaling"
            rope = dict(field("rope_scaling", None) or {}, rope_theta=field("rope_theta", 10000.0))
        if not isinstance(rope, Mapping):
            raise ValueError(f"{rope_field} must be a mapping of the rotary settings; got {rope!r}")
        rope_type = rope.get("rope_type", rope.get("type")) or "default"
        if rope_type != "default":
            raise ValueError(
                f"{rope_field}={dict(rope)!r}: rope_type {rope_type!r} is not implemented here; this module "
                f"computes plain RoPE (rope_type 'default'), so the checkpoint's scaled frequencies and "
                f"softmax factor (mscale) would be ignored and its weights would compute something else")
        if field("attention_bias", False):
            raise ValueError("attention_bias=True: this module's projections have no biases (DeepSeek-V3's "
                             "configuration has attention_bias=False); allowed: attention_bias=False")
        interleave = field("rope_interleave", True)
        if interleave is not None and not isinstance(interleave, (bool, np.bool_)):
            raise ValueError(f"rope_interleave must be True, False or None (read as False, as Hugging Face "
                             f"does); got rope_interleave={interleave!r}")
        return cls(d_model=field("hidden_size"), num_heads=field("num_attention_heads"),
                   kv_lora_rank=field("kv_lora_rank"), qk_nope_head_dim=field("qk_nope_head_dim"),
                   qk_rope_head_dim=field("qk_rope_head_dim"), v_head_dim=field("v_head_dim"),
                   q_lora_rank=field("q_lora_rank"), rope_base=rope.get("rope_theta", 10000.0),
                   rope_interleave=bool(interleave))

    def queries(self, x, positions):
        """``x (B, N, d_model)`` -> ``q_nope (B, H, N, d_nope)``, ``q_rope (B, H, N, d_rope)``.

        ``q_rope`` is rotated by ``positions`` ``(N,)`` in the module's pairing (``rope_convention``).
        """
        b, n, _ = x.shape
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(b, n, self.num_heads, self.qk_head_dim).transpose(1, 2)  # (B, H, N, d_nope + d_rope)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_rope = apply_rope(q_rope, positions, self.rope_base, self.rope_convention)  # (B, H, N, d_rope)
        return q_nope, q_rope  # (B, H, N, d_nope), (B, H, N, d_rope)

    def latents(self, x, positions):
        """``x (B, N, d_model)`` -> what is cached: ``latent (B, N, r)`` (normalised), ``rope_key (B, N, d_rope)``.

        ``rope_key`` is rotated by ``positions`` ``(N,)`` in the module's pairing, entries in
        their original order (Hugging Face caches the same numbers of an interleaved key with
        the even entries first).
        """
        c, k_rope = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_rope = apply_rope(k_rope, positions, self.rope_base, self.rope_convention)  # (B, N, d_rope)
        return self.kv_a_layernorm(c), k_rope  # (B, N, r), (B, N, d_rope)

    def up_projections(self):
        """``(W_uk, W_uv)``: ``(H, d_nope, r)`` and ``(H, d_v, r)``, the heads' rows of ``kv_b_proj``."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]  # (H, d_nope, r), (H, d_v, r)

    def forward(self, x, *, causal=True, cache=None, absorb=False, need_weights=False):
        """Attention of the N tokens of ``x`` over themselves and the cache.

        Args:
            x: ``(B, N, d_model)``; positions continue from ``len(cache)``.
            causal: bottom-right aligned causal mask.
            cache: optional :class:`MLACache`, appended to.
            absorb: compute scores and outputs on the latents (the up-projections folded into
                the query and the output); equal to the plain form, which first rebuilds every
                head's keys and values.
            need_weights: also return the weights ``(B, H, N, T + N)``.

        Returns:
            ``(B, N, d_model)``, or ``(out, weights)``.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be a tensor (B, N, d_model={self.d_model}); got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        b, n, _ = x.shape
        start = 0 if cache is None else len(cache)
        positions = np.arange(start, start + n)  # (N,)
        q_nope, q_rope = self.queries(x, positions)  # (B, H, N, d_nope), (B, H, N, d_rope)
        latent, k_rope = self.latents(x, positions)  # (B, N, r), (B, N, d_rope)
        if cache is not None:
            latent, k_rope = cache.append(latent, k_rope)  # (B, T + N, r), (B, T + N, d_rope)
        t = latent.shape[1]
        scale = 1.0 / math.sqrt(self.qk_head_dim)
        rope_scores = q_rope @ k_rope[:, None].transpose(-1, -2)  # (B, H, N, T + N): the shared key
        w_uk, w_uv = self.up_projections()  # (H, d_nope, r), (H, d_v, r)
        if absorb:
            q_latent = torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)  # (B, H, N, r): W_uk folded into q
            scores = q_latent @ latent[:, None].transpose(-1, -2)  # (B, H, N, T + N)
        else:
            kv = self.kv_b_proj(latent).view(b, t, self.num_heads, -1).transpose(1, 2)  # (B, H, T + N, d_nope + d_v)
            k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)  # (B, H, T + N, .) each
            scores = q_nope @ k_nope.transpose(-1, -2)  # (B, H, N, T + N)
        scores = (scores + rope_scores) * scale  # (B, H, N, T + N)
        if causal:
            allowed = torch.ones(n, t, dtype=torch.bool, device=x.device).tril(diagonal=t - n)  # (N, T + N)
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, H, N, T + N)
        if absorb:
            z_latent = weights @ latent[:, None]  # (B, H, N, r): mix the latents first
            z = torch.einsum("bhnr,hvr->bhnv", z_latent, w_uv)  # (B, H, N, d_v): W_uv after the sum
        else:
            z = weights @ v  # (B, H, N, d_v)
        out = self.o_proj(z.transpose(1, 2).reshape(b, n, self.num_heads * self.v_head_dim))  # (B, N, d_model)
        return (out, weights) if need_weights else out
