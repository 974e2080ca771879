"""Exercise 05: a head score from attention weights, and one ablation measured (NumPy).

* ``relation_score(weights, pairs)``: how much of each head's weight goes from the query
  that predicts a word onto the word it depends on (``mhalib.interpret.relation_score``
  for one layer);
* ``probe_accuracy_from_logits(logits, positions, correct, wrong)``: the share of probe
  items whose right form gets the higher logit (``mhalib.language.probe_accuracy``, from
  logits the learner computed);
* ``ablation_effect(logits, ablated_logits, tokens, positions, correct, wrong)``: what
  zeroing a head costs: the accuracy it takes away and the average loss it adds, in nats.

The cases are random arrays of the shapes the model produces; the references are written
here in NumPy, and the tests check them against ``mhalib.interpret`` and ``mhalib.language``
on the shipped model.
"""

from __future__ import annotations

import numpy as np

from mhalib.grade.exercises import _numpy_variants as wrong
from mhalib.grade.spec import Case, Exercise, Graded, check_array, check_pair, describe, match_variant

KEY = "05_heads_in_language"
_FORBIDDEN = ("mhalib.language.*",)


# ----------------------------------------------------------------------------- references
def reference_relation_score(weights, pairs):
    """``(H,)``: the mean over pairs ``(b, target, key)`` of ``weights[b, :, target - 1, key]``."""
    w = np.asarray(weights, dtype=np.float64)
    b, target, key = np.asarray(pairs, dtype=np.int64).reshape(-1, 3).T
    return w[b, :, target - 1, key].mean(axis=0)


def margins_from_logits(logits, positions, correct, wrong_ids):
    """``(n,)`` float64: item by item, the logit of the right form minus that of the wrong one,
    read where the item's word is predicted (``position - 1``). Written apart from
    ``mhalib.language.probes.margins_from_logits`` (one indexed gather), which a test holds
    it against on the shipped model."""
    x = np.asarray(logits, dtype=np.float64)  # (n, N, V)
    return np.array([x[i, int(p) - 1, int(c)] - x[i, int(p) - 1, int(w)]
                     for i, (p, c, w) in enumerate(zip(positions, correct, wrong_ids))], dtype=np.float64)


def reference_probe_accuracy(logits, positions, correct, wrong_ids):
    """Share of items whose right form has the strictly higher logit at ``position - 1``."""
    return float((margins_from_logits(logits, positions, correct, wrong_ids) > 0).mean())


def next_token_loss(logits, tokens):
    """Mean cross-entropy (nats) of predicting ``tokens[:, 1:]`` from ``logits[:, :-1]``."""
    x = np.asarray(logits, dtype=np.float64)[:, :-1]
    x = x - x.max(axis=-1, keepdims=True)
    log_p = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    t = np.asarray(tokens)[:, 1:]
    return float(-np.take_along_axis(log_p, t[..., None], axis=-1).mean())


def reference_ablation_effect(logits, ablated, tokens, positions, correct, wrong_ids):
    """``(accuracy_drop, loss_increase)``: intact minus ablated accuracy, ablated minus intact loss."""
    drop = (reference_probe_accuracy(logits, positions, correct, wrong_ids)
            - reference_probe_accuracy(ablated, positions, correct, wrong_ids))
    return drop, next_token_loss(ablated, tokens) - next_token_loss(logits, tokens)


# ----------------------------------------------------------------------------- helpers
def _number(got):
    """``got`` as a Python float when it is one number (int, float, NumPy scalar, 0-d array)."""
    if isinstance(got, (bool, np.bool_)):
        return None
    if isinstance(got, (int, float, np.integer, np.floating)):
        return float(got)
    if isinstance(got, np.ndarray) and got.shape in ((), (1,)) and got.dtype.kind in "iuf":
        return float(got.reshape(()))
    return None


def _check_number(got, expected, what, tol=1e-6):
    value = _number(got)
    if value is None:
        return None, f"{what} should be one number (a float); got {describe(got)}"
    if not np.isfinite(value):
        return value, f"{what} is {value}; expected a finite number"
    if abs(value - expected) > tol * max(1.0, abs(expected)):
        return value, f"{what} is {value:.6g}; expected {expected:.6g}"
    return value, None


def _pairs(rng, b, n, m):
    seq = rng.integers(0, b, size=m)
    target = rng.integers(2, n, size=m)
    key = np.array([rng.integers(0, t - 1) for t in target])  # key < target - 1: never the query itself
    return np.stack([seq, target, key], axis=1).astype(np.int64)


def _probe_items(rng, n_items, n, v):
    positions = rng.integers(1, n, size=n_items).astype(np.int64)
    correct = rng.integers(0, v, size=n_items).astype(np.int64)
    wrong_ids = (correct + rng.integers(1, v, size=n_items)) % v
    return positions, correct, wrong_ids.astype(np.int64)


def _tie(logits, positions, correct, wrong_ids, items):
    """Give items ``items`` the same logit for both forms: not passed, since passing needs the
    right form *strictly* higher (these ties tell ``>`` from ``>=``)."""
    for i in items:
        logits[i, positions[i] - 1, wrong_ids[i]] = logits[i, positions[i] - 1, correct[i]]


STRICT = ("an item whose two logits are equal was counted as passed: the right form must be "
          "strictly higher (>), not >=")
OVERFLOW = ("the loss is not finite: some logits are near 1000 and exp(1000) overflows; subtract "
            "each row's maximum before np.exp (log-sum-exp)")


# ----------------------------------------------------------------------------- relation score
def relation_cases(rng):
    """Three cases of ``relation_score(weights, pairs)``: causal weights ``(B, H, N, N)``, pairs ``(m, 3)``.

    float64 and float32 weights; pairs ``(b, target, key)`` int64 with ``key < target - 1``;
    head 0 puts all of the first pair's query weight on its key.
    """
    cases = []
    for dtype in (np.float64, np.float32, np.float64):
        b, h, n = int(rng.integers(2, 5)), int(rng.integers(2, 6)), int(rng.integers(6, 12))
        scores = rng.standard_normal((b, h, n, n)) * 2.0 + wrong.causal_mask(n)
        w = wrong.softmax(scores).astype(dtype)
        pairs = _pairs(rng, b, n, int(rng.integers(3, 9)))
        w[pairs[0, 0], 0, pairs[0, 1] - 1] = 0.0  # one head puts all of one query's weight on its key
        w[pairs[0, 0], 0, pairs[0, 1] - 1, pairs[0, 2]] = 1.0
        cases.append(Case(args=(w, pairs), expected=reference_relation_score(w, pairs),
                          label=f"weights {w.shape} {np.dtype(dtype).name}, pairs {pairs.shape}"))
    return cases


def judge_relation(case, got):
    """``None`` when the per-head scores ``(H,)`` are right, else a message naming the mistake.

    Recognises one row per pair, reading row ``target`` instead of ``target - 1``, query and
    key swapped, and a sum over the pairs instead of a mean.
    """
    w, pairs = case.args
    msg = check_array(got, case.expected, "relation_score(weights, pairs)")
    if not msg:
        return None
    w = w.astype(np.float64)
    b, target, key = pairs.T
    if isinstance(got, np.ndarray) and got.shape == (len(pairs), w.shape[1]):
        return ("the result has one row per pair; average over the pairs and keep one value per head (H,)")
    return match_variant(got, [
        ("you read row `target`; the word at `target` is predicted by the query at `target - 1`, "
         "so read weights[b, :, target - 1, key]", lambda: w[b, :, target, key].mean(axis=0)),
        ("rows are queries and columns keys: read weights[b, :, target - 1, key], not [..., key, target - 1]",
         lambda: w[b, :, key, target - 1].mean(axis=0)),
        ("take the mean over the pairs, not the sum", lambda: w[b, :, target - 1, key].sum(axis=0)),
    ]) or msg


# ----------------------------------------------------------------------------- probe accuracy
def probe_cases(rng):
    """Three cases of ``probe_accuracy_from_logits``: float32 logits ``(n_items, N, V)`` and int64 items.

    Some items are decided differently at ``position`` and at ``position - 1``, and some
    have both forms tied (to tell ``>`` from ``>=``); up to 40 items.
    """
    cases = []
    for n_items in (int(rng.integers(5, 12)), int(rng.integers(12, 30)), 40):
        n, v = int(rng.integers(5, 10)), int(rng.integers(6, 20))
        logits = rng.standard_normal((n_items, n, v)).astype(np.float32)
        positions, correct, wrong_ids = _probe_items(rng, n_items, n, v)
        # a few items decided at `position` but not at `position - 1`, to tell the two apart
        for i in range(0, n_items, 3):
            logits[i, positions[i] - 1, correct[i]] = 3.0
            logits[i, positions[i] - 1, wrong_ids[i]] = -3.0
            if positions[i] < n:
                logits[i, positions[i], [correct[i], wrong_ids[i]]] = [-3.0, 3.0]
        _tie(logits, positions, correct, wrong_ids, range(1, n_items, 4))
        args = (logits, positions, correct, wrong_ids)
        cases.append(Case(args=args, expected=reference_probe_accuracy(*args),
                          label=f"logits {logits.shape}, {n_items} items"))
    return cases


def judge_probe(case, got):
    """``None`` when the accuracy is right, else a message naming the mistake.

    Recognises a non-number, logits read at ``position``, a count instead of a share, the
    share where the wrong form wins, and ties counted as passed.
    """
    logits, positions, correct, wrong_ids = case.args
    value, msg = _check_number(got, case.expected, "probe_accuracy_from_logits(...)")
    if not msg:
        return None
    if value is None:
        return msg
    x = logits.astype(np.float64)
    rows = np.arange(len(positions))
    at_position = x[rows, np.minimum(positions, x.shape[1] - 1)]
    known = [
        ((at_position[rows, correct] > at_position[rows, wrong_ids]).mean(),
         "the logits at `position` predict the word after it; the word at `position` is "
         "predicted by the logits at `position - 1`"),
        ((margins_from_logits(x, positions, correct, wrong_ids) > 0).sum(),
         "return the share of items (between 0 and 1), not their count"),
        ((margins_from_logits(x, positions, correct, wrong_ids) < 0).mean(),
         "that is the share where the *wrong* form wins; count the items whose right form is higher"),
        ((margins_from_logits(x, positions, correct, wrong_ids) >= 0).mean(), STRICT),
    ]
    for wrong_value, why in known:
        if abs(value - float(wrong_value)) <= 1e-9 and abs(value - case.expected) > 1e-9:
            return why
    return msg


# ----------------------------------------------------------------------------- ablation effect
def effect_cases(rng):
    """Two cases of ``ablation_effect``: float32 logits and ablated logits ``(n_items, N, V)``.

    Tokens ``(n_items, N)`` are int64. The intact model is mostly right, one item is tied in
    the intact model only, and one row of logits is near 1000 in both (exp overflows without
    subtracting the maximum).
    """
    cases = []
    for n_items in (int(rng.integers(6, 12)), int(rng.integers(12, 24))):
        n, v = int(rng.integers(5, 10)), int(rng.integers(6, 16))
        logits = (rng.standard_normal((n_items, n, v)) * 2).astype(np.float32)
        ablated = (logits + rng.standard_normal(logits.shape).astype(np.float32)).astype(np.float32)
        tokens = rng.integers(0, v, size=(n_items, n)).astype(np.int64)
        positions, correct, wrong_ids = _probe_items(rng, n_items, n, v)
        rows = np.arange(n_items)
        logits[rows, positions - 1, correct] += 4.0  # the intact model is mostly right
        _tie(logits, positions, correct, wrong_ids, [1])  # in the intact model only: >= moves the drop
        # one row of logits near 1000, in both models: exp overflows unless the row's maximum is
        # subtracted first (a shift that changes no softmax, hence no loss; not a probe row)
        row = 0 if positions[0] != 1 else 1
        logits[0, row] += 1000.0
        ablated[0, row] += 1000.0
        args = (logits, ablated, tokens, positions, correct, wrong_ids)
        cases.append(Case(args=args, expected=reference_ablation_effect(*args),
                          label=f"logits {logits.shape}, {n_items} items"))
    return cases


def judge_effect(case, got):
    """``None`` when ``(accuracy_drop, loss_increase)`` is right, else a message naming the mistake.

    A list or an array of two numbers counts as the pair. Recognises a drop of the wrong
    sign or with ties counted as passed, and a loss increase that is not finite, of the
    wrong sign, in percent, in bits, or computed without shifting the tokens.
    """
    logits, ablated, tokens, positions, correct, wrong_ids = case.args
    if isinstance(got, list) or (isinstance(got, np.ndarray) and got.shape == (2,)):
        got = tuple(got)  # two numbers in a list or an array are as good as a tuple
    msg = check_pair(got, ("accuracy_drop", "loss_increase"))
    if msg:
        return msg
    drop, rise = case.expected
    got_drop, msg = _check_number(got[0], drop, "accuracy_drop (the first item)")
    if msg:
        if got_drop is not None and abs(got_drop + drop) <= 1e-9 and abs(drop) > 1e-9:
            return "accuracy_drop has the wrong sign: it is intact accuracy minus ablated accuracy"
        not_strict = [(margins_from_logits(x, positions, correct, wrong_ids) >= 0).mean()
                      for x in (logits, ablated)]
        if got_drop is not None and abs(got_drop - (not_strict[0] - not_strict[1])) <= 1e-9:
            return f"accuracy_drop: {STRICT}"
        return msg
    got_rise, msg = _check_number(got[1], rise, "loss_increase (the second item)")
    if not msg:
        return None
    if got_rise is None:
        return msg
    if not np.isfinite(got_rise):
        return f"loss_increase: {OVERFLOW}"
    intact = next_token_loss(logits, tokens)
    unshifted = lambda x: -np.take_along_axis(  # noqa: E731
        np.log(wrong.softmax(np.asarray(x, dtype=np.float64))), tokens[..., None], axis=-1).mean()
    known = [
        (-rise, "loss_increase has the wrong sign: it is ablated loss minus intact loss (positive when the head helped)"),
        (100 * rise / intact, "give the increase in nats (ablated minus intact), not in percent"),
        (rise / np.log(2), "give the increase in nats (natural log), not in bits"),
        (unshifted(ablated) - unshifted(logits),
         "the logits at position i predict token i + 1: compare logits[:, :-1] with tokens[:, 1:]"),
    ]
    for wrong_value, why in known:
        if abs(got_rise - float(wrong_value)) <= 1e-6 * max(1.0, abs(float(wrong_value))):
            return why
    return msg


EXERCISE = Exercise(
    key=KEY,
    title="Heads in a small language model: a head score and an ablation",
    forbidden=_FORBIDDEN,
    graded=[
        Graded(name="relation_score", points=3, signature="relation_score(weights, pairs)", make_cases=relation_cases,
               judge=judge_relation),
        Graded(name="probe_accuracy_from_logits", points=2,
               signature="probe_accuracy_from_logits(logits, positions, correct, wrong)",
               make_cases=probe_cases, judge=judge_probe),
        Graded(name="ablation_effect", points=3,
               signature="ablation_effect(logits, ablated_logits, tokens, positions, correct, wrong)",
               make_cases=effect_cases, judge=judge_effect),
    ],
)
