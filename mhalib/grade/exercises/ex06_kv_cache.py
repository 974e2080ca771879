"""Exercise 06: ``kv_cache_bytes`` and one ``decode_step`` with a KV cache (NumPy)."""

from __future__ import annotations

import numpy as np

from mhalib.grade.exercises import _numpy_variants as wrong
from mhalib.grade.spec import (
    ATTENTION_FORBIDDEN, Case, Exercise, Graded, Variant,
    check_decode_step, describe,
)

KEY = "06_kv_cache"

# The variants: where the caches keep their positions. The course's own layout is (B, H, T, d_head);
# flash-attention's kernels keep (B, T, H, d_head); a time-major cache, as nn.MultiheadAttention's
# default batch_first=False reads sequences, keeps (T, B, H, d_head).
LAYOUTS = {"BHTD": "(B, H, T, d_head)", "BTHD": "(B, T, H, d_head)", "TBHD": "(T, B, H, d_head)"}
TIME_AXIS = {"BHTD": 2, "BTHD": 1, "TBHD": 0}
_TO_BHTD = {"BHTD": (0, 1, 2, 3), "BTHD": (0, 2, 1, 3), "TBHD": (1, 2, 0, 3)}
_FROM_BHTD = {"BHTD": (0, 1, 2, 3), "BTHD": (0, 2, 1, 3), "TBHD": (2, 0, 1, 3)}
VARIANTS = (
    Variant("", "decode_step keeps the caches as (B, H, T, d_head) and appends the new key and value "
                "along axis 2", {"cache": "BHTD"}, "caches (B, H, T, d_head)"),
    Variant("B", "decode_step keeps the caches as (B, T, H, d_head), positions on axis 1 (the layout of "
                 "flash-attention's kernels): it takes and returns them so, appending along axis 1",
            {"cache": "BTHD"}, "caches (B, T, H, d_head)"),
    Variant("C", "decode_step keeps the caches as (T, B, H, d_head), positions first (time-major, as "
                 "nn.MultiheadAttention reads sequences without batch_first): it takes and returns them so, "
                 "appending along axis 0", {"cache": "TBHD"}, "caches (T, B, H, d_head)"),
)


def to_bhtd(cache, layout):
    """A cache of ``layout`` as ``(B, H, T, d_head)``."""
    return np.transpose(cache, _TO_BHTD[layout])


def from_bhtd(cache, layout):
    """A ``(B, H, T, d_head)`` cache in ``layout``."""
    return np.transpose(cache, _FROM_BHTD[layout])


def _layout(case):
    variant = case.extra.get("variant")
    return variant["cache"] if variant is not None else "BHTD"

# (num_layers, num_kv_heads, head_dim): Llama-2-7B, Llama-2-70B, Mistral-7B, Falcon-7B
_REAL = [(32, 32, 128), (80, 8, 128), (32, 8, 128), (32, 1, 64)]


def bytes_cases(rng):
    """Four cases of ``kv_cache_bytes``: a real model's shape (Llama-2, Mistral, Falcon) for one token,
    one for 1,024 to 32,768 tokens with ``batch_size=8``, and two random ones that also set
    ``batch_size`` (2 to 8) and ``bytes_per_element``: 1 in one, 4 in the other, on every draw, so
    that an answer that ignores either argument (or assumes fp16's 2 bytes) fails every time.
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
    for bytes_per_element in (1, 4):  # never 2, the default: the argument must be used
        a = [int(rng.integers(1, 50)), int(rng.integers(1, 17)), int(rng.choice([32, 64, 96, 128])),
             int(rng.integers(1, 5000)), int(rng.integers(2, 9)), bytes_per_element]
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
    matches, the mistake: ``bytes_per_element`` taken as 2 whatever it is, keys or values only,
    no ``bytes_per_element``, no ``batch_size``, or bits instead of bytes.
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
        (2 * base * 2, f"use bytes_per_element (here {a['bytes_per_element']}), not always 2 (fp16's)"),
        (base * a["bytes_per_element"], "count keys and values: multiply by 2"),
        (2 * base, "multiply by bytes_per_element (2 for fp16)"),
        (2 * base * a["bytes_per_element"] // max(a["batch_size"], 1), "multiply by batch_size"),
        (16 * base * a["bytes_per_element"], "that is bits: the answer is in bytes"),
    ]
    hints = [h for value, h in known if value == got]
    hint = " or ".join(hints) if len(hints) < 3 else ""
    return f"got {got:,}, expected {case.expected:,}" + (f": {hint}" if hint else "")


def decode_cases(rng, variant=None):
    """Three cases of ``decode_step``: x_new ``(B, 1, d_model)``, caches ``(B, H, T, d_head)``, four weights.

    An empty cache (T = 0), a short one and a longer float32 one; the answer
    ``(out, k_cache, v_cache)`` is computed in float64. A ``variant`` keeps the same draws with
    the caches in its layout, in and out.
    """
    from mhalib.kv_cache import decode_step

    layout = variant["cache"] if variant is not None else "BHTD"

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
        out, k_new, v_new = decode_step(*(a.astype(np.float64) for a in (x, kc, vc, *ws)), h)
        exp = (out, from_bhtd(k_new, layout), from_bhtd(v_new, layout))
        kc, vc = from_bhtd(kc, layout).copy(), from_bhtd(vc, layout).copy()
        cases.append(Case(args=(x, kc, vc, *ws, h), expected=exp,
                          label=f"B={b}, T={t} cached, H={h}, d_model={d}, {np.dtype(dtype).name}"
                                + (f", caches {LAYOUTS[layout]}" if layout != "BHTD" else ""),
                          extra={"variant": variant} if variant is not None else {}))
    return cases


def judge_decode(case, got):
    """``None`` when ``(out, k_cache, v_cache)`` is right, else a message naming the mistake.

    Recognises caches not extended or extended at the front, an ``out`` where the new token did
    not attend to itself, and, in a variant, caches returned in the course's own layout.
    """
    layout = _layout(case)
    x, kc, vc, *ws, h = case.args
    time = TIME_AXIS[layout]

    def prepended(name, cache):
        e = case.expected[1 if name == "k_cache" else 2]
        old = kc if name == "k_cache" else vc
        if cache.shape == e.shape and old.shape[time] > 0 and np.allclose(
                np.take(cache, np.arange(1, cache.shape[time]), axis=time).astype(np.float64),
                np.take(e, np.arange(e.shape[time] - 1), axis=time), atol=1e-5):
            return f"{name}: append the new entry at the end (axis {time}), not the front"
        if layout != "BHTD" and cache.shape == to_bhtd(e, layout).shape and cache.shape != e.shape:
            return (f"{name} came back as {cache.shape}, the course's own layout (B, H, T + 1, d_head); your "
                    f"variant keeps the caches as {LAYOUTS[layout]}: take them and return them so")
        return None

    def stale(out):
        if out.shape != case.expected[0].shape or kc.shape[time] == 0:
            return None
        try:
            q = wrong.split(x.astype(np.float64) @ ws[0], h)
            z, _ = wrong.sdpa(q, to_bhtd(kc, layout), to_bhtd(vc, layout))
            if np.allclose(out, wrong.merge(z) @ ws[3], atol=1e-5):
                return "the new token does not attend to itself: append its key and value before attending"
        except Exception:
            pass
        return None

    return check_decode_step(got, case.expected, (kc, vc), explain_cache=prepended, explain_out=stale,
                             time_axis=time)


def explain_decode_error(case, error, call):
    """In a variant, an error where the caches meet the new key: the course's own layout assumed."""
    layout = _layout(case)
    if layout == "BHTD" or not error.startswith(("ValueError", "IndexError")):
        return None
    return (f"your variant's caches are {LAYOUTS[layout]}: their positions are axis {TIME_AXIS[layout]}, and the "
            "new key and value go there (the course's own version, (B, H, T, d_head), appends along axis 2)")


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
               make_cases=decode_cases, judge=judge_decode, explain_error=explain_decode_error),
    ],
    variants=VARIANTS,
)
