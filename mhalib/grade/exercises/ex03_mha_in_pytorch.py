"""Exercise 03 (torch): a ``MultiHeadAttention`` module from scratch, and ``to_torch_mha``.

The grader sends the weights and inputs as arrays; the child builds the learner's
module, loads ``W_Q .. W_O`` and runs ``forward``. The reference is NumPy multi-head
attention with ``W = layer.weight.T``, computed in float64 in the grader's process.
"""

from __future__ import annotations

import numpy as np

from mhalib.grade.exercises import _numpy_variants as wrong
from mhalib.grade.spec import Case, Exercise, Graded, check_array, check_pair, match_variant

KEY = "03_mha_in_pytorch"

# The from-scratch forward may use neither nn.MultiheadAttention nor the course library.
_LIBRARY = ("mhalib.attention.*", "mhalib.np_attention.*", "mhalib.kv_cache.*", "mhalib.decoder.*",
            "mhalib.convert.*", "mhalib.interpret.*")
_FORWARD_FORBIDDEN = (*_LIBRARY, "torch.nn.functional.multi_head_attention_forward",
                      "torch.nn.modules.activation.MultiheadAttention.forward",
                      "torch.nn.modules.activation.MultiheadAttention.__init__")
# use_sdpa=True must call PyTorch's fused kernel, whose output equals the plain path's to rounding:
# one case of that check forbids it, so that reaching it is what passes (``Case.must_call``)
SDPA = "torch._C._nn.scaled_dot_product_attention"
SDPA_NAME = "torch.nn.functional.scaled_dot_product_attention"
_SDPA_PROBE_FORBIDDEN = (*_FORWARD_FORBIDDEN, SDPA)
_CONFIGS = [(32, 4), (16, 2), (24, 3), (32, 8), (16, 4)]
_TOL = {}  # the judges' float32-derived default (spec.RTOL, spec.ATOL): torch computes in float32


def _draw(rng, d_model, num_heads, b=None, n=None):
    b = int(rng.integers(1, 5)) if b is None else b
    n = int(rng.integers(3, 11)) if n is None else n
    x = rng.standard_normal((b, n, d_model)).astype(np.float32)
    bound = 1 / np.sqrt(d_model)  # nn.Linear's own initialisation range
    ws = [rng.uniform(-bound, bound, (d_model, d_model)).astype(np.float32) for _ in range(4)]
    return x, ws


def _reference(x, ws, num_heads, causal):
    from mhalib.np_attention import causal_mask, multi_head_attention

    n = x.shape[-2]
    w_np = [w.astype(np.float64).T for w in ws]  # nn.Linear computes x @ weight.T
    out, _ = multi_head_attention(x.astype(np.float64), *w_np, num_heads,
                                  mask=causal_mask(n) if causal else None)
    return out


def _forward_cases(causal_options, use_sdpa, refuse=False):
    """Cases of the module's forward: three configurations (the first is (32, 4), x (4, 10, 32)),
    causal as ``causal_options`` says. With ``use_sdpa``, one more case checks that forward calls
    F.scaled_dot_product_attention (the others compare the numbers, the kernel allowed); with
    ``refuse``, one more builds ``MultiHeadAttention(12, 5)``, which must raise ValueError naming
    12 and 5 (5 heads do not divide 12)."""
    def make(rng):
        cases = []
        picks = [_CONFIGS[0]] + [_CONFIGS[int(i)] for i in rng.choice(np.arange(1, len(_CONFIGS)), 2, replace=False)]
        for i, (d_model, h) in enumerate(picks):
            causal = causal_options[i % len(causal_options)]
            x, ws = _draw(rng, d_model, h, *((4, 10) if i == 0 else ()))
            kwargs = {"causal": causal} if causal else {}
            if use_sdpa:
                kwargs["use_sdpa"] = True
            cases.append(Case(args=(x, *ws), kwargs=kwargs, expected=_reference(x, ws, h, causal),
                              params={"class": "MultiHeadAttention", "d_model": d_model, "num_heads": h},
                              forbidden=_FORWARD_FORBIDDEN if use_sdpa else None,
                              label=f"MultiHeadAttention({d_model}, {h}), x {x.shape}"
                                    + (", causal=True" if causal else "") + (", use_sdpa=True" if use_sdpa else "")))
        if use_sdpa:  # the fused kernel must be reached: this case forbids it, and passes when it is called
            x, ws = _draw(rng, 16, 2, 2, 6)
            cases.append(Case(args=(x, *ws), kwargs={"use_sdpa": True}, must_call=SDPA_NAME,
                              params={"class": "MultiHeadAttention", "d_model": 16, "num_heads": 2},
                              label=f"MultiHeadAttention(16, 2), x {x.shape}, use_sdpa=True: "
                                    "forward calls F.scaled_dot_product_attention"))
        if refuse:
            d_model, h = 12, 5
            x, ws = _draw(rng, d_model, h, 2, 4)
            cases.append(Case(args=(x, *ws), params={"class": "MultiHeadAttention", "d_model": d_model,
                                                     "num_heads": h},
                              label=f"MultiHeadAttention({d_model}, {h}): 5 heads do not divide d_model 12",
                              raises="ValueError", raises_names=(d_model, h),
                              raises_why=f"num_heads={h} does not divide d_model={d_model}; __init__ must raise "
                                         "ValueError naming both"))
        return cases
    return make


def judge_forward(case, got):
    """``None`` when the module's output ``(B, N, d_model)`` is right, else a message naming the mistake.

    Recognises a tuple returned, a missing or flipped causal mask, scaling by sqrt(d_model),
    heads in the wrong order, no output projection and untransposed weights.
    """
    x, *ws = case.args
    h = case.params["num_heads"]
    causal = bool(case.kwargs.get("causal"))
    if case.must_call:  # it returned without reaching the fused kernel
        return (f"forward(x, use_sdpa=True) never called {case.must_call}: use_sdpa=True must compute "
                "the attention with F.scaled_dot_product_attention(q, k, v, is_causal=causal), not the plain path")
    if isinstance(got, tuple) and got and isinstance(got[0], np.ndarray):
        return "forward should return only the output tensor (B, N, d_model), not a tuple"
    msg = check_array(got, case.expected, "the output", **_TOL)
    if not msg:
        return None
    n = x.shape[-2]
    wt = [w.astype(np.float64).T for w in ws]
    mask = wrong.causal_mask(n) if causal else None
    variants = [
        ("the causal mask is not applied (causal=True must hide later positions)",
         lambda: wrong.gqa(x, *wt, h, h, None)[0] if causal else None),
        ("the mask hides the past instead of the future: -inf goes above the diagonal "
         "(torch.triu(..., diagonal=1))", lambda: wrong.gqa(x, *wt, h, h, mask.T)[0]),
        ("the scores are scaled by sqrt(d_model); scale by sqrt(d_head)",
         lambda: wrong.gqa(x, *wt, h, h, mask, scale="model")[0]),
        ("heads come out in the wrong order: view as (B, N, H, d_head) first, then transpose(1, 2)",
         lambda: wrong.gqa(x, *wt, h, h, mask, split_how="reshape_only")[0]),
        ("the output projection W_O is not applied", lambda: wrong.gqa(x, *wt, h, h, mask, use_wo=False)[0]),
        ("the weights are used untransposed (x @ W.weight); call the layers, self.W_Q(x), which "
         "compute x @ weight.T", lambda: wrong.gqa(x, *[w.astype(np.float64) for w in ws], h, h, mask)[0]),
    ]
    return match_variant(got, variants, **_TOL) or msg


def to_mha_cases(rng):
    """Two cases of ``to_torch_mha(module)``: ``MultiHeadAttention(32, 4)`` and one other size.

    x ``(B, N, d_model)`` (``(4, 10, 32)`` in the first) and the four weights are float32; the
    answer is the stacked ``in_proj_weight``, ``out_proj.weight`` and the converted layer's output.
    """
    cases = []
    for i, (d_model, h) in enumerate([_CONFIGS[0], _CONFIGS[int(rng.integers(1, len(_CONFIGS)))]]):
        x, ws = _draw(rng, d_model, h, *((4, 10) if i == 0 else ()))
        expected = (np.concatenate(ws[:3], axis=0), ws[3], _reference(x, ws, h, False))
        cases.append(Case(args=(x, *ws), expected=expected,
                          params={"class": "MultiHeadAttention", "d_model": d_model, "num_heads": h},
                          label=f"to_torch_mha(MultiHeadAttention({d_model}, {h})), x {x.shape}"))
    return cases


def judge_to_mha(case, got):
    """``None`` when the converted layer is right, else a message naming the mistake.

    ``got`` is ``(in_proj_weight, out_proj.weight, output)``; recognises transposed weights
    and Q, K, V stacked in the wrong order.
    """
    msg = check_pair(got, ("in_proj_weight", "out_proj.weight", "output"))
    if msg:
        return f"the grader could not read the converted layer ({msg})"
    in_proj, out_proj, out = got
    exp_in, exp_out, exp = case.expected
    x, wq, wk, wv, wo = case.args
    msg = check_array(in_proj, exp_in.astype(np.float64), "in_proj_weight", **_TOL)
    if msg:
        return match_variant(in_proj, [
            ("in_proj_weight holds transposed weights: stack W_Q.weight, W_K.weight, W_V.weight as they "
             "are (both use the (d_out, d_in) layout)", lambda: np.concatenate([wq.T, wk.T, wv.T])),
            ("in_proj_weight stacks the projections in the wrong order: Q, then K, then V",
             lambda: np.concatenate([wk, wq, wv])),
            ("in_proj_weight stacks the projections in the wrong order: Q, then K, then V",
             lambda: np.concatenate([wv, wk, wq])),
        ], **_TOL) or msg
    msg = check_array(out_proj, exp_out.astype(np.float64), "out_proj.weight", **_TOL)
    if msg:
        return match_variant(out_proj, [
            ("out_proj.weight is transposed: copy W_O.weight as it is", lambda: wo.T),
        ], **_TOL) or msg
    msg = check_array(out, exp, "the converted layer's output", **_TOL)
    return msg


EXERCISE = Exercise(
    key=KEY,
    title="Multi-head attention in PyTorch",
    forbidden=_FORWARD_FORBIDDEN,
    preload=("torch",),
    graded=[
        Graded(name="MultiHeadAttention", points=4,
               signature="MultiHeadAttention(d_model, num_heads).forward(x, causal=False, use_sdpa=False)",
               make_cases=_forward_cases([False], False, refuse=True), judge=judge_forward, adapter="torch_module",
               target="MultiHeadAttention",
               description="forward(x) equals multi-head attention with W = layer.weight.T; __init__ refuses "
                           "num_heads that do not divide d_model"),
        Graded(name="MultiHeadAttention (causal=True)", points=1,
               signature="MultiHeadAttention(d_model, num_heads).forward(x, causal=True)",
               make_cases=_forward_cases([True, True, False], False), judge=judge_forward,
               adapter="torch_module", target="MultiHeadAttention"),
        Graded(name="MultiHeadAttention (use_sdpa=True)", points=1,
               signature="MultiHeadAttention(d_model, num_heads).forward(x, causal=False, use_sdpa=True)",
               make_cases=_forward_cases([False, True, False], True), judge=judge_forward,
               adapter="torch_module", target="MultiHeadAttention", forbidden=_SDPA_PROBE_FORBIDDEN),
        Graded(name="to_torch_mha", points=2, signature="to_torch_mha(module)", make_cases=to_mha_cases,
               judge=judge_to_mha, adapter="torch_to_mha", forbidden=_LIBRARY),
    ],
)
