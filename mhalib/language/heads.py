"""Which head does what in the language model: the grammar's head scores, and the patching that tests them.

The measuring tools themselves are the course's one set, in :mod:`mhalib.interpret`
(:func:`~mhalib.interpret.head_scores`, :func:`~mhalib.interpret.ablation_table`,
:func:`~mhalib.interpret.record_heads`); this module supplies what is the grammar's own:

* :data:`SCORE_NAMES`: the five scores notebook 05 reads, three of them from the grammar's
  relation pairs (verb -> subject ``"agreement"``, pronoun -> antecedent ``"coreference"``,
  and ``"induction"``), scored on its text by :func:`grammar_head_scores`;
* the interventions that test what a score suggests: :func:`number_patching` (does a head
  carry the subject's number?), :func:`path_patching` (does an earlier head act by changing
  where a later head looks?), :func:`mean_ablation`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from mhalib.interpret import ablation_kwargs, head_scores, record_heads
from mhalib.language.grammar import THINGS, VOCAB, WORD_TO_ID, _plural, other_number, sample_sequences
from mhalib.language.probes import ProbeSet, probe_margins, probe_tokens
from mhalib.language.training import EVAL_STREAM

__all__ = ["SCORE_NAMES", "grammar_head_scores", "flip_subject_number", "number_patching", "path_patching",
           "mean_ablation"]

SCORE_NAMES = ("previous", "bos", "agreement", "coreference", "induction")


def grammar_head_scores(model, n=256, seed=0):
    """The five :data:`SCORE_NAMES` of every head, on ``n`` fresh sequences of the grammar.

    The text is ``sample_sequences(n, seed, stream=EVAL_STREAM)``; "agreement", "coreference"
    and "induction" are :func:`~mhalib.interpret.relation_score` on its relation pairs.

    Returns:
        dict name -> ``(L, H)`` NumPy array.
    """
    text = sample_sequences(n, seed, model.config.seq_len, stream=EVAL_STREAM)
    return head_scores(model, text.tokens, SCORE_NAMES, relations=text.relations)


# ----------------------------------------------------------------------------- interventions
def flip_subject_number(probes):
    """Agreement items with a thing as subject, and the same items with its number flipped.

    The counterfactual of "the key near the cabinets | is" is "the keys near the cabinets
    | are": the subject noun (and the verb of a subject relative clause, "that chases",
    which agrees with it) takes the other number; the right and wrong forms swap.

    Args:
        probes: an agreement :class:`~mhalib.language.probes.ProbeSet`.

    Returns:
        ``(kept, flipped)``: the items whose subject is a thing (a ``ProbeSet``) and their
        counterfactuals (same positions, same length).
    """
    if not isinstance(probes, ProbeSet) or probes.kind != "agreement":
        raise ValueError("flip_subject_number takes an agreement ProbeSet from make_probe_set('agreement', n, seed)")
    noun_swap = {}
    for noun in THINGS:
        noun_swap[WORD_TO_ID[noun]], noun_swap[WORD_TO_ID[_plural(noun)]] = WORD_TO_ID[_plural(noun)], WORD_TO_ID[noun]
    that = WORD_TO_ID["that"]
    rows = np.arange(len(probes))
    keep = np.array([int(probes.tokens[i, probes.keys[i]]) in noun_swap for i in rows])
    kept = _select(probes, keep)
    tokens = kept.tokens.copy()
    for i, key in enumerate(kept.keys):
        tokens[i, key] = noun_swap[int(tokens[i, key])]
        if tokens[i, key + 1] == that:  # a subject relative clause: its verb agrees with the subject
            word = VOCAB[tokens[i, key + 2]]
            try:
                tokens[i, key + 2] = WORD_TO_ID[other_number(word)]
            except ValueError:  # an object relative clause: "that the cats ...", nothing to flip
                pass
    answers = np.where(kept.answers == "sg", "pl", "sg")
    flipped = dataclasses.replace(kept, tokens=tokens, correct=kept.wrong.copy(), wrong=kept.correct.copy(),
                                  answers=answers)
    return kept, flipped


def _select(probes, mask):
    """The items of ``probes`` where ``mask`` is True."""
    return dataclasses.replace(probes, **{f.name: getattr(probes, f.name)[mask] for f in dataclasses.fields(probes)
                                          if f.name != "kind"})


def number_patching(model, probes, heads=None):
    """Does a head's output carry the subject's number to the verb? Patch it from the counterfactual.

    For the agreement items with a thing subject, run the counterfactual (subject number
    flipped, :func:`flip_subject_number`), take one head's output ``z`` from that run, and
    put it into the run on the original item. If the head carries the number, the model
    now prefers the *other* form.

    Args:
        model: a :class:`~mhalib.decoder.Decoder`.
        probes: an agreement ProbeSet.
        heads: ``(layer, head)`` pairs to patch one at a time (default: every head).

    Returns:
        dict ``(layer, head)`` -> share of items whose preference flips, plus the two
        references: ``"none"`` (no patch: the model's error rate) and ``"all"`` (the
        counterfactual run itself: its accuracy on the flipped items).
    """
    kept, flipped = flip_subject_number(probes)
    tokens_cf = probe_tokens(flipped)
    source = record_heads(model, tokens_cf)["z"]  # (n, L, H, N', d_head)
    if heads is None:
        heads = [(layer, head) for layer in range(model.num_layers) for head in range(model.num_heads)]
    out = {"none": float((probe_margins(model, kept) < 0).mean()),
           "all": float((probe_margins(model, flipped) > 0).mean())}
    for layer, head in heads:
        margins = probe_margins(model, kept, replace_z={(layer, head): source[:, layer, head]})
        out[(layer, head)] = float((margins < 0).mean())
    return out


def path_patching(model, probes, upstream, downstream, *, how="zero", reference_z=None, seed=0):
    """Through which path does an earlier head matter? Remove it from one path at a time.

    An earlier head reaches the prediction along three kinds of path: it changes where the
    later heads look (their queries and keys), it changes what they read (their values),
    or it goes around them (through the MLPs and the residual stream). Each run below
    removes ``upstream`` from one kind of path only, and keeps it everywhere else:

    * ``"intact"`` and ``"ablated"`` (``upstream`` removed on every path);
    * ``"query/key path"``: the ``downstream`` heads attend with the weights they have when
      ``upstream`` is removed; everything else is intact;
    * ``"value path"``: the ``downstream`` heads keep their intact weights but read the
      values they would read with ``upstream`` removed;
    * ``"other paths"``: ``upstream`` removed, but the ``downstream`` heads' outputs are
      the intact ones.

    Args:
        model: a :class:`~mhalib.decoder.Decoder`.
        probes: a ProbeSet.
        upstream: a ``(layer, head)`` pair.
        downstream: a pair, or a list of pairs, all in later layers than ``upstream``
            (for a 2-layer model: every head of layer 1).
        how: how ``upstream`` is removed, one of :data:`mhalib.interpret.ABLATIONS` ("zero",
            the default; "mean" and "resample" need ``reference_z``, see
            :func:`mhalib.interpret.ablation_kwargs`, drawn with ``seed``).

    Returns:
        dict run -> ``{"accuracy": float, "weight_on_key": float}``: the accuracy, and
        the downstream heads' mean weight from the predicting position onto the subject
        (or antecedent) in that run.
    """
    upstream = tuple(upstream)
    down = [tuple(downstream)] if np.ndim(downstream) == 1 else [tuple(d) for d in downstream]
    if any(layer <= upstream[0] for layer, _ in down):
        raise ValueError(f"downstream heads {down} must all be in later layers than upstream {upstream}")
    tokens = probe_tokens(probes)
    remove = ablation_kwargs([upstream], how, tokens.shape[0], tokens.shape[1], reference_z, seed=seed)
    intact = record_heads(model, tokens)
    broken = record_heads(model, tokens, **remove)
    pattern = lambda run: {d: run["weights"][:, d[0], d[1]] for d in down}  # noqa: E731  (n, N', N') each
    output = lambda run: {d: run["z"][:, d[0], d[1]] for d in down}  # noqa: E731  (n, N', d_head) each
    with torch.no_grad():  # intact weights, values from the ablated run
        value_only = {}
        model(tokens, replace_weights=pattern(intact), record=value_only, **remove)
    rows = np.arange(len(probes))

    def on_key(weights):
        return float(np.mean([w.numpy()[rows, probes.positions - 1, probes.keys].mean() for w in weights.values()]))

    around = dict(remove, replace_z={**remove.get("replace_z", {}), **output(intact)})
    runs = {
        "intact": (dict(), pattern(intact)),
        "ablated": (remove, pattern(broken)),
        "query/key path": (dict(replace_weights=pattern(broken)), pattern(broken)),
        "value path": (dict(replace_z=output(value_only)), pattern(intact)),
        "other paths": (around, pattern(intact)),
    }
    out = {}
    for name, (patch, seen) in runs.items():
        margins = probe_margins(model, probes, **patch)
        out[name] = {"accuracy": float((margins > 0).mean()), "weight_on_key": on_key(seen)}
    return out


def mean_ablation(model, probes, heads, *, n=256, seed=0):
    """Probe accuracy with ``heads`` replaced by their mean output instead of zero.

    The mean is taken over ``n`` fresh sequences of the grammar, position by position, so
    the head keeps its average contribution and loses only what it says about *this*
    item. Zero ablation also removes the average, which the rest of the model may rely on.

    Returns:
        float: the accuracy.
    """
    tokens = probe_tokens(probes)
    text = sample_sequences(n, seed, model.config.seq_len, stream=EVAL_STREAM).tokens
    z = record_heads(model, text)["z"].mean(dim=0)  # (L, H, N, d_head)
    patch = {(layer, head): z[layer, head, : tokens.shape[1]].expand(len(probes), -1, -1) for layer, head in heads}
    return float((probe_margins(model, probes, replace_z=patch) > 0).mean())
