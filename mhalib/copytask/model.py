"""The copy-task model of notebooks 04 and 08: the course's decoder, attention only.

After Elhage et al. (2021) and Olsson et al. (2022): a :class:`~mhalib.decoder.Decoder`
with

* token embedding -> residual stream ``(B, N, d_model)``;
* ``num_layers`` attention layers, each adding its output to the residual stream;
  no MLP, no LayerNorm, so every head's contribution can be read off directly;
* learned positions added to the **queries and keys only**: the residual stream and
  the values carry token identity alone, so a head can *find* by position but what it
  *moves* is a token (this keeps the copy task honest: position is never copied);
* a linear unembedding to logits ``(B, N, vocab_size)``.

``num_kv_heads`` turns the same model into GQA (``1 < g < H``) or MQA (``g = 1``).
Its shipped weights load with :func:`load_pretrained`; it trains with
:func:`mhalib.copytask.training.train`.
"""

from __future__ import annotations

from dataclasses import asdict

from mhalib.checkpoints import load_model
from mhalib.decoder import DecoderConfig, make_config

__all__ = ["COPY_TASK_CONFIG", "copy_task_config", "load_pretrained", "PRETRAINED"]

PRETRAINED = "induction_2layer"  # the model trained in notebook 04

#: The model of notebook 04: 2 attention-only layers of 4 heads, d_model 64, 64 tokens, 32 positions.
COPY_TASK_CONFIG = DecoderConfig(vocab_size=64, seq_len=32, d_model=64, num_heads=4, num_kv_heads=4, num_layers=2,
                                 mlp=False, layer_norm=False, positions="queries_keys")


def copy_task_config(**overrides):
    """:data:`COPY_TASK_CONFIG` with some fields changed (e.g. ``num_layers=1``); a ValueError names a bad one."""
    return make_config(asdict(COPY_TASK_CONFIG), **overrides)


def load_pretrained(name=PRETRAINED):
    """The model trained in notebook 04 (shipped in ``mhalib/data``); returns ``(model, metadata)``."""
    if name != PRETRAINED:
        raise ValueError(f"no shipped copy-task model named {name!r}; available: [{PRETRAINED!r}]")
    model = load_model(name)
    return model, model.metadata
