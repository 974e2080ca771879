"""The attention variants notebook 10 compares: one model family, one thing changed.

Every variant is the course's :class:`~mhalib.decoder.Decoder` as a small pre-LayerNorm GPT-2
(:func:`mhalib.language.language_config`'s block) at the sizes of :data:`BASE`: 2 layers,
``d_model`` 64, **8 query heads** of 8 numbers (so that g can halve three times), reading the
grammar's words and the recall task's keys and values. Only the attention changes
(:data:`VARIANTS`):

* ``MHA``, ``GQA-4``, ``GQA-2``, ``MQA``: 8, 4, 2, 1 key/value heads;
* ``MLA-16``, ``MLA-32``: multi-head latent attention caching a latent of 16 or 32 numbers
  and a shared rotated key of 4 (:class:`~mhalib.mla.MultiHeadLatentAttention`): 20 and 36
  numbers per token and layer, between MQA's 16 and GQA-4's 64;
* ``SWA-8``, ``SWA-16``: sliding windows of 8 and 16 positions (each query sees itself and
  the 7 or 15 before it); ``SWA-8+sink``, ``SWA-16+sink``: the same cache sizes with one slot
  kept for position 0 (``<bos>``), an attention sink (Xiao et al. 2023);
* ``SWA-32`` (:data:`HELD_BACK`): left out of the notebook's frontier for its exercise to place.

Two comparisons, kept apart: at **fixed width** (the table above; fewer K/V heads also means
fewer parameters) and at a **fixed parameter budget** (the ``... =params`` rows: the
variants with fewer attention parameters get them back as a wider MLP,
:func:`matched_mlp_width`, to within 1% of MHA's count). A window changes no parameter.

The latent variants also differ in one more way: their heads carry rotary positions on 4
of their query/key numbers (DeepSeek-V2's decoupled RoPE), on top of the learned positions
every variant adds to the stream.
"""

from __future__ import annotations

from pathlib import Path

from mhalib.checkpoints import load_model
from mhalib.data import DATA_DIR
from mhalib.decoder import Decoder, make_config
from mhalib.language.grammar import SEQ_LEN
from mhalib.variants.recall import VOCAB_SIZE

__all__ = ["BASE", "VARIANTS", "FIXED_WIDTH", "FIXED_PARAMS", "HELD_BACK", "SHIPPED", "variant_config", "new_variant_model",
           "matched_mlp_width", "parameter_count", "variant_path", "load_variant", "RUNS_DIR"]

#: The fields every variant shares.
BASE = {"vocab_size": VOCAB_SIZE, "seq_len": SEQ_LEN, "d_model": 64, "num_heads": 8, "num_kv_heads": None,
        "num_layers": 2, "mlp": True, "layer_norm": True, "positions": "residual", "dropout": 0.0}

#: What each variant changes in :data:`BASE` (fixed width).
FIXED_WIDTH = {
    "MHA": {},
    "GQA-4": {"num_kv_heads": 4},
    "GQA-2": {"num_kv_heads": 2},
    "MQA": {"num_kv_heads": 1},
    "MLA-16": {"kv_lora_rank": 16},
    "MLA-32": {"kv_lora_rank": 32},
    "SWA-8": {"window": 8},
    "SWA-16": {"window": 16},
    "SWA-8+sink": {"window": 8, "num_sinks": 1},
    "SWA-16+sink": {"window": 16, "num_sinks": 1},
}
#: The variants with fewer attention parameters than MHA, at MHA's parameter count.
FIXED_PARAMS = {f"{name} =params": dict(FIXED_WIDTH[name], match_params=True) for name in ("GQA-2", "MQA")}
#: A configuration the notebook leaves out of its frontier, for the exercise to place on it.
HELD_BACK = {"SWA-32": {"window": 32}}
VARIANTS = {**FIXED_WIDTH, **FIXED_PARAMS, **HELD_BACK}

#: Where ``python -m mhalib.variants train`` writes the weights (not shipped: about 0.8 MB a run).
RUNS_DIR = Path("artifacts") / "variants"
#: The runs whose weights ship (``mhalib/data/variants/``): the exercise measures this one.
SHIPPED = (("SWA-32", 0),)
SHIPPED_DIR = DATA_DIR / "variants"


def parameter_count(model_or_config):
    """Trainable parameters of a model, or of the model a config describes."""
    model = model_or_config if isinstance(model_or_config, Decoder) else Decoder(model_or_config)
    return sum(p.numel() for p in model.parameters())


def matched_mlp_width(overrides):
    """The MLP width that brings a variant's parameter count closest to MHA's (``BASE``).

    Each unit of MLP width costs ``2 d_model + 1`` parameters per layer (a column in, a row
    out, a bias), so the width is ``4 d_model`` plus the missing parameters over that, rounded.
    """
    target = parameter_count(make_config(BASE))
    fields = {k: v for k, v in overrides.items() if k != "match_params"}
    short = target - parameter_count(make_config(BASE, **fields))
    per_unit = BASE["num_layers"] * (2 * BASE["d_model"] + 1)
    return 4 * BASE["d_model"] + round(short / per_unit)


def variant_config(name):
    """The :class:`~mhalib.decoder.DecoderConfig` of variant ``name`` (a key of :data:`VARIANTS`)."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose one of {', '.join(VARIANTS)}")
    overrides = dict(VARIANTS[name])
    if overrides.pop("match_params", False):
        overrides["mlp_width"] = matched_mlp_width(overrides)
    return make_config(BASE, **overrides)


def new_variant_model(name, seed=0):
    """A freshly initialised model of variant ``name``, drawn after ``torch.manual_seed(seed)``."""
    import torch

    config = variant_config(name)
    torch.manual_seed(seed)
    return Decoder(config)


def variant_path(name, seed, shipped=False):
    """Where seed ``seed`` of variant ``name`` is saved (without ``.pt``/``.json``): under
    :data:`RUNS_DIR`, or :data:`SHIPPED_DIR` for a shipped run."""
    variant_config(name)  # checks the name
    slug = name.replace(" =params", "-params").replace("+", "-").lower()
    return (SHIPPED_DIR if shipped else RUNS_DIR) / f"{slug}_seed{seed}"


def load_variant(name, seed=0):
    """A trained variant: a shipped run (:data:`SHIPPED`), else one ``python -m mhalib.variants train`` wrote."""
    shipped = (name, seed) in SHIPPED
    return load_model(variant_path(name, seed, shipped=shipped),
                      f"; train it with: python -m mhalib.variants train --variants '{name}' --seeds {seed}")
