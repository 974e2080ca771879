"""Exercise 04: ``previous_token_score``, ``induction_score`` and ``ablate_head``."""

from __future__ import annotations

import numpy as np

from mhalib.grade.exercises import _numpy_variants as wrong
from mhalib.grade.spec import Case, Exercise, Graded, check_array, match_variant

KEY = "04_what_heads_learn"
_FORBIDDEN = ("mhalib.interpret.*",)


def causal_weights(rng, shape, dtype=np.float64):
    """Random attention maps ``(..., N, N)``: causal rows that sum to 1, some heads peaked."""
    n = shape[-1]
    scores = rng.standard_normal(shape) * 2.0
    scores = scores + wrong.causal_mask(n)
    return wrong.softmax(scores).astype(dtype)


# ----------------------------------------------------------------------------- previous token
def previous_cases(rng):
    """Cases of ``previous_token_score(weights)``: causal weights ``(H, N, N)`` or ``(B, H, N, N)``.

    float64 and float32; in the batched case head 0 is a clean previous-token head.
    """
    from mhalib.interpret import previous_token_score

    cases = []
    for lead, dtype in (((), np.float64), ((int(rng.integers(2, 4)),), np.float32), ((), np.float32)):
        h, n = int(rng.integers(2, 6)), int(rng.integers(4, 10))
        w = causal_weights(rng, (*lead, h, n, n), dtype)
        if lead:  # make one head a clean previous-token head
            w[:, 0] = np.eye(n, k=-1) + np.eye(n)[0] * (np.arange(n) == 0)[:, None]
        cases.append(Case(args=(w,), expected=previous_token_score(w.astype(np.float64)),
                          label=f"weights {w.shape} {np.dtype(dtype).name}"))
    return cases


def judge_previous(case, got):
    """``None`` when the per-head scores ``(H,)`` are right, else a message naming the mistake.

    Recognises one value per batch element, the next token or the diagonal measured
    instead of the previous token, and dividing by N instead of N - 1.
    """
    (w,) = case.args
    exp = case.expected
    w4 = w.astype(np.float64).reshape((-1,) + w.shape[-3:])
    n = w.shape[-1]
    if isinstance(got, np.ndarray) and got.ndim == 1 and got.shape != exp.shape and w.ndim == 4:
        if got.shape == (w.shape[0],):
            return f"the result has shape {got.shape}, one value per batch element; average over the batch, keep one value per head (H,)"
    msg = check_array(got, exp, "previous_token_score(weights)")
    if msg:
        diag = lambda k: np.diagonal(w4, offset=k, axis1=-2, axis2=-1)  # noqa: E731
        return match_variant(got, [
            ("you measured the weight on the next token (offset +1); rows are queries, so the previous "
             "token of query i is column i - 1", lambda: diag(1).mean(axis=(0, 2)) if n > 1 else None),
            ("you measured the weight of each token on itself (the diagonal); use column i - 1",
             lambda: diag(0).mean(axis=(0, 2))),
            ("divide by the N - 1 query positions that have a previous token, not by N",
             lambda: diag(-1).sum(axis=-1).mean(axis=0) / n),
        ]) or msg
    return None


# ----------------------------------------------------------------------------- induction
def _tokens(rng, b, n):
    kind = rng.integers(2)
    if kind == 0:  # random tokens from a small vocabulary: plenty of repeats
        return rng.integers(0, 5, size=(b, n))
    seg = n // 2
    first = rng.permutation(50)[:seg]  # a segment of distinct tokens, then its copy
    t = np.concatenate([first, first, rng.integers(50, 60, size=n - 2 * seg)])
    return np.broadcast_to(t, (b, n)).copy()


def induction_cases(rng):
    """Cases of ``induction_score(weights, tokens)``: causal weights ``(H, N, N)`` or ``(B, H, N, N)``.

    Tokens ``(N,)`` or ``(B, N)``, int64: either drawn from a vocabulary of 5 (many repeats)
    or a segment of distinct tokens followed by its copy.
    """
    from mhalib.interpret import induction_score

    cases = []
    for lead in ((), (int(rng.integers(2, 4)),), (2,)):
        h, n = int(rng.integers(2, 5)), int(rng.integers(6, 13))
        b = lead[0] if lead else 1
        tokens = _tokens(rng, b, n).astype(np.int64)
        if not lead:
            tokens = tokens[0]
        w = causal_weights(rng, (*lead, h, n, n))
        cases.append(Case(args=(w, tokens), expected=induction_score(w, tokens),
                          label=f"weights {w.shape}, tokens {tokens.shape}"))
    return cases


def _induction_variant(w, tokens, *, shift=1, all_queries=False):
    w4 = w.reshape((-1,) + w.shape[-3:])
    t = np.broadcast_to(tokens.reshape(-1, tokens.shape[-1]), (w4.shape[0], tokens.shape[-1]))
    n = t.shape[1]
    match = (t[:, :, None] == t[:, None, :]) & np.tri(n, n, -1, dtype=bool)[None]
    target = np.zeros_like(match)
    if shift:
        target[:, :, 1:] = match[:, :, :-1]
    else:
        target = match
    total = (w4 * target[:, None]).sum(-1)  # (B, H, N)
    queries = np.ones_like(match[..., 0]) if all_queries else match.any(-1)
    return (total * queries[:, None]).sum(axis=(0, 2)) / max(queries.sum(), 1)


def judge_induction(case, got):
    """``None`` when the per-head scores are right, else a message naming the mistake.

    Recognises the weight on the earlier occurrence itself (not the token after it) and
    averaging over every query instead of those whose token occurred before.
    """
    w, tokens = case.args
    msg = check_array(got, case.expected, "induction_score(weights, tokens)")
    if msg:
        return match_variant(got, [
            ("you measured the weight on the earlier occurrence itself (j), the duplicate-token "
             "pattern; an induction head looks at j + 1, the token that came next",
             lambda: _induction_variant(w, tokens, shift=0)),
            ("average only over the queries whose token occurred earlier, not over every query",
             lambda: _induction_variant(w, tokens, all_queries=True)),
        ]) or msg
    return None


# ----------------------------------------------------------------------------- ablation
def ablate_cases(rng):
    """Cases of ``ablate_head(z, head)``: z ``(H, N, d_head)``, ``(B, H, N, d_head)`` or 5-D.

    The 5-D case is ``(2, 2, H, N, d_head)``; float64 and float32, with a random head index.
    """
    from mhalib.interpret import ablate_head

    cases = []
    for lead, dtype in (((), np.float64), ((int(rng.integers(2, 4)),), np.float32), ((2, 2), np.float64)):
        h = int(rng.integers(2, 6))
        z = rng.standard_normal((*lead, h, int(rng.integers(3, 7)), int(rng.integers(2, 5)))).astype(dtype)
        head = int(rng.integers(0, h))
        cases.append(Case(args=(z, head), expected=ablate_head(z, head),
                          label=f"z {z.shape} {np.dtype(dtype).name}, head={head}"))
    return cases


def judge_ablate(case, got):
    """``None`` when the right head is zeroed, else a message naming the mistake.

    Recognises zeroing along the first axis instead of the head axis, and nothing zeroed.
    """
    z, head = case.args
    msg = check_array(got, case.expected.astype(np.float64), f"ablate_head(z, {head})")
    if msg:
        def first_axis():
            out = z.copy()
            out[head] = 0
            return out
        return match_variant(got, [
            ("the wrong axis was zeroed: the head axis is -3 in (..., H, N, d_head), e.g. out[..., head, :, :] = 0",
             first_axis),
            ("nothing was zeroed: set head `head` of the copy to zero", lambda: z),
        ]) or msg
    return None


EXERCISE = Exercise(
    key=KEY,
    title="What heads learn: scores and ablation",
    forbidden=_FORBIDDEN,
    graded=[
        Graded(name="previous_token_score", points=2, signature="previous_token_score(weights)",
               make_cases=previous_cases, judge=judge_previous),
        Graded(name="induction_score", points=3, signature="induction_score(weights, tokens)",
               make_cases=induction_cases, judge=judge_induction),
        Graded(name="ablate_head", points=2, signature="ablate_head(z, head)", make_cases=ablate_cases,
               judge=judge_ablate),
    ],
)
