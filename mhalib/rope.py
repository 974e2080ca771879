"""Rotary position embeddings (RoPE, Su et al. 2021, *RoFormer*): positions by rotation.

Each query and key vector of a head is cut into d_head / 2 pairs; pair i of the vector at
position p is rotated by the angle ``p * theta_i`` with ``theta_i = base ** (-2 i / d_head)``
(base 10000). A rotation by ``p * theta`` of the query against one by ``s * theta`` of the key
leaves their dot product depending on ``p - s`` only: the score sees the offset, not the
absolute positions.

Two ways of choosing the pairs are in use, and a checkpoint is written for one of them:

* ``"half"`` (Hugging Face's ``rotate_half``, Llama): pair i is ``(x[i], x[i + d/2])``;
* ``"interleaved"`` (the paper, Meta's original Llama code, GPT-J): pair i is ``(x[2i], x[2i + 1])``.

:func:`interleaved_to_half` is the permutation between them: reorder the rows of each head of
W_q and W_k with it (:func:`permute_heads_for_half`) and a model written for interleaved pairs
computes the same scores with ``rotate_half``.

* :func:`rope_angles`, :func:`apply_rope`: the rotation, NumPy arrays or torch tensors.
* :func:`rope_decode_step`: one NumPy decoding step of grouped-query attention with a cache
  of rotated keys (the reference of exercise 09).
* :class:`RotaryGroupedQueryAttention`: ``mhalib.attention.GroupedQueryAttention`` with
  RoPE; with a :class:`mhalib.kv_cache.KVCache` the positions continue from the cache length.

"""

from __future__ import annotations

import numpy as np
import torch

from mhalib.attention import GroupedQueryAttention
from mhalib.kv_cache import check_decode_inputs
from mhalib.np_attention import merge_heads, scaled_dot_product_attention, split_heads
from mhalib.validation import check_divisible

__all__ = [
    "CONVENTIONS",
    "rope_angles",
    "apply_rope",
    "interleaved_to_half",
    "permute_heads_for_half",
    "rope_decode_step",
    "RotaryGroupedQueryAttention",
]

CONVENTIONS = ("half", "interleaved")


def _check_head_dim(head_dim):
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"RoPE rotates pairs, so head_dim must be an even integer >= 2; got head_dim={head_dim!r}")
    return int(head_dim)


def rope_angles(positions, head_dim, base=10000.0):
    """The rotation angles ``p * theta_i``, ``theta_i = base ** (-2 i / head_dim)``, in float64.

    Args:
        positions: ``(N,)`` integer positions (any integers; decoding starts past the cache).
        head_dim: d_head, even.
        base: 10000 in the paper and in Llama 2 (Llama 3 uses 500000).

    Returns:
        ``(N, head_dim // 2)`` float64 array of angles in radians.
    """
    head_dim = _check_head_dim(head_dim)
    if not base > 1:
        raise ValueError(f"base must be a number above 1; got base={base!r}")
    positions = np.asarray(positions, dtype=np.float64).reshape(-1)  # (N,)
    inv_freq = float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (d/2,)
    return positions[:, None] * inv_freq[None, :]  # (N, d/2)


def apply_rope(x, positions, base=10000.0, convention="half"):
    """Rotate every pair of ``x`` by its position's angle.

    Args:
        x: ``(..., N, head_dim)``: NumPy array or torch tensor (queries or keys of any heads).
        positions: ``(N,)`` the position of each of the N vectors.
        base: see :func:`rope_angles`.
        convention: ``"half"`` (pairs ``i, i + d/2``, Hugging Face's ``rotate_half``) or
            ``"interleaved"`` (pairs ``2i, 2i + 1``, the paper's).

    Returns:
        Same type, shape and dtype as ``x``: the rotated vectors (lengths unchanged).
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {', '.join(map(repr, CONVENTIONS))}; got {convention!r}")
    shape = tuple(x.shape)
    if len(shape) < 2:
        raise ValueError(f"x must be (..., N, head_dim); got shape {shape}")
    n, d = shape[-2], shape[-1]
    positions = np.asarray(positions)
    if positions.shape != (n,):
        raise ValueError(f"positions must be ({n},), one per vector of x {shape}; got shape {positions.shape}")
    angles = rope_angles(positions, d, base)  # (N, d/2)
    cos, sin = np.cos(angles), np.sin(angles)  # (N, d/2) each
    if isinstance(x, np.ndarray):
        cos, sin = cos.astype(np.result_type(x, np.float32)), sin.astype(np.result_type(x, np.float32))
        cat, stack = np.concatenate, np.stack
    else:
        cos = torch.as_tensor(cos, dtype=x.dtype, device=x.device)  # (N, d/2)
        sin = torch.as_tensor(sin, dtype=x.dtype, device=x.device)  # (N, d/2)
        cat = lambda ts, axis: torch.cat(ts, dim=axis)  # noqa: E731
        stack = lambda ts, axis: torch.stack(ts, dim=axis)  # noqa: E731
    if convention == "half":
        x1, x2 = x[..., : d // 2], x[..., d // 2:]  # (..., N, d/2) each
        return cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)  # (..., N, d)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., N, d/2): even and odd entries
    pairs = stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)  # (..., N, d/2, 2)
    return pairs.reshape(shape)  # (..., N, d): back to 2i, 2i + 1


def interleaved_to_half(head_dim):
    """The permutation ``perm`` of one head's entries from interleaved to half pairs.

    ``x[..., perm]`` puts the even entries first, then the odd ones, so interleaved pair i,
    ``(x[2i], x[2i + 1])``, becomes half pair i, ``(y[i], y[i + d/2])``. Hence
    ``apply_rope(x[..., perm], p, convention="half") == apply_rope(x, p, convention="interleaved")[..., perm]``,
    and since permuting both q and k leaves ``q . k`` unchanged, the scores agree.

    Returns:
        ``(head_dim,)`` int array ``[0, 2, 4, ..., 1, 3, 5, ...]``.
    """
    head_dim = _check_head_dim(head_dim)
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def permute_heads_for_half(weight, num_heads):
    """Reorder the output rows of each head of a q or k projection for the ``half`` convention.

    Args:
        weight: ``nn.Linear`` weight ``(num_heads * head_dim, d_model)`` (torch) or NumPy array
            of that shape, written for interleaved pairs.
        num_heads: heads in the projection (H for W_q, g for W_k).

    Returns:
        The same kind of object, shape unchanged: row ``h * head_dim + j`` is the old row
        ``h * head_dim + perm[j]`` with ``perm = interleaved_to_half(head_dim)``.
    """
    rows = weight.shape[0]
    check_divisible(rows, num_heads, "rows of the weight", "num_heads")
    head_dim = _check_head_dim(rows // num_heads)
    perm = interleaved_to_half(head_dim)
    index = (np.arange(num_heads)[:, None] * head_dim + perm[None, :]).reshape(-1)  # (H * d_head,)
    if isinstance(weight, np.ndarray):
        return weight[index]
    return weight[torch.as_tensor(index, device=weight.device)]


def rope_decode_step(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads, base=10000.0):
    """One decoding step of grouped-query attention with RoPE and a cache of rotated keys (NumPy).

    The new token's position is ``T = k_cache.shape[2]``, the number of tokens already
    cached (positions continue from the cache; they do not restart at 0). Its query and key
    are rotated by position T (``half`` convention); the key is rotated **before** it is
    appended, so the cache holds rotated keys and nothing cached is rotated again. Query head h
    reads key/value head ``h // (H // g)`` (``repeat_interleave`` order).

    Args:
        x_new: ``(B, 1, d_model)``.
        k_cache, v_cache: ``(B, g, T, d_head)``; T may be 0.
        w_q, w_o: ``(d_model, d_model)``; w_k, w_v: ``(d_model, g * d_head)`` (``x @ W``).
        num_heads: H; d_head = d_model / H, even.

    Returns:
        ``(out, k_cache, v_cache)``: ``(B, 1, d_model)`` and new caches ``(B, g, T + 1, d_head)``.
    """
    x_new, k_cache, v_cache, num_kv_heads, head_dim = check_decode_inputs(
        x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads)
    _check_head_dim(head_dim)

    position = np.array([k_cache.shape[2]])  # (1,): continues from the cache
    q = apply_rope(split_heads(x_new @ w_q, num_heads), position, base)  # (B, H, 1, d_head)
    k = apply_rope(split_heads(x_new @ w_k, num_kv_heads), position, base)  # (B, g, 1, d_head), rotated
    v = split_heads(x_new @ w_v, num_kv_heads)  # (B, g, 1, d_head)
    k_cache = np.concatenate([k_cache, k.astype(k_cache.dtype)], axis=2)  # (B, g, T + 1, d_head)
    v_cache = np.concatenate([v_cache, v.astype(v_cache.dtype)], axis=2)  # (B, g, T + 1, d_head)
    group = num_heads // num_kv_heads
    k_all = np.repeat(k_cache, group, axis=1)  # (B, H, T + 1, d_head): 0, 0, 1, 1, ... (interleaved)
    v_all = np.repeat(v_cache, group, axis=1)  # (B, H, T + 1, d_head)
    z, _ = scaled_dot_product_attention(q, k_all, v_all)  # (B, H, 1, d_head)
    return merge_heads(z) @ w_o, k_cache, v_cache  # (B, 1, d_model)


class RotaryGroupedQueryAttention(GroupedQueryAttention):
    """Grouped-query attention with rotary positions (Llama's attention, ``half`` convention).

    Queries and keys are rotated after the projection and before attention; the keys are
    rotated **before** they go into the cache, so the cache holds rotated keys. With a
    :class:`mhalib.kv_cache.KVCache` holding T positions, the N new tokens sit at positions
    T .. T + N - 1: prefill then decode equals one full causal pass. g K/V heads are rotated,
    one per group, however many query heads read each.

    Args:
        d_model, num_heads, num_kv_heads, bias: as :class:`mhalib.attention.GroupedQueryAttention`.
        rope_base: the base of the frequencies (10000).
    """

    def __init__(self, d_model, num_heads, num_kv_heads, bias=False, rope_base=10000.0):
        super().__init__(d_model, num_heads, num_kv_heads, bias=bias)
        _check_head_dim(self.head_dim)
        self.rope_base = float(rope_base)

    def forward(self, x, *, causal=True, attn_mask=None, need_weights=False, kv_cache=None):
        """As :meth:`GroupedQueryAttention.forward` (causal by default), with rotated q and k.

        Returns:
            ``(B, N, d_model)``, or ``(output, weights)`` with weights ``(B, H, N, N_k)``.
        """
        self._check_input(x)
        b, n, _ = x.shape
        start = 0 if kv_cache is None else len(kv_cache)  # positions continue from the cache
        positions = np.arange(start, start + n)  # (N,)
        q, k, v = self.project(x)  # (B, H, N, d), (B, g, N, d), (B, g, N, d)
        q = apply_rope(q, positions, self.rope_base)  # (B, H, N, d)
        k = apply_rope(k, positions, self.rope_base)  # (B, g, N, d): one rotated K head per group
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # (B, g, T + N, d) each: rotated keys are cached
        result = self.attend(q, k, v, causal=causal, attn_mask=attn_mask, need_weights=need_weights)
        out, weights = result if need_weights else (result, None)
        out = self.o_proj(out.transpose(1, 2).reshape(b, n, self.d_model))  # (B, N, d_model)
        return (out, weights) if need_weights else out
