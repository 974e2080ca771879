"""Multi-query associative recall (after Arora et al. 2023, *Zoology*, section 3): what a cache must hold.

A sequence lists ``P`` key-value pairs, then asks for keys again; after each asked key the
model must name its value::

    <bos> [k3:v7] [k9:v1] [k0:v4] ... | k9 v1 k3 v7 k9 v1 ...
          --- P pairs, one token each ---   --- queries: a key, then its value ---

Keys are distinct within a sequence and values drawn freely, so a value can only be
recalled by finding the pair whose key is the one asked and reading its value; nothing about
the query's position or its neighbours says which value comes. The answers (the values after
asked keys) are the only positions scored (``mask``). More pairs means more to hold and to
tell apart, further back; a window shorter than the distance to a pair cannot read it directly.
(In the course's measurements every full cache recalls above 0.99 at every number of pairs:
this task, at these sizes, does not reach the capacity of any of them.)

How it differs from Zoology's MQAR, and why. There a pair is two tokens, key then value; to
answer, a model must first copy each key into its value's position (a previous-token head) and
match on that in a later layer: an induction circuit. The course's small models did not form it
within a laptop's training budget (recall 0.17 to 0.32 after 1,000 to 3,000 steps, in every
configuration tried, with 32 values, so 1/32 by chance), so here each pair is one token
``[k:v]`` and a single attention hop answers. Also unlike Zoology: values may repeat within a
sequence (there they are distinct); keys are asked uniformly and repeatedly (there each once,
at positions drawn from a power law); and each answer follows its key in the input, so a later
ask of the same key can also be answered from an earlier ask (there the answers are labels only).
What a full cache must hold is unchanged: every pair, until it is asked.

Tokens: the recall task has its own ids after the grammar's (:data:`PAIR_IDS`, :data:`KEY_IDS`,
:data:`VALUE_IDS`) and starts with the grammar's ``<bos>``, so one model reads both.
Everything is drawn from ``numpy.random.default_rng([seed, stream])``.

The sizes are this course's choice, small enough for a laptop: 32 keys, 16 values,
sequences of 64 tokens, ``P`` in :data:`PAIRS`. Zoology's sweep uses a vocabulary of 8,192
and 4 to 256 pairs in sequences of 64 to 512 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mhalib.language.grammar import SEQ_LEN, VOCAB, make_rng

__all__ = ["NUM_KEYS", "NUM_VALUES", "KEY_IDS", "VALUE_IDS", "PAIR_IDS", "VOCAB_SIZE", "PAIRS", "RecallBatch",
           "make_recall", "RECALL_STREAM"]

NUM_KEYS = 32
NUM_VALUES = 16
KEY_IDS = np.arange(len(VOCAB), len(VOCAB) + NUM_KEYS)  # (32,)
VALUE_IDS = KEY_IDS[-1] + 1 + np.arange(NUM_VALUES)  # (16,)
#: ``PAIR_IDS[k, v]``: the token of the pair (key k, value v).
PAIR_IDS = (VALUE_IDS[-1] + 1 + np.arange(NUM_KEYS * NUM_VALUES)).reshape(NUM_KEYS, NUM_VALUES)  # (32, 16)
#: Tokens of a model that reads both the grammar and the recall task.
VOCAB_SIZE = int(PAIR_IDS[-1, -1]) + 1
#: Pairs per sequence that training mixes and the measurements sweep.
PAIRS = (4, 8, 16, 24, 32)
RECALL_STREAM = 20  # make_rng(seed, 20 + ...): the recall task's streams, apart from the grammar's


@dataclass
class RecallBatch:
    """Recall sequences and where they are scored.

    Attributes:
        tokens: ``(B, N)`` int64.
        mask: ``(B, N)`` bool, True at the answers (each value after a queried key).
        pairs: ``(B,)`` the number of pairs of each sequence.
        distance: ``(B, N)`` int, at each answer the distance back from the asked key to its
            pair (how far the model must look), 0 elsewhere.
    """

    tokens: np.ndarray
    mask: np.ndarray
    pairs: np.ndarray
    distance: np.ndarray


def _check(value, name, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}; got {name}={value!r}")
    return int(value)


def make_recall(n, seed, pairs=PAIRS, seq_len=SEQ_LEN, *, stream=0):
    """``n`` recall sequences; the same arguments give the same batch.

    Args:
        n: sequences.
        seed: seed of the text (``make_rng(seed, RECALL_STREAM + stream)``).
        pairs: the number of pairs, an int or a sequence of ints drawn from uniformly per sequence;
            each at most ``NUM_KEYS`` and at most ``seq_len - 3`` (room for one query).
        seq_len: tokens per sequence, ``<bos>`` included.
        stream: a stream of its own (0 training, 1 evaluation, others free).

    Returns:
        a :class:`RecallBatch`. After the pairs, queries fill the sequence: each is a key drawn
        uniformly from the sequence's keys, followed by its value; a last odd position holds
        one more key, unscored.
    """
    n = _check(n, "n", 1)
    seq_len = _check(seq_len, "seq_len", 4)
    choices = (pairs,) if isinstance(pairs, (int, np.integer)) and not isinstance(pairs, bool) else tuple(pairs)
    most = min(NUM_KEYS, seq_len - 3)
    if not choices or any(isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 1 <= p <= most
                          for p in choices):
        raise ValueError(f"pairs must be an int or a list of ints in 1 .. {most} (at most {NUM_KEYS} keys, and "
                         f"room for a query in {seq_len} tokens); got {pairs!r}")
    rng = make_rng(seed, RECALL_STREAM + _check(stream, "stream", 0))
    tokens = np.zeros((n, seq_len), np.int64)  # <bos> is id 0
    mask = np.zeros((n, seq_len), bool)
    distance = np.zeros((n, seq_len), np.int64)
    counts = np.empty(n, np.int64)
    for b in range(n):
        p = int(choices[rng.integers(len(choices))])
        counts[b] = p
        keys = rng.choice(NUM_KEYS, size=p, replace=False)  # (P,) distinct
        values = rng.integers(NUM_VALUES, size=p)  # (P,)
        tokens[b, 1:1 + p] = PAIR_IDS[keys, values]
        i = 1 + p
        while i < seq_len:
            j = rng.integers(p)
            tokens[b, i] = KEY_IDS[keys[j]]
            if i + 1 < seq_len:
                tokens[b, i + 1] = VALUE_IDS[values[j]]
                mask[b, i + 1] = True
                distance[b, i + 1] = i - (1 + j)
            i += 2
    return RecallBatch(tokens, mask, counts, distance)
