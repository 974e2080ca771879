"""The course's shipped data, and the one place that says where it lives.

Trained weights (``*.pt`` with their ``*.json``, read by :mod:`mhalib.checkpoints`), the
measured runs of the language model's sweeps, the quiz questions (:mod:`mhalib.quiz`) and
the attention shapes of real models (:data:`mhalib.kv_cache.MODEL_CONFIGS`).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DATA_DIR", "read_json"]

DATA_DIR = Path(__file__).resolve().parent


def read_json(name):
    """The JSON file ``name`` of :data:`DATA_DIR`, parsed (UTF-8)."""
    return json.loads((DATA_DIR / name).read_text(encoding="utf-8"))
