"""Finding what heads do, in any model of the course: attention scores, ablation, patching.

Scores of one layer take attention weights ``(H, N, N)`` or ``(B, H, N, N)`` (rows are
queries, as everywhere in mhalib) as NumPy arrays or torch tensors and return one number
per head, a NumPy array ``(H,)``:

* :func:`previous_token_score`: mean weight on the token one back;
* :func:`offset_score`: the same for any fixed distance back;
* :func:`induction_score`: weight on the token *after* an earlier occurrence of the
  current token (the induction pattern of Olsson et al., 2022);
* :func:`duplicate_token_score`: weight on earlier occurrences of the current token.

Scores of every layer take ``(B, L, H, N, N)`` and return ``(L, H)``:
:func:`relation_score` (weight from the query predicting a target onto a given key) and
:func:`bos_score` (weight on position 0, the attention sink).

On a model (:class:`~mhalib.decoder.Decoder`): :func:`attention_weights`,
:func:`head_scores` (any of the scores above, for every head), :func:`ablation_table`
(each head zeroed in turn, measured by a function you give), :func:`record_heads` (what
each head computed: the inputs of a patch), and :func:`ablate_head` /
:func:`ablation_hook` for the model's ``z_hook``.

Removing a head can mean three things (:data:`ABLATIONS`): set its output to zero, to its
mean over reference text (position by position), or to its output on another, randomly
drawn reference sequence (resample ablation). :func:`ablation_kwargs` turns each into the
model's keyword arguments, so that a claim about a head can be tested under all three.

Counting a claim over seeds: :func:`count_null` gives the chance of a count at least as
large (or as small) if each seed held the claim with a given probability (the null).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from mhalib.runtime import measuring

__all__ = [
    "previous_token_score",
    "offset_score",
    "induction_score",
    "duplicate_token_score",
    "ablate_head",
    "ablation_hook",
    "relation_score",
    "bos_score",
    "attention_weights",
    "record_heads",
    "head_scores",
    "SCORES",
    "ablation_table",
    "ABLATIONS",
    "ablation_kwargs",
    "count_null",
    "claim_status",
    "null_bound",
    "Claim",
]


def _as_numpy(x, name):
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of numbers; got {type(x).__name__}") from None


def _weights_4d(weights):
    w = _as_numpy(weights, "weights")
    if w.ndim == 3:
        w = w[None]  # (1, H, N, N)
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be (H, N, N) or (B, H, N, N); got shape {np.shape(weights)}")
    return w  # (B, H, N, N)


def _tokens_2d(tokens, w):
    t = np.asarray(tokens.detach().cpu().numpy() if hasattr(tokens, "detach") else tokens)
    if t.ndim == 1:
        t = t[None]  # (1, N)
    b, _, n, _ = w.shape
    if t.ndim != 2 or t.shape[1] != n or t.shape[0] not in (1, b):
        raise ValueError(
            f"tokens must be (N,) or (B, N) matching weights (B={b}, H, N={n}, N={n}); "
            f"got shape {np.shape(tokens)}"
        )
    return np.broadcast_to(t, (b, n))  # (B, N)


def offset_score(weights, offset):
    """Mean attention weight on the key ``offset`` positions back.

    Args:
        weights: ``(H, N, N)`` or ``(B, H, N, N)``.
        offset: distance back, ``1 <= offset < N``.

    Returns:
        ``(H,)``: the mean of ``weights[..., i, i - offset]`` over the batch and the
        query positions ``i = offset .. N - 1``.
    """
    w = _weights_4d(weights)  # (B, H, N, N)
    n = w.shape[-1]
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or not 1 <= offset < n:
        raise ValueError(f"offset must be an int in 1 .. {n - 1} for N={n}; got {offset!r}")
    i = np.arange(offset, n)
    return w[:, :, i, i - offset].mean(axis=(0, 2))  # (H,)


def previous_token_score(weights):
    """Mean attention weight on the previous token.

    Args:
        weights: ``(H, N, N)`` or ``(B, H, N, N)`` with ``N >= 2``.

    Returns:
        ``(H,)``: the mean of ``weights[..., i, i - 1]`` over the batch and the query
        positions ``1 .. N - 1`` (position 0 has no previous token). 1 for a head that
        always looks one back, about ``1 / i`` on average for a uniform causal head.
    """
    w = _weights_4d(weights)
    if w.shape[-1] < 2:
        raise ValueError(f"previous_token_score needs N >= 2 positions; got N={w.shape[-1]}")
    return offset_score(w, 1)


def _earlier_matches(t):
    """``(B, N, N)`` bool: ``[b, i, j]`` True when ``j < i`` and ``t[b, j] == t[b, i]``."""
    n = t.shape[1]
    same = t[:, :, None] == t[:, None, :]  # (B, N, N)
    return same & np.tri(n, n, -1, dtype=bool)[None]  # (B, N, N): keys strictly before the query


def _masked_mean(w, target, queries):
    """Mean over the selected queries of the total weight on the target keys; ``(H,)``."""
    total = (w * target[:, None]).sum(axis=-1)  # (B, H, N)
    count = queries.sum()
    if count == 0:
        return np.zeros(w.shape[1])
    return (total * queries[:, None]).sum(axis=(0, 2)) / count  # (H,)


def induction_score(weights, tokens):
    """Attention on the token that followed an earlier occurrence of the current token.

    For a query i whose token appeared before, at every position j < i with
    ``tokens[j] == tokens[i]``, an induction head looks at ``j + 1`` (what came next
    last time) to predict what comes next now.

    Args:
        weights: ``(H, N, N)`` or ``(B, H, N, N)``.
        tokens: ``(N,)`` or ``(B, N)`` token ids of the same sequences.

    Returns:
        ``(H,)``: the mean, over all queries (batch and positions) whose token occurred
        earlier, of the total weight on the positions ``j + 1``. Zeros if no token repeats.
    """
    w = _weights_4d(weights)  # (B, H, N, N)
    match = _earlier_matches(_tokens_2d(tokens, w))  # (B, N, N)
    target = np.zeros_like(match)
    target[:, :, 1:] = match[:, :, :-1]  # (B, N, N): j + 1 for every match j
    return _masked_mean(w, target, match.any(axis=-1))


def duplicate_token_score(weights, tokens):
    """Attention on earlier occurrences of the current token.

    Args:
        weights: ``(H, N, N)`` or ``(B, H, N, N)``.
        tokens: ``(N,)`` or ``(B, N)``.

    Returns:
        ``(H,)``: the mean, over queries whose token occurred earlier, of the total weight
        on the positions j < i holding the same token. Zeros if no token repeats.
    """
    w = _weights_4d(weights)
    match = _earlier_matches(_tokens_2d(tokens, w))  # (B, N, N)
    return _masked_mean(w, match, match.any(axis=-1))


def ablate_head(z, head):
    """A copy of the per-head outputs ``z`` with one head (or several) set to zero.

    Args:
        z: ``(..., H, N, d_head)``, NumPy array or torch tensor (the head outputs before
            they are merged and projected by ``W_O``).
        head: an int in ``0 .. H - 1``, or a sequence of them.

    Returns:
        same type and shape as ``z``; ``z`` itself is left unchanged.
    """
    if not hasattr(z, "ndim") or z.ndim < 3:
        raise ValueError(f"z must be an array (..., H, N, d_head) with at least 3 dimensions; "
                         f"got shape {getattr(z, 'shape', type(z).__name__)}")
    num_heads = z.shape[-3]
    heads = [head] if isinstance(head, (int, np.integer)) and not isinstance(head, bool) else head
    try:
        heads = list(heads)
    except TypeError:
        raise ValueError(f"head must be an int or a list of ints; got {head!r}") from None
    for h in heads:
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or not 0 <= h < num_heads:
            raise ValueError(f"head must be in 0 .. {num_heads - 1} (z has H={num_heads}); got {h!r}")
    out = z.clone() if hasattr(z, "clone") else np.array(z, copy=True)
    out[..., heads, :, :] = 0
    return out


def ablation_hook(layer, heads):
    """A ``z_hook`` for :meth:`~mhalib.decoder.Decoder.forward` that zeroes ``heads`` in ``layer``.

    The same as ``ablate=[(layer, h) for h in heads]``; written out, it shows what a hook is.
    """
    def hook(layer_index, z):
        return ablate_head(z, heads) if layer_index == layer else z
    return hook


def _weights_5d(weights):
    w = _as_numpy(weights, "weights")
    if w.ndim != 5 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"weights must be (B, L, H, N, N); got shape {np.shape(weights)}")
    return w


def relation_score(weights, pairs):
    """Mean weight from the query that predicts ``target`` onto ``key``, per head of every layer.

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
    """Mean weight on position 0 (``<bos>``, the attention sink) over every query after it: ``(L, H)``."""
    w = _weights_5d(weights)
    return w[:, :, :, 1:, 0].mean(axis=(0, 3))  # (L, H)


def _tokens_tensor(tokens):
    import torch

    return torch.as_tensor(np.asarray(tokens.detach().cpu() if hasattr(tokens, "detach") else tokens),
                           dtype=torch.long)


def _measured(model, tokens, threads, **options):
    """One run of ``model`` on ``tokens``, measuring (:func:`mhalib.runtime.measuring`)."""
    with measuring(model, threads):
        return model(_tokens_tensor(tokens), **options)


def attention_weights(model, tokens, ablate=None, *, threads=1):
    """Every layer's attention weights for ``tokens`` ``(B, N)`` (NumPy or torch): NumPy ``(B, L, H, N, N)``.

    ``ablate``: optional ``(layer, head)`` pairs zeroed during the run. The model runs in eval
    mode (no dropout), as every measurement of :mod:`mhalib.interpret` does.
    """
    _, weights = _measured(model, tokens, threads, return_weights=True, ablate=ablate)  # (B, L, H, N, N)
    return weights.numpy()


def record_heads(model, tokens, ablate=None, *, threads=1, replace_z=None):
    """Every head's output ``z`` and attention weights on ``tokens`` (the inputs of a patch).

    Args:
        model: a :class:`~mhalib.decoder.Decoder`.
        tokens: ``(B, N)`` token ids.
        ablate: optional heads zeroed during the run.
        replace_z: optional patches ``(layer, head) -> (B, N, d_head)`` during the run (e.g.
            a mean or resample ablation, :func:`ablation_kwargs`).

    Returns:
        dict with ``"z"`` ``(B, L, H, N, d_head)`` and ``"weights"`` ``(B, L, H, N, N)`` tensors.
    """
    record = {}
    _measured(model, tokens, threads, ablate=ablate, replace_z=replace_z, record=record)
    return record


#: The scores :func:`head_scores` computes from the tokens alone (a relation's come from its pairs).
SCORES = ("previous", "bos", "induction", "duplicate")


def head_scores(model, tokens, names=("previous", "induction", "duplicate"), *, relations=None):
    """Scores of every head of ``model`` on ``tokens``, from one run's attention weights.

    Args:
        model: a :class:`~mhalib.decoder.Decoder`.
        tokens: ``(B, N)`` token ids (NumPy or torch).
        names: which scores, in this order (a name or a list of names): any of :data:`SCORES`,
            and the names of ``relations``.
        relations: optional dict name -> ``(M, 3)`` pairs ``(sequence, target, key)`` scored
            by :func:`relation_score` (e.g. the grammar's ``batch.relations``). A name found
            here is scored from its pairs, even one of :data:`SCORES`.

    Returns:
        dict name -> ``(L, H)`` NumPy array (ready for ``mhalib.plots.attention_grid(..., scores=...)``).
    """
    relations = relations or {}
    names = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in names if n not in relations and n not in SCORES]
    if unknown:
        raise ValueError(f"unknown scores {unknown}; allowed: {list(SCORES)} and the relations given "
                         f"({sorted(relations) or 'none'})")
    w = attention_weights(model, tokens)  # (B, L, H, N, N)
    t = _tokens_tensor(tokens).numpy()
    by_layer = {"previous": previous_token_score, "induction": lambda wl: induction_score(wl, t),
                "duplicate": lambda wl: duplicate_token_score(wl, t)}
    out = {}
    for name in names:
        if name in relations:
            out[name] = relation_score(w, relations[name])
        elif name == "bos":
            out[name] = bos_score(w)
        else:
            out[name] = np.stack([by_layer[name](w[:, layer]) for layer in range(w.shape[1])])  # (L, H)
    return out


def ablation_table(model, measure, heads=None):
    """What removing each head costs: ``measure`` with the model intact, then with each head zeroed.

    Args:
        model: a :class:`~mhalib.decoder.Decoder`.
        measure: ``fn(ablate) -> dict`` of numbers, where ``ablate`` is None (intact) or a
            list of ``(layer, head)`` pairs to zero; e.g.
            ``lambda ablate: mhalib.copytask.training.evaluate(model, task, ablate=ablate)``.
        heads: which ablations to run, a list of lists of ``(layer, head)`` pairs
            (default: every single head).

    Returns:
        list of dicts ``{"ablate": pairs, **measure(pairs)}``; the first row is the intact
        model (``"ablate"`` is ``[]``), then one row per ablation.
    """
    if heads is None:
        heads = [[(layer, head)] for layer in range(model.num_layers) for head in range(model.num_heads)]
    return [{"ablate": ablate, **measure(ablate or None)} for ablate in [[]] + [list(h) for h in heads]]


#: The three ways of removing a head: its output set to zero, to its mean over reference
#: text (position by position), or to its output on another reference sequence.
ABLATIONS = ("zero", "mean", "resample")


def ablation_kwargs(heads, how, batch_size, length, reference_z=None, *, seed=0):
    """Keyword arguments for :meth:`~mhalib.decoder.Decoder.forward` that remove ``heads`` one way.

    Args:
        heads: ``(layer, head)`` pairs to remove.
        how: one of :data:`ABLATIONS`: ``"zero"`` (``ablate=heads``), ``"mean"`` (each head's
            output replaced by its mean over the reference sequences at the same position) or
            ``"resample"`` (replaced by its output on one reference sequence, drawn at random
            for each item with ``seed``; the same draw for every head removed).
        batch_size, length: the shape ``(B, N)`` of the tokens the model will run on.
        reference_z: ``(R, L, H, N_ref, d_head)`` tensor of head outputs on reference text
            (``record_heads(model, reference)["z"]``, with ``N_ref >= length``); needed for
            ``"mean"`` and ``"resample"``.

    Returns:
        dict: ``{"ablate": [...]}`` or ``{"replace_z": {(layer, head): (B, N, d_head)}}``.
    """
    if how not in ABLATIONS:
        raise ValueError(f"how must be one of {ABLATIONS}; got {how!r}")
    heads = [tuple(int(v) for v in h) for h in heads]
    if how == "zero":
        return {"ablate": heads}
    if reference_z is None or getattr(reference_z, "ndim", 0) != 5:
        raise ValueError(f"{how} ablation needs reference_z (R, L, H, N_ref, d_head) from "
                         f"record_heads(model, reference)['z']")
    if reference_z.shape[3] < length:
        raise ValueError(f"reference sequences have {reference_z.shape[3]} positions; the tokens have {length}")
    if how == "mean":
        mean = reference_z[:, :, :, :length].mean(dim=0)  # (L, H, N, d_head)
        return {"replace_z": {(l, h): mean[l, h].expand(batch_size, -1, -1) for l, h in heads}}
    draw = np.random.default_rng(seed).integers(reference_z.shape[0], size=batch_size)  # (B,)
    idx = _tokens_tensor(draw)
    return {"replace_z": {(l, h): reference_z[idx, l, h, :length] for l, h in heads}}


@dataclass(frozen=True)
class Claim:
    """One claim about a trained model, as a test of one seed (notebooks 04, 05 and 08).

    Attributes:
        key: a short name.
        text: the claim in words, as the notebook states it.
        test: ``fn(measurements, how) -> bool`` (``how`` is ignored by claims that are not
            about an ablation).
        null: the per-seed chance under the null: a number (a permutation null), or
            ``"untrained"`` (the share of untrained models that pass the test).
        null_text: how that chance was computed.
        ablations: the ablations the claim is tested under (``("none",)``: no ablation).
        section: the notebook section that states it.
    """

    key: str
    text: str
    test: Callable
    null: object
    null_text: str
    ablations: tuple = ("none",)
    section: str = ""


def claim_status(by, finding):
    """The verdict on a claim counted over seeds under each ablation (``by``: ablation -> a dict with
    ``count``, ``tail`` and ``p_value``, as :func:`count_null` gives).

    Under one ablation the count is:

    * ``"finding"``: at least ``finding`` seeds, and above its null (tail ``"at least"``, P <= 0.05);
    * ``"tendency"``: fewer seeds, but still above its null (P <= 0.05);
    * ``"below its null"``: clearly *below* what chance gives (tail ``"at most"``, P <= 0.05);
    * ``"not above its null"``: anything else (P > 0.05: chance alone gives a count like it).

    A count that is not above its null is never a tendency, however many seeds it holds in.
    Returns the verdict when it is the same under every ablation, else the verdicts with their
    ablations, e.g. ``"finding under zero, mean; not above its null under resample"``.
    """
    def one(v):
        if v["p_value"] > 0.05:
            return "not above its null"
        if v["tail"] != "at least":
            return "below its null"
        return "finding" if v["count"] >= finding else "tendency"

    verdicts = {how: one(v) for how, v in by.items()}
    if len(set(verdicts.values())) == 1:
        return next(iter(verdicts.values()))
    order = [v for v in ("finding", "tendency", "below its null", "not above its null") if v in verdicts.values()]
    return "; ".join(f"{v} under {', '.join(h for h, w in verdicts.items() if w == v)}" for v in order)


def null_bound(passed, models, tail, level=0.05):
    """The one-sided confidence bound (Clopper-Pearson, ``level``) on a null chance estimated from models.

    A null measured on ``models`` models (untrained ones, say), ``passed`` of which pass, is an
    estimate: 0 of 10 does not mean the chance is 0. For a count tested for being *high*
    (``tail="at least"``) the honest null is the largest chance the models do not rule out:
    the upper bound (0 of 10 gives 1 - 0.05 ** (1 / 10) = 0.259); for a count tested for being
    *low*, the lower bound.
    """
    if not 0 <= passed <= models or models < 1:
        raise ValueError(f"need 0 <= passed <= models with models >= 1; got passed={passed!r}, models={models!r}")
    if tail not in ("at least", "at most"):
        raise ValueError(f"tail must be 'at least' or 'at most'; got {tail!r}")
    if tail == "at least" and passed == models or tail == "at most" and passed == 0:
        return float(passed / models)
    # upper bound u: P(X <= passed | u) = level; lower bound l: P(X >= passed | l) = level (bisection)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if tail == "at least":
            too_small = count_null(passed, models, mid, "at most")["p_value"] > level
        else:
            too_small = count_null(passed, models, mid, "at least")["p_value"] < level
        lo, hi = (mid, hi) if too_small else (lo, mid)
    return (lo + hi) / 2


def count_null(count, total, p, tail="at least", estimated_from=None):
    """The chance of a count this extreme if each of ``total`` seeds held the claim with chance ``p``.

    A claim "in ``count`` of ``total`` seeds" is read against a null: the per-seed chance
    ``p`` that it holds by accident (for "the costliest head is in layer 0", 4 of 8 heads
    are: ``p = 1/2``). Seeds are independent runs, so the count is binomial (Poisson-binomial
    when the chance differs from seed to seed).

    Args:
        count, total: the count and the number of seeds.
        p: the per-seed chance under the null, in [0, 1], or a list of ``total`` such chances.
        tail: ``"at least"`` (P(X >= count)) or ``"at most"`` (P(X <= count)).
        estimated_from: when ``p`` is a share measured on models (e.g. 0 of 10 untrained
            models pass), the number of those models: the tail is then computed with the
            bound of :func:`null_bound` on the side that makes the test conservative, so
            that "0 of 10 untrained models" is not read as a chance of exactly 0.

    Returns:
        dict ``{"expected": sum of the chances, "p_value": float}``, plus ``"p_bound"`` (the
        chance the tail was computed with) when ``estimated_from`` is given.
    """
    if isinstance(total, bool) or not isinstance(total, (int, np.integer)) or total < 1 or not 0 <= count <= total:
        raise ValueError(f"need 0 <= count <= total with total >= 1; got count={count!r}, total={total!r}")
    chances = [float(p)] * int(total) if np.ndim(p) == 0 else [float(v) for v in p]
    if len(chances) != total or not all(0 <= v <= 1 for v in chances):
        raise ValueError(f"p must be a probability in [0, 1] or a list of {total} of them; got {p!r}")
    if tail not in ("at least", "at most"):
        raise ValueError(f"tail must be 'at least' or 'at most'; got {tail!r}")
    pmf = np.zeros(total + 1)
    pmf[0] = 1.0
    for v in chances:  # add one seed at a time: P(k) = P(k) (1 - v) + P(k - 1) v
        pmf[1:] = pmf[1:] * (1 - v) + pmf[:-1] * v
        pmf[0] *= 1 - v
    tail_mass = pmf[count:].sum() if tail == "at least" else pmf[:count + 1].sum()
    out = {"expected": float(sum(chances)), "p_value": float(min(1.0, tail_mass))}
    if estimated_from is not None:
        if np.ndim(p) != 0 or isinstance(estimated_from, bool) or not isinstance(estimated_from, (int, np.integer)) \
                or estimated_from < 1 or abs(p * estimated_from - round(p * estimated_from)) > 1e-9:
            raise ValueError(f"estimated_from must be the number of models p was measured on (p a share of them); "
                             f"got p={p!r}, estimated_from={estimated_from!r}")
        bound = null_bound(int(round(p * estimated_from)), int(estimated_from), tail)
        out.update(p_value=count_null(count, total, bound, tail)["p_value"], p_bound=bound)
    return out
