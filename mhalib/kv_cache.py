"""The KV cache: what decoding keeps from step to step, and how many bytes that costs.

* :func:`kv_cache_bytes`: the size formula, ``2 x layers x kv_heads x head_dim x tokens
  x batch x bytes_per_element`` (the 2 is one tensor for keys, one for values).
* :data:`MODEL_CONFIGS`: attention shapes of real models, each with its source.
* :class:`KVCache`: one layer's cache for the torch modules; append a step, read back.
* :func:`decode_step`: one decoding step of multi-head attention in NumPy, with a cache.

Shapes: B batch, T cached positions, H query heads, g key/value heads, d_head = d_model / H.
``import mhalib.kv_cache`` does not import torch; :class:`KVCache` does, on first use.
"""

from __future__ import annotations

import numpy as np

from mhalib.data import read_json
from mhalib.np_attention import merge_heads, scaled_dot_product_attention, split_heads
from mhalib.validation import check_divisible

__all__ = [
    "cached_length",
    "check_decode_inputs",
    "kv_cache_bytes",
    "MODEL_CONFIGS",
    "model_kv_bytes",
    "format_bytes",
    "KVCache",
    "decode_step",
]


def _positive_int(value, name, *, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer; got {value!r}")
    low = 0 if allow_zero else 1
    if value < low:
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} must be {kind} integer; got {name}={value}")
    return int(value)


def kv_cache_bytes(num_layers, num_kv_heads, head_dim, num_tokens, batch_size=1, bytes_per_element=2):
    """Bytes of the KV cache: keys and values of every layer, KV head and cached token.

    ``2 * num_layers * num_kv_heads * head_dim * num_tokens * batch_size * bytes_per_element``.
    ``bytes_per_element`` is 2 for fp16/bf16 (the default), 4 for fp32, 1 for int8.

    Example: Llama-2-7B (32 layers, 32 KV heads, head_dim 128) in fp16 keeps
    ``kv_cache_bytes(32, 32, 128, 1) == 524_288`` bytes (512 KiB) per token.

    Returns:
        ``int`` (Python integers do not overflow, so long contexts are exact).
    """
    num_layers = _positive_int(num_layers, "num_layers")
    num_kv_heads = _positive_int(num_kv_heads, "num_kv_heads")
    head_dim = _positive_int(head_dim, "head_dim")
    num_tokens = _positive_int(num_tokens, "num_tokens", allow_zero=True)
    batch_size = _positive_int(batch_size, "batch_size")
    bytes_per_element = _positive_int(bytes_per_element, "bytes_per_element")
    return 2 * num_layers * num_kv_heads * head_dim * num_tokens * batch_size * bytes_per_element


#: Attention shapes of real models, each with its source (``mhalib/data/model_configs.json``).
#: ``head_dim = d_model / num_heads`` in every one; ``sliding_window``, where given: each token
#: attends to that many tokens at most, so the cache never needs to hold more than that many.
MODEL_CONFIGS = read_json("model_configs.json")["models"]


def model_kv_bytes(name, num_tokens=1, batch_size=1, bytes_per_element=2):
    """KV-cache bytes of a model in :data:`MODEL_CONFIGS` (``name`` as listed there)."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_CONFIGS)}")
    c = MODEL_CONFIGS[name]
    return kv_cache_bytes(c["num_layers"], c["num_kv_heads"], c["head_dim"], num_tokens,
                          batch_size, bytes_per_element)


def format_bytes(n):
    """Human-readable binary units: ``format_bytes(524288) == '512 KiB'``, ``'2 GiB'``, ``'1.5 MiB'``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            text = f"{n:.1f}".rstrip("0").rstrip(".") if n != int(n) else f"{int(n)}"
            return f"{text} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class KVCache:
    """One attention layer's KV cache for the torch modules.

    Keys and values live in preallocated buffers ``(B, g, capacity, d_head)`` that double
    when full, so appending one step copies one step (not the whole history, as
    ``torch.cat`` would on every step).

    Use::

        cache = KVCache()
        y = layer(x_prompt, causal=True, kv_cache=cache)     # fills T positions
        y = layer(x_next, causal=True, kv_cache=cache)       # appends one, attends to T + 1

    Attributes:
        keys, values: ``(B, g, T, d_head)`` views of what is cached (``None`` while empty).
    """

    def __init__(self, capacity=256):
        self.capacity = _positive_int(capacity, "capacity")
        self._k = self._v = None
        self._len = 0

    def __len__(self):
        return self._len

    def __repr__(self):
        shape = None if self._k is None else (*self._k.shape[:2], self._len, self._k.shape[-1])
        return f"KVCache(tokens={self._len}, shape={shape}, nbytes={self.nbytes})"

    def reset(self):
        """Forget every cached position (keeps nothing)."""
        self._k = self._v = None
        self._len = 0

    def truncate(self, length):
        """Forget the positions from ``length`` on (keep the first ``length``)."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self._len:
            raise ValueError(f"length must be an int in 0 .. {self._len} (the positions cached); got {length!r}")
        self._len = length

    def append(self, k, v):
        """Append ``k, v`` of shape ``(B, g, N_new, d_head)``; return all keys and values so far.

        Returns:
            ``(keys, values)``, each ``(B, g, T + N_new, d_head)`` (views of the buffers).
        """
        import torch

        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            raise ValueError(f"k and v must be torch tensors; got {type(k).__name__}, {type(v).__name__}")
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(
                f"k and v must both be (B, g, N_new, d_head); got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        b, g, n_new, d = k.shape
        if self._k is not None:
            want = (self._k.shape[0], self._k.shape[1], self._k.shape[3])
            if (b, g, d) != want or k.dtype != self._k.dtype:
                raise ValueError(
                    f"this cache holds (B, g, T, d_head) = ({want[0]}, {want[1]}, T, {want[2]}) "
                    f"{self._k.dtype}; got a step of {tuple(k.shape)} {k.dtype}"
                )
        need = self._len + n_new
        if self._k is None or need > self._k.shape[2]:
            cap = max(self.capacity, need)
            while cap < need:
                cap *= 2
            if self._k is not None:
                cap = max(cap, 2 * self._k.shape[2])
            new_k = k.new_empty(b, g, cap, d)  # (B, g, capacity, d_head)
            new_v = v.new_empty(b, g, cap, d)  # (B, g, capacity, d_head)
            if self._k is not None:
                new_k[:, :, : self._len] = self._k[:, :, : self._len]
                new_v[:, :, : self._len] = self._v[:, :, : self._len]
            self._k, self._v = new_k, new_v
        self._k[:, :, self._len: need] = k
        self._v[:, :, self._len: need] = v
        self._len = need
        return self.keys, self.values

    @property
    def keys(self):
        """The cached keys ``(B, g, T, d_head)``, or ``None`` while empty."""
        return None if self._k is None else self._k[:, :, : self._len]  # (B, g, T, d_head)

    @property
    def values(self):
        """The cached values ``(B, g, T, d_head)``, or ``None`` while empty."""
        return None if self._v is None else self._v[:, :, : self._len]  # (B, g, T, d_head)

    @property
    def nbytes(self):
        """Bytes of the cached keys and values (what :func:`kv_cache_bytes` predicts for one layer)."""
        if self._k is None:
            return 0
        b, g, _, d = self._k.shape
        return 2 * b * g * self._len * d * self._k.element_size()


def cached_length(kv_caches, num_layers):
    """How many positions ``kv_caches`` (a model's list of one :class:`KVCache` per layer, or
    None) already hold; ValueError unless it is one cache per layer, all of one length."""
    if kv_caches is None:
        return 0
    if (not isinstance(kv_caches, (list, tuple)) or len(kv_caches) != num_layers
            or not all(isinstance(cache, KVCache) for cache in kv_caches)):
        got = [type(c).__name__ for c in kv_caches] if isinstance(kv_caches, (list, tuple)) else type(kv_caches).__name__
        raise ValueError(f"kv_caches must be a list of {num_layers} KVCache, one per layer "
                         f"(mhalib.generate.new_caches(model)); got {got}")
    lengths = {len(cache) for cache in kv_caches}
    if len(lengths) != 1:
        raise ValueError(f"the layers' caches hold different numbers of positions: {sorted(lengths)}")
    return lengths.pop()


def check_decode_inputs(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads):
    """Validate the inputs of one decoding step (:func:`decode_step` and RoPE's).

    Returns:
        ``(x_new, k_cache, v_cache, num_kv_heads, head_dim)``, the arrays as NumPy arrays.
        Raises ``ValueError`` naming the shape given and the one expected.
    """
    x_new = np.asarray(x_new)
    k_cache, v_cache = np.asarray(k_cache), np.asarray(v_cache)
    if x_new.ndim != 3 or x_new.shape[1] != 1:
        raise ValueError(f"x_new must be (B, 1, d_model); got shape {x_new.shape}")
    b, _, d_model = x_new.shape
    check_divisible(d_model, num_heads, "d_model", "num_heads")
    head_dim = d_model // num_heads
    for name, w in (("w_q", w_q), ("w_o", w_o)):
        if np.shape(w) != (d_model, d_model):
            raise ValueError(f"{name} must be ({d_model}, {d_model}) (x @ W convention); got {np.shape(w)}")
    if np.ndim(w_k) != 2 or np.shape(w_k) != np.shape(w_v) or np.shape(w_k)[0] != d_model \
            or np.shape(w_k)[1] % head_dim:
        raise ValueError(
            f"w_k and w_v must be ({d_model}, g * {head_dim}); got {np.shape(w_k)} and {np.shape(w_v)}"
        )
    num_kv_heads = np.shape(w_k)[1] // head_dim
    check_divisible(num_heads, num_kv_heads, "num_heads", "num_kv_heads")
    want = (b, num_kv_heads, head_dim)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.ndim != 4 or (c.shape[0], c.shape[1], c.shape[3]) != want:
            raise ValueError(f"{name} must be (B={b}, g={num_kv_heads}, T, d_head={head_dim}); got {c.shape}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must match; got {k_cache.shape} and {v_cache.shape}")
    return x_new, k_cache, v_cache, num_kv_heads, head_dim


def decode_step(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads):
    """One step of autoregressive decoding with a KV cache (NumPy, multi-head attention).

    The new token's key and value are projected once and appended to the cache; its
    query then attends to every cached position and to itself (no mask is needed: the
    newest token may see everything before it). Equal to the last row of full causal
    attention over the whole sequence, at O(T) cost instead of O(T^2).

    Args:
        x_new: ``(B, 1, d_model)`` the newest token's input.
        k_cache, v_cache: ``(B, H, T, d_head)`` keys and values of the T earlier tokens
            (T may be 0). With ``w_k`` of width ``g * d_head`` the caches are ``(B, g, T, d_head)``
            and query head h reads key/value head ``h // (H // g)``.
        w_q, w_o: ``(d_model, d_model)``; w_k, w_v: ``(d_model, d_model)`` for multi-head
            attention, or ``(d_model, g * d_head)`` (``x @ W`` convention).
        num_heads: H; must divide d_model.

    Returns:
        ``(out, k_cache, v_cache)``: ``out`` is ``(B, 1, d_model)``; the caches are new
        arrays ``(B, H, T + 1, d_head)``.
    """
    x_new, k_cache, v_cache, num_kv_heads, head_dim = check_decode_inputs(
        x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads)

    q = split_heads(x_new @ w_q, num_heads)  # (B, H, 1, d_head)
    k = split_heads(x_new @ w_k, num_kv_heads)  # (B, g, 1, d_head)
    v = split_heads(x_new @ w_v, num_kv_heads)  # (B, g, 1, d_head)
    k_cache = np.concatenate([k_cache, k.astype(k_cache.dtype)], axis=2)  # (B, g, T + 1, d_head)
    v_cache = np.concatenate([v_cache, v.astype(v_cache.dtype)], axis=2)  # (B, g, T + 1, d_head)
    group = num_heads // num_kv_heads
    k_all = np.repeat(k_cache, group, axis=1)  # (B, H, T + 1, d_head)
    v_all = np.repeat(v_cache, group, axis=1)  # (B, H, T + 1, d_head)
    z, _ = scaled_dot_product_attention(q, k_all, v_all)  # (B, H, 1, d_head)
    out = merge_heads(z) @ w_o  # (B, 1, d_model)
    return out, k_cache, v_cache
