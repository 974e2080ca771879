"""Exercise 01: ``causal_mask(n)`` and ``scaled_dot_product_attention(q, k, v, mask=None)``."""

from __future__ import annotations

import numpy as np

from mhalib.grade.exercises import _numpy_variants as wrong
from mhalib.grade.spec import (
    FROM_SCRATCH_FORBIDDEN, Case, Exercise, Graded,
    check_array, check_pair, judge_returned, match_variant,
)

KEY = "01_single_head_attention"


# ----------------------------------------------------------------------------- causal_mask
def causal_mask_cases(rng):
    """Four cases of ``causal_mask(n)``: one small, one medium and one larger n (2 to 16), and n = 1."""
    from mhalib.np_attention import causal_mask

    ns = [int(rng.integers(2, 5)), int(rng.integers(5, 9)), int(rng.integers(9, 17)), 1]
    return [Case(args=(n,), expected=causal_mask(n), label=f"causal_mask({n})") for n in ns]


def judge_causal_mask(case, got):
    """``None`` when the mask is right, else a message naming the mistake.

    Recognises a boolean mask, ``-inf`` below instead of above the diagonal, ``-inf`` on the
    diagonal, a large finite number or 1 in place of ``-inf``, and 1 where 0.0 belongs;
    otherwise the plain shape, dtype or value message.
    """
    n = case.args[0]
    expected = case.expected
    if isinstance(got, np.ndarray) and got.shape == expected.shape:
        upper = np.triu(np.ones((n, n), dtype=bool), k=1)
        if got.dtype.kind == "b":
            return ("causal_mask returned booleans; return an additive float mask: 0.0 on and "
                    "below the diagonal, -inf above it")
        g = got.astype(np.float64) if got.dtype.kind in "fiu" else None
        if g is not None and not np.isnan(g).any():
            if n > 1 and np.isneginf(g[upper.T]).all() and not np.isneginf(g[upper]).any():
                return ("the -inf entries are below the diagonal; put them above it, so query i "
                        "sees keys 0..i (np.triu(..., k=1))")
            if np.isneginf(np.diag(g)).any():
                return ("mask has -inf on the diagonal: a position must be allowed to attend to "
                        "itself (use k=1 in np.triu)")
            above = g[upper] if n > 1 else np.array([-np.inf])
            if np.isfinite(above).all() and (above <= -1e3).all() and (g[~upper] == 0).all():
                return (f"use -inf above the diagonal, not a large finite number ({above.min():g}): "
                        "the exercise asks for exactly 0 and -inf")
            if (above == 1).all() and (g[~upper] == 0).all():
                return "use -inf above the diagonal, not 1: the mask is added to the scores"
            if (g[~upper] == 1).all():
                return "allowed positions must be 0.0 (an additive mask), not 1"
    return check_array(got, expected, f"causal_mask({n})")


NO_POSITIONS = ("a mask needs at least one position (say in the message what was given and that n "
                "must be at least 1)")


def causal_mask_refusal_cases(rng):
    """n = 0 and a negative n: the exercise asks for a ValueError that says what was given.

    NumPy refuses a negative n by itself (``np.ones((-2, -2))``: "negative dimensions are not
    allowed"); that message does not name n, so a function without the check earns nothing.
    """
    return [Case(args=(n,), label=f"causal_mask({n})", raises="ValueError", raises_why=NO_POSITIONS,
                 raises_names=(n,))
            for n in (0, -int(rng.integers(1, 6)))]


# ----------------------------------------------------------------------------- SDPA
def _rand(rng, shape, dtype):
    return (rng.standard_normal(shape) * 1.5).astype(dtype)


def sdpa_cases(rng):
    """Cases of ``scaled_dot_product_attention(q, k, v, mask=None)`` with ``(out, weights)`` answers.

    Inputs are 2-D ``(N, d)``, 3-D ``(B, N, d)`` and 4-D ``(B, H, N, d)``, float64 and float32,
    with N_k != N_q and d_v != d_k in some; masks: none, causal, padding, a finite bias,
    boolean (True = keep), one that blocks every key of query 0, and scores up to 1000.
    Also a cube B = N = d (where ``k.T`` runs) and a too-large mask that must raise ValueError.
    """
    from mhalib.np_attention import causal_mask, scaled_dot_product_attention

    cases = []
    B, H = int(rng.integers(2, 4)), int(rng.integers(2, 5))
    n = int(rng.integers(3, 7))
    n_k = n + int(rng.integers(1, 4))
    d, d_v = int(rng.integers(3, 9)), int(rng.integers(2, 7))
    if d_v == d:
        d_v += 1

    def add(q, k, v, mask, label):
        out, weights = scaled_dot_product_attention(
            q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
            mask=mask if mask is None or mask.dtype == bool else mask.astype(np.float64))
        kwargs = {} if mask is None else {"mask": mask}
        cases.append(Case(args=(q, k, v), kwargs=kwargs, expected=(out, weights), label=label))

    f64, f32 = np.float64, np.float32
    add(_rand(rng, (n, d), f64), _rand(rng, (n, d), f64), _rand(rng, (n, d_v), f64), None,
        f"q, k {(n, d)}, v {(n, d_v)}, no mask")
    add(_rand(rng, (B, n, d), f64), _rand(rng, (B, n, d), f64), _rand(rng, (B, n, d), f64),
        causal_mask(n), f"(B, N, d) = {(B, n, d)}, causal mask {(n, n)}")
    pad = np.zeros((B, 1, 1, n_k))
    for b in range(B):
        pad[b, 0, 0, int(rng.integers(1, n_k)):] = -np.inf  # padding: every row keeps >= 1 key
    add(_rand(rng, (B, H, n, d), f32), _rand(rng, (B, H, n_k, d), f32), _rand(rng, (B, H, n_k, d_v), f32),
        pad.astype(f32), f"q {(B, H, n, d)}, k {(B, H, n_k, d)}, v {(B, H, n_k, d_v)}, float32, "
                         f"padding mask {pad.shape}")
    add(_rand(rng, (B, H, n, d), f32), _rand(rng, (B, H, n, d), f32), _rand(rng, (B, H, n, d), f32),
        causal_mask(n, dtype=f32), f"(B, H, N, d) = {(B, H, n, d)}, float32, causal mask")
    bias = rng.standard_normal((n, n_k))
    add(_rand(rng, (n, 16), f64), _rand(rng, (n_k, 16), f64), _rand(rng, (n_k, d_v), f64), bias,
        f"q {(n, 16)}, k {(n_k, 16)}, a finite additive mask (a bias) {(n, n_k)}")
    # boolean masks, True = keep: padding that keeps 1 .. n_k - 1 keys of each sequence (read the
    # other way round, every row still keeps a key, so the mistake can be named), and a causal one
    keep = np.zeros((B, 1, n_k), dtype=bool)
    for b in range(B):
        keep[b, 0, :int(rng.integers(1, n_k))] = True
    add(_rand(rng, (B, n, d), f64), _rand(rng, (B, n_k, d), f64), _rand(rng, (B, n_k, d_v), f64), keep,
        f"(B, N, d) = {(B, n, d)}, N_k = {n_k}, a boolean padding mask {keep.shape} (True = keep)")
    add(_rand(rng, (B, H, n, d), f32), _rand(rng, (B, H, n, d), f32), _rand(rng, (B, H, n, d_v), f32),
        np.tril(np.ones((n, n), dtype=bool)), f"(B, H, N, d) = {(B, H, n, d)}, float32, a boolean causal "
                                               f"mask {(n, n)} (True = keep)")
    # rows whose every key is blocked: their weights must be 0, not NaN
    blocked = np.where(rng.random((B, n, n_k)) < 0.3, -np.inf, 0.0)
    blocked[:, 0] = -np.inf
    blocked[:, 1:, 0] = 0.0
    add(_rand(rng, (B, n, d), f64), _rand(rng, (B, n_k, d), f64), _rand(rng, (B, n_k, d_v), f64), blocked,
        f"(B, N, d) = {(B, n, d)}, a mask {blocked.shape} that blocks every key of query 0")
    cases[-1].extra["blocked_rows"] = True
    # scores around 1000: exp overflows unless each row's maximum is subtracted first
    q, k = _rand(rng, (n, d), f64), _rand(rng, (n_k, d), f64)
    q *= 1000 / np.abs(q @ k.T / np.sqrt(d)).max()
    q *= np.sign((q @ k.T).flat[np.abs(q @ k.T).argmax()])  # the largest score is +1000
    add(q, k, _rand(rng, (n_k, d_v), f64), None, f"q {(n, d)}, k {(n_k, d)}, scores up to 1000 in size")
    cases[-1].extra["large_scores"] = True
    # B = N = d: `k.T` (which reverses every axis) runs here and gives the wrong numbers
    c = int(rng.integers(3, 6))
    add(_rand(rng, (c, c, c), f64), _rand(rng, (c, c, c), f64), _rand(rng, (c, c, c), f64), None,
        f"(B, N, d) = {(c, c, c)}, no mask")
    # a mask that would make the result larger than the scores: the exercise asks for ValueError
    big = np.zeros((B, n, n_k))
    cases.append(Case(args=(_rand(rng, (n, d), f64), _rand(rng, (n_k, d), f64), _rand(rng, (n_k, d_v), f64)),
                      kwargs={"mask": big}, label=f"scores {(n, n_k)}, mask {big.shape}: too large",
                      raises="ValueError", raises_names=(big.shape, (n, n_k)),
                      raises_why=f"the mask {big.shape} does not fit the scores {(n, n_k)} (it would make "
                                 "the result larger than the scores); raise ValueError naming both shapes"))
    return cases


BLOCKED_ROWS = ("a row whose every key is blocked came back as NaN; the exercise asks for weights of 0 "
                "there (not NaN): when a row's maximum is -inf, subtract 0 instead, and divide only "
                "where the row's sum is positive")
OVERFLOW = ("the softmax overflows on scores around 1000 (exp(1000) is inf): use a numerically stable "
            "softmax, subtracting each row's maximum before np.exp")
K_DOT_T = ("`k.T` reverses every axis of a batched k, (B, N, d) -> (d, N, B); transpose only the last "
           "two axes: np.swapaxes(k, -1, -2)")
BOOL_AS_NUMBERS = ("the boolean mask was added as numbers (True = 1, False = 0); turn it into an "
                   "additive mask first: True = keep -> 0.0, False = block -> -inf")
BOOL_INVERTED = ("the boolean mask is read the wrong way round: True means keep (as in PyTorch's "
                 "scaled_dot_product_attention), False means block")


def _mask_variants(mask):
    """``(message, mask as the mistaken code reads it)`` for a boolean mask; none for a float one."""
    if mask is None or np.asarray(mask).dtype != bool:
        return []
    return [(BOOL_INVERTED, np.where(mask, -np.inf, 0.0)), (BOOL_AS_NUMBERS, mask.astype(np.float64))]


def judge_sdpa(case, got):
    """``None`` when ``(out, weights)`` is right, else a message naming the mistake.

    Checks the pair and its order, then the weights (NaN in fully blocked rows, overflow,
    misread boolean masks, ``k.T``, wrong scale, softmax axis or missing mask, rows not
    summing to 1), then ``out`` against ``weights @ v``.
    """
    msg = check_pair(got, ("out", "weights"))
    if msg:
        return msg
    out_exp, w_exp = case.expected
    out, weights = got
    if (isinstance(out, np.ndarray) and isinstance(weights, np.ndarray) and out_exp.shape != w_exp.shape
            and out.shape == w_exp.shape and weights.shape == out_exp.shape):
        return "return (out, weights) in this order; the two came back swapped"
    q, k, v = case.args
    mask = case.kwargs.get("mask")
    msg = check_array(weights, w_exp, "weights")
    if msg:
        if isinstance(weights, np.ndarray) and weights.shape == w_exp.shape and weights.dtype.kind == "f":
            bad = ~np.isfinite(weights.astype(np.float64))
            empty = (w_exp == 0).all(axis=-1, keepdims=True)  # rows with every key blocked
            if case.extra.get("blocked_rows") and bad.any() and not bad[~np.broadcast_to(empty, bad.shape)].any():
                return BLOCKED_ROWS
            if case.extra.get("large_scores") and bad.any():
                return OVERFLOW
        variants = [(why, lambda m=m: wrong.sdpa(q, k, v, m)[1]) for why, m in _mask_variants(mask)]
        better = match_variant(weights, variants + [
            (K_DOT_T, lambda: wrong.sdpa(q, k, v, mask, transpose="all")[1]),
            ("the scores are not divided by sqrt(d_k)", lambda: wrong.sdpa(q, k, v, mask, scale="none")[1]),
            ("the scores are divided by d_k; divide by sqrt(d_k)", lambda: wrong.sdpa(q, k, v, mask, scale="dk")[1]),
            ("the scores are divided by sqrt(d_v); divide by sqrt(d_k), the last axis of q and k",
             lambda: wrong.sdpa(q, k, v, mask, scale="sqrt_dv")[1]),
            ("softmax over the wrong axis: normalise over the keys (axis=-1), so that each "
             "query's weights sum to 1", lambda: wrong.sdpa(q, k, v, mask, axis=-2)[1]),
            ("the mask is not applied: add it to the scores before the softmax",
             lambda: wrong.sdpa(q, k, v, mask, use_mask=False)[1]),
        ])
        if better:
            return better
        if (isinstance(weights, np.ndarray) and weights.shape == w_exp.shape
                and weights.dtype in (np.float32, np.float64)
                and np.isfinite(weights).all()):
            rows = w_exp.sum(-1) > 0.5  # rows with a key left to attend to sum to 1
            if not np.allclose(weights.astype(np.float64).sum(-1)[rows], 1.0, atol=1e-4):
                return "weights rows do not sum to 1: apply the softmax over the last axis (the keys)"
        return msg
    msg = check_array(out, out_exp, "out")
    if msg and isinstance(out, np.ndarray) and out.shape == out_exp.shape:
        return f"{msg}: out should be weights @ v"
    return msg


def explain_sdpa_error(case, error, call):
    """``k.T`` on a batched k usually raises (the core dimensions of ``q @ k.T`` do not line up).

    To tell it from other shape errors, call the function once more on a cube, B = N = d, where
    ``k.T`` runs: a function that uses it then gives exactly the ``k.T`` numbers.
    """
    if not error.startswith("ValueError") or np.ndim(case.args[0]) < 3:
        return None
    rng = np.random.default_rng(len(case.label))
    q, k, v = (rng.standard_normal((4, 4, 4)) for _ in range(3))
    got = call((q, k, v), {})
    if not isinstance(got, tuple) or len(got) != 2:
        return None
    return match_variant(got[1], [(K_DOT_T, lambda: wrong.sdpa(q, k, v, transpose="all")[1])])


_SDPA_FORBIDDEN = FROM_SCRATCH_FORBIDDEN

EXERCISE = Exercise(
    key=KEY,
    title="Scaled dot-product attention, one head",
    forbidden=_SDPA_FORBIDDEN,
    graded=[
        Graded(name="causal_mask", points=2.5, signature="causal_mask(n)", make_cases=causal_mask_cases,
               judge=judge_causal_mask, description="(n, n) float: 0 on and below the diagonal, -inf above"),
        Graded(name="causal_mask (n < 1)", target="causal_mask", points=0.5, signature="causal_mask(n)",
               make_cases=causal_mask_refusal_cases, judge=judge_returned, description="ValueError for n < 1"),
        Graded(name="scaled_dot_product_attention", points=5,
               signature="scaled_dot_product_attention(q, k, v, mask=None)", make_cases=sdpa_cases,
               judge=judge_sdpa, explain_error=explain_sdpa_error,
               description="(out, weights) = softmax(q k^T / sqrt(d_k) + mask) v"),
    ],
)
