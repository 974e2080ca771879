"""Exercise 09 (the capstone): ``apply_rope``, ``gqa_rope_decode_step`` and ``merge_partials`` in NumPy.

The judges name the rules a learner may misread: the pairing and direction of the rotation,
rotating the keys after caching them, positions restarting at 0, ``repeat`` for
``repeat_interleave``, and a merge of partial softmaxes without the maximum subtracted.
"""

from __future__ import annotations

import numpy as np

from mhalib.grade.spec import (
    ATTENTION_FORBIDDEN, RTOL, Case, Exercise, Graded, Variant,
    check_array, check_decode_step, check_pair, close, match_variant,
)

KEY = "09_beyond_gqa"
_FORBIDDEN = (*ATTENTION_FORBIDDEN, "mhalib.rope.*", "mhalib.online_softmax.*", "mhalib.sliding_window.*",
              "mhalib.mla.*")

# The variants: the RoPE pairing, and where the decode step's caches keep their positions. The
# course's own pairs x[i] with x[i + d/2] (Hugging Face's rotate_half) and keeps (B, g, T, d_head);
# the RoPE paper and Meta's original Llama code pair neighbours (x[2i], x[2i+1]).
_HALF = "apply_rope pairs x[i] with x[i + d/2] (Hugging Face's rotate_half)"
_NEIGHBOURS = ("apply_rope pairs neighbours, (x[2i], x[2i+1]), pair i turned by theta_i as before (the RoPE "
               "paper's and Meta's original Llama pairing); gqa_rope_decode_step rotates with it")
VARIANTS = (
    Variant("", f"{_HALF}; gqa_rope_decode_step keeps the caches as (B, g, T, d_head)",
            {"pairing": "half", "cache": "BgTD"}, "pairs (x[i], x[i + d/2]), caches (B, g, T, d_head)"),
    Variant("B", f"{_NEIGHBOURS}; its caches are (B, g, T, d_head)",
            {"pairing": "interleaved", "cache": "BgTD"}, "pairs (x[2i], x[2i+1]), caches (B, g, T, d_head)"),
    Variant("C", f"{_NEIGHBOURS}; its caches are (B, T, g, d_head), positions on axis 1 (flash-attention's "
                 "layout), taken and returned so",
            {"pairing": "interleaved", "cache": "BTgD"}, "pairs (x[2i], x[2i+1]), caches (B, T, g, d_head)"),
)
TIME_AXIS = {"BgTD": 2, "BTgD": 1}
LAYOUTS = {"BgTD": "(B, g, T, d_head)", "BTgD": "(B, T, g, d_head)"}


def _options(case):
    variant = case.extra.get("variant")
    return variant.options if variant is not None else VARIANTS[0].options


def rope_tolerance(max_position):
    """``rtol = atol`` for a rotation at positions up to ``max_position``, derived from float32.

    An answer may compute the angles in float32 whatever x's dtype, as Hugging Face does. Then
    theta_i = base ** (-2i / d) is off by about u (one rounding of the power) and p * theta_i by
    one more: the angle is off by up to 4 u p theta_i <= 4 u p (theta_i <= 1), and cos and sin move
    by as much, plus their own rounding u. y = x1 cos - x2 sin adds 3 u of products and sum, so
    |dy| <= (|x1| + |x2|) u (4 p + 4); and |x1| + |x2| <= 2 max |y| (a rotation keeps the pair's
    length). :func:`close` allows ``atol`` times the largest value: hence 2 u (4 p + 4), and never
    less than the judges' default. At p = 5000 that is 2.4e-3; a wrong rotation (pairing,
    direction, frequencies, positions) is off by a quantity of the order of the values.
    """
    u = float(np.finfo(np.float32).eps) / 2
    tol = max(RTOL, 2 * u * (4 * float(max_position) + 4))
    return {"rtol": tol, "atol": tol}


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
            pairing="half", cache="BgTD"):
    """One GQA + RoPE decode step with one mistake switched on; returns (out, k_cache, v_cache).

    ``pairing="interleaved"`` and ``cache="BTgD"`` (caches ``(B, T, g, d_head)``, in and out) are
    also the variants' conventions: this is their reference.
    """
    x_new, k_cache, v_cache, w_q, w_k, w_v, w_o = (np.asarray(a, dtype=np.float64)
                                                    for a in (x_new, k_cache, v_cache, w_q, w_k, w_v, w_o))
    if cache == "BTgD":  # (B, T, g, d) -> (B, g, T, d)
        k_cache, v_cache = k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3)
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
    if cache == "BTgD":  # back to (B, T + 1, g, d)
        cached, v_all = cached.transpose(0, 2, 1, 3), v_all.transpose(0, 2, 1, 3)
    return z.transpose(0, 2, 1, 3).reshape(b, 1, -1) @ w_o, cached, v_all


# ----------------------------------------------------------------------------- apply_rope
def rope_cases(rng, variant=None):
    """Cases of ``apply_rope(x, positions, base=10000.0)``: x ``(..., N, d)`` with d of 4, 6 or 8.

    float64 and float32; positions unordered and distinct, or consecutive from 0 up to a few
    thousand; one case uses ``base=500000``. Each case allows the rounding of angles computed in
    float32 at its largest position (:func:`rope_tolerance`). One more case has an odd head_dim
    and must raise a ValueError naming it. A ``variant`` keeps the draws and pairs as it says.
    """
    from mhalib.rope import apply_rope

    pairing = variant["pairing"] if variant is not None else "half"
    extra = {"variant": variant} if variant is not None and variant.code else {}
    cases = []
    plans = [((), np.float64, 0, 10000.0), ((3,), np.float64, int(rng.integers(1, 50)), 10000.0),
             ((2, 2), np.float32, int(rng.integers(100, 5000)), 10000.0), ((2,), np.float64, 7, 500000.0)]
    for lead, dtype, start, base in plans:
        n, d = int(rng.integers(2, 6)), int(rng.choice([4, 6, 8]))
        x = rng.standard_normal((*lead, n, d)).astype(dtype)
        positions = np.arange(start, start + n) if start or lead else rng.permutation(n + 3)[:n]
        kwargs = {} if base == 10000.0 else {"base": base}
        expected = apply_rope(x.astype(np.float64), positions, base, convention=pairing)
        cases.append(Case(args=(x, positions), kwargs=kwargs, expected=expected,
                          extra={**extra, "tol": rope_tolerance(np.max(positions))},
                          label=f"x {x.shape} {np.dtype(dtype).name}, positions {positions.tolist()}"
                                + ("" if not kwargs else f", base={base:g}")))
    d = int(rng.choice([3, 5, 7]))
    cases.append(Case(args=(rng.standard_normal((2, d)), np.arange(2)), label=f"x (2, {d}): odd head_dim",
                      raises="ValueError", raises_names=(d,),
                      raises_why=f"head_dim={d} is odd and RoPE rotates pairs; raise ValueError naming it"))
    return cases


def judge_rope(case, got):
    """``None`` when the rotated x is right, else a message naming the mistake.

    Recognises neighbouring pairs instead of halves (or, in a variant that pairs neighbours, the
    reverse), the wrong direction, frequencies without the 2, positions 0 .. N-1 instead of those
    given, and the base ignored.
    """
    tol = case.extra.get("tol") or {}
    msg = check_array(got, case.expected, "the rotated x", **tol)
    if not msg:
        return None
    x, positions = case.args
    base = case.kwargs.get("base", 10000.0)
    pairing = _options(case)["pairing"]
    if pairing == "half":
        other = ("you paired neighbours (x[2i], x[2i+1]); this exercise pairs x[i] with x[i + d/2] (Hugging Face's "
                 "rotate_half)", lambda: _rotate(x, positions, base, pairing="interleaved"))
    else:
        other = ("you paired x[i] with x[i + d/2], the course's own exercise (Hugging Face's rotate_half); your "
                 "variant pairs neighbours, (x[2i], x[2i+1])", lambda: _rotate(x, positions, base, pairing="half"))
    hint = match_variant(got, [
        other,
        ("the rotation turns the wrong way: the first of each pair is x1 cos - x2 sin, the second x2 cos + x1 sin",
         lambda: _rotate(x, positions, base, pairing=pairing, sign=-1.0)),
        ("the frequencies are off: theta_i = base ** (-2 i / head_dim), with the 2",
         lambda: _rotate(x, positions, base, pairing=pairing, two=1.0)),
        ("use the positions you are given, not 0 .. N-1",
         lambda: _rotate(x, np.arange(len(positions)), base, pairing=pairing)),
        ("use the base you are given (the keyword argument), not always 10000",
         lambda: _rotate(x, positions, pairing=pairing)),
    ], **tol)
    return hint or msg


# ----------------------------------------------------------------------------- gqa_rope_decode_step
def _weights(rng, d_model, kv_width, dtype):
    scale = 1.5 / np.sqrt(d_model)
    w_q, w_o = (rng.standard_normal((d_model, d_model)) * scale for _ in range(2))
    w_k, w_v = (rng.standard_normal((d_model, kv_width)) * scale for _ in range(2))
    return [w.astype(dtype) for w in (w_q, w_k, w_v, w_o)]


def decode_cases(rng, variant=None):
    """Cases of ``gqa_rope_decode_step``: x_new ``(B, 1, d_model)``, caches ``(B, g, T, d_head)``, weights.

    The caches are built by the reference (rotated keys at 0 .. T-1); T = 0 in one, (H, g)
    covers GQA, MQA (g = 1) and MHA (g = H), float64 and float32. One more case with H = 6,
    g = 4 must raise a ValueError whose message names both. A ``variant`` keeps the draws; its
    caches are built with its pairing and given in its layout.
    """
    from mhalib.rope import rope_decode_step

    options = variant.options if variant is not None else VARIANTS[0].options
    if options == VARIANTS[0].options:
        step = rope_decode_step
    else:
        def step(x, kc, vc, w_q, w_k, w_v, w_o, h):  # the variant's reference (written here), (B, g, T, d) caches
            return _decode(x, kc, vc, w_q, w_k, w_v, w_o, h, kc.shape[1], pairing=options["pairing"])

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
            _, kc, vc = step(rng.standard_normal((b, 1, d_model)), kc, vc, *w64, h)
        x = rng.standard_normal((b, 1, d_model)).astype(dtype)
        kc, vc = kc.astype(dtype), vc.astype(dtype)
        out, k_new, v_new = step(x.astype(np.float64), kc.astype(np.float64), vc.astype(np.float64), *w64, h)
        if options["cache"] == "BTgD":  # the variant's layout, in and out
            kc, vc, k_new, v_new = (a.transpose(0, 2, 1, 3).copy() for a in (kc, vc, k_new, v_new))
        cases.append(Case(args=(x, kc, vc, *ws, h, g), expected=(out, k_new, v_new),
                          extra={"variant": variant} if variant is not None and variant.code else {},
                          label=f"B={b}, T={t} cached, H={h}, g={g}, d_head={dh}, {np.dtype(dtype).name}"
                                + (f", caches {LAYOUTS[options['cache']]}" if options["cache"] != "BgTD" else "")))
    h, g, dh = 6, 4, 2
    ws = _weights(rng, h * dh, g * dh, np.float64)
    cases.append(Case(args=(rng.standard_normal((1, 1, h * dh)), np.zeros((1, g, 2, dh)), np.zeros((1, g, 2, dh)),
                            *ws, h, g), label=f"H={h}, g={g}", raises="ValueError",
                      raises_names=(h, g),
                      raises_why=f"num_kv_heads={g} does not divide num_heads={h}; raise ValueError whose message "
                                 "names both"))
    return cases


def judge_decode(case, got):
    """``None`` when ``(out, k_cache, v_cache)`` is right, else a message naming the mistake.

    Recognises neighbouring pairs, keys rotated after caching or cached unrotated,
    positions restarting at 0, and ``np.tile`` instead of ``np.repeat`` for the K/V heads.
    """
    x, kc, vc, *ws, h, g = case.args
    options = _options(case)
    layout, pairing = options["cache"], options["pairing"]
    t = kc.shape[TIME_AXIS[layout]]

    def variant(**how):
        return _decode(x, kc, vc, *ws, h, g, **{"pairing": pairing, "cache": layout, **how})

    def rotation_mistake(name, cache):
        own = tuple(int(n) for n in np.take(case.expected[1].shape, (0, 2, 1, 3)))  # (B, g, T + 1, d_head)
        if layout != "BgTD" and cache.shape == own != case.expected[1].shape:
            return (f"{name} came back as {cache.shape}, the course's own layout (B, g, T + 1, d_head); your "
                    f"variant keeps the caches as {LAYOUTS[layout]}: take them and return them so")
        if name != "k_cache":
            return None
        if pairing == "half" and close(cache, variant(pairing="interleaved")[1]):
            return ("the new key is rotated with neighbouring pairs (x[2i], x[2i+1]); pair x[i] with x[i + d/2], "
                    "as apply_rope does")
        if pairing == "interleaved" and close(cache, variant(pairing="half")[1]):
            return ("the new key is rotated with the pairs (x[i], x[i + d/2]) of the course's own exercise; your "
                    "variant pairs neighbours, (x[2i], x[2i+1]), as your apply_rope does")
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
                             explain_out=output_mistake, time_axis=TIME_AXIS[layout])


def explain_decode_error(case, error, call):
    """In a variant with ``(B, T, g, d_head)`` caches, an error where the caches meet the new key."""
    layout = _options(case)["cache"]
    if layout == "BgTD" or not error.startswith(("ValueError", "IndexError")):
        return None
    return (f"your variant's caches are {LAYOUTS[layout]}: their positions are axis {TIME_AXIS[layout]}, and the new "
            "key and value go there (the course's own version, (B, g, T, d_head), appends along axis 2)")


# ----------------------------------------------------------------------------- merge_partials
def merge_cases(rng):
    """Cases of ``merge_partials(outputs, log_sum_exps)``: S chunks of one decoding query's attention.

    Outputs ``(S, d)`` or ``(S, ..., 1, d)`` with log-sum-exps ``(S,)`` or ``(S, ..., 1)``, float64,
    S from 2 to 6; in one case the log-sum-exps are near 1000. In one more, a chunk of one row had
    every key masked: its log-sum-exp is -inf and its output zeros (what a softmax gives a row
    with nothing to attend to), and it weighs nothing: the merge is that of the row's other chunks.
    (Every row keeps a chunk with a key; a row with none is not graded.)
    """
    from mhalib.online_softmax import merge_partials, split_attention

    cases = []
    for s, lead, shift in ((2, (), 0.0), (3, (2, 4), 0.0), (int(rng.integers(4, 7)), (3,), 0.0), (3, (2,), 1000.0),
                           (3, (2,), 0.0)):
        d = int(rng.integers(2, 6))
        n_k = s * int(rng.integers(1, 4)) + int(rng.integers(0, s))  # at least one key per chunk
        q = rng.standard_normal((*lead, 1, d))  # (..., 1, d): one decoding query
        k = rng.standard_normal((*lead, n_k, d)) * 2
        v = rng.standard_normal((*lead, n_k, d))
        outs, lses = split_attention(q, k, v, s)  # (S, ..., 1, d), (S, ..., 1)
        if not lead:
            outs, lses = outs[:, 0], lses[:, 0]  # (S, d), (S,)
        lses = lses + shift  # the same softmax of scores shifted by `shift`: the outputs do not change
        label = f"S={s} chunks, outputs {outs.shape}" + (f", log-sum-exps near {shift:g}" if shift else "")
        if len(cases) == 4:  # one chunk of row 0: every key masked
            masked = int(rng.integers(0, s))
            outs[masked, 0], lses[masked, 0] = 0.0, -np.inf
            label += f", chunk {masked} of row 0 fully masked (log-sum-exp -inf, output 0)"
        cases.append(Case(args=(outs, lses), expected=merge_partials(outs, lses), label=label))
    return cases


def judge_merge(case, got):
    """``None`` when ``(out, lse)`` is right, else a message naming the mistake.

    Recognises a NaN from a fully masked chunk (the log-sum-exps centred on something -inf made
    -inf), an overflow from not subtracting the largest log-sum-exp, chunks averaged equally,
    unnormalised weights, and a merged lse that is the maximum or the sum.
    """
    msg = check_pair(got, ("out", "lse"))
    if msg:
        return msg
    outs, lses = case.args
    out_e, lse_e = case.expected
    out, lse = got
    msg = check_array(out, out_e, "the merged out")
    if msg:
        broken = isinstance(out, np.ndarray) and out.shape == out_e.shape and not np.isfinite(
            np.asarray(out, dtype=np.float64)).all()
        if broken and np.isneginf(lses).any():
            return ("a fully masked chunk (log-sum-exp -inf) made NaN or inf: it must weigh exp(-inf - m) = 0; "
                    "subtract m = the largest log-sum-exp, finite while a chunk has a key (a mean or a sum of "
                    "log-sum-exps is -inf there, and -inf - -inf is NaN)")
        if broken and lses.max() > 700:
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
               make_cases=decode_cases, judge=judge_decode, explain_error=explain_decode_error),
        Graded(name="merge_partials", points=3, signature="merge_partials(outputs, log_sum_exps)",
               make_cases=merge_cases, judge=judge_merge),
    ],
    variants=VARIANTS,
)
