"""Exercise 08: ``mean_pool_kv``, the mean-pool conversion of a K or V projection weight.

The weight arrives in the learner's function as a torch tensor (as ``layer.weight``
would), ``(H * d_head, d_model)``; the reference is :func:`mhalib.convert.mean_pool_kv`.
"""

from __future__ import annotations

import numpy as np

from mhalib.grade.spec import Case, Exercise, Graded, check_array, match_variant

KEY = "08_mha_to_gqa"
_PLANS = [(4, 2), (4, 1), (8, 2), (8, 4), (6, 3), (6, 2), (4, 4)]


def mean_pool_cases(rng):
    """Four cases of ``mean_pool_kv(weight, num_heads, num_kv_heads)``, weight ``(H * d_head, d_model)``.

    The weight is float32; (H, g) = (4, 2) and three other pairs, from g = 1 to g = H.
    """
    from mhalib.convert import mean_pool_kv

    cases = []
    picks = [_PLANS[0]] + [_PLANS[int(i)] for i in rng.choice(np.arange(1, len(_PLANS)), 3, replace=False)]
    for h, g in picks:
        d_head = int(rng.integers(2, 6))
        d_model = int(rng.choice([8, 12, 16]))
        weight = rng.standard_normal((h * d_head, d_model)).astype(np.float32)
        cases.append(Case(args=(weight, h, g), expected=np.asarray(mean_pool_kv(weight.astype(np.float64), h, g)),
                          label=f"weight {weight.shape} (H={h}, d_head={d_head}), num_kv_heads={g}"))
    return cases


def judge_mean_pool(case, got):
    """``None`` when the pooled weight ``(g * d_head, d_model)`` is right, else a message naming the mistake.

    Recognises groups of every g-th head instead of consecutive heads, a sum instead of a
    mean, the first head of each group, and rows split as ``(d_head, H)``.
    """
    weight, h, g = case.args
    w = weight.astype(np.float64)
    rows, d_model = w.shape
    d_head = rows // h
    msg = check_array(got, case.expected, "mean_pool_kv(weight, num_heads, num_kv_heads)")
    if not msg:
        return None
    heads = w.reshape(h, d_head, d_model)
    return match_variant(got, [
        ("groups must be consecutive heads: group k is heads k*H/g .. (k+1)*H/g - 1 (you averaged "
         "every g-th head)", lambda: heads.reshape(h // g, g, d_head, d_model).mean(0).reshape(-1, d_model)),
        ("take the mean of each group, not the sum",
         lambda: heads.reshape(g, h // g, d_head, d_model).sum(1).reshape(-1, d_model)),
        ("that is the first head of each group; the exercise asks for the mean of the group",
         lambda: heads.reshape(g, h // g, d_head, d_model)[:, 0].reshape(-1, d_model)),
        ("the rows were split as (d_head, H) instead of (H, d_head): head j owns rows j*d_head .. (j+1)*d_head - 1",
         lambda: w.reshape(d_head, g, h // g, d_model).mean(2).transpose(1, 0, 2).reshape(-1, d_model)),
    ]) or msg


EXERCISE = Exercise(
    key=KEY,
    title="From MHA to GQA: mean-pooling K/V heads",
    preload=("torch",),
    graded=[
        Graded(name="mean_pool_kv", points=4, signature="mean_pool_kv(weight, num_heads, num_kv_heads)",
               make_cases=mean_pool_cases, judge=judge_mean_pool,
               forbidden=("mhalib.convert.*", "mhalib.attention.*"), params={"torch_args": [0]}),
    ],
)
