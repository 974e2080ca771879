"""Exercise 10: what a variant costs and keeps: ``cache_bytes``, ``recall_accuracy``, ``pareto_front``.

The references are written here, apart from :mod:`mhalib.variants` (which the notebook uses):
a learner's answer is held against a second, independent statement of the same definitions.
"""

from __future__ import annotations

import numpy as np

from mhalib.grade.spec import Case, Exercise, Graded, check_array, describe

KEY = "10_choosing_a_variant"

_NAMES = ("num_layers", "num_tokens")
_KEYWORDS = ("num_kv_heads", "head_dim", "kv_lora_rank", "rope_head_dim", "window", "bytes_per_element")


def reference_cache_bytes(num_layers, num_tokens, num_kv_heads=1, head_dim=1, kv_lora_rank=None, rope_head_dim=0,
                          window=None, bytes_per_element=2):
    """One sequence's cache: a window holds ``min(num_tokens, window)`` positions; latent attention
    ``kv_lora_rank + rope_head_dim`` numbers per position and layer, the others ``2 g d_head``."""
    held = num_tokens if window is None else min(num_tokens, window)
    per_token = kv_lora_rank + rope_head_dim if kv_lora_rank is not None else 2 * num_kv_heads * head_dim
    return num_layers * held * per_token * bytes_per_element


# (num_layers, num_kv_heads, head_dim) of real models: Llama-2-7B, Llama-2-70B, Mistral-7B, Falcon-7B
_REAL = [(32, 32, 128), (80, 8, 128), (32, 8, 128), (32, 1, 64)]


def bytes_cases(rng):
    """Six cases: grouped-query attention (a real model's shape), latent attention (DeepSeek-V3's
    512 + 64 and a random one), a window shorter and one longer than the tokens, and a window with
    latent attention; ``bytes_per_element`` is 1 or 4 in three of them, so that it must be used."""
    cases = []
    layers, g, d = _REAL[int(rng.integers(len(_REAL)))]
    tokens = int(rng.choice([1024, 4096, 32768]))
    plans = [
        dict(num_kv_heads=g, head_dim=d),
        dict(kv_lora_rank=512, rope_head_dim=64),
        dict(kv_lora_rank=int(rng.choice([16, 32, 128])), rope_head_dim=int(rng.choice([4, 8])), bytes_per_element=4),
        dict(num_kv_heads=int(rng.choice([1, 2, 8])), head_dim=int(rng.choice([8, 64, 128])),
             window=int(rng.integers(16, 513)), bytes_per_element=1),
        dict(num_kv_heads=int(rng.choice([1, 4])), head_dim=64, window=tokens * 2),
        dict(kv_lora_rank=int(rng.choice([32, 64])), rope_head_dim=8, window=int(rng.integers(16, 257)),
             bytes_per_element=4),
    ]
    for plan in plans:
        kwargs = dict(plan)
        expected = reference_cache_bytes(layers, tokens, **kwargs)
        shown = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        cases.append(Case(args=(layers, tokens), kwargs=kwargs, expected=expected,
                          label=f"cache_bytes({layers}, {tokens}, {shown})"))
    return cases


def judge_bytes(case, got):
    """``None`` when the byte count is right, else a message naming the mistake when it is a known one:
    the window ignored or always applied, latent attention counted twice (as keys and values) or
    without its rotated key, ``bytes_per_element`` taken as 2, or keys only."""
    if isinstance(got, float) and got == case.expected:
        return "return an int (a number of bytes), not a float: use // or int(...)"
    if isinstance(got, np.integer) and not isinstance(got, np.bool_):
        got = int(got)  # a NumPy integer counts as one (docs/exercises.md)
    if type(got) is not int:
        return f"cache_bytes should return an int; got {describe(got)}"
    if got == case.expected:
        return None
    layers, tokens = case.args
    a = dict(num_kv_heads=1, head_dim=1, kv_lora_rank=None, rope_head_dim=0, window=None, bytes_per_element=2)
    a.update(case.kwargs)
    ref = reference_cache_bytes

    def variant(**changes):
        b = dict(a, **changes)
        return ref(layers, tokens, **b)

    known = []
    if a["window"] is not None:
        known.append((variant(window=None), "a window keeps only the last `window` positions: hold min(num_tokens, "
                                             "window), not every token"))
        known.append((ref(layers, a["window"], **dict(a, window=None)),
                      "a window longer than the text holds only the tokens there are: min(num_tokens, window)"))
    if a["kv_lora_rank"] is not None:
        per = a["kv_lora_rank"] + a["rope_head_dim"]
        held = tokens if a["window"] is None else min(tokens, a["window"])
        known.append((2 * layers * held * per * a["bytes_per_element"],
                      "latent attention caches one latent (and one rotated key) per position, not keys and values "
                      "apart: no factor 2"))
        known.append((layers * held * a["kv_lora_rank"] * a["bytes_per_element"],
                      "count the rotated key too: kv_lora_rank + rope_head_dim numbers per position and layer"))
    else:
        known.append((variant() // 2, "count keys and values: 2 * num_kv_heads * head_dim numbers per position "
                                      "and layer"))
    if a["bytes_per_element"] != 2:
        known.append((variant(bytes_per_element=2), f"use bytes_per_element (here {a['bytes_per_element']}), "
                                                    "not always 2 (fp16's)"))
    hints = [h for value, h in known if value == got]
    return f"got {got:,}, expected {case.expected:,}" + (f": {hints[0]}" if hints else "")


def reference_recall_accuracy(logits, tokens, mask):
    """The fraction of masked positions whose token is the argmax of the logits one position earlier."""
    predicted = np.asarray(logits)[:, :-1].argmax(-1)  # (B, N-1): the guess for tokens 1..N-1
    scored = np.asarray(mask)[:, 1:]
    return float((predicted == np.asarray(tokens)[:, 1:])[scored].mean())


def recall_cases(rng):
    """Three cases: logits ``(B, N, V)`` float32, tokens ``(B, N)`` int64, mask ``(B, N)`` bool with
    a different number of answers in each row (so a mean of per-row accuracies differs), and about
    half the answers right (so scoring every position, or no shift, gives other numbers)."""
    cases = []
    for b, n, v in ((2, 9, 7), (3, 16, 11), (int(rng.integers(3, 6)), int(rng.integers(12, 24)), 13)):
        tokens = rng.integers(v, size=(b, n)).astype(np.int64)
        logits = rng.standard_normal((b, n, v)).astype(np.float32)
        mask = np.zeros((b, n), bool)
        for row in range(b):
            where = rng.choice(np.arange(1, n), size=row + 2, replace=False)
            mask[row, where] = True
            for i in where[: (row + 2) // 2 + 1]:  # make about half of them right
                logits[row, i - 1, tokens[row, i]] = logits[row, i - 1].max() + 1.0
        cases.append(Case(args=(logits, tokens, mask), expected=reference_recall_accuracy(logits, tokens, mask),
                          label=f"logits {logits.shape}, {int(mask.sum())} answers"))
    return cases


def judge_recall(case, got):
    """``None`` when the accuracy is right; else a message naming the mistake if it is a known one:
    no shift (position i's logits scored against token i), every position scored, the mean of each
    row's accuracy, or a count instead of a fraction."""
    if isinstance(got, (np.floating, np.integer)):
        got = got.item()
    if type(got) not in (float, int) or isinstance(got, bool):
        return f"recall_accuracy should return a float; got {describe(got)}"
    if abs(got - case.expected) <= 1e-9:
        return None
    logits, tokens, mask = case.args
    right = logits.argmax(-1) == tokens  # (B, N): no shift
    shifted = np.zeros(tokens.shape, bool)
    shifted[:, 1:] = logits[:, :-1].argmax(-1) == tokens[:, 1:]
    every = np.ones_like(mask)
    every[:, 0] = False
    known = [
        (float(right[mask].mean()), "the logits at position i predict token i + 1: compare logits[:, :-1] with "
                                    "tokens[:, 1:]"),
        (float(shifted[every].mean()), "score only the answers (mask), not every position"),
        (float(np.mean([shifted[r][mask[r]].mean() for r in range(len(mask))])),
         "that is the mean of each row's accuracy; the exercise asks for the fraction of all answers (rows with more "
         "answers weigh more)"),
        (float(shifted[mask].sum()), "return the fraction of answers right, not their number"),
    ]
    hints = [h for value, h in known if abs(value - got) <= 1e-9]
    return f"got {got:.4g}, expected {case.expected:.4g}" + (f": {hints[0]}" if hints else "")


def reference_pareto_front(costs, qualities):
    """True for each point that no other point dominates (costs no more, is as good, and is better in one)."""
    c, q = np.asarray(costs, np.float64), np.asarray(qualities, np.float64)
    le, ge = c[None, :] <= c[:, None], q[None, :] >= q[:, None]  # [i, j]: j costs no more than i, is as good
    strictly = (c[None, :] < c[:, None]) | (q[None, :] > q[:, None])
    return ~(le & ge & strictly).any(axis=1)


def front_cases(rng):
    """Four cases of ``pareto_front(costs, qualities)``: float arrays ``(n,)``; one with two equal costs,
    one with a point repeated exactly (both kept: neither dominates the other), one with equal
    qualities, one random of 8 to 12 points."""
    cases = []
    plans = [
        (np.array([4.0, 2.0, 2.0, 8.0, 1.0]), np.array([0.9, 0.7, 0.6, 0.95, 0.2])),
        (np.array([3.0, 1.0, 3.0, 5.0]), np.array([0.8, 0.5, 0.8, 0.7])),
        (np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.5, 0.5, 0.9, 0.9])),
    ]
    n = int(rng.integers(8, 13))
    plans.append((rng.integers(1, 40, size=n).astype(np.float64), np.round(rng.uniform(0.2, 1.0, size=n), 2)))
    for costs, qualities in plans:
        cases.append(Case(args=(costs, qualities), expected=reference_pareto_front(costs, qualities),
                          label=f"{len(costs)} points: costs {costs.tolist()}, qualities {qualities.tolist()}"))
    return cases


def judge_front(case, got):
    """``None`` when the mask is right; else which points are wrong and, when it is a known mistake, why:
    dominance with both inequalities strict or both loose, or the quality taken as a cost."""
    if isinstance(got, (list, tuple)):
        got = np.asarray(got)
    if not isinstance(got, np.ndarray) or got.dtype.kind != "b":
        return f"pareto_front should return a bool array of shape {case.expected.shape}; got {describe(got)}"
    msg = check_array(got.astype(np.float64), case.expected.astype(np.float64), "the mask", float_only=False)
    if msg is None:
        return None
    if got.shape != case.expected.shape:
        return msg
    c, q = (np.asarray(a, np.float64) for a in case.args)
    strict = ~((c[None, :] < c[:, None]) & (q[None, :] > q[:, None])).any(axis=1)
    loose = ~((c[None, :] <= c[:, None]) & (q[None, :] >= q[:, None]) & ~np.eye(len(c), dtype=bool)).any(axis=1)
    inverted = reference_pareto_front(c, -q)
    known = [(strict, "a point is also dominated by one that costs the same and is better, or costs less and is as "
                      "good: one inequality strict, the other not"),
             (loose, "a point equal to another in cost and quality is not dominated by it: keep both"),
             (inverted, "higher quality is better: a point is dominated by one that costs no more and is at least "
                        "as good")]
    hint = next((h for wrong, h in known if np.array_equal(wrong, got)), None)
    wrong = np.flatnonzero(got != case.expected).tolist()
    return f"points {wrong} are marked wrongly" + (f": {hint}" if hint else "")


EXERCISE = Exercise(
    key=KEY,
    title="Choosing a variant: cache bytes, recall and the frontier",
    graded=[
        Graded(name="cache_bytes", points=3,
               signature="cache_bytes(num_layers, num_tokens, num_kv_heads=1, head_dim=1, kv_lora_rank=None, "
                         "rope_head_dim=0, window=None, bytes_per_element=2)",
               make_cases=bytes_cases, judge=judge_bytes, forbidden=("mhalib.variants.*", "mhalib.kv_cache.*",
                                                                    "mhalib.mla.*")),
        Graded(name="recall_accuracy", points=2, signature="recall_accuracy(logits, tokens, mask)",
               make_cases=recall_cases, judge=judge_recall, forbidden=("mhalib.variants.*",)),
        Graded(name="pareto_front", points=3, signature="pareto_front(costs, qualities)",
               make_cases=front_cases, judge=judge_front, forbidden=("mhalib.variants.*",)),
    ],
)
