"""Exercise 06: ``kv_cache_bytes`` and one ``decode_step`` with a KV cache (NumPy)."""

from __future__ import annotations

import numpy as np

from mhalib.grade.exercises import _numpy_variants as wrong
from mhalib.grade.spec import (
    ATTENTION_FORBIDDEN, Case, Exercise, Graded,
    check_decode_step, describe,
)

KEY = "06_kv_cache"

# (num_layers, num_kv_heads, head_dim): Llama-2-7B, Llama-2-70B, Mistral-7B, Falcon-7B
_REAL = [(32, 32, 128), (80, 8, 128), (32, 8, 128), (32, 1, 64)]


def bytes_cases(rng):
    """Four cases of ``kv_cache_bytes``: a real model's shape (Llama-2, Mistral, Falcon) for one token,
    one for 1,024 to 32,768 tokens with ``batch_size=8``, and two random ones that also set
    ``batch_size`` and ``bytes_per_element`` (1, 2 or 4).
    """
    from mhalib.kv_cache import kv_cache_bytes

    cases = []
    layers, kv, hd = _REAL[int(rng.integers(len(_REAL)))]
    cases.append(Case(args=(layers, kv, hd, 1), expected=kv_cache_bytes(layers, kv, hd, 1),
                      label=f"kv_cache_bytes({layers}, {kv}, {hd}, 1)"))
    tokens = int(rng.choice([1024, 4096, 32768]))
    layers, kv, hd = _REAL[int(rng.integers(len(_REAL)))]
    cases.append(Case(args=(layers, kv, hd, tokens), kwargs={"batch_size": 8},
                      expected=kv_cache_bytes(layers, kv, hd, tokens, batch_size=8),
                      label=f"kv_cache_bytes({layers}, {kv}, {hd}, {tokens}, batch_size=8)"))
    for _ in range(2):
        a = [int(rng.integers(1, 50)), int(rng.integers(1, 17)), int(rng.choice([32, 64, 96, 128])),
             int(rng.integers(1, 5000)), int(rng.integers(1, 9)), int(rng.choice([1, 2, 4]))]
        cases.append(Case(args=tuple(a), expected=kv_cache_bytes(*a),
                          label="kv_cache_bytes(" + ", ".join(map(str, a)) + ")"))
    return cases


def _bytes_args(case):
    names = ("num_layers", "num_kv_heads", "head_dim", "num_tokens", "batch_size", "bytes_per_element")
    values = dict(zip(names, (1, 1, 1, 1, 1, 2)))
    values.update(zip(names, case.args))
    values.update(case.kwargs)
    return values


def judge_bytes(case, got):
    """``None`` when the byte count is right, else a message.

    Refuses a float or any non-int; for a wrong int, says what was expected and, when it
    matches, the mistake: keys or values only, no ``bytes_per_element``, no ``batch_size``,
    or bits instead of bytes.
    """
    if isinstance(got, float) and got == case.expected:
        return "return an int (a number of bytes), not a float: use // or int(...)"
    if type(got) is not int:
        return f"kv_cache_bytes should return an int; got {describe(got)}"
    if got == case.expected:
        return None
    a = _bytes_args(case)
    base = a["num_layers"] * a["num_kv_heads"] * a["head_dim"] * a["num_tokens"] * a["batch_size"]
    known = [
        (base * a["bytes_per_element"], "count keys and values: multiply by 2"),
        (2 * base, "multiply by bytes_per_element (2 for fp16)"),
        (2 * base * a["bytes_per_element"] // max(a["batch_size"], 1), "multiply by batch_size"),
        (16 * base * a["bytes_per_element"], "that is bits: the answer is in bytes"),
    ]
    hints = [h for value, h in known if value == got]
    hint = " or ".join(hints) if len(hints) < 3 else ""
    return f"got {got:,}, expected {case.expected:,}" + (f": {hint}" if hint else "")


def decode_cases(rng):
    """Three cases of ``decode_step``: x_new ``(B, 1, d_model)``, caches ``(B, H, T, d_head)``, four weights.

    An empty cache (T = 0), a short one and a longer float32 one; the answer
    ``(out, k_cache, v_cache)`` is computed in float64.
    """
    from mhalib.kv_cache import decode_step

    cases = []
    for b, t, dtype in ((1, 0, np.float64), (2, int(rng.integers(1, 4)), np.float64),
                        (int(rng.integers(1, 4)), int(rng.integers(4, 9)), np.float32)):
        h = int(rng.choice([2, 4]))
        dh = int(rng.integers(2, 5))
        d = h * dh
        x = rng.standard_normal((b, 1, d)).astype(dtype)
        kc = rng.standard_normal((b, h, t, dh)).astype(dtype)
        vc = rng.standard_normal((b, h, t, dh)).astype(dtype)
        ws = [(rng.standard_normal((d, d)) / np.sqrt(d) * 1.5).astype(dtype) for _ in range(4)]
        exp = decode_step(*(a.astype(np.float64) for a in (x, kc, vc, *ws)), h)
        cases.append(Case(args=(x, kc, vc, *ws, h), expected=exp,
                          label=f"B={b}, T={t} cached, H={h}, d_model={d}, {np.dtype(dtype).name}"))
    return cases


def judge_decode(case, got):
    """``None`` when ``(out, k_cache, v_cache)`` is right, else a message naming the mistake.

    Recognises caches not extended or extended at the front, and an ``out`` where the new
    token did not attend to itself.
    """
    x, kc, vc, *ws, h = case.args

    def prepended(name, cache):
        e = case.expected[1 if name == "k_cache" else 2]
        old = kc if name == "k_cache" else vc
        if cache.shape == e.shape and old.shape[2] > 0 and np.allclose(
                cache[:, :, 1:].astype(np.float64), e[:, :, :-1], atol=1e-5):
            return f"{name}: append the new entry at the end (axis 2), not the front"
        return None

    def stale(out):
        if out.shape != case.expected[0].shape or kc.shape[2] == 0:
            return None
        try:
            q = wrong.split(x.astype(np.float64) @ ws[0], h)
            z, _ = wrong.sdpa(q, kc, vc)
            if np.allclose(out, wrong.merge(z) @ ws[3], atol=1e-5):
                return "the new token does not attend to itself: append its key and value before attending"
        except Exception:
            pass
        return None

    return check_decode_step(got, case.expected, (kc, vc), explain_cache=prepended, explain_out=stale)


_FORBIDDEN = ATTENTION_FORBIDDEN

EXERCISE = Exercise(
    key=KEY,
    title="Decoding with a KV cache",
    forbidden=_FORBIDDEN,
    graded=[
        Graded(name="kv_cache_bytes", points=2,
               signature="kv_cache_bytes(num_layers, num_kv_heads, head_dim, num_tokens, batch_size=1, "
                         "bytes_per_element=2)",
               make_cases=bytes_cases, judge=judge_bytes, forbidden=("mhalib.kv_cache.*",)),
        Graded(name="decode_step", points=5,
               signature="decode_step(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads)",
               make_cases=decode_cases, judge=judge_decode),
    ],
)
