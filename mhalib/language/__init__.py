"""Heads in a small language model (notebook 05): a grammar, a model, probes, head scores.

Modules, one concept each:

* :mod:`mhalib.language.grammar`: a seeded grammar of English-like sentences with
  number agreement across attractors, gendered antecedents and pronouns, ``<bos>`` and
  several sentences per sequence; :func:`sample_sequences`, :func:`encode`, :func:`decode`.
* :mod:`mhalib.language.model`: :func:`language_config`, the course's
  :class:`~mhalib.decoder.Decoder` as a small pre-LayerNorm GPT-2, and
  :func:`load_language_model` (the shipped weights of ten seeds).
* :mod:`mhalib.language.training`: :func:`train_language`, :func:`lm_loss`,
  :func:`loss_by_role`.
* :mod:`mhalib.language.probes`: :func:`make_probe_set` ("agreement", "coreference"),
  :func:`probe_accuracy`, the :class:`Bigram` baseline and :func:`shallow_baselines`
  (first noun, nearest noun, majority class).
* :mod:`mhalib.language.heads`: :func:`grammar_head_scores` (previous-token, ``<bos>``,
  verb -> subject, pronoun -> antecedent, induction), and the interventions that test what
  a score suggests: :func:`number_patching` (does a head carry the subject's number?),
  :func:`path_patching` (does an earlier head act by changing where a later head looks?),
  :func:`mean_ablation`.
* :mod:`mhalib.language.claims`: notebook 05's claims as tests of one seed, each with its
  null, counted over the ten seeds under zero, mean and resample ablation.

``python -m mhalib.language train`` trains the shipped model again from its seed;
``python -m mhalib.language --help`` lists the other runs (the H sweep, seeds, dropout).
"""

from mhalib.language.grammar import VOCAB, decode, encode, sample_sequences
from mhalib.language.heads import (SCORE_NAMES, flip_subject_number, grammar_head_scores, mean_ablation,
                                   number_patching, path_patching)
from mhalib.language.model import SHIPPED_SEEDS, language_config, load_language_model
from mhalib.language.probes import (CONTROL, HELD_OUT, PROBE_KINDS, Bigram, ProbeSet, make_probe_set, probe_accuracy,
                                    probe_margins, shallow_baselines)
from mhalib.language.training import lm_loss, loss_by_role, new_language_model, token_losses, train_language

__all__ = [
    "VOCAB",
    "encode",
    "decode",
    "sample_sequences",
    "language_config",
    "SHIPPED_SEEDS",
    "load_language_model",
    "new_language_model",
    "train_language",
    "token_losses",
    "lm_loss",
    "loss_by_role",
    "PROBE_KINDS",
    "ProbeSet",
    "make_probe_set",
    "probe_margins",
    "probe_accuracy",
    "HELD_OUT",
    "CONTROL",
    "shallow_baselines",
    "Bigram",
    "SCORE_NAMES",
    "grammar_head_scores",
    "flip_subject_number",
    "number_patching",
    "path_patching",
    "mean_ablation",
]
