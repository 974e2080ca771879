"""Exercise 07: ``grouped_query_attention`` and ``multi_query_attention`` in NumPy."""

from __future__ import annotations

import numpy as np

from mhalib.grade.exercises._attention import projection_weights, explain_attention_error, judge_attention
from mhalib.grade.spec import ATTENTION_FORBIDDEN, Case, Exercise, Graded

KEY = "07_mqa_gqa"

_PLANS = {4: (2,), 6: (2, 3), 8: (2, 4)}


def _case(rng, h, g, lead, dtype, causal):
    from mhalib.np_attention import causal_mask, grouped_query_attention

    dh = int(rng.integers(2, 5))
    d_model = h * dh
    n = int(rng.integers(3, 7))
    x = rng.standard_normal((*lead, n, d_model)).astype(dtype)
    ws = projection_weights(rng, d_model, g * dh, dtype)
    mask = causal_mask(n, dtype=dtype) if causal else None
    exp = grouped_query_attention(x.astype(np.float64), *(w.astype(np.float64) for w in ws), h, g,
                                  mask=None if mask is None else mask.astype(np.float64))
    return x, ws, mask, exp, n


def gqa_cases(rng):
    """Cases of ``grouped_query_attention``: x ``(N, d_model)`` or ``(B, N, d_model)``, H of 4, 6 or 8.

    float64 and float32, with and without a causal mask, g between 1 and H (including
    g = H and g = 1); one more case with H = 6, g = 4 must raise a ValueError saying that g
    does not divide H.
    """
    cases = []
    plans = [((), np.float64, False, None), ((2,), np.float64, True, None), ((3,), np.float32, True, None),
             ((2,), np.float64, True, "mha"), ((), np.float32, False, "mqa")]
    for lead, dtype, causal, kind in plans:
        h = int(rng.choice(list(_PLANS)))
        g = {"mha": h, "mqa": 1}.get(kind) or int(rng.choice(_PLANS[h]))
        x, ws, mask, exp, _ = _case(rng, h, g, lead, dtype, causal)
        cases.append(Case(args=(x, *ws, h, g), kwargs={} if mask is None else {"mask": mask}, expected=exp,
                          label=f"x {x.shape} {np.dtype(dtype).name}, H={h}, g={g}"
                                + (", causal mask" if causal else "")))
    # g that does not divide H: NumPy fails by itself later (the head axes do not broadcast),
    # naming shapes but never saying why, so the message must say that g does not divide H
    h, g = 6, 4
    dh = int(rng.integers(2, 5))
    x = rng.standard_normal((int(rng.integers(3, 7)), h * dh))
    ws = projection_weights(rng, h * dh, g * dh, np.float64)
    cases.append(Case(args=(x, *ws, h, g), label=f"x {x.shape}, H={h}, g={g}", raises="ValueError",
                      raises_names=(h, g, ["divi", "multiple"]),
                      raises_why=f"num_kv_heads={g} does not divide num_heads={h}; raise ValueError "
                                 "that says so"))
    return cases


def mqa_cases(rng):
    """Three cases of ``multi_query_attention``: x ``(N, d_model)`` or ``(B, N, d_model)``, one K/V head.

    float64 and float32, with and without a causal mask; H is 4, 6 or 8.
    """
    cases = []
    for lead, dtype, causal in (((), np.float64, False), ((2,), np.float64, True), ((3,), np.float32, True)):
        h = int(rng.choice(list(_PLANS)))
        x, ws, mask, exp, _ = _case(rng, h, 1, lead, dtype, causal)
        cases.append(Case(args=(x, *ws, h), kwargs={} if mask is None else {"mask": mask}, expected=exp,
                          label=f"x {x.shape} {np.dtype(dtype).name}, H={h}"
                                + (", causal mask" if causal else "")))
    return cases


def judge_mqa(case, got):
    """``None`` when ``(out, weights)`` is right, else a message naming the mistake (one K/V head)."""
    return judge_attention(case, got, g=1)


def explain_mqa_error(case, error, call):
    """The mistake behind an exception of ``multi_query_attention`` (heads not merged), or ``None``."""
    return explain_attention_error(case, error, call, g=1)


_FORBIDDEN = ATTENTION_FORBIDDEN

EXERCISE = Exercise(
    key=KEY,
    title="Multi-query and grouped-query attention",
    forbidden=_FORBIDDEN,
    graded=[
        Graded(name="grouped_query_attention", points=5,
               signature="grouped_query_attention(x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads, mask=None)",
               make_cases=gqa_cases, judge=judge_attention, explain_error=explain_attention_error),
        Graded(name="multi_query_attention", points=3,
               signature="multi_query_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None)",
               make_cases=mqa_cases, judge=judge_mqa, explain_error=explain_mqa_error),
    ],
)
