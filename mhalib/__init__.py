"""mhalib: the small, tested library behind the course "Multi-Head Attention, from one head to GQA".

Modules, one concept each (dependencies flow downwards only):

* ``mhalib.np_attention``: attention in NumPy (the reference the grader trusts).
* ``mhalib.attention``: the same in PyTorch: ``MultiHeadAttention``,
  ``MultiQueryAttention``, ``GroupedQueryAttention``, ``grouped_attention``.
* ``mhalib.validation``: the shared input checks and their error messages.
* ``mhalib.fused_decode``: a fused grouped-query decode kernel in Numba (one pass over the
  cache, online softmax, key blocks merged by log-sum-exp); Numba loads on its first call.
* ``mhalib.kv_cache``: KV-cache sizes for real models, a cache, one NumPy decode step.
* ``mhalib.decoder``: the one decoder-only transformer every trained model of the course is
  (``Decoder``, ``DecoderConfig``), with one head contract for ablation and patching;
  ``mhalib.checkpoints`` its one file format and loader; ``mhalib.fit`` its one training
  loop; ``mhalib.runtime`` threads and progress bars; ``mhalib.data`` the shipped data
  (weights, measured runs, quiz questions, real models' shapes) and where it lives.
* ``mhalib.copytask``: the copy-task family of notebooks 04 and 08: the tasks, the
  attention-only configuration and its shipped weights, training and evaluation.
* ``mhalib.interpret``: head scores (previous-token, induction, duplicate, ``<bos>``,
  relations), ablation tables and recorded heads, for any model of the course.
* ``mhalib.language``: the language family of notebooks 05 and 06: a seeded grammar, the
  decoder as a small GPT-2, probes, the grammar's head scores and patching, and the shipped
  weights of five seeds (``python -m mhalib.language train`` retrains them).
* ``mhalib.convert``: turning a trained MHA model into GQA/MQA (mean, first, random), for
  either model.
* ``mhalib.generate``: greedy generation with and without a KV cache, for either model
  (notebook 06 runs it on the language model).
* ``mhalib.rope``, ``mhalib.sliding_window``, ``mhalib.online_softmax``, ``mhalib.mla``,
  ``mhalib.serving`` (notebook 09): rotary positions with a cache, sliding windows with a
  rolling buffer, the one-pass softmax and the log-sum-exp merge, multi-head latent
  attention, and the bytes of a decode step.
* ``mhalib.plots`` and ``mhalib.widgets``: figures and slider explorers (matplotlib,
  ipywidgets); ``mhalib.quiz``: quizzes that explain wrong answers.
* ``mhalib.check`` (learners' self-checks) and ``mhalib.grade`` (the grader).

Names used everywhere: ``d_model``, ``num_heads`` (H), ``num_kv_heads`` (g),
``head_dim`` (d_k = d_model / H).

``import mhalib`` is fast and headless: torch is imported on first use of a torch
name, and matplotlib and ipywidgets only by the modules that draw.
"""

from importlib import import_module

from mhalib.np_attention import (
    causal_mask,
    grouped_query_attention,
    merge_heads,
    multi_head_attention,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from mhalib.validation import divisors

__version__ = "0.1.0"

# name -> module that defines it; imported lazily so that `import mhalib` never loads torch.
_LAZY = {
    "GroupedQueryAttention": "mhalib.attention",
    "MultiHeadAttention": "mhalib.attention",
    "MultiQueryAttention": "mhalib.attention",
    "grouped_attention": "mhalib.attention",
    "repeat_kv": "mhalib.attention",
    "to_nn_multihead_attention": "mhalib.attention",
    "KVCache": "mhalib.kv_cache",
    "kv_cache_bytes": "mhalib.kv_cache",
    "decode_step": "mhalib.kv_cache",
    "MODEL_CONFIGS": "mhalib.kv_cache",
    "Decoder": "mhalib.decoder",
    "DecoderConfig": "mhalib.decoder",
    "load_model": "mhalib.checkpoints",
    "load_pretrained": "mhalib.copytask.model",
    "convert_kv": "mhalib.convert",
    "mean_pool_kv": "mhalib.convert",
}

__all__ = [
    "causal_mask",
    "divisors",
    "grouped_query_attention",
    "merge_heads",
    "multi_head_attention",
    "scaled_dot_product_attention",
    "softmax",
    "split_heads",
    *_LAZY,
]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mhalib' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
