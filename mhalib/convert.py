"""Converting a trained multi-head model to grouped-query (or multi-query) attention.

Ainslie et al. (2023), "GQA", build a GQA checkpoint from an MHA one: the query
heads and output projection stay; the H key and value heads are merged into g, one
per group of H/g consecutive heads; then the model is trained a little more
("uptraining", 5% of the original steps in the paper). Three ways to merge (their
Fig. 4 compares them; mean works best, then first, then random):

* ``"mean"``: the mean of the group's K (and V) projection weights (:func:`mean_pool_kv`);
* ``"first"``: the first head of each group, the others dropped (:func:`first_head_kv`);
* ``"random"``: fresh random K/V weights: the trained K/V knowledge is thrown away.

Query head h reads key/value head ``h // (H / g)`` (the convention of
:func:`mhalib.attention.repeat_kv`), so "group" means consecutive heads.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from mhalib.decoder import INIT_STD, Decoder
from mhalib.validation import check_divisible

__all__ = ["mean_pool_kv", "first_head_kv", "convert_kv", "attention_modules", "METHODS"]

METHODS = ("mean", "first", "random")


def _grouped(weight, num_heads, num_kv_heads):
    """View ``(H * d_head, d_model)`` as ``(g, H / g, d_head, d_model)``."""
    if not hasattr(weight, "shape") or len(weight.shape) != 2:
        raise ValueError(f"weight must be 2-D (H * d_head, d_model); got shape "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    check_divisible(num_heads, num_kv_heads, "num_heads", "num_kv_heads")
    rows, d_model = weight.shape
    if rows % num_heads:
        raise ValueError(f"weight has {rows} rows, not a multiple of num_heads={num_heads}; "
                         f"a K/V weight is (num_heads * d_head, d_model)")
    d_head = rows // num_heads
    return weight.reshape(num_kv_heads, num_heads // num_kv_heads, d_head, d_model)  # (g, H/g, d_head, d_model)


def mean_pool_kv(weight, num_heads, num_kv_heads):
    """Merge K (or V) heads by averaging each group of ``H / g`` consecutive heads.

    Args:
        weight: an ``nn.Linear`` K or V weight ``(H * d_head, d_model)``, NumPy or torch.
        num_heads: H, the heads ``weight`` holds.
        num_kv_heads: g, dividing H.

    Returns:
        ``(g * d_head, d_model)``, same type as ``weight``: rows ``k * d_head ..
        (k + 1) * d_head - 1`` are the mean of heads ``k * H/g .. (k + 1) * H/g - 1``.
        With g = H it is the weight unchanged.
    """
    grouped = _grouped(weight, num_heads, num_kv_heads)  # (g, H/g, d_head, d_model)
    pooled = grouped.mean(axis=1) if isinstance(grouped, np.ndarray) else grouped.mean(dim=1)  # (g, d_head, d_model)
    return pooled.reshape(-1, weight.shape[1])  # (g * d_head, d_model)


def first_head_kv(weight, num_heads, num_kv_heads):
    """Keep the first K (or V) head of each group of ``H / g``; same shapes as :func:`mean_pool_kv`."""
    grouped = _grouped(weight, num_heads, num_kv_heads)  # (g, H/g, d_head, d_model)
    return grouped[:, 0].reshape(-1, weight.shape[1])  # (g * d_head, d_model)


def attention_modules(model):
    """The :class:`~mhalib.attention.GroupedQueryAttention` of each block of a :class:`~mhalib.decoder.Decoder`."""
    return [block.attn for block in model.blocks]


def convert_kv(model, num_kv_heads, method="mean", *, seed=0):
    """A copy of ``model`` with every layer's keys and values merged into ``num_kv_heads`` heads.

    Args:
        model: a trained :class:`~mhalib.decoder.Decoder` of either family (left unchanged).
        num_kv_heads: g, dividing the model's current number of K/V heads.
        method: ``"mean"``, ``"first"`` or ``"random"`` (see the module docstring).
        seed: seeds the fresh weights of ``"random"``.

    Returns:
        a new Decoder with ``num_kv_heads=g``, in eval mode and in the model's dtype; everything but the K and V
        projections (embeddings, positions, queries, outputs, MLPs, LayerNorms) is a copy.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if not isinstance(model, Decoder):
        raise ValueError(f"convert_kv converts a course model (a mhalib.decoder.Decoder); got {type(model).__name__}")
    config = model.config
    old_layers = attention_modules(model)
    current = config.num_kv_heads
    check_divisible(current, num_kv_heads, "the model's num_kv_heads", "num_kv_heads")
    dtype = next(model.parameters()).dtype
    new = Decoder(replace(config, num_kv_heads=num_kv_heads)).to(dtype)  # a float64 model stays float64
    state = {k: v for k, v in model.state_dict().items() if not k.endswith(("k_proj.weight", "v_proj.weight"))}
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for old, layer in zip(old_layers, attention_modules(new)):
            for name in ("k_proj", "v_proj"):
                w = getattr(old, name).weight  # (g_old * d_head, d_model)
                if method == "mean":
                    merged = mean_pool_kv(w, current, num_kv_heads)  # (g * d_head, d_model)
                elif method == "first":
                    merged = first_head_kv(w, current, num_kv_heads)  # (g * d_head, d_model)
                else:
                    shape = getattr(layer, name).weight.shape
                    merged = torch.randn(shape, generator=generator).to(dtype) * INIT_STD  # (g * d_head, d_model)
                getattr(layer, name).weight.copy_(merged)
    missing, unexpected = new.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith(("k_proj.weight", "v_proj.weight")) for k in missing)
    new.eval()
    return new
