"""When fewer key/value heads pay: every byte one decoding step reads, and what MLA's absorbed form costs.

A decoding step of a batch of B sequences reads

* the **weights** once, shared by the batch, except the input embedding: each new token looks
  up its own row, so the step gathers B rows of that table, not the table;
* the attention weights ``W_q, W_o`` (``d_model x H d_head`` each) and ``W_k, W_v``
  (``d_model x g d_head`` each): fewer K/V heads shrink ``W_k`` and ``W_v`` too, not only the cache;
* the MLP, the norms, and the LM head in full (every logit needs every row);
* each sequence's **cache** once: ``B x context`` tokens of ``2 x layers x g x d_head`` numbers.

The weight bytes are (almost) fixed; the cache bytes grow with ``B x context``. The
**crossover**, where the two are equal, is at ``B x context = weight bytes / cache bytes per token``.
Activations and arithmetic are left out: at batch sizes where decoding is memory-bound they are
small next to these reads.

* :data:`LLAMA_CONFIGS`: the published shapes of Llama-2-7B and Llama-3-8B (model cards).
* :func:`llama_parameter_count`: their parameters counted from those shapes.
* :func:`decode_step_bytes`, :func:`crossover_tokens`: the bytes of one step, by where they come from.
* :func:`mla_attention_flops`, :func:`absorb_crossover_queries`: multi-head latent attention's
  plain and absorbed forms counted in FLOPs, and how many queries per key make the plain one cheaper.
"""

from __future__ import annotations

import math

import numpy as np

from mhalib.kv_cache import kv_cache_bytes
from mhalib.validation import check_divisible

__all__ = ["LLAMA_CONFIGS", "llama_parameter_count", "decode_step_bytes", "crossover_tokens",
           "mla_attention_flops", "absorb_crossover_queries"]

LLAMA_CONFIGS = {
    "Llama-2-7B": dict(
        num_layers=32, d_model=4096, num_heads=32, num_kv_heads=32, head_dim=128, d_ff=11008, vocab=32000,
        source="model card meta-llama/Llama-2-7b-hf, config.json (num_hidden_layers 32, hidden_size 4096, "
               "num_attention_heads 32, num_key_value_heads 32, intermediate_size 11008, vocab_size 32000); "
               "Touvron et al. 2023, 'Llama 2', Table 1 (7B, no GQA)",
    ),
    "Llama-3-8B": dict(
        num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, head_dim=128, d_ff=14336, vocab=128256,
        source="model card meta-llama/Meta-Llama-3-8B, config.json (num_hidden_layers 32, hidden_size 4096, "
               "num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336, vocab_size 128256)",
    ),
}

_SHAPE = ("num_layers", "d_model", "num_heads", "num_kv_heads", "head_dim", "d_ff", "vocab")


def _count(value, name, *, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer; got {value!r}")
    if value < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '>= 1'}; got {name}={value}")
    return int(value)


def _shape(config, num_kv_heads=None):
    """The config's shape as ints, with ``num_kv_heads`` replaced when given (checked to divide H)."""
    missing = [k for k in _SHAPE if k not in config]
    if missing:
        raise ValueError(f"config needs {', '.join(_SHAPE)}; missing {', '.join(missing)}")
    shape = {k: _count(config[k], k) for k in _SHAPE}
    if num_kv_heads is not None:
        shape["num_kv_heads"] = _count(num_kv_heads, "num_kv_heads")
    check_divisible(shape["num_heads"], shape["num_kv_heads"], "num_heads", "num_kv_heads")
    return shape


def llama_parameter_count(num_layers, d_model, num_heads, num_kv_heads, head_dim, d_ff, vocab, **_):
    """Parameters of a Llama-style decoder with untied input and output embeddings.

    Per layer: W_q and W_o ``d_model x H d_head``, W_k and W_v ``d_model x g d_head``, the gated
    MLP's three ``d_model x d_ff`` matrices, two RMSNorm weights; plus the embedding and the
    output head (``vocab x d_model`` each) and the final norm. Fewer K/V heads (smaller g)
    remove ``2 x layers x d_model x (H - g) d_head`` parameters.

    Returns:
        ``int``.
    """
    attn = 2 * d_model * num_heads * head_dim + 2 * d_model * num_kv_heads * head_dim
    per_layer = attn + 3 * d_model * d_ff + 2 * d_model
    return num_layers * per_layer + 2 * vocab * d_model + d_model


def decode_step_bytes(config, batch_size, context, *, num_kv_heads=None, bytes_per_element=2):
    """Bytes one decoding step of a batch reads, by where they come from.

    Args:
        config: a Llama-style shape (``num_layers, d_model, num_heads, num_kv_heads, head_dim,
            d_ff, vocab``), e.g. ``LLAMA_CONFIGS["Llama-2-7B"]``.
        batch_size: B sequences decoded together (each adds one new token); int or array.
        context: tokens already cached for each sequence; int or array (broadcast with B).
        num_kv_heads: g, replacing the config's (the same model with fewer or more K/V heads:
            W_k, W_v and the cache change with it).
        bytes_per_element: 2 for fp16/bf16.

    Returns:
        ``dict`` of bytes: ``embedding`` (the B rows the new tokens look up, ``B x d_model``),
        ``attention`` (W_q, W_k, W_v, W_o of every layer), ``mlp``, ``norms``, ``lm_head``
        (``vocab x d_model``, read whole), ``weights`` (their sum), ``cache``
        (``B x context x 2 x layers x g x d_head``) and ``total``. Ints, or int64 arrays where
        the batch or context is an array.
    """
    s = _shape(config, num_kv_heads)
    bytes_per_element = _count(bytes_per_element, "bytes_per_element")
    batch, context = np.asarray(batch_size), np.asarray(context)
    if not np.issubdtype(batch.dtype, np.integer) or not np.issubdtype(context.dtype, np.integer):
        raise ValueError(f"batch_size and context must be integers; got batch_size={batch_size!r}, context={context!r}")
    if (batch < 1).any() or (context < 0).any():
        raise ValueError(f"batch_size must be >= 1 and context >= 0; got batch_size={batch_size}, context={context}")
    batch, context = np.broadcast_arrays(batch.astype(np.int64), context.astype(np.int64))
    d, layers, b = s["d_model"], s["num_layers"], bytes_per_element
    attention = layers * 2 * d * (s["num_heads"] + s["num_kv_heads"]) * s["head_dim"] * b  # W_q, W_o; W_k, W_v
    parts = {
        "embedding": batch * d * b,  # a gather: one row per new token
        "attention": attention,
        "mlp": layers * 3 * d * s["d_ff"] * b,
        "norms": (2 * layers + 1) * d * b,
        "lm_head": s["vocab"] * d * b,  # every logit reads its row
    }
    parts["weights"] = sum(parts.values())
    per_token = kv_cache_bytes(layers, s["num_kv_heads"], s["head_dim"], 1, bytes_per_element=b)
    parts["cache"] = batch * context * per_token
    parts["total"] = parts["weights"] + parts["cache"]
    scalar = batch.ndim == 0
    return {k: int(v) if scalar else np.broadcast_to(np.asarray(v, dtype=np.int64), batch.shape).copy()
            for k, v in parts.items()}


def crossover_tokens(config, *, batch_size=1, num_kv_heads=None, bytes_per_element=2):
    """``batch x context`` at which the cache a step reads equals its weight bytes: a float.

    The weight bytes include the ``batch_size`` embedding rows the step gathers, so the
    crossover moves (a little) with the batch; at batch 1 it is
    ``(weight bytes without the embedding table + one row) / cache bytes per token``.
    """
    step = decode_step_bytes(config, batch_size, 0, num_kv_heads=num_kv_heads, bytes_per_element=bytes_per_element)
    s = _shape(config, num_kv_heads)
    per_token = kv_cache_bytes(s["num_layers"], s["num_kv_heads"], s["head_dim"], 1,
                               bytes_per_element=bytes_per_element)
    return step["weights"] / per_token


def mla_attention_flops(num_queries, num_keys, num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                        v_head_dim, *, absorb, causal=False):
    """FLOPs of multi-head latent attention for ``num_queries`` queries against ``num_keys`` cached keys.

    Counted per layer, 2 FLOPs per multiply-add, for the parts where the two forms differ and the
    scores and mixing they both do; the query and latent projections before, and ``o_proj``
    after, are the same in both and left out (so is the softmax). With Q queries, T keys,
    P (query, key) pairs, H heads, r = ``kv_lora_rank``, d_n, d_R, d_v the head dimensions:

    * plain: rebuild every key's ``k_h = W^UK_h c`` and value ``v_h = W^UV_h c`` from its latent
      (``T H r (d_n + d_v)`` multiply-adds), score with the rebuilt and the rotary keys
      (``P H (d_n + d_R)``) and mix the values (``P H d_v``);
    * absorbed: fold ``W^UK_h`` into each query (``Q H r d_n``), score the latents and the rotary
      key (``P H (r + d_R)``), mix the latents (``P H r``), then up-project the mix once
      per query and head (``Q H r d_v``).

    ``causal=False``: every query reads every key, ``P = Q T``. ``causal=True``: the queries are
    the last Q of the T positions and each reads the keys up to its own, ``P = Q T - Q (Q - 1) / 2``
    (a prefill of T tokens: ``Q = T``, ``P = T (T + 1) / 2``; one decoding query: ``P = T``).

    The plain form pays per key, the absorbed form per (query, key) pair: decoding (one query
    against many keys) favours absorbing, prefill (many queries per key) the plain form.

    Returns:
        ``int``.
    """
    q, t = _count(num_queries, "num_queries"), _count(num_keys, "num_keys")
    h, r = _count(num_heads, "num_heads"), _count(kv_lora_rank, "kv_lora_rank")
    dn, dr = _count(qk_nope_head_dim, "qk_nope_head_dim"), _count(qk_rope_head_dim, "qk_rope_head_dim", allow_zero=True)
    dv = _count(v_head_dim, "v_head_dim")
    if causal and q > t:
        raise ValueError(f"causal=True needs num_queries <= num_keys (the queries are the last of the keys' "
                         f"positions); got num_queries={q}, num_keys={t}")
    pairs = q * t - q * (q - 1) // 2 if causal else q * t
    if absorb:
        macs = q * h * r * dn + pairs * h * (r + dr) + pairs * h * r + q * h * r * dv
    else:
        macs = t * h * r * (dn + dv) + pairs * h * (dn + dr) + pairs * h * dv
    return 2 * macs


def absorb_crossover_queries(kv_lora_rank, qk_nope_head_dim, v_head_dim, num_keys=None):
    """Queries per key above which the plain form of MLA costs fewer FLOPs than the absorbed one.

    Setting the two counts of :func:`mla_attention_flops` equal, every query reading every key
    (the rotary and the head count cancel):
    ``T r (d_n + d_v) + Q T (d_n + d_v) = Q r (d_n + d_v) + 2 Q T r``, so
    ``Q* = T r (d_n + d_v) / (r (d_n + d_v) + T (2 r - d_n - d_v))``; with many keys
    (``num_keys=None``) ``Q* = r (d_n + d_v) / (2 r - d_n - d_v)``. Returns ``math.inf`` when
    ``2 r <= d_n + d_v`` (then absorbing never costs more).

    Returns:
        ``float``.
    """
    r, dn = _count(kv_lora_rank, "kv_lora_rank"), _count(qk_nope_head_dim, "qk_nope_head_dim")
    dv = _count(v_head_dim, "v_head_dim")
    extra = 2 * r - dn - dv  # per query and key: what absorbing adds to the mixing and scoring
    if extra <= 0:
        return math.inf
    if num_keys is None:
        return r * (dn + dv) / extra
    t = _count(num_keys, "num_keys")
    return t * r * (dn + dv) / (r * (dn + dv) + t * extra)
