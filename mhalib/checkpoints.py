"""The one checkpoint format of the course, and the one loader of every shipped model.

A model is saved as two files side by side: ``PATH.pt``, its state dict (tensors only, so
``torch.load(..., weights_only=True)`` reads it), and ``PATH.json``, its
:class:`~mhalib.decoder.DecoderConfig` under ``"config"`` with whatever facts were saved
with it (seed, recipe, measured numbers). The shipped models live in ``mhalib/data``:
``induction_2layer`` (notebook 04's copy-task model) and ``induction_2layer_seed1`` .. ``_seed9``
(its recipe's other seeds), ``language_model`` and ``language_model_seed1`` .. ``_seed9``
(notebook 05's ten seeds).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from mhalib.data import DATA_DIR
from mhalib.decoder import Decoder, DecoderConfig

__all__ = ["save_model", "load_model", "shipped_models"]


def _paths(path):
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (".pt", ".json") else path
    return stem.with_suffix(".pt"), stem.with_suffix(".json")


def shipped_models():
    """The names of the shipped models (``mhalib/data/NAME.pt`` with its ``.json``), sorted."""
    return sorted(p.stem for p in DATA_DIR.glob("*.pt") if p.with_suffix(".json").exists())


def save_model(model, path, **metadata):
    """Save ``model`` as ``PATH.pt`` (its state dict) and ``PATH.json`` (config + metadata).

    Args:
        model: a :class:`~mhalib.decoder.Decoder`.
        path: file name with or without ``.pt``/``.json``.
        **metadata: JSON-serialisable facts to keep with it (seed, steps, recipe, ...).

    Returns:
        the ``.pt`` path.
    """
    if not isinstance(model, Decoder):
        raise ValueError(f"save_model saves a Decoder; got {type(model).__name__}")
    pt, js = _paths(path)
    pt.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    torch.save(state, pt)
    js.write_text(json.dumps({"config": asdict(model.config), **metadata}, indent=1, sort_keys=True) + "\n")
    return pt


def load_model(path, hint=""):
    """A model saved by :func:`save_model`, or a shipped one by name (:func:`shipped_models`).

    Args:
        path: a shipped model's name (a string such as ``"induction_2layer"``: the shipped one,
            whatever lies in the working folder), or a file name with or without ``.pt``/``.json``.
        hint: appended to the error when nothing is there (e.g. how to train one).

    Returns:
        a :class:`~mhalib.decoder.Decoder` in eval mode; its ``metadata`` attribute holds
        the JSON dict (``config`` included).
    """
    if isinstance(path, str) and path in shipped_models():
        path = DATA_DIR / path
    pt, js = _paths(path)
    if not pt.exists() or not js.exists():
        raise ValueError(f"no model at {pt.with_suffix('')} (need both .pt and .json); "
                         f"shipped: {', '.join(shipped_models())}{hint}")
    meta = json.loads(js.read_text())
    fields = set(DecoderConfig.__dataclass_fields__)
    config = meta.get("config")
    if not isinstance(config, dict) or not set(config) <= fields or "positions" not in config:
        raise ValueError(f"{js} does not hold a DecoderConfig under 'config' (fields {sorted(fields)}); "
                         f"a checkpoint saved before the course had one model class must be saved again "
                         f"with save_model; got {config!r}")
    model = Decoder(DecoderConfig(**config))
    state, expected = torch.load(pt, weights_only=True), set(model.state_dict())
    if set(state) != expected:
        raise ValueError(f"{pt} does not hold the weights its config describes: missing "
                         f"{sorted(expected - set(state))}, unexpected {sorted(set(state) - expected)}")
    model.load_state_dict(state)
    model.eval()
    model.metadata = meta
    return model
