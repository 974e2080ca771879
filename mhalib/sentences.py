"""Demo sentences with fixed, seeded token embeddings and projection weights.

Nothing here is trained: the embeddings are random vectors (the same for the same
word, whatever its case) plus a sinusoidal position code, so that the two "the"s of a
sentence differ. They make attention maps to look at, not meaningful ones.

Shapes: N tokens, d_model features. Weights use the ``x @ W`` convention.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["SENTENCES", "tokens_of", "positions", "embed", "demo_weights"]

#: name -> tokens. The first two are the demo inputs of notebook 02.
SENTENCES = {
    "The cat sat on": ["The", "cat", "sat", "on"],
    "I love deep learning": ["I", "love", "deep", "learning"],
    "the cat sat on the mat": ["the", "cat", "sat", "on", "the", "mat"],
    "The animal didn't cross the street because it was too tired": [
        "The", "animal", "didn't", "cross", "the", "street", "because", "it", "was", "too", "tired",
    ],
}


def tokens_of(sentence):
    """The tokens of a sentence given by name (a key of :data:`SENTENCES`) or as a list."""
    if isinstance(sentence, str):
        if sentence in SENTENCES:
            return list(SENTENCES[sentence])
        tokens = sentence.split()
    else:
        tokens = [str(t) for t in sentence]
    if not tokens:
        raise ValueError(f"a sentence needs at least one token; got {sentence!r}")
    return tokens


def positions(n, d_model):
    """Sinusoidal position codes (Vaswani et al. 2017, section 3.5): ``(n, d_model)``."""
    pos = np.arange(n)[:, None]  # (n, 1)
    i = np.arange(d_model)[None, :]  # (1, d_model)
    angle = pos / np.power(10000.0, (2 * (i // 2)) / d_model)  # (n, d_model)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle))  # (n, d_model)


def embed(sentence, d_model, *, position_scale=0.5):
    """Fixed embeddings of a sentence: ``(N, d_model)``.

    Each word (lower-cased) gets a standard-normal vector seeded by the word itself, so
    the same word always gets the same vector for a given ``d_model``; a scaled
    sinusoidal position code is added.
    """
    tokens = tokens_of(sentence)
    d_model = int(d_model)
    if d_model < 1:
        raise ValueError(f"d_model must be a positive integer; got d_model={d_model}")
    rows = [np.random.default_rng([zlib.crc32(t.lower().encode()), d_model]).standard_normal(d_model)
            for t in tokens]
    return np.stack(rows) + position_scale * positions(len(tokens), d_model)  # (N, d_model)


def demo_weights(d_model, *, seed=0, gain=1.5):
    """Seeded projection matrices ``w_q, w_k, w_v, w_o``, each ``(d_model, d_model)``.

    They depend on ``d_model`` and ``seed`` only, not on the number of heads: changing H
    regroups the same columns into heads. ``w_q`` and ``w_k`` are scaled by ``gain`` so
    the attention maps are peaked enough to see.
    """
    d_model = int(d_model)
    if d_model < 1:
        raise ValueError(f"d_model must be a positive integer; got d_model={d_model}")
    rng = np.random.default_rng([seed, d_model])
    std = 1.0 / np.sqrt(d_model)
    w_q, w_k, w_v, w_o = (rng.standard_normal((d_model, d_model)) * std for _ in range(4))
    return w_q * gain, w_k * gain, w_v, w_o
