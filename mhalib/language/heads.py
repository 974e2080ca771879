"""Which head does what in the language model: scores from attention weights, and ablation.

Scores take attention weights ``(B, L, H, N, N)`` (rows are queries) and return one
number per head, an ``(L, H)`` array:

* :func:`relation_score`: for pairs ``(sequence, target, key)``, the mean weight that the
  query *predicting* the target (position ``target - 1``) puts on the key. With the
  grammar's pairs this gives the verb -> subject (``"agreement"``), pronoun -> antecedent
  (``"coreference"``) and induction scores;
* :func:`bos_score`: mean weight on position 0, ``<bos>`` (the attention sink);
* the previous-token score of :func:`mhalib.interpret.previous_token_score`.

:func:`head_scores` computes all five; :func:`ablation_table` zeroes each head in turn
and measures the loss and both probes.
"""

from __future__ import annotations

import numpy as np
import torch

from mhalib.interpret import previous_token_score
from mhalib.language.probes import probe_accuracy
from mhalib.language.training import EVAL_STREAM, loss_by_role
from mhalib.language.grammar import sample_sequences
from mhalib.training import num_threads

__all__ = ["attention_weights", "relation_score", "bos_score", "head_scores", "SCORE_NAMES", "ablation_table"]

SCORE_NAMES = ("previous", "bos", "agreement", "coreference", "induction")


@torch.no_grad()
def attention_weights(model, tokens, ablate=None, *, threads=1):
    """Every layer's attention weights for ``tokens`` ``(B, N)``: NumPy ``(B, L, H, N, N)``."""
    tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    with num_threads(threads):
        _, weights = model(tokens, return_weights=True, ablate=ablate)  # (B, L, H, N, N)
    return weights.numpy()


def _weights_5d(weights):
    w = weights.detach().cpu().numpy() if hasattr(weights, "detach") else np.asarray(weights, dtype=float)
    if w.ndim != 5 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be (B, L, H, N, N); got shape {np.shape(weights)}")
    return w


def relation_score(weights, pairs):
    """Mean weight from the query that predicts ``target`` onto ``key``, per head.

    Args:
        weights: ``(B, L, H, N, N)``.
        pairs: ``(M, 3)`` int array of ``(sequence, target, key)`` with ``1 <= target``
            and ``key < target``, e.g. ``LanguageBatch.relations["agreement"]``.

    Returns:
        ``(L, H)``: the mean over the M pairs of ``weights[b, :, :, target - 1, key]``.
        1 means the head always looks exactly at the key when the target is predicted.
    """
    w = _weights_5d(weights)
    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 3)
    if len(p) == 0:
        raise ValueError("pairs is empty: no relation to score")
    b, target, key = p.T
    if (target < 1).any() or (key >= target).any() or (b >= w.shape[0]).any() or (target >= w.shape[-1]).any():
        raise ValueError(f"pairs must be (sequence < {w.shape[0]}, 1 <= target < {w.shape[-1]}, key < target)")
    return w[b, :, :, target - 1, key].mean(axis=0)  # (L, H)


def bos_score(weights):
    """Mean weight on position 0 (``<bos>``) over every query after it: ``(L, H)``."""
    w = _weights_5d(weights)
    return w[:, :, :, 1:, 0].mean(axis=(0, 3))  # (L, H)


def head_scores(model, n=256, seed=0):
    """The five scores of every head on ``n`` fresh sequences of the grammar.

    Args:
        model: a :class:`~mhalib.language.model.LanguageModel`.
        n: number of sequences (``sample_sequences(n, seed, stream=EVAL_STREAM)``).
        seed: seeds them.

    Returns:
        dict name -> ``(L, H)`` NumPy array, names :data:`SCORE_NAMES` (ready for
        ``mhalib.plots.attention_grid(..., scores=...)``).
    """
    batch = sample_sequences(n, seed, model.config.seq_len, stream=EVAL_STREAM)
    w = attention_weights(model, batch.tokens)  # (B, L, H, N, N)
    scores = {"previous": np.stack([previous_token_score(w[:, layer]) for layer in range(w.shape[1])]),
              "bos": bos_score(w)}
    for name in ("agreement", "coreference", "induction"):
        scores[name] = relation_score(w, batch.relations[name])
    return {name: scores[name] for name in SCORE_NAMES}


def ablation_table(model, agreement_probes, coreference_probes, *, n=256, seed=0, heads=None):
    """Loss and probe accuracies with the model intact and with each head zeroed in turn.

    Args:
        model: a :class:`~mhalib.language.model.LanguageModel`.
        agreement_probes, coreference_probes: :class:`~mhalib.language.probes.ProbeSet`.
        n, seed: the text for the loss (:func:`~mhalib.language.training.loss_by_role`).
        heads: which ablations to run, a list of lists of ``(layer, head)`` pairs
            (default: every single head).

    Returns:
        list of dicts with ``"ablate"`` (the pairs; ``[]`` for the intact model, first),
        ``"loss"``, ``"loss_agreement"``, ``"loss_coreference"``, ``"loss_relation"``,
        ``"loss_other"`` (see :func:`~mhalib.language.training.loss_by_role`),
        ``"agreement"``, ``"coreference"`` (probe accuracies).
    """
    if heads is None:
        heads = [[(layer, head)] for layer in range(model.num_layers) for head in range(model.num_heads)]
    rows = []
    for ablate in [[]] + [list(h) for h in heads]:
        loss = loss_by_role(model, n, seed, ablate or None)
        rows.append({
            "ablate": ablate,
            "loss": loss["all"],
            "loss_agreement": loss["agreement"],
            "loss_coreference": loss["coreference"],
            "loss_relation": loss["relation"],
            "loss_other": loss["other"],
            "agreement": probe_accuracy(model, agreement_probes, ablate or None),
            "coreference": probe_accuracy(model, coreference_probes, ablate or None),
        })
    return rows
