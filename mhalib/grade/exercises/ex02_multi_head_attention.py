"""Exercise 02: ``split_heads``, ``merge_heads`` and ``multi_head_attention`` in NumPy."""

from __future__ import annotations

import numpy as np

from mhalib.grade.exercises import _numpy_variants as wrong
from mhalib.grade.exercises._attention import projection_weights, explain_attention_error, judge_attention
from mhalib.grade.spec import (
    FROM_SCRATCH_FORBIDDEN, Case, Exercise, Graded,
    check_array, match_variant,
)

KEY = "02_multi_head_attention"

_HEADS = {8: (2, 4), 12: (2, 3, 4, 6), 16: (2, 4, 8), 24: (2, 3, 4, 6, 8)}


def _dims(rng):
    d_model = int(rng.choice(list(_HEADS)))
    return d_model, int(rng.choice(_HEADS[d_model]))


def _x(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------- split / merge
def split_cases(rng):
    """Cases of ``split_heads(x, num_heads)``: x ``(N, d_model)``, ``(B, N, d_model)``, ``(2, B, N, d_model)``.

    float64 and float32, with N != H so that a missing axis swap shows; one more case has a
    num_heads (5 or 7) that does not divide d_model and must raise a ValueError naming both.
    """
    from mhalib.np_attention import split_heads

    cases = []
    for lead, dtype in (((), np.float64), ((int(rng.integers(2, 4)),), np.float32),
                        ((2, int(rng.integers(2, 4))), np.float64)):
        d_model, h = _dims(rng)
        n = int(rng.choice([m for m in range(3, 8) if m != h]))  # N != H: a missing swap shows
        x = _x(rng, (*lead, n, d_model), dtype)
        cases.append(Case(args=(x, h), expected=split_heads(x.astype(np.float64), h),
                          label=f"x {x.shape} {np.dtype(dtype).name}, num_heads={h}"))
    # num_heads that does not divide d_model: NumPy's own reshape error fails later, with its own
    # message; the exercise asks for a ValueError whose message names both
    d_model = int(rng.choice([12, 16, 24]))
    h = int(rng.choice([m for m in (5, 7) if d_model % m]))
    x = _x(rng, (int(rng.integers(3, 8)), d_model))
    cases.append(Case(args=(x, h), label=f"x {x.shape}, num_heads={h}", raises="ValueError",
                      raises_names=(d_model, h),
                      raises_why=f"num_heads={h} does not divide d_model={d_model}; raise ValueError "
                                 "saying what was given and which values would work"))
    return cases


def judge_split(case, got):
    """``None`` when ``split_heads`` is right, else a message naming the mistake.

    Recognises ``(..., N, H, d_head)`` (no axis swap) and heads mixed with positions
    (reshape straight to ``(..., H, N, d_head)``); otherwise the plain array message.
    """
    x, h = case.args
    exp = case.expected
    *lead, n, d = x.shape
    if isinstance(got, np.ndarray) and got.shape == (*lead, n, h, d // h) and got.shape != exp.shape:
        return (f"returned shape {got.shape} = (..., N, H, d_head): move the head axis in front of N "
                "(swap axes -3 and -2) to get (..., H, N, d_head)")
    msg = check_array(got, exp, "split_heads(x)")
    if msg:
        return match_variant(got, [
            ("heads come out in the wrong order: reshape to (..., N, H, d_head) first, then swap the "
             "N and H axes (reshape before transpose)", lambda: wrong.split(x, h, "reshape_only")),
        ]) or msg
    return None


def merge_cases(rng):
    """Cases of ``merge_heads(x)``: x ``(H, N, d_head)``, ``(B, H, N, d_head)`` and ``(2, 2, H, N, d_head)``.

    float64 and float32, with N != H.
    """
    from mhalib.np_attention import merge_heads

    cases = []
    for lead, dtype in (((), np.float64), ((int(rng.integers(2, 4)),), np.float32),
                        ((2, 2), np.float64)):
        h, dh = int(rng.integers(2, 5)), int(rng.integers(2, 5))
        n = int(rng.choice([m for m in range(3, 8) if m != h]))
        x = _x(rng, (*lead, h, n, dh), dtype)
        cases.append(Case(args=(x,), expected=merge_heads(x.astype(np.float64)),
                          label=f"x {x.shape} {np.dtype(dtype).name}"))
    return cases


def judge_merge(case, got):
    """``None`` when ``merge_heads`` is right, else a message naming the mistake.

    Recognises a reshape without swapping H and N back; otherwise the plain array message.
    """
    (x,) = case.args
    msg = check_array(got, case.expected, "merge_heads(x)")
    if msg:
        return match_variant(got, [
            ("positions and heads are mixed: swap the H and N axes back (to (..., N, H, d_head)) "
             "before reshaping to (..., N, d_model)", lambda: wrong.merge(x, "reshape_only")),
        ]) or msg
    return None


# ----------------------------------------------------------------------------- MHA
def mha_cases(rng):
    """Cases of ``multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None)``.

    x is ``(N, d_model)`` or ``(B, N, d_model)``, float64 or float32, with and without a
    causal mask (also on an x without a batch axis, where the mask must not add one); the
    answer ``(out, weights)`` is computed in float64.
    """
    from mhalib.np_attention import causal_mask, multi_head_attention

    cases = []
    plans = [((), np.float64, False), ((int(rng.integers(2, 4)),), np.float64, True),
             ((2,), np.float32, True), ((), np.float32, False), ((), np.float64, True)]
    for lead, dtype, causal in plans:
        d_model, h = _dims(rng)
        n = int(rng.integers(3, 7))
        x = _x(rng, (*lead, n, d_model), dtype)
        ws = projection_weights(rng, d_model, d_model, dtype)
        mask = causal_mask(n, dtype=dtype) if causal else None
        exp = multi_head_attention(x.astype(np.float64), *(w.astype(np.float64) for w in ws), h,
                                   mask=None if mask is None else mask.astype(np.float64))
        cases.append(Case(args=(x, *ws, h), kwargs={} if mask is None else {"mask": mask}, expected=exp,
                          label=f"x {x.shape} {np.dtype(dtype).name}, num_heads={h}"
                                + (", causal mask" if causal else "")))
    return cases


_FORBIDDEN = FROM_SCRATCH_FORBIDDEN

EXERCISE = Exercise(
    key=KEY,
    title="Multi-head attention in NumPy",
    forbidden=_FORBIDDEN,
    graded=[
        Graded(name="split_heads", points=2, signature="split_heads(x, num_heads)", make_cases=split_cases,
               judge=judge_split),
        Graded(name="merge_heads", points=2, signature="merge_heads(x)", make_cases=merge_cases, judge=judge_merge),
        Graded(name="multi_head_attention", points=4,
               signature="multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None)",
               make_cases=mha_cases, judge=judge_attention, explain_error=explain_attention_error),
    ],
)
