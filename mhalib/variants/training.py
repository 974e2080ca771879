"""Training a variant on the grammar and the recall task together, and measuring it.

Every step draws a fresh batch: half of ``batch_size`` sequences of the grammar (every
token after ``<bos>`` scored, as notebook 05's models) and half recall sequences
(:mod:`mhalib.variants.recall`; only the answers scored, with the number of pairs drawn
from :data:`~mhalib.variants.recall.PAIRS` for each sequence). One optimiser, the loss over
all scored tokens together. The schedule and the optimiser are notebook 05's
(:func:`mhalib.language.train_language`): Adam, linear warm-up, cosine to a tenth, gradients
clipped at norm 1.
"""

from __future__ import annotations

import torch

from mhalib.decoder import Decoder
from mhalib.fit import fit, warmup_cosine
from mhalib.language.grammar import Grammar, encode, make_rng
from mhalib.language.training import TRAIN_STREAM
from mhalib.variants.recall import PAIRS, make_recall

__all__ = ["RECIPE", "train_variant", "mixed_batch"]

#: The recipe every variant follows (one thread keeps a run reproducible on one machine).
RECIPE = {"steps": 1000, "batch_size": 32, "lr": 3e-3, "warmup": 100, "threads": 1}


def mixed_batch(grammar_rng, grammar, seed, step, batch_size, seq_len):
    """One training batch: ``(tokens (B, N), mask (B, N))``, B/2 grammar rows first, recall rows after."""
    text_rows = batch_size // 2
    rows = [encode(grammar.sequence(grammar_rng, seq_len)[0]) for _ in range(text_rows)]
    text = torch.tensor(rows, dtype=torch.long)  # (B/2, N)
    recall = make_recall(batch_size - text_rows, seed, PAIRS, seq_len, stream=1000 + step)  # one stream per step
    tokens = torch.cat([text, torch.from_numpy(recall.tokens)])  # (B, N)
    mask = torch.cat([torch.ones_like(text, dtype=torch.bool), torch.from_numpy(recall.mask)])  # (B, N)
    return tokens, mask


def train_variant(model, *, seed=0, steps=RECIPE["steps"], batch_size=RECIPE["batch_size"], lr=RECIPE["lr"],
                  warmup=RECIPE["warmup"], threads=RECIPE["threads"], progress=True, stop_after=None):
    """Train ``model`` (a :class:`~mhalib.decoder.Decoder` of :mod:`mhalib.variants.model`) in place.

    ``seed`` seeds the text (the grammar's training stream and the recall task's) and dropout;
    the weights are drawn when the model is made (:func:`~mhalib.variants.model.new_variant_model`).
    Returns the history of :func:`mhalib.fit.fit` (loss and accuracy per step).
    """
    if not isinstance(model, Decoder):
        raise ValueError(f"train_variant trains a Decoder (new_variant_model); got {type(model).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 2:
        raise ValueError(f"batch_size must be an int >= 2 (grammar and recall rows); got {batch_size!r}")
    rng = make_rng(seed, TRAIN_STREAM)
    grammar = Grammar()
    return fit(model, lambda step: mixed_batch(rng, grammar, seed, step, batch_size, model.config.seq_len),
               steps, lr=lr, schedule=lambda step, total, peak: warmup_cosine(step, total, peak, warmup),
               clip_norm=1.0, dropout_seed=seed, threads=threads, progress=progress, desc="training",
               stop_after=stop_after)
