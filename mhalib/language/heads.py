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

import dataclasses

import numpy as np
import torch

from mhalib.interpret import previous_token_score
from mhalib.language.grammar import THINGS, VOCAB, WORD_TO_ID, _plural, other_number, sample_sequences
from mhalib.language.probes import ProbeSet, probe_accuracy, probe_margins, probe_tokens
from mhalib.language.training import EVAL_STREAM, loss_by_role
from mhalib.training import num_threads

__all__ = ["attention_weights", "relation_score", "bos_score", "head_scores", "SCORE_NAMES", "ablation_table",
           "flip_subject_number", "record_heads", "number_patching", "path_patching", "mean_ablation"]

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


@torch.no_grad()
def record_heads(model, tokens, ablate=None, *, threads=1):
    """Every head's output ``z`` and attention weights on ``tokens`` (the inputs of a patch).

    Args:
        model: a :class:`~mhalib.language.model.LanguageModel`.
        tokens: ``(B, N)`` token ids.
        ablate: optional heads zeroed during the run.

    Returns:
        dict with ``"z"`` ``(B, L, H, N, d_head)`` and ``"weights"`` ``(B, L, H, N, N)`` tensors.
    """
    record = {}
    with num_threads(threads):
        model(torch.as_tensor(np.asarray(tokens), dtype=torch.long), ablate=ablate, record=record)
    return record


def number_patching(model, probes, heads=None):
    """Does a head's output carry the subject's number to the verb? Patch it from the counterfactual.

    For the agreement items with a thing subject, run the counterfactual (subject number
    flipped, :func:`flip_subject_number`), take one head's output ``z`` from that run, and
    put it into the run on the original item. If the head carries the number, the model
    now prefers the *other* form.

    Args:
        model: a :class:`~mhalib.language.model.LanguageModel`.
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


def path_patching(model, probes, upstream, downstream):
    """Through which path does an earlier head matter? Remove it from one path at a time.

    An earlier head reaches the prediction along three kinds of path: it changes where the
    later heads look (their queries and keys), it changes what they read (their values),
    or it goes around them (through the MLPs and the residual stream). Each run below
    removes ``upstream`` from one kind of path only, and keeps it everywhere else:

    * ``"intact"`` and ``"ablated"`` (``upstream`` zeroed on every path);
    * ``"query/key path"``: the ``downstream`` heads attend with the weights they have when
      ``upstream`` is zeroed; everything else is intact;
    * ``"value path"``: the ``downstream`` heads keep their intact weights but read the
      values they would read with ``upstream`` zeroed;
    * ``"other paths"``: ``upstream`` zeroed, but the ``downstream`` heads' outputs are
      the intact ones.

    Args:
        model: a :class:`~mhalib.language.model.LanguageModel`.
        probes: a ProbeSet.
        upstream: a ``(layer, head)`` pair.
        downstream: a pair, or a list of pairs, all in later layers than ``upstream``
            (for a 2-layer model: every head of layer 1).

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
    intact = record_heads(model, tokens)
    broken = record_heads(model, tokens, ablate=[upstream])
    pattern = lambda run: {d: run["weights"][:, d[0], d[1]] for d in down}  # noqa: E731  (n, N', N') each
    output = lambda run: {d: run["z"][:, d[0], d[1]] for d in down}  # noqa: E731  (n, N', d_head) each
    with torch.no_grad():  # intact weights, values from the ablated run
        value_only = {}
        model(tokens, ablate=[upstream], replace_weights=pattern(intact), record=value_only)
    rows = np.arange(len(probes))

    def on_key(weights):
        return float(np.mean([w.numpy()[rows, probes.positions - 1, probes.keys].mean() for w in weights.values()]))

    runs = {
        "intact": (dict(), pattern(intact)),
        "ablated": (dict(ablate=[upstream]), pattern(broken)),
        "query/key path": (dict(replace_weights=pattern(broken)), pattern(broken)),
        "value path": (dict(replace_z=output(value_only)), pattern(intact)),
        "other paths": (dict(ablate=[upstream], replace_z=output(intact)), pattern(intact)),
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
