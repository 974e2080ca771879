"""Probes: does the model prefer the right form of a verb or a pronoun?

A probe item is a sequence of the grammar and one position in it where the grammar fixes
a word's form. The model passes the item when it gives the right form a higher
probability than the wrong one (the same verb with the other number, the same pronoun
with the other gender), as in Linzen et al. (2016) and Marvin & Linzen (2018). Only the
two forms are compared, so the model's uncertainty about *which* verb comes next does
not count.

* ``"agreement"``: a main verb, with an attractor of the *other* number between it and
  its subject ("the key near the cabinets | is"); constructions ``"pp"``, ``"orc"``
  (object relative clause), ``"src"`` (subject relative clause).
* ``"coreference"``: the pronoun of the antecedent against the pronoun of a competitor
  placed between them: "he" against "she" when the antecedent is a person and the
  competitor a person of the other gender, "it" against "they" when it is a thing and the
  competitor a thing of the other number (likewise "greets-him" against "greets-her");
  constructions ``"initial"`` (the next sentence's subject), ``"because"`` (notebook
  01's sentence in this grammar), ``"fused"`` (a verb carrying its object pronoun).

:class:`Bigram` is the baseline: the next word from the previous word alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mhalib.language.grammar import (SEQ_LEN, VOCAB, Grammar, decode, encode, make_rng,
                                     sample_sequences)
from mhalib.language.training import TRAIN_STREAM
from mhalib.training import num_threads

__all__ = ["PROBE_KINDS", "ProbeSet", "make_probe_set", "probe_margins", "margins_from_logits", "probe_accuracy",
           "Bigram"]

PROBE_KINDS = ("agreement", "coreference")
_STREAM = {"agreement": 2, "coreference": 3}
_OTHER = {"m": "f", "f": "m", "sg": "pl", "pl": "sg"}


@dataclass
class ProbeSet:
    """Probe items: sequences, the position to predict, the right and the wrong word.

    Attributes:
        kind: "agreement" or "coreference".
        tokens: ``(n, N)`` int64 NumPy array of whole sequences (only the tokens before
            ``positions`` matter: the model is causal).
        positions: ``(n,)`` position of the word to predict (predicted from position - 1).
        correct, wrong: ``(n,)`` token ids of the right form and of the other form.
        keys: ``(n,)`` position of the word the form depends on (subject or antecedent).
        constructions: ``(n,)`` array of construction names (see the module docstring).
    """

    kind: str
    tokens: np.ndarray
    positions: np.ndarray
    correct: np.ndarray
    wrong: np.ndarray
    keys: np.ndarray
    constructions: np.ndarray

    def __len__(self):
        return len(self.positions)

    def prefix(self, i):
        """The words of item ``i`` up to the word to predict, then ``right | wrong``."""
        words = decode(self.tokens[i, : self.positions[i]])
        return " ".join(words) + f" [{VOCAB[self.correct[i]]} | {VOCAB[self.wrong[i]]}]"


def _agreement_item(grammar, rng):
    construction = grammar._choice(rng, ("pp", "orc", "src"))
    predicate = grammar._choice(rng, ("intransitive", "copula", "transitive", "because", "fused"))
    subject = grammar._choice(rng, {"thing": 0.5, "person": 0.25, "name": 0.25})
    number = grammar._choice(rng, ("sg", "pl")) if subject == "thing" else "sg"
    target = dict(subject=subject, subject_number=number, attractor=construction,
                  attractor_number=_OTHER[number], predicate=predicate)
    forced = [None] * int(rng.random() < 0.5)
    if predicate == "fused":  # its object pronoun needs a singular person before it
        forced.append(dict(subject=grammar._choice(rng, ("person", "name"))))
    return construction, forced + [target], "agreement"


def _coreference_item(grammar, rng):
    construction = grammar._choice(rng, ("initial", "because", "fused"))
    kind = grammar._choice(rng, grammar.subject_kinds)  # the antecedent: a thing, a person, a name
    if kind == "thing":  # "it" against "they": a thing of the other number competes
        number = grammar._choice(rng, ("sg", "pl"))
        antecedent = dict(subject=kind, subject_number=number, distractor=("number", _OTHER[number]))
    else:  # "he" against "she": a person of the other gender competes
        gender = grammar._choice(rng, ("m", "f"))
        antecedent = dict(subject=kind, subject_gender=gender, distractor=("gender", _OTHER[gender]))
    forced = [None] * int(rng.random() < 0.5)
    if construction == "initial":
        forced += [antecedent, dict(subject="pronoun")]
    elif construction == "because":
        forced += [dict(antecedent, predicate="because")]
    else:
        forced += [antecedent, dict(subject=grammar._choice(rng, grammar.subject_kinds), predicate="fused")]
    return construction, forced, "coreference"


def make_probe_set(kind, n, seed, seq_len=SEQ_LEN):
    """``n`` probe items of ``kind`` drawn with ``seed``; the same arguments give the same set.

    Args:
        kind: "agreement" or "coreference".
        n: number of items.
        seed: seed of this probe set's own stream (different from the training text's).
        seq_len: tokens per sequence.

    Returns:
        a :class:`ProbeSet`. Constructions are drawn uniformly; half the items start with
        one free sentence before the forced ones.
    """
    if kind not in PROBE_KINDS:
        raise ValueError(f"kind must be one of {PROBE_KINDS}; got {kind!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int; got {n!r}")
    rng = make_rng(seed, _STREAM[kind])
    grammar = Grammar()
    make_item = _agreement_item if kind == "agreement" else _coreference_item
    rows, positions, correct, wrong, keys, constructions = [], [], [], [], [], []
    for _ in range(n):
        construction, forced, relation = make_item(grammar, rng)
        words, events, _, marks = grammar.sequence(rng, seq_len, forced)
        event = next(e for e in events[marks[-1]:] if e.relation == relation)
        rows.append(encode(words))
        positions.append(event.target)
        correct.append(encode([event.correct])[0])
        wrong.append(encode([event.wrong])[0])
        keys.append(event.key)
        constructions.append(construction)
    as_int = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    return ProbeSet(kind, as_int(rows), as_int(positions), as_int(correct), as_int(wrong), as_int(keys),
                    np.array(constructions))


def _check_probes(probes):
    if not isinstance(probes, ProbeSet):
        raise ValueError(f"probes must be a ProbeSet from make_probe_set(kind, n, seed); got {type(probes).__name__}")


@torch.no_grad()
def probe_margins(model, probes, ablate=None, *, threads=1):
    """``log p(right) - log p(wrong)`` for every item: positive means the model is right.

    Args:
        model: a :class:`~mhalib.language.model.LanguageModel`.
        probes: a :class:`ProbeSet`.
        ablate: list of ``(layer, head)`` pairs whose outputs are zeroed.

    Returns:
        NumPy ``(n,)`` float64, in nats.
    """
    _check_probes(probes)
    # the model is causal: the tokens after the last position to predict change nothing
    tokens = torch.as_tensor(probes.tokens[:, : int(probes.positions.max())])  # (n, N')
    was_training = model.training
    model.eval()
    with num_threads(threads):
        logits = model(tokens, ablate=ablate)  # (n, N, V)
    model.train(was_training)
    return margins_from_logits(logits.numpy(), probes.positions, probes.correct, probes.wrong)


def margins_from_logits(logits, positions, correct, wrong):
    """``logit(right) - logit(wrong)`` where each item's word is predicted: NumPy ``(n,)`` float64.

    Args:
        logits: ``(n, N, V)``, one row of items each.
        positions: ``(n,)`` where each item's word stands; it is predicted at ``position - 1``.
        correct, wrong: ``(n,)`` token ids of the two forms.

    Equal to ``log p(right) - log p(wrong)``: softmax's normaliser cancels.
    """
    x = np.asarray(logits, dtype=np.float64)
    rows = np.arange(x.shape[0])
    at = x[rows, np.asarray(positions) - 1]  # (n, V): the predicting position
    return at[rows, correct] - at[rows, wrong]


def probe_accuracy(model, probes, ablate=None):
    """Fraction of items where the model gives the right form the higher probability.

    Args:
        model: a :class:`~mhalib.language.model.LanguageModel`.
        probes: a :class:`ProbeSet` from :func:`make_probe_set`.
        ablate: list of ``(layer, head)`` pairs whose outputs are zeroed, e.g. ``[(1, 2)]``.

    Returns:
        float in [0, 1].
    """
    return float((probe_margins(model, probes, ablate) > 0).mean())


class Bigram:
    """The next word from the previous word alone: counts with add-one smoothing.

    Args:
        n: sequences of training text to count (``sample_sequences(n, seed, stream=0)``,
            the stream the models train on).
        seed: seed of that text.

    Attributes:
        log_probs: ``(V, V)``: ``log_probs[a, b] = log p(next = b | previous = a)``.
    """

    def __init__(self, n=4096, seed=0):
        tokens = sample_sequences(n, seed, stream=TRAIN_STREAM).tokens  # (n, N)
        v = len(VOCAB)
        counts = np.ones((v, v))
        np.add.at(counts, (tokens[:, :-1].ravel(), tokens[:, 1:].ravel()), 1)
        self.log_probs = np.log(counts / counts.sum(axis=1, keepdims=True))

    def margins(self, probes):
        """``log p(right) - log p(wrong)`` given the previous word, for every item: ``(n,)``."""
        _check_probes(probes)
        previous = probes.tokens[np.arange(len(probes)), probes.positions - 1]
        return self.log_probs[previous, probes.correct] - self.log_probs[previous, probes.wrong]

    def probe_accuracy(self, probes):
        """Fraction right; a tie (the previous word says nothing) counts as a coin flip, 1/2."""
        m = self.margins(probes)
        return float(((m > 0) + 0.5 * (m == 0)).mean())

    def loss(self, tokens):
        """Average next-token loss on ``tokens`` ``(B, N)`` (every token after the first)."""
        t = np.asarray(tokens)
        return float(-self.log_probs[t[:, :-1], t[:, 1:]].mean())
