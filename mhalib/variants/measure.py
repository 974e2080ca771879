"""What each variant costs and keeps: quality, cache bytes (formula and held), decode time.

* :func:`measure_quality`: the grammar's loss and probes (notebook 05's measures), and
  recall accuracy for each number of pairs and each distance band.
* :func:`cache_bytes`: the cache of one sequence of ``n`` tokens, from the variant's shape
  (:func:`~mhalib.kv_cache.kv_cache_bytes`, :func:`~mhalib.mla.mla_cache_bytes`; a window
  holds ``min(n, window)`` positions). :func:`decode_with_caches` decodes token by token
  through the cache each variant really keeps (:class:`~mhalib.kv_cache.KVCache`,
  :class:`~mhalib.sliding_window.RollingKVCache`, :class:`~mhalib.mla.MLACache`), so the
  bytes held can be set beside the formula and the logits beside the full forward pass.
* :func:`time_decode`: one decoding step's attention over a long cache, in the variant's
  shape, with the course's fused kernel (:func:`~mhalib.fused_decode.fused_decode`). MLA is
  timed in its absorbed form, which is multi-query attention over the latents: the key is
  ``[latent, rotated key]`` (``r + d_rope`` numbers), the value the latent, which the
  kernel reads as a value row of the same width padded with zeros.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from mhalib.decoder import Decoder
from mhalib.kv_cache import KVCache, kv_cache_bytes
from mhalib.language.probes import make_probe_set, probe_accuracy
from mhalib.language.training import lm_loss
from mhalib.mla import MLACache, mla_cache_bytes
from mhalib.runtime import measuring
from mhalib.sliding_window import RollingKVCache
from mhalib.variants.recall import PAIRS, make_recall

__all__ = ["DISTANCE_BANDS", "EVAL", "recall_accuracy", "measure_quality", "cache_bytes", "decode_with_caches",
           "time_decode"]

#: Distance bands (tokens back from the queried key to its pair) that recall is also scored in.
DISTANCE_BANDS = ((1, 7), (8, 15), (16, 31), (32, 63))
#: Evaluation sizes and seed: text, probes and recall sequences none of the runs trained on.
EVAL = {"seed": 0, "n_sequences": 256, "n_probes": 1000, "n_recall": 300}


def _check_model(model):
    if not isinstance(model, Decoder):
        raise ValueError(f"model must be a Decoder (mhalib.variants.new_variant_model); got {type(model).__name__}")


def recall_accuracy(model, batch):
    """Fraction of a :class:`~mhalib.variants.recall.RecallBatch`'s answers the model predicts (argmax).

    Returns:
        ``(accuracy, correct)``: a float, and ``(B, N)`` bool (True at answers predicted right).
    """
    _check_model(model)
    tokens = torch.from_numpy(batch.tokens)  # (B, N)
    with measuring(model, 1):
        logits = model(tokens)  # (B, N, V)
    predicted = logits[:, :-1].argmax(-1).numpy()  # (B, N-1): the guess for tokens 1..N-1
    correct = np.zeros(batch.tokens.shape, bool)
    correct[:, 1:] = (predicted == batch.tokens[:, 1:]) & batch.mask[:, 1:]
    return float(correct[batch.mask].mean()), correct


def measure_quality(model, seed=EVAL["seed"]):
    """The quality numbers of one model, on evaluation text drawn with ``seed``.

    Returns:
        dict: ``loss`` (nats per token, grammar), ``agreement`` and ``coreference`` (probe
        accuracy), ``recall`` (accuracy over all :data:`PAIRS`), ``recall_by_pairs``
        ``{P: accuracy}``, ``recall_by_distance`` ``{"lo-hi": accuracy}``.
    """
    _check_model(model)
    out = {"loss": lm_loss(model, EVAL["n_sequences"], seed)}
    for kind in ("agreement", "coreference"):
        out[kind] = probe_accuracy(model, make_probe_set(kind, EVAL["n_probes"], seed))
    by_pairs, hits, dist = {}, [], []
    for p in PAIRS:
        batch = make_recall(EVAL["n_recall"], seed, p, model.config.seq_len, stream=1)
        by_pairs[str(p)], correct = recall_accuracy(model, batch)
        hits.append(correct[batch.mask])
        dist.append(batch.distance[batch.mask])
    hits, dist = np.concatenate(hits), np.concatenate(dist)
    out["recall"] = float(np.mean(list(by_pairs.values())))
    out["recall_by_pairs"] = by_pairs
    out["recall_by_distance"] = {f"{lo}-{hi}": float(hits[(dist >= lo) & (dist <= hi)].mean())
                                 for lo, hi in DISTANCE_BANDS if ((dist >= lo) & (dist <= hi)).any()}
    return out


def cache_bytes(config, num_tokens, bytes_per_element=2):
    """Bytes of one sequence's cache after ``num_tokens`` tokens, all layers, from the shape alone.

    Multi-head, grouped-query and multi-query attention keep ``2 g d_head`` numbers per token
    and layer; latent attention ``kv_lora_rank + rope_head_dim``; a window keeps only the last
    ``window`` positions (its sinks among them).
    """
    held = num_tokens if config.window is None else min(num_tokens, config.window)
    if config.kv_lora_rank is not None:
        return mla_cache_bytes(config.num_layers, config.kv_lora_rank, config.rope_head_dim, held,
                               bytes_per_element=bytes_per_element)
    return kv_cache_bytes(config.num_layers, config.num_kv_heads, config.head_dim, held,
                          bytes_per_element=bytes_per_element)


def _new_cache(config):
    if config.kv_lora_rank is not None:
        return MLACache()
    if config.window is not None:
        return RollingKVCache(config.window, config.num_sinks)
    return KVCache(config.seq_len)


def _attend_step(block, h, cache):
    """One block's attention for new rows ``h`` (B, n, d_model) through ``cache``."""
    attn = block.attn
    if isinstance(cache, MLACache):
        return attn(h, causal=True, cache=cache)
    if isinstance(cache, RollingKVCache):
        q, k, v = attn.project(h)  # (B, H, n, d), (B, g, n, d) x 2
        z = cache.attend(q, k, v)  # (B, H, n, d)
        b, n = h.shape[:2]
        return attn.o_proj(z.transpose(1, 2).reshape(b, n, attn.d_model))
    return attn(h, causal=True, kv_cache=cache)


@torch.no_grad()
def decode_with_caches(model, tokens):
    """Run ``tokens`` ``(B, N)`` one position at a time through the cache each layer really keeps.

    Returns:
        ``(logits (B, N, V), caches)``: the logits of every step (equal to ``model(tokens)``
        to rounding) and the per-layer caches at the end (their ``nbytes`` is what is held).
    """
    _check_model(model)
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    if tokens.dim() != 2 or tokens.shape[1] > model.config.seq_len:
        raise ValueError(f"tokens must be (B, N) with N <= {model.config.seq_len}; got {tuple(tokens.shape)}")
    caches = [_new_cache(model.config) for _ in model.blocks]
    steps = []
    for i in range(tokens.shape[1]):
        x = model.embed(tokens[:, i:i + 1]) + model.pos.weight[i]  # (B, 1, d_model)
        for block, cache in zip(model.blocks, caches):
            x = x + _attend_step(block, block.ln_1(x), cache)
            x = x + block.mlp(block.ln_2(x))
        steps.append(model.unembed(model.ln_f(x)))  # (B, 1, V)
    return torch.cat(steps, dim=1), caches


def _decode_shapes(config, num_tokens, scale=1):
    """(q, k, v) for one decoding step of one layer of ``config`` over ``num_tokens`` cached tokens,
    every width (head, latent, rotated key) multiplied by ``scale``."""
    h, d = config.num_heads, config.head_dim * scale
    gen = torch.Generator().manual_seed(0)
    if config.kv_lora_rank is not None:  # absorbed MLA: MQA over [latent, rotated key]
        rank = config.kv_lora_rank * scale
        width = rank + config.rope_head_dim * scale
        q = torch.randn(1, h, 1, width, generator=gen)
        k = torch.randn(1, 1, num_tokens, width, generator=gen)
        v = k.clone()
        v[..., rank:] = 0.0  # the value is the latent alone
        return q, k, v
    held = num_tokens if config.window is None else min(num_tokens, config.window)
    q = torch.randn(1, h, 1, d, generator=gen)
    k = torch.randn(1, config.num_kv_heads, held, d, generator=gen)
    v = torch.randn(1, config.num_kv_heads, held, d, generator=gen)
    return q, k, v


def time_decode(configs, num_tokens=65536, repeats=20, threads=1, scale=1):
    """Seconds per decoding step of one layer's attention for each config, timed in one run.

    Args:
        configs: dict name -> :class:`~mhalib.decoder.DecoderConfig`.
        num_tokens: tokens in the cache (a window holds at most ``window``).
        scale: every width multiplied by this (16 turns heads of 8 into heads of 128, a latent of
            16 into one of 256): the same variants at the width of real models' heads.
        repeats: timed calls per config, after one untimed call; the median is kept. The configs
            are timed in turn, ``repeats`` rounds, so that a slow moment of a shared machine
            falls on all of them.
        threads: the kernel's threads.

    Returns:
        dict name -> median seconds.
    """
    from mhalib.fused_decode import fused_decode

    inputs = {name: _decode_shapes(c, num_tokens, scale) for name, c in configs.items()}
    for q, k, v in inputs.values():
        fused_decode(q, k, v, num_threads=threads)  # compile and warm
    times = {name: [] for name in configs}
    for _ in range(repeats):
        for name, (q, k, v) in inputs.items():
            start = time.perf_counter()
            fused_decode(q, k, v, num_threads=threads)
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}
