"""Exercise 09 (the capstone): ``apply_rope``, ``gqa_rope_decode_step`` and ``merge_partials`` in NumPy.

The judges name the rules a learner may misread: the pairing and direction of the rotation,
rotating the keys after caching them, positions restarting at 0, ``repeat`` for
``repeat_interleave``, and a merge of partial softmaxes without the maximum subtracted.
"""

from __future__ import annotations

import numpy as np

from mhalib.grade.spec import (
    ATTENTION_FORBIDDEN, Case, Exercise, Graded,
    check_array, check_decode_step, check_pair, close, match_variant,
)

KEY = "09_beyond_gqa"
_FORBIDDEN = (*ATTENTION_FORBIDDEN, "mhalib.rope.*", "mhalib.online_softmax.*", "mhalib.sliding_window.*",
              "mhalib.mla.*")


# ----------------------------------------------------------------------------- known-wrong versions
def _rotate(x, positions, base=10000.0, *, pairing="half", sign=1.0, two=2.0):
    """RoPE with one mistake switched on (computed here, in float64)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    theta = base ** (-two * np.arange(d // 2) / d)  # (d/2,)
    angle = np.asarray(positions, dtype=np.float64)[:, None] * theta[None, :] * sign  # (N, d/2)
    cos, sin = np.cos(angle), np.sin(angle)
    if pairing == "half":
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return np.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(x.shape)


def _heads(x, n):  # (B, 1, n * d) -> (B, n, 1, d)
    b, t, w = x.shape
    return x.reshape(b, t, n, w // n).transpose(0, 2, 1, 3)


def _decode(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, h, g, *, start="cache", rotate="before", order="interleave",
            pairing="half"):
    """One GQA + RoPE decode step with one mistake switched on; returns (out, k_cache, v_cache)."""
    x_new, k_cache, v_cache, w_q, w_k, w_v, w_o = (np.asarray(a, dtype=np.float64)
                                                    for a in (x_new, k_cache, v_cache, w_q, w_k, w_v, w_o))
    t = k_cache.shape[2]
    pos = np.array([0 if start == "zero" else t])
    def _rope(x, positions):  # the pairing this variant uses
        return _rotate(x, positions, pairing=pairing)

    q = _rope(_heads(x_new @ w_q, h), pos)  # (B, H, 1, d)
    k_raw = _heads(x_new @ w_k, g)  # (B, g, 1, d)
    v = _heads(x_new @ w_v, g)
    if rotate == "before":
        k_all = np.concatenate([k_cache, _rope(k_raw, pos)], axis=2)  # (B, g, T + 1, d)
        cached = k_all
    elif rotate == "after":  # appended raw, then the whole cache turned by the new position
        k_all = _rope(np.concatenate([k_cache, k_raw], axis=2), np.full(t + 1, pos[0]))
        cached = k_all
    else:  # "never": the raw key is cached, the rotated one only scored
        k_all = np.concatenate([k_cache, _rope(k_raw, pos)], axis=2)
        cached = np.concatenate([k_cache, k_raw], axis=2)
    v_all = np.concatenate([v_cache, v], axis=2)
    rep = h // g
    if order == "interleave":
        k_h, v_h = np.repeat(k_all, rep, axis=1), np.repeat(v_all, rep, axis=1)  # (B, H, T + 1, d)
    else:  # np.tile: head h reads K/V head h % g
        k_h, v_h = np.tile(k_all, (1, rep, 1, 1)), np.tile(v_all, (1, rep, 1, 1))
    s = q @ np.swapaxes(k_h, -1, -2) / np.sqrt(q.shape[-1])  # (B, H, 1, T + 1)
    w = np.exp(s - s.max(-1, keepdims=True))
    z = (w / w.sum(-1, keepdims=True)) @ v_h  # (B, H, 1, d)
    b = x_new.shape[0]
    return z.transpose(0, 2, 1, 3).reshape(b, 1, -1) @ w_o, cached, v_all


# ----------------------------------------------------------------------------- apply_rope
def rope_cases(rng):
    """Cases of ``apply_rope(x, positions, base=10000.0)``: x ``(..., N, d)`` with d of 4, 6 or 8.

    float64 and float32; positions unordered and distinct, or consecutive from 0 up to a few
    thousand; one case uses ``base=500000``. One more case has an odd head_dim and must
    raise a ValueError naming it.
    """
    from mhalib.rope import apply_rope

    cases = []
    plans = [((), np.float64, 0, 10000.0), ((3,), np.float64, int(rng.integers(1, 50)), 10000.0),
             ((2, 2), np.float32, int(rng.integers(100, 5000)), 10000.0), ((2,), np.float64, 7, 500000.0)]
    for lead, dtype, start, base in plans:
        n, d = int(rng.integers(2, 6)), int(rng.choice([4, 6, 8]))
        x = rng.standard_normal((*lead, n, d)).astype(dtype)
        positions = np.arange(start, start + n) if start or lead else rng.permutation(n + 3)[:n]
        kwargs = {} if base == 10000.0 else {"base": base}
        cases.append(Case(args=(x, positions), kwargs=kwargs, expected=apply_rope(x.astype(np.float64), positions, base),
                          label=f"x {x.shape} {np.dtype(dtype).name}, positions {positions.tolist()}"
                                + ("" if not kwargs else f", base={base:g}")))
    d = int(rng.choice([3, 5, 7]))
    cases.append(Case(args=(rng.standard_normal((2, d)), np.arange(2)), label=f"x (2, {d}): odd head_dim",
                      raises="ValueError", raises_names=(d,),
                      raises_why=f"head_dim={d} is odd and RoPE rotates pairs; raise ValueError naming it"))
    return cases


def judge_rope(case, got):
    """``None`` when the rotated x is right, else a message naming the mistake.

    Recognises neighbouring pairs instead of halves, the wrong direction, frequencies
    without the 2, positions 0 .. N-1 instead of those given, and the base ignored.
    """
    msg = check_array(got, case.expected, "the rotated x")
    if not msg:
        return None
    x, positions = case.args
    base = case.kwargs.get("base", 10000.0)
    hint = match_variant(got, [
        ("you paired neighbours (x[2i], x[2i+1]); this exercise pairs x[i] with x[i + d/2] (Hugging Face's "
         "rotate_half)", lambda: _rotate(x, positions, base, pairing="interleaved")),
        ("the rotation turns the wrong way: the first half is x1 cos - x2 sin, the second x2 cos + x1 sin",
         lambda: _rotate(x, positions, base, sign=-1.0)),
        ("the frequencies are off: theta_i = base ** (-2 i / head_dim), with the 2",
         lambda: _rotate(x, positions, base, two=1.0)),
        ("use the positions you are given, not 0 .. N-1", lambda: _rotate(x, np.arange(len(positions)), base)),
        ("use the base you are given (the keyword argument), not always 10000", lambda: _rotate(x, positions)),
    ], rtol=1e-4, atol=1e-5)
    return hint or msg


# ----------------------------------------------------------------------------- gqa_rope_decode_step
def _weights(rng, d_model, kv_width, dtype):
    scale = 1.5 / np.sqrt(d_model)
    w_q, w_o = (rng.standard_normal((d_model, d_model)) * scale for _ in range(2))
    w_k, w_v = (rng.standard_normal((d_model, kv_width)) * scale for _ in range(2))
    return [w.astype(dtype) for w in (w_q, w_k, w_v, w_o)]


def decode_cases(rng):
    """Cases of ``gqa_rope_decode_step``: x_new ``(B, 1, d_model)``, caches ``(B, g, T, d_head)``, weights.

    The caches are built by the reference (rotated keys at 0 .. T-1); T = 0 in one, (H, g)
    covers GQA, MQA (g = 1) and MHA (g = H), float64 and float32. One more case with H = 6,
    g = 4 must raise a ValueError saying that g does not divide H.
    """
    from mhalib.rope import rope_decode_step

    cases = []
    plans = [(1, 0, 4, 2, np.float64), (2, int(rng.integers(2, 5)), 4, 2, np.float64),
             (int(rng.integers(1, 3)), int(rng.integers(4, 9)), 8, 2, np.float32),
             (2, int(rng.integers(2, 6)), 6, 3, np.float64), (1, int(rng.integers(3, 6)), 4, 1, np.float64),
             (2, int(rng.integers(2, 5)), 4, 4, np.float64)]
    for b, t, h, g, dtype in plans:
        dh = int(rng.choice([2, 4]))
        d_model = h * dh
        ws = _weights(rng, d_model, g * dh, dtype)
        w64 = [w.astype(np.float64) for w in ws]
        # the cache of T earlier tokens, built by the reference itself: rotated keys at 0 .. T-1
        kc, vc = np.zeros((b, g, 0, dh)), np.zeros((b, g, 0, dh))
        for _ in range(t):
            _, kc, vc = rope_decode_step(rng.standard_normal((b, 1, d_model)), kc, vc, *w64, h)
        x = rng.standard_normal((b, 1, d_model)).astype(dtype)
        kc, vc = kc.astype(dtype), vc.astype(dtype)
        exp = rope_decode_step(x.astype(np.float64), kc.astype(np.float64), vc.astype(np.float64), *w64, h)
        cases.append(Case(args=(x, kc, vc, *ws, h, g), expected=exp,
                          label=f"B={b}, T={t} cached, H={h}, g={g}, d_head={dh}, {np.dtype(dtype).name}"))
    h, g, dh = 6, 4, 2
    ws = _weights(rng, h * dh, g * dh, np.float64)
    cases.append(Case(args=(rng.standard_normal((1, 1, h * dh)), np.zeros((1, g, 2, dh)), np.zeros((1, g, 2, dh)),
                            *ws, h, g), label=f"H={h}, g={g}", raises="ValueError",
                      raises_names=(h, g, ["divi", "multiple"]),
                      raises_why=f"num_kv_heads={g} does not divide num_heads={h}; raise ValueError that says so"))
    return cases


def judge_decode(case, got):
    """``None`` when ``(out, k_cache, v_cache)`` is right, else a message naming the mistake.

    Recognises neighbouring pairs, keys rotated after caching or cached unrotated,
    positions restarting at 0, and ``np.tile`` instead of ``np.repeat`` for the K/V heads.
    """
    x, kc, vc, *ws, h, g = case.args
    t = kc.shape[2]

    def variant(**how):
        return _decode(x, kc, vc, *ws, h, g, **how)

    def rotation_mistake(name, cache):
        if name != "k_cache":
            return None
        if close(cache, variant(pairing="interleaved")[1]):
            return ("the new key is rotated with neighbouring pairs (x[2i], x[2i+1]); pair x[i] with x[i + d/2], "
                    "as apply_rope does")
        if t > 0 and close(cache, variant(rotate="after")[1]):
            return ("the keys were rotated after caching: every cached key got the new position's angle. "
                    "Rotate only the new key, by its own position, before appending it")
        if t > 0 and close(cache, variant(rotate="never")[1]):
            if isinstance(got[0], np.ndarray) and close(got[0], variant(start="zero")[0]):
                return (f"positions restarted at 0: the new token sits at position T = k_cache.shape[2] "
                        f"(here {t}); rotate its query and key by T")
            return "the cache holds the new key unrotated: rotate it by its position before appending it"
        return None

    def output_mistake(out):
        if h // g > 1 and g > 1 and close(out, variant(order="tile")[0]):
            return ("query head h must read K/V head h // (H // g) (np.repeat along the head axis, like "
                    "repeat_interleave); np.tile (torch's repeat) sends it to head h % g")
        if t > 0 and close(out, variant(start="zero")[0]):
            return (f"positions restarted at 0: the new token sits at position T = k_cache.shape[2] (here {t}); "
                    "rotate its query by T")
        return None

    return check_decode_step(got, case.expected, (kc, vc), explain_cache=rotation_mistake,
                             explain_out=output_mistake)


# ----------------------------------------------------------------------------- merge_partials
def merge_cases(rng):
    """Cases of ``merge_partials(outputs, log_sum_exps)``: S chunks of one decoding query's attention.

    Outputs ``(S, d)`` or ``(S, ..., 1, d)`` with log-sum-exps ``(S,)`` or ``(S, ..., 1)``, float64,
    S from 2 to 6; in one case the log-sum-exps are near 1000.
    """
    from mhalib.online_softmax import merge_partials, split_attention

    cases = []
    for s, lead, shift in ((2, (), 0.0), (3, (2, 4), 0.0), (int(rng.integers(4, 7)), (3,), 0.0), (3, (2,), 1000.0)):
        d = int(rng.integers(2, 6))
        n_k = s * int(rng.integers(1, 4)) + int(rng.integers(0, s))  # at least one key per chunk
        q = rng.standard_normal((*lead, 1, d))  # (..., 1, d): one decoding query
        k = rng.standard_normal((*lead, n_k, d)) * 2
        v = rng.standard_normal((*lead, n_k, d))
        outs, lses = split_attention(q, k, v, s)  # (S, ..., 1, d), (S, ..., 1)
        if not lead:
            outs, lses = outs[:, 0], lses[:, 0]  # (S, d), (S,)
        lses = lses + shift  # the same softmax of scores shifted by `shift`: the outputs do not change
        cases.append(Case(args=(outs, lses), expected=merge_partials(outs, lses),
                          label=f"S={s} chunks, outputs {outs.shape}" + (f", log-sum-exps near {shift:g}" if shift else "")))
    return cases


def judge_merge(case, got):
    """``None`` when ``(out, lse)`` is right, else a message naming the mistake.

    Recognises an overflow from not subtracting the largest log-sum-exp, chunks averaged
    equally, unnormalised weights, and a merged lse that is the maximum or the sum.
    """
    msg = check_pair(got, ("out", "lse"))
    if msg:
        return msg
    outs, lses = case.args
    out_e, lse_e = case.expected
    out, lse = got
    msg = check_array(out, out_e, "the merged out")
    if msg:
        if isinstance(out, np.ndarray) and out.shape == out_e.shape and not np.isfinite(
                np.asarray(out, dtype=np.float64)).all() and lses.max() > 700:
            return ("merge without the max: exp(log_sum_exp) overflows for log-sum-exps near 1000 (inf / inf is "
                    "NaN); subtract the largest log-sum-exp before exponentiating")
        hint = match_variant(out, [
            ("the chunks were averaged equally; weigh chunk i by exp(lse_i - max lse), normalised",
             lambda: outs.mean(axis=0)),
            ("the weights exp(lse_i - max lse) were not normalised: divide by their sum",
             lambda: (np.exp(lses - lses.max(0))[..., None] * outs).sum(0)),
        ])
        return hint or msg
    if np.ndim(lse_e) == 0 and isinstance(lse, (int, float)) and not isinstance(lse, bool):
        lse = np.asarray(float(lse))  # one merged row: a NumPy scalar arrives as a float
    msg = check_array(lse, lse_e, "the merged lse")
    if msg:
        top = lses.max(axis=0)
        hint = match_variant(lse, [
            ("the merged lse is max + log(sum of exp(lse_i - max)), not the largest lse", lambda: top),
            ("the merged lse is a log of a sum of exps, not a sum of log-sum-exps", lambda: lses.sum(0)),
        ])
        return hint or msg
    return None


EXERCISE = Exercise(
    key=KEY,
    title="Beyond GQA: rotary positions with a cache, and the log-sum-exp merge",
    forbidden=_FORBIDDEN,
    graded=[
        Graded(name="apply_rope", points=2, signature="apply_rope(x, positions, base=10000.0)", make_cases=rope_cases,
               judge=judge_rope),
        Graded(name="gqa_rope_decode_step", points=5,
               signature="gqa_rope_decode_step(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads, num_kv_heads)",
               make_cases=decode_cases, judge=judge_decode),
        Graded(name="merge_partials", points=3, signature="merge_partials(outputs, log_sum_exps)",
               make_cases=merge_cases, judge=judge_merge),
    ],
)
