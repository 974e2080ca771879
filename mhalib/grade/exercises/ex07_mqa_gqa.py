"""Exercise 07: ``grouped_query_attention`` and ``multi_query_attention`` in NumPy."""

from __future__ import annotations

import numpy as np

from mhalib.grade.exercises import _numpy_variants as wrong
from mhalib.grade.exercises._attention import projection_weights, explain_attention_error, judge_attention
from mhalib.grade.spec import ATTENTION_FORBIDDEN, Case, Exercise, Graded, Variant

KEY = "07_mqa_gqa"

_PLANS = {4: (2,), 6: (2, 3), 8: (2, 4)}

# The variants: which K/V head a query head reads, and how a projection's columns are dealt to
# its heads. The course's own: query head h reads K/V head h // (H // g) (consecutive query heads
# share one: np.repeat), and head h owns the d_head consecutive columns h * d_head .. (h+1) * d_head - 1.
_CONSECUTIVE = "query head h reads K/V head h // (H // g) (consecutive query heads share one: np.repeat)"
_ROUND_ROBIN = "query head h reads K/V head h % g (round-robin: heads j, j + g, j + 2g, ... share K/V head j)"
_BLOCKED = "head h owns the d_head consecutive columns h * d_head .. (h + 1) * d_head - 1 of its projection"
_INTERLEAVED = ("the columns are dealt to the heads in turn: column c of x @ w_q belongs to query head c % H, "
                "column c of x @ w_k and x @ w_v to K/V head c % g (head h owns columns h, h + H, h + 2H, ...); "
                "merge the heads back the same way before w_o")
VARIANTS = (
    Variant("", f"{_CONSECUTIVE}; {_BLOCKED}", {"kv_heads": "consecutive", "columns": "blocked"},
            "K/V head h // (H // g), heads in blocks of columns"),
    Variant("B", f"{_ROUND_ROBIN}; {_BLOCKED}", {"kv_heads": "round_robin", "columns": "blocked"},
            "K/V head h % g, heads in blocks of columns"),
    Variant("C", f"{_CONSECUTIVE}; {_INTERLEAVED}", {"kv_heads": "consecutive", "columns": "interleaved"},
            "K/V head h // (H // g), heads in interleaved columns"),
    Variant("D", f"{_ROUND_ROBIN}; {_INTERLEAVED}", {"kv_heads": "round_robin", "columns": "interleaved"},
            "K/V head h % g, heads in interleaved columns"),
)


def frame(variant):
    """The keyword arguments of :func:`_numpy_variants.gqa` that compute ``variant``'s attention."""
    return {"repeat": "tile" if variant["kv_heads"] == "round_robin" else "interleave",
            "columns": variant["columns"]}


def variant_attention(variant, x, ws, h, g, mask):
    """``(out, weights)`` of ``variant``, in float64 (the course's own: mhalib's reference)."""
    x64, w64 = np.asarray(x, dtype=np.float64), [np.asarray(w, dtype=np.float64) for w in ws]
    m64 = None if mask is None else np.asarray(mask, dtype=np.float64)
    if variant is None or not variant.code:
        from mhalib.np_attention import grouped_query_attention

        return grouped_query_attention(x64, *w64, h, g, mask=m64)
    return wrong.gqa(x64, *w64, h, g, m64, **frame(variant))


def _case(rng, h, g, lead, dtype, causal, variant=None):
    from mhalib.np_attention import causal_mask

    dh = int(rng.integers(2, 5))
    d_model = h * dh
    n = int(rng.integers(3, 7))
    x = rng.standard_normal((*lead, n, d_model)).astype(dtype)
    ws = projection_weights(rng, d_model, g * dh, dtype)
    mask = causal_mask(n, dtype=dtype) if causal else None
    return x, ws, mask, variant_attention(variant, x, ws, h, g, mask), n


def _extra(variant, x, ws, h, g, mask):
    """What a variant's judge needs: the variant, its conventions, and the other variants' answers."""
    if variant is None or not variant.code:
        return {}
    others = [(v, variant_attention(v, x, ws, h, g, mask)) for v in VARIANTS if v.code != variant.code]
    return {"variant": variant, "frame": frame(variant), "others": others, "exercise": KEY[:2]}


def gqa_cases(rng, variant=None):
    """Cases of ``grouped_query_attention``: x ``(N, d_model)`` or ``(B, N, d_model)``, H of 4, 6 or 8.

    float64 and float32, with and without a causal mask (also on an x without a batch axis, where a
    mask must not add one), g between 1 and H (including g = H and g = 1); one more case with
    H = 6, g = 4 must raise a ValueError whose message names both. A ``variant`` keeps the same
    draws; its answers follow its conventions.
    """
    cases = []
    plans = [((), np.float64, False, None), ((2,), np.float64, True, None), ((3,), np.float32, True, None),
             ((2,), np.float64, True, "mha"), ((), np.float32, False, "mqa"), ((), np.float64, True, None)]
    for lead, dtype, causal, kind in plans:
        h = int(rng.choice(list(_PLANS)))
        g = {"mha": h, "mqa": 1}.get(kind) or int(rng.choice(_PLANS[h]))
        x, ws, mask, exp, _ = _case(rng, h, g, lead, dtype, causal, variant)
        cases.append(Case(args=(x, *ws, h, g), kwargs={} if mask is None else {"mask": mask}, expected=exp,
                          label=f"x {x.shape} {np.dtype(dtype).name}, H={h}, g={g}"
                                + (", causal mask" if causal else ""), extra=_extra(variant, x, ws, h, g, mask)))
    # g that does not divide H: NumPy fails by itself later (a reshape, or head axes that do not
    # broadcast), with its own message; the exercise asks for a ValueError that names H and g
    h, g = 6, 4
    dh = int(rng.integers(2, 5))
    x = rng.standard_normal((int(rng.integers(3, 6)), h * dh))  # N < 6: no axis of 6 but the heads'
    ws = projection_weights(rng, h * dh, g * dh, np.float64)
    cases.append(Case(args=(x, *ws, h, g), label=f"x {x.shape}, H={h}, g={g}", raises="ValueError",
                      raises_names=(h, g),
                      raises_why=f"num_kv_heads={g} does not divide num_heads={h}; raise ValueError "
                                 "whose message names both"))
    return cases


def mqa_cases(rng, variant=None):
    """Four cases of ``multi_query_attention``: x ``(N, d_model)`` or ``(B, N, d_model)``, one K/V head.

    float64 and float32, with and without a causal mask (also on an x without a batch axis);
    H is 4, 6 or 8.
    """
    cases = []
    for lead, dtype, causal in (((), np.float64, False), ((2,), np.float64, True), ((3,), np.float32, True),
                                ((), np.float32, True)):
        h = int(rng.choice(list(_PLANS)))
        x, ws, mask, exp, _ = _case(rng, h, 1, lead, dtype, causal, variant)
        cases.append(Case(args=(x, *ws, h), kwargs={} if mask is None else {"mask": mask}, expected=exp,
                          label=f"x {x.shape} {np.dtype(dtype).name}, H={h}"
                                + (", causal mask" if causal else ""), extra=_extra(variant, x, ws, h, 1, mask)))
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
    variants=VARIANTS,
)
