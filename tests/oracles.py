"""Independent oracles for the attention tests: PyTorch's own modules, filled by hand, and loops.

Nothing here imports mhalib: an oracle must share no code with what it checks. A module
under test is only read (its ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` are
``nn.Linear`` layers, weight ``(d_out, d_in)``); its weights are copied into
``torch.nn.MultiheadAttention``, whose ``in_proj_weight`` stacks the query, key and
value weights ``(3 d_model, d_model)`` and whose ``out_proj`` is the output projection.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def kv_rows_for_every_query_head(weight, num_heads, num_kv_heads):
    """``(g * d_head, ...) -> (H * d_head, ...)``: query head h gets the rows of K/V head h // (H / g).

    Built by a loop over query heads (consecutive query heads share a K/V head).
    """
    d_head = weight.shape[0] // num_kv_heads
    group = num_heads // num_kv_heads
    rows = [weight[(h // group) * d_head:(h // group + 1) * d_head] for h in range(num_heads)]  # H x (d_head, ...)
    return torch.cat(rows)  # (H * d_head, ...)


def torch_mha_holding(module, num_heads, num_kv_heads):
    """``nn.MultiheadAttention(batch_first=True)`` in eval mode holding the weights of ``module``.

    With ``num_kv_heads < num_heads`` every K/V head is copied to the query heads that
    share it: grouped-query attention is multi-head attention with repeated K/V heads.
    """
    d_model = module.q_proj.weight.shape[1]
    bias = module.q_proj.bias is not None
    ref = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True, dtype=module.q_proj.weight.dtype)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([
            module.q_proj.weight,  # (d_model, d_model)
            kv_rows_for_every_query_head(module.k_proj.weight, num_heads, num_kv_heads),  # (d_model, d_model)
            kv_rows_for_every_query_head(module.v_proj.weight, num_heads, num_kv_heads),  # (d_model, d_model)
        ]))  # (3 d_model, d_model)
        ref.out_proj.weight.copy_(module.o_proj.weight)  # (d_model, d_model)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([
                module.q_proj.bias,
                kv_rows_for_every_query_head(module.k_proj.bias, num_heads, num_kv_heads),
                kv_rows_for_every_query_head(module.v_proj.bias, num_heads, num_kv_heads),
            ]))  # (3 d_model,)
            ref.out_proj.bias.copy_(module.o_proj.bias)  # (d_model,)
    return ref.eval()


def allowed_by_loop(n_q, n_k=None):
    """``(n_q, n_k)`` bool, True where query i may see key j; built by a loop.

    Bottom-right aligned: the n_q queries are the last n_q of n_k positions, so query i
    sits at position n_k - n_q + i and sees keys 0 .. n_k - n_q + i.
    """
    n_k = n_q if n_k is None else n_k
    allowed = torch.zeros(n_q, n_k, dtype=torch.bool)
    for i in range(n_q):
        for j in range(n_k):
            allowed[i, j] = j <= n_k - n_q + i
    return allowed


def blocked_future(n_q, n_k=None):
    """The causal mask in ``nn.MultiheadAttention``'s convention: True = may NOT attend."""
    return ~allowed_by_loop(n_q, n_k)


def loop_attention(q, k, v, allowed=None):
    """Explicit loop over batch and query heads; head h reads key/value head h // (H / g).

    Args:
        q: ``(B, H, N_q, d)``; k, v: ``(B, g, N_k, d)``; allowed: optional ``(N_q, N_k)`` bool.

    Returns:
        ``(out, weights)``: ``(B, H, N_q, d)`` and ``(B, H, N_q, N_k)``.
    """
    b, h, n_q, d = q.shape
    g, n_k = k.shape[1], k.shape[2]
    out = torch.empty_like(q)
    weights = torch.empty(b, h, n_q, n_k, dtype=q.dtype)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // g)
            s = q[bi, hi] @ k[bi, kv].T / math.sqrt(d)  # (N_q, N_k)
            if allowed is not None:
                s = s.masked_fill(~allowed, float("-inf"))
            weights[bi, hi] = torch.softmax(s, dim=-1)  # rows: one query each
            out[bi, hi] = weights[bi, hi] @ v[bi, kv]  # (N_q, d)
    return out, weights


def parameter_count(*modules):
    """Parameters of real torch modules, counted the way PyTorch stores them."""
    return sum(p.numel() for m in modules for p in m.parameters())
