"""When fewer key/value heads pay: the bytes one decoding step reads, weights against cache.

A decoding step of a batch reads every weight once (all sequences share them) and each
sequence's own cache once. Weight bytes are fixed; cache bytes grow with batch x context.
While the weights dominate, shrinking the cache (fewer K/V heads) saves little of the step;
past the crossover ``batch x context = weight bytes / cache bytes per token`` the cache
dominates and the saving approaches the cache ratio.

* :data:`LLAMA_CONFIGS`: the published shapes of Llama-2-7B and Llama-3-8B (model cards).
* :func:`llama_parameter_count`: their parameters counted from those shapes.
* :func:`decode_step_bytes`, :func:`crossover_tokens`.

The model is simplified on purpose: every weight is read once per step (the embedding table
too), activations and the arithmetic are ignored.
"""

from __future__ import annotations

import numpy as np

from mhalib.kv_cache import kv_cache_bytes

__all__ = ["LLAMA_CONFIGS", "llama_parameter_count", "decode_step_bytes", "crossover_tokens"]

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


def llama_parameter_count(num_layers, d_model, num_heads, num_kv_heads, head_dim, d_ff, vocab, **_):
    """Parameters of a Llama-style decoder with untied input and output embeddings.

    Per layer: W_q and W_o ``d_model x H d_head``, W_k and W_v ``d_model x g d_head``, the gated
    MLP's three ``d_model x d_ff`` matrices, two RMSNorm weights; plus the embedding and the
    output head (``vocab x d_model`` each) and the final norm.

    Returns:
        ``int``.
    """
    attn = 2 * d_model * num_heads * head_dim + 2 * d_model * num_kv_heads * head_dim
    per_layer = attn + 3 * d_model * d_ff + 2 * d_model
    return num_layers * per_layer + 2 * vocab * d_model + d_model


def decode_step_bytes(num_params, num_layers, num_kv_heads, head_dim, batch_size, context, bytes_per_element=2):
    """Bytes one decoding step reads: ``(weights, cache)``.

    Args:
        num_params: parameters, read once per step for the whole batch.
        num_layers, num_kv_heads, head_dim: the cache's shape (see :func:`mhalib.kv_cache.kv_cache_bytes`).
        batch_size, context: sequences in the batch and tokens cached for each; arrays broadcast.
        bytes_per_element: 2 for fp16.

    Returns:
        ``(weight_bytes, cache_bytes)``: an int and an int (or an int64 array when the
        batch or context is an array).
    """
    if num_params < 1:
        raise ValueError(f"num_params must be positive; got num_params={num_params}")
    weights = int(num_params) * bytes_per_element
    per_token = kv_cache_bytes(num_layers, num_kv_heads, head_dim, 1, bytes_per_element=bytes_per_element)
    batch, context = np.asarray(batch_size), np.asarray(context)
    if (batch < 1).any() or (context < 0).any():
        raise ValueError(f"batch_size must be >= 1 and context >= 0; got batch_size={batch_size}, context={context}")
    cache = per_token * batch.astype(np.int64) * context.astype(np.int64)
    return weights, int(cache) if cache.ndim == 0 else cache


def crossover_tokens(num_params, num_layers, num_kv_heads, head_dim, bytes_per_element=2):
    """``batch x context`` at which the cache read per step equals the weights read: a float."""
    weights, _ = decode_step_bytes(num_params, num_layers, num_kv_heads, head_dim, 1, 0, bytes_per_element)
    return weights / kv_cache_bytes(num_layers, num_kv_heads, head_dim, 1, bytes_per_element=bytes_per_element)
