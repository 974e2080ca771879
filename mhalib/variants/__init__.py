"""Attention variants side by side (notebook 10): what each costs in quality, memory and time.

Modules, one concept each:

* :mod:`mhalib.variants.recall`: multi-query associative recall (after Zoology), the task that
  stresses what a cache must hold, with ids after the grammar's.
* :mod:`mhalib.variants.model`: the variants (:data:`VARIANTS`: MHA, GQA, MQA, latent
  attention, sliding windows with and without a sink; at fixed width and at MHA's parameter
  count), each one :class:`~mhalib.decoder.Decoder` configuration.
* :mod:`mhalib.variants.training`: :func:`train_variant`, the grammar and the recall task together.
* :mod:`mhalib.variants.measure`: quality (:func:`measure_quality`), cache bytes from the shape
  and held by each variant's own cache (:func:`cache_bytes`, :func:`decode_with_caches`), decode
  time with the fused kernel (:func:`time_decode`).
* :mod:`mhalib.variants.compare`: spread over seeds, paired counts against MHA with their null,
  the frontier (:func:`pareto_front`).

``python -m mhalib.variants --help`` trains and measures them again.
"""

from mhalib.variants.compare import paired_against, pareto_front, summarize
from mhalib.variants.measure import cache_bytes, decode_with_caches, measure_quality, recall_accuracy, time_decode
from mhalib.variants.model import VARIANTS, load_variant, new_variant_model, parameter_count, variant_config
from mhalib.variants.recall import PAIRS, make_recall
from mhalib.variants.training import RECIPE, train_variant

__all__ = ["VARIANTS", "variant_config", "new_variant_model", "load_variant", "parameter_count", "make_recall",
           "PAIRS", "RECIPE", "train_variant", "measure_quality", "recall_accuracy", "cache_bytes",
           "decode_with_caches", "time_decode", "summarize", "paired_against", "pareto_front"]
