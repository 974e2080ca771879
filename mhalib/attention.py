"""Attention in PyTorch: multi-head, multi-query and grouped-query attention modules.

The attribute names follow Hugging Face's Llama attention (``q_proj``, ``k_proj``,
``v_proj``, ``o_proj``, ``num_key_value_heads`` is our ``num_kv_heads``), so real
checkpoints map onto these modules by name.

Shapes: B batch, N positions, H query heads, g key/value heads, d_head = d_model / H.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mhalib.validation import check_divisible

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "causal_allowed",
    "normalize_mask",
    "repeat_kv",
    "grouped_attention",
    "GroupedQueryAttention",
    "MultiHeadAttention",
    "MultiQueryAttention",
    "to_nn_multihead_attention",
]


def causal_allowed(n_q, n_k=None, *, device=None):
    """Boolean causal mask, ``True`` where attention is allowed.

    Named apart from :func:`mhalib.np_attention.causal_mask`, the *additive* mask (0 where
    allowed, ``-inf`` where not): a boolean and an additive mask never share a name.

    With ``n_q < n_k`` (decoding with a cache) the mask is aligned to the bottom
    right: the last query sees every key, query i sees keys ``0 .. n_k - n_q + i``.

    Returns:
        ``(n_q, n_k)`` bool tensor.
    """
    n_k = n_q if n_k is None else n_k
    if n_q < 1 or n_k < n_q:
        raise ValueError(f"causal_allowed needs 1 <= n_q <= n_k; got n_q={n_q}, n_k={n_k}")
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(diagonal=n_k - n_q)


def normalize_mask(attn_mask, batch_size, num_heads, n_q, n_k, dtype):
    """Turn a user mask into an additive float mask that broadcasts to (B, H, N_q, N_k).

    Allowed forms: ``(N_q, N_k)`` (every batch element and head) or 4-D
    ``(B or 1, H or 1, N_q, N_k)``. A boolean mask means ``True`` = may attend (the
    convention of ``F.scaled_dot_product_attention``); a float mask is added to the
    scores (0 = keep, ``-inf`` = block). A 3-D mask is refused as ambiguous: it could
    be (B, N, N) or (H, N, N), and both would broadcast wrongly against (B, H, N, N).
    """
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, torch.Tensor):
        raise ValueError(f"attn_mask must be a torch.Tensor; got {type(attn_mask).__name__}")
    shape = tuple(attn_mask.shape)
    target = (batch_size, num_heads, n_q, n_k)
    if attn_mask.dim() == 3:
        raise ValueError(
            f"attn_mask of shape {shape} is ambiguous: a 3-D mask could mean (B, N, N) or "
            f"(H, N, N). Pass ({n_q}, {n_k}) for all, or a 4-D mask such as "
            f"({batch_size}, 1, {n_q}, {n_k}) or (1, {num_heads}, {n_q}, {n_k})"
        )
    ok = attn_mask.dim() in (2, 4) and all(
        m in (1, t) for m, t in zip(reversed(shape), reversed(target))
    ) and shape[-2:] == (n_q, n_k)
    if not ok:
        raise ValueError(
            f"attn_mask of shape {shape} does not fit the scores of shape {target}; allowed: "
            f"({n_q}, {n_k}), or 4-D ({batch_size} or 1, {num_heads} or 1, {n_q}, {n_k})"
        )
    if attn_mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=dtype, device=attn_mask.device)
        return torch.where(attn_mask, zero, torch.tensor(float("-inf"), dtype=dtype))
    if not attn_mask.is_floating_point():
        raise ValueError(f"attn_mask must be bool or floating point; got {attn_mask.dtype}")
    return attn_mask.to(dtype)


def repeat_kv(x, n_rep):
    """Repeat each key/value head ``n_rep`` times: ``(B, g, N, d) -> (B, g * n_rep, N, d)``.

    Equivalent to ``torch.repeat_interleave(x, n_rep, dim=1)``: head j appears at
    positions ``j * n_rep .. (j + 1) * n_rep - 1``, so query head h reads key/value
    head ``h // n_rep``. Built with ``expand`` and one ``reshape`` (the copy happens
    in the reshape).
    """
    b, g, n, d = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(b, g, n_rep, n, d)  # (B, g, n_rep, N, d), no copy
    return x.reshape(b, g * n_rep, n, d)  # (B, H, N, d)


#: The kernels :meth:`GroupedQueryAttention.attend` can use (see its docstring).
ATTN_IMPLEMENTATIONS = ("auto", "eager", "sdpa")


def grouped_attention(q, k, v, *, causal=False, attn_mask=None, need_weights=False):
    """Attention of H query heads against g shared key/value heads, without repeating K/V.

    The H/g query heads of a group are stacked as rows of one query matrix,
    ``(B, H, N_q, d) -> (B, g, H/g * N_q, d)``, so each key/value head meets all the
    queries that share it in one matrix product: K and V are read once, never copied
    H/g times (for a single decoding query this turns H/g matrix-vector products,
    each re-reading the cache, into one small matrix product). Equivalent to
    ``F.scaled_dot_product_attention(q, k, v, is_causal=..., enable_gqa=True)``
    (with causal masking aligned to the bottom right when ``N_q < N_k``), and to
    ``repeat_kv`` followed by ordinary attention.

    Args:
        q: ``(B, H, N_q, d_head)``.
        k, v: ``(B, g, N_k, d_head)`` with g dividing H.
        causal: bottom-right-aligned causal mask (see :func:`causal_allowed`).
        attn_mask: optional additive float mask broadcasting to ``(B, H, N_q, N_k)``
            (use :func:`normalize_mask` to build one from user input).
        need_weights: also return the attention weights.

    Returns:
        ``(B, H, N_q, d_head)``, or ``(out, weights)`` with weights ``(B, H, N_q, N_k)``.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"grouped_attention needs 4-D q (B, H, N_q, d) and k, v (B, g, N_k, d); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, h, n_q, d = q.shape
    g, n_k = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != b or k.shape[-1] != d:
        raise ValueError(
            f"k and v must both be (B={b}, g, N_k, d={d}); got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    check_divisible(h, g, "num_heads", "num_kv_heads")
    rep = h // g
    # The H/g query heads of a group become H/g * N_q rows against one K/V head.
    qg = (q * (1.0 / math.sqrt(d))).reshape(b, g, rep * n_q, d)  # (B, g, H/g * N_q, d)
    scores = qg @ k.transpose(-1, -2)  # (B, g, H/g * N_q, N_k): one product per K/V head
    if causal:
        allowed = causal_allowed(n_q, n_k, device=q.device)  # (N_q, N_k)
        scores.view(b, g, rep, n_q, n_k).masked_fill_(~allowed, float("-inf"))
    if attn_mask is not None:
        scores = (scores.view(b, h, n_q, n_k) + attn_mask).view(b, g, rep * n_q, n_k)  # (B, g, H/g * N_q, N_k)
    weights = torch.softmax(scores, dim=-1)  # (B, g, H/g * N_q, N_k)
    out = weights @ v  # (B, g, H/g * N_q, d): each K/V head read once for its whole group
    out = out.view(b, h, n_q, d)  # (B, H, N_q, d)
    return (out, weights.view(b, h, n_q, n_k)) if need_weights else out


class GroupedQueryAttention(nn.Module):
    """Grouped-query attention (Ainslie et al., 2023).

    H query heads in g groups; the heads of a group share one key/value head.
    ``num_kv_heads == num_heads`` is multi-head attention (Vaswani et al., 2017);
    ``num_kv_heads == 1`` is multi-query attention (Shazeer, 2019).

    ``attn_implementation`` names the kernel: ``"eager"`` (the formula, :func:`grouped_attention`),
    ``"sdpa"`` (PyTorch's fused kernel) or ``"auto"`` (the measured faster one; see :meth:`attend`).
    All three give the same numbers to float rounding.

    Attributes:
        q_proj: ``nn.Linear(d_model, d_model)``.
        k_proj, v_proj: ``nn.Linear(d_model, num_kv_heads * head_dim)``.
        o_proj: ``nn.Linear(d_model, d_model)``.
        attn_implementation: the kernel, as given (it may be changed on the module).
    """

    def __init__(self, d_model, num_heads, num_kv_heads, bias=False, attn_implementation="auto"):
        super().__init__()
        check_divisible(d_model, num_heads, "d_model", "num_heads")
        check_divisible(num_heads, num_kv_heads, "num_heads", "num_kv_heads")
        if attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation must be one of {', '.join(map(repr, ATTN_IMPLEMENTATIONS))}; "
                             f"got {attn_implementation!r}")
        self.attn_implementation = attn_implementation
        self.d_model = int(d_model)
        self.num_heads = int(num_heads)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = self.d_model // self.num_heads
        kv_dim = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(self.d_model, self.d_model, bias=bias)
        self.k_proj = nn.Linear(self.d_model, kv_dim, bias=bias)
        self.v_proj = nn.Linear(self.d_model, kv_dim, bias=bias)
        self.o_proj = nn.Linear(self.d_model, self.d_model, bias=bias)

    def extra_repr(self):
        """The sizes shown in the module's repr."""
        kernel = "" if self.attn_implementation == "auto" else f", attn_implementation={self.attn_implementation!r}"
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}{kernel}")

    def _check_input(self, x):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"x must be a torch.Tensor of shape (B, N, d_model); got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(
                f"x must be 3-D (B, N, d_model={self.d_model}); got shape {tuple(x.shape)}"
                + (" (add a batch dimension with x.unsqueeze(0))" if x.dim() == 2 else "")
            )
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"x has last dimension {x.shape[-1]} but this module has d_model={self.d_model}"
            )

    def project(self, x, qk_input=None):
        """Project and split: ``x (B, N, d_model)`` -> q ``(B, H, N, d)``, k, v ``(B, g, N, d)``.

        ``qk_input`` ``(B, N, d_model)``, if given, is what the queries and keys are computed
        from instead of ``x`` (the values still read ``x``): positions that help a head *find*
        a token without being *moved* with it (:class:`mhalib.decoder.Decoder`'s
        ``positions="queries_keys"``).
        """
        b, n, _ = x.shape
        qk = x if qk_input is None else qk_input
        q = self.q_proj(qk).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, N, d)
        k = self.k_proj(qk).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, g, N, d)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, g, N, d)
        return q, k, v

    def attend(self, q, k, v, *, causal=False, attn_mask=None, need_weights=False):
        """Attention over already projected heads; returns ``(B, H, N_q, d)`` (and weights).

        ``q`` is ``(B, H, N_q, d)``, ``k, v`` are ``(B, g, N_k, d)`` with ``N_q <= N_k``
        when ``causal`` (the mask is then aligned to the bottom right, as in decoding).
        The kernel is the module's ``attn_implementation`` (Hugging Face's name for the choice):

        * ``"eager"``: :func:`grouped_attention`, the formula written out, always;
        * ``"sdpa"``: PyTorch's fused ``scaled_dot_product_attention`` with ``enable_gqa``,
          which never forms the ``(N_q, N_k)`` score matrix in full; a request for the
          weights goes to ``"eager"`` (the fused kernel does not return them);
        * ``"auto"`` (the default): the faster of the two as measured on a CPU
          (``benchmarks/bench_decode.py``): ``"eager"`` for one decoding query or the
          weights, ``"sdpa"`` for several queries.
        """
        b, _, n_q, _ = q.shape
        n_k = k.shape[2]
        mask = normalize_mask(attn_mask, b, self.num_heads, n_q, n_k, q.dtype)
        kernel = self.attn_implementation
        if kernel == "auto":
            kernel = "eager" if n_q == 1 else "sdpa"
        if need_weights or kernel == "eager":
            return grouped_attention(q, k, v, causal=causal, attn_mask=mask, need_weights=need_weights)
        if causal and n_q != n_k:
            allowed = causal_allowed(n_q, n_k, device=q.device)  # (N_q, N_k), bottom-right aligned
            blocked = torch.zeros(n_q, n_k, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
            mask = blocked if mask is None else mask + blocked
            causal = False
        gqa = self.num_kv_heads != self.num_heads
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)

    def forward(self, x, *, causal=False, attn_mask=None, need_weights=False, kv_cache=None, qk_input=None,
                z_hook=None, pattern_hook=None):
        """Attend from every position of ``x`` to every position of ``x`` (and of the cache).

        Args:
            x: ``(B, N, d_model)``.
            causal: apply a causal mask (position i sees 0..i). With a cache holding T
                earlier positions, the N new queries sit at positions T..T+N-1 and the
                mask is aligned to the bottom right.
            attn_mask: optional ``(N, N_k)`` or 4-D ``(B|1, H|1, N, N_k)`` mask; bool
                (``True`` = may attend) or additive float. ``N_k`` is N, or T + N with a cache.
            need_weights: also return the attention weights.
            kv_cache: optional :class:`mhalib.kv_cache.KVCache`; this call appends its
                keys and values to it and attends to everything cached so far.
            qk_input: optional ``(B, N, d_model)`` for the queries and keys (see :meth:`project`).
            z_hook: the head contract, for ablation and patching: ``fn(z)`` on the per-head
                outputs ``z`` ``(B, H, N, d_head)`` *before* ``o_proj`` mixes the heads; it
                returns the ``z`` to use (or None to keep it). Zeroing ``z[:, h]`` removes
                exactly head h's contribution.
            pattern_hook: ``fn(weights)`` on the attention weights ``(B, H, N, N_k)``; if it
                returns weights, the heads attend with those (``z`` is recomputed from them
                and this call's values); None keeps them. Forces the eager kernel.

        Returns:
            ``(B, N, d_model)``, or ``(output, weights)`` with weights ``(B, H, N, N_k)``.
        """
        self._check_input(x)
        if qk_input is not None and (not isinstance(qk_input, torch.Tensor) or qk_input.shape != x.shape):
            got = tuple(qk_input.shape) if isinstance(qk_input, torch.Tensor) else type(qk_input).__name__
            raise ValueError(f"qk_input must be a tensor of the shape of x {tuple(x.shape)}; got {got}")
        b, n, _ = x.shape
        q, k, v = self.project(x, qk_input)  # (B, H, N, d), (B, g, N, d), (B, g, N, d)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # (B, g, T + N, d) each
        explicit = need_weights or pattern_hook is not None
        result = self.attend(q, k, v, causal=causal, attn_mask=attn_mask, need_weights=explicit)
        z, weights = result if explicit else (result, None)  # z: (B, H, N, d)
        if pattern_hook is not None:
            patched = pattern_hook(weights)
            if patched is not None:
                weights = patched  # (B, H, N, N_k)
                z = weights @ repeat_kv(v, self.num_heads // self.num_kv_heads)  # (B, H, N, d)
        if z_hook is not None:
            changed = z_hook(z)
            z = z if changed is None else changed  # (B, H, N, d)
        out = self.o_proj(z.transpose(1, 2).reshape(b, n, self.d_model))  # (B, N, d_model)
        return (out, weights) if need_weights else out


class MultiHeadAttention(GroupedQueryAttention):
    """Multi-head attention: every query head has its own key/value head (g = H)."""

    def __init__(self, d_model, num_heads, bias=False, attn_implementation="auto"):
        check_divisible(d_model, num_heads, "d_model", "num_heads")
        super().__init__(d_model, num_heads, num_heads, bias=bias, attn_implementation=attn_implementation)


class MultiQueryAttention(GroupedQueryAttention):
    """Multi-query attention: all query heads share one key/value head (g = 1)."""

    def __init__(self, d_model, num_heads, bias=False, attn_implementation="auto"):
        super().__init__(d_model, num_heads, 1, bias=bias, attn_implementation=attn_implementation)


def to_nn_multihead_attention(module):
    """``nn.MultiheadAttention(batch_first=True)`` computing what ``module`` computes.

    ``module`` is a :class:`GroupedQueryAttention` (or anything with ``q_proj``,
    ``k_proj``, ``v_proj``, ``o_proj``, ``d_model``, ``num_heads``, ``num_kv_heads``).
    With g < H each key/value head is copied to the H/g consecutive query heads that
    share it (``repeat_interleave`` order): GQA equals MHA with repeated K/V heads.
    Biases are copied when the module has them. The result has the module's dtype
    and is in eval mode.

    Returns:
        ``nn.MultiheadAttention(d_model, H, bias=..., batch_first=True)``.
    """
    h, g = module.num_heads, getattr(module, "num_kv_heads", module.num_heads)
    head_dim = module.d_model // h
    bias = module.q_proj.bias is not None
    ref = nn.MultiheadAttention(module.d_model, h, bias=bias, batch_first=True)
    ref = ref.to(module.q_proj.weight.dtype)

    def per_query_head(t):  # (g * d_head, ...) -> (H * d_head, ...)
        return t.reshape(g, head_dim, *t.shape[1:]).repeat_interleave(h // g, dim=0).reshape(h * head_dim, *t.shape[1:])

    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([module.q_proj.weight, per_query_head(module.k_proj.weight),
                                            per_query_head(module.v_proj.weight)]))  # (3 d_model, d_model)
        ref.out_proj.weight.copy_(module.o_proj.weight)  # (d_model, d_model)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([module.q_proj.bias, per_query_head(module.k_proj.bias),
                                              per_query_head(module.v_proj.bias)]))  # (3 d_model,)
            ref.out_proj.bias.copy_(module.o_proj.bias)
    return ref.eval()
