"""Training the language model on the grammar, and its loss on fresh text.

Every step draws a fresh batch from the grammar (``make_rng(seed, TRAIN_STREAM)``), so
the model never sees the same batch twice and the evaluation text (``EVAL_STREAM``) is
text it was not trained on. The learning rate warms up linearly, then follows a cosine
down to a tenth of its peak; gradients are clipped at norm 1.

Reproducibility: the same seed, step count and thread count give the same weights on the
same machine (the weights come from ``torch.manual_seed(seed)``, the batches from the
grammar's seeded generator, dropout from torch's generator). One thread is the default:
a fixed thread count keeps floating-point sums in the same order.
"""

from __future__ import annotations

import numpy as np
import torch

from mhalib.decoder import Decoder
from mhalib.fit import fit, warmup_cosine
from mhalib.language.grammar import Grammar, encode, make_rng, sample_sequences
from mhalib.language.model import language_config
from mhalib.runtime import measuring

__all__ = [
    "TRAIN_STREAM",
    "EVAL_STREAM",
    "new_language_model",
    "train_language",
    "token_losses",
    "lm_loss",
    "loss_by_role",
]

TRAIN_STREAM = 0  # make_rng(seed, 0): training batches
EVAL_STREAM = 1  # make_rng(seed, 1): lm_loss, head scores


def new_language_model(seed=0, **config):
    """A freshly initialised language :class:`~mhalib.decoder.Decoder`, drawn after ``torch.manual_seed(seed)``.

    ``config`` overrides fields of :func:`~mhalib.language.model.language_config` (e.g. ``num_heads=8``).
    """
    torch.manual_seed(seed)
    return Decoder(language_config(**config))


def _batch(rng, grammar, batch_size, seq_len):
    rows = [encode(grammar.sequence(rng, seq_len)[0]) for _ in range(batch_size)]
    return torch.tensor(rows, dtype=torch.long)  # (B, N)


def train_language(model, steps, *, batch_size=32, lr=3e-3, warmup=100, seed=0, threads=1,
                   progress=True, desc="training", callback=None, stop_after=None):
    """Train ``model`` with Adam on fresh batches of the grammar; returns the history.

    Args:
        model: a language :class:`~mhalib.decoder.Decoder` (trained in place, left in eval mode).
        steps: optimiser steps, one fresh batch of ``batch_size`` sequences each.
        batch_size, lr, warmup: batch size, peak learning rate, warm-up steps.
        seed: seeds the training text (``make_rng(seed, TRAIN_STREAM)``) and dropout.
        threads: CPU threads while training (``None`` keeps torch's setting).
        progress: show a progress bar (a widget in Jupyter, text in a terminal).
        callback: optional ``fn(step, model)`` after every step (step counts from 1); if it
            returns True, training stops there.
        stop_after: stop after this many steps, keeping the schedule of ``steps`` (the
            first steps of a long run, e.g. to check that a run starts as recorded).

    Returns:
        dict with ``"loss"`` and ``"accuracy"`` (next-token, on that step's batch): one float
        per step (:func:`mhalib.fit.fit`).
    """
    if not isinstance(model, Decoder):
        raise ValueError(f"train_language trains a Decoder (new_language_model); got {type(model).__name__}")
    rng = make_rng(seed, TRAIN_STREAM)
    grammar = Grammar()
    return fit(model, lambda step: (_batch(rng, grammar, batch_size, model.config.seq_len), None), steps, lr=lr,
               schedule=lambda step, total, peak: warmup_cosine(step, total, peak, warmup), clip_norm=1.0,
               dropout_seed=seed, threads=threads, progress=progress, desc=desc, callback=callback,
               stop_after=stop_after)


def token_losses(model, tokens, ablate=None, *, threads=1, replace_z=None):
    """Cross-entropy of every next-token prediction.

    Args:
        model: a language :class:`~mhalib.decoder.Decoder`.
        tokens: ``(B, N)`` token ids (NumPy or torch).
        ablate: list of ``(layer, head)`` pairs to zero (see :meth:`~mhalib.decoder.Decoder.forward`).
        replace_z: optional patches ``(layer, head) -> (B, N, d_head)`` (mean or resample
            ablation: :func:`mhalib.interpret.ablation_kwargs`).

    Returns:
        NumPy ``(B, N)`` float64: entry ``[b, i]`` is the loss of predicting ``tokens[b, i]``
        from the tokens before it; column 0 (``<bos>``, never predicted) is NaN.
    """
    tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
    with measuring(model, threads):
        logits = model(tokens, ablate=ablate, replace_z=replace_z)  # (B, N, V)
    logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)  # (B, N-1, V)
    nll = -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)  # (B, N-1)
    out = np.full(tokens.shape, np.nan)
    out[:, 1:] = nll.numpy()
    return out


def _check_n_seed(n, seed):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int; got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int; got {seed!r}")


def lm_loss(model, n, seed, ablate=None):
    """Average next-token loss (nats per token) on ``n`` fresh sequences of the grammar.

    Args:
        model: a language :class:`~mhalib.decoder.Decoder`.
        n: number of sequences (``seq_len`` tokens each; every token after ``<bos>`` counts).
        seed: seeds the text (``sample_sequences(n, seed, stream=EVAL_STREAM)``).
        ablate: list of ``(layer, head)`` pairs whose outputs are zeroed.

    Returns:
        float.
    """
    return loss_by_role(model, n, seed, ablate)["all"]


def loss_by_role(model, n, seed, ablate=None, *, replace_z=None):
    """Average loss on all tokens and on the tokens whose form a relation fixes.

    Same text as :func:`lm_loss`. Returns a dict of floats: ``"all"``; ``"agreement"``
    (main verbs); ``"coreference"`` (pronouns and verbs carrying one); ``"relation"``
    (tokens in either role: a verb carrying a pronoun is in both); ``"other"`` (tokens in
    neither); and ``"share_agreement"``, ``"share_coreference"``, ``"share_relation"``: the
    fraction of all predicted tokens in each role. ``all`` is exactly
    ``share_relation * relation + (1 - share_relation) * other``. ``replace_z``: patches over
    the ``(n, seq_len)`` text, as in :func:`token_losses`.
    """
    _check_n_seed(n, seed)
    batch = sample_sequences(n, seed, model.config.seq_len, stream=EVAL_STREAM)
    losses = token_losses(model, batch.tokens, ablate, replace_z=replace_z)  # (B, N), NaN at <bos>
    scored = ~np.isnan(losses)
    agreement, coreference = batch.roles["agreement"] & scored, batch.roles["coreference"] & scored
    relation = agreement | coreference
    other = scored & ~relation
    return {
        "all": float(losses[scored].mean()),
        "agreement": float(losses[agreement].mean()),
        "coreference": float(losses[coreference].mean()),
        "relation": float(losses[relation].mean()),
        "other": float(losses[other].mean()),
        "share_agreement": float(agreement.sum() / scored.sum()),
        "share_coreference": float(coreference.sum() / scored.sum()),
        "share_relation": float(relation.sum() / scored.sum()),
    }
