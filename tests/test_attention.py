"""The torch modules against independent oracles: nn.MultiheadAttention with the weights
copied in by the test, and SDPA with enable_gqa; the NumPy core as a second implementation."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import mhalib
from mhalib import np_attention as npa
from mhalib.attention import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
    causal_allowed,
    to_nn_multihead_attention,
)
from mhalib.validation import divisors
from oracles import parameter_count, torch_mha_holding
from tolerance import float_tol

# Float32 against torch's modules and kernels, which sum in another order: bounds for the
# largest shapes below (d_model <= 64, d_head <= 64, N <= 9): two projections over d_model,
# the scores over d_head, the softmax and the weighted sum over N keys (tolerance.py)
F32_OUT = float_tol(torch.float32, 2 * 64 + 64 + 2 * 9)
F32_WEIGHTS = float_tol(torch.float32, 64 + 64 + 9)
F32_GRAD = float_tol(torch.float32, 4 * (2 * 64 + 64 + 2 * 9))  # the backward pass sums over B * N too


def numpy_weights(module):
    return [getattr(module, p).weight.detach().double().numpy().T for p in ("q_proj", "k_proj", "v_proj", "o_proj")]


def test_import_mhalib_does_not_load_torch_or_plotting():
    import subprocess
    import sys

    code = "import sys, mhalib; print(sorted(m for m in ('torch', 'matplotlib', 'ipywidgets') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert mhalib.GroupedQueryAttention is GroupedQueryAttention  # lazy export works


@pytest.mark.parametrize("module", ["mhalib.interpret", "mhalib.kv_cache", "mhalib.quiz", "mhalib.runtime",
                                    "mhalib.np_attention", "mhalib.data"])
def test_numpy_modules_do_not_load_torch(module):
    """The grader's NumPy references and the learners' check() import these: no torch, no tqdm."""
    import subprocess
    import sys

    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'tqdm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_attribute_names_follow_hugging_face():
    m = GroupedQueryAttention(64, 8, 2)
    assert m.q_proj.weight.shape == (64, 64)
    assert m.k_proj.weight.shape == (16, 64)  # num_kv_heads * head_dim
    assert m.v_proj.weight.shape == (16, 64)
    assert m.o_proj.weight.shape == (64, 64)
    assert (m.head_dim, m.num_kv_heads) == (8, 2)
    assert m.q_proj.bias is None
    assert GroupedQueryAttention(64, 8, 2, bias=True).k_proj.bias.shape == (16,)


@pytest.mark.parametrize("b,n,d_model,h", [(2, 5, 64, 8), (1, 1, 16, 4), (3, 7, 12, 3), (2, 4, 8, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_mha_matches_torch_multihead_attention(b, n, d_model, h, causal):
    torch.manual_seed(0)
    ours = MultiHeadAttention(d_model, h).eval()
    ref = torch_mha_holding(ours, h, h)
    x = torch.randn(b, n, d_model)
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1) if causal else None  # True = blocked, torch MHA convention
    with torch.no_grad():
        out, w = ours(x, causal=causal, need_weights=True)
        fast = ours(x, causal=causal)
        ref_out, ref_w = ref(x, x, x, attn_mask=mask, average_attn_weights=False)
    assert out.shape == (b, n, d_model) and w.shape == (b, h, n, n)
    torch.testing.assert_close(out, ref_out, **F32_OUT)
    torch.testing.assert_close(fast, ref_out, **F32_OUT)
    torch.testing.assert_close(w, ref_w, **F32_WEIGHTS)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.sampled_from([8, 12, 16, 24]), st.booleans(), st.data())
def test_gqa_matches_sdpa_enable_gqa(b, n, d_model, causal, data):
    h = data.draw(st.sampled_from(divisors(d_model)))
    g = data.draw(st.sampled_from(divisors(h)))
    torch.manual_seed(n * 31 + d_model)
    m = GroupedQueryAttention(d_model, h, g).eval()
    x = torch.randn(b, n, d_model)
    d = d_model // h
    with torch.no_grad():
        q = (x @ m.q_proj.weight.T).view(b, n, h, d).transpose(1, 2)  # (B, H, N, d)
        k = (x @ m.k_proj.weight.T).view(b, n, g, d).transpose(1, 2)  # (B, g, N, d)
        v = (x @ m.v_proj.weight.T).view(b, n, g, d).transpose(1, 2)  # (B, g, N, d)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # (B, H, N, d)
        ref = ref.transpose(1, 2).reshape(b, n, d_model) @ m.o_proj.weight.T  # (B, N, d_model)
        out = m(x, causal=causal)
        out_w, _ = m(x, causal=causal, need_weights=True)
    torch.testing.assert_close(out, ref, **F32_OUT)
    torch.testing.assert_close(out_w, ref, **F32_OUT)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([8, 16]), st.integers(1, 6), st.data())
def test_torch_and_numpy_paths_agree(d_model, n, data):
    h = data.draw(st.sampled_from(divisors(d_model)))
    g = data.draw(st.sampled_from(divisors(h)))
    causal = data.draw(st.booleans())
    torch.manual_seed(d_model + n)
    m = GroupedQueryAttention(d_model, h, g).double().eval()
    x = torch.randn(2, n, d_model, dtype=torch.float64)
    with torch.no_grad():
        out, w = m(x, causal=causal, need_weights=True)
    mask = npa.causal_mask(n) if causal else None
    ref, ref_w = npa.grouped_query_attention(x.numpy(), *numpy_weights(m), h, g, mask=mask)
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(w.numpy(), ref_w, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_mqa_equals_nn_multihead_attention_with_one_shared_kv_head(causal):
    torch.manual_seed(1)
    mqa = MultiQueryAttention(32, 4).eval()
    assert mqa.num_kv_heads == 1 and mqa.k_proj.weight.shape == mqa.v_proj.weight.shape == (8, 32)
    ref = nn.MultiheadAttention(32, 4, bias=False, batch_first=True)
    with torch.no_grad():  # every query head gets a copy of the one K/V head
        ref.in_proj_weight.copy_(torch.cat([mqa.q_proj.weight, mqa.k_proj.weight.repeat(4, 1),
                                            mqa.v_proj.weight.repeat(4, 1)]))  # (3 d_model, d_model)
        ref.out_proj.weight.copy_(mqa.o_proj.weight)  # (d_model, d_model)
    x = torch.randn(2, 6, 32)  # (B, N, d_model)
    mask = torch.ones(6, 6, dtype=torch.bool).triu(1) if causal else None  # True = blocked in nn.MHA
    with torch.no_grad():
        want, want_w = ref(x, x, x, attn_mask=mask, average_attn_weights=False)
        got, got_w = mqa(x, causal=causal, need_weights=True)
        fast = mqa(x, causal=causal)
    torch.testing.assert_close(got, want, **F32_OUT)
    torch.testing.assert_close(fast, want, **F32_OUT)
    torch.testing.assert_close(got_w, want_w, **F32_WEIGHTS)


@pytest.mark.parametrize("bias", [False, True])
def test_parameter_counts_equal_those_of_real_torch_modules(bias):
    d_model, h = 64, 8
    d_head = d_model // h
    # MHA has exactly the parameters of torch's own multi-head attention
    assert parameter_count(MultiHeadAttention(d_model, h, bias=bias)) == parameter_count(
        nn.MultiheadAttention(d_model, h, bias=bias))
    # MQA and GQA: full-width Q and O, K and V of g * d_head outputs each
    for module, g in ((MultiQueryAttention(d_model, h, bias=bias), 1),
                      (GroupedQueryAttention(d_model, h, 2, bias=bias), 2)):
        q_o = [nn.Linear(d_model, d_model, bias=bias) for _ in range(2)]
        k_v = [nn.Linear(d_model, g * d_head, bias=bias) for _ in range(2)]
        assert parameter_count(module) == parameter_count(*q_o, *k_v), type(module).__name__


@pytest.mark.parametrize("bias", [False, True])
def test_conversion_to_nn_multihead_attention_keeps_biases(bias):
    torch.manual_seed(6)
    m = GroupedQueryAttention(16, 4, 2, bias=bias).eval()
    converted = to_nn_multihead_attention(m)
    by_hand = torch_mha_holding(m, 4, 2)  # K/V head j copied to query heads 2j and 2j + 1
    assert isinstance(converted, nn.MultiheadAttention) and converted.batch_first and not converted.training
    assert (converted.in_proj_bias is not None) == bias
    torch.testing.assert_close(converted.in_proj_weight, by_hand.in_proj_weight, atol=0, rtol=0)
    torch.testing.assert_close(converted.out_proj.weight, by_hand.out_proj.weight, atol=0, rtol=0)
    if bias:
        torch.testing.assert_close(converted.in_proj_bias, by_hand.in_proj_bias, atol=0, rtol=0)
        torch.testing.assert_close(converted.out_proj.bias, by_hand.out_proj.bias, atol=0, rtol=0)
    x = torch.randn(2, 5, 16)  # (B, N, d_model)
    blocked = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True = blocked in nn.MHA
    with torch.no_grad():
        want = by_hand(x, x, x, attn_mask=blocked)[0]  # (B, N, d_model)
        torch.testing.assert_close(converted(x, x, x, attn_mask=blocked)[0], want, **F32_WEIGHTS)
        torch.testing.assert_close(m(x, causal=True), want, **F32_OUT)


def test_causal_allowed_is_bottom_right_aligned():
    assert causal_allowed(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_allowed(3).equal(torch.ones(3, 3, dtype=torch.bool).tril())
    with pytest.raises(ValueError, match="1 <= n_q <= n_k"):
        causal_allowed(4, 2)


def test_bool_float_and_4d_masks_agree():
    torch.manual_seed(3)
    m = GroupedQueryAttention(16, 4, 2).eval()
    x = torch.randn(2, 5, 16)
    keep = torch.rand(5, 5) > 0.3
    keep[:, 0] = True
    additive = torch.zeros(5, 5).masked_fill(~keep, float("-inf"))
    with torch.no_grad():
        want, want_w = torch_mha_holding(m, 4, 2)(x, x, x, attn_mask=~keep, average_attn_weights=False)
        a = m(x, attn_mask=keep)
        b = m(x, attn_mask=additive)
        c = m(x, attn_mask=keep[None, None].expand(2, 1, 5, 5))
        _, w = m(x, attn_mask=keep, need_weights=True)
    torch.testing.assert_close(a, want, **F32_OUT)
    torch.testing.assert_close(b, want, **F32_OUT)
    torch.testing.assert_close(c, want, **F32_OUT)
    torch.testing.assert_close(w, want_w, **F32_WEIGHTS)
    assert torch.all(w[:, :, ~keep] == 0)


def test_a_batch_specific_mask_is_applied_to_its_own_batch_element():
    torch.manual_seed(4)
    m = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 4, 8)
    keep = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    keep[1, :, :, 2:] = False  # only batch element 1 is restricted
    blocked = (~keep).expand(2, 2, 4, 4).reshape(2 * 2, 4, 4)  # (B * H, N, N), batch-major as nn.MHA reads it
    with torch.no_grad():
        out, w = m(x, attn_mask=keep, need_weights=True)
        want, want_w = torch_mha_holding(m, 2, 2)(x, x, x, attn_mask=blocked, average_attn_weights=False)
    assert torch.all(w[1, :, :, 2:] == 0)
    assert torch.all(w[0, :, :, 2:] > 0)
    torch.testing.assert_close(out, want, **F32_OUT)
    torch.testing.assert_close(w, want_w, **F32_WEIGHTS)


@pytest.mark.parametrize("args,message", [
    ((64, 7, 7), r"d_model=64 is not divisible by num_heads=7; choose one of 1, 2, 4, 8, 16, 32, 64"),
    ((64, 8, 3), r"num_heads=8 is not divisible by num_kv_heads=3; choose one of 1, 2, 4, 8"),
    ((64, 0, 1), r"num_heads must be a positive integer; got num_heads=0"),
    ((64, 2.5, 1), r"num_heads must be a positive integer; got 2.5"),
])
def test_constructor_errors_name_what_is_allowed(args, message):
    with pytest.raises(ValueError, match=message):
        GroupedQueryAttention(*args)


def test_forward_errors_name_what_was_given():
    m = GroupedQueryAttention(16, 4, 2)
    with pytest.raises(ValueError, match=r"3-D \(B, N, d_model=16\); got shape \(5, 16\).*unsqueeze"):
        m(torch.randn(5, 16))
    with pytest.raises(ValueError, match="last dimension 8 but this module has d_model=16"):
        m(torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match=r"\(2, 5, 5\) is ambiguous.*\(B, N, N\) or \(H, N, N\)"):
        m(torch.randn(2, 5, 16), attn_mask=torch.ones(2, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 4\) does not fit the scores of shape \(2, 4, 5, 5\)"):
        m(torch.randn(2, 5, 16), attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(3, 1, 5, 5\) does not fit"):
        m(torch.randn(2, 5, 16), attn_mask=torch.ones(3, 1, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        m(torch.randn(2, 5, 16), attn_mask=np.zeros((5, 5)))
    with pytest.raises(ValueError, match="must be a torch.Tensor"):
        m(np.zeros((2, 5, 16)))


def test_gradients_of_every_projection_equal_nn_multihead_attention():
    torch.manual_seed(5)
    h, g, d_model, d = 4, 2, 16, 4
    m = GroupedQueryAttention(d_model, h, g)
    ref = torch_mha_holding(m, h, g).train()
    x = torch.randn(2, 3, d_model)  # (B, N, d_model)
    m(x, causal=True).square().sum().backward()
    ref(x, x, x, attn_mask=torch.ones(3, 3, dtype=torch.bool).triu(1))[0].square().sum().backward()
    g_q, g_k, g_v = ref.in_proj_weight.grad.chunk(3)  # each (d_model, d_model): H heads of d rows
    # a shared K/V head collects the gradients of the H / g query heads that read it
    g_k = g_k.view(g, h // g, d, d_model).sum(1).reshape(g * d, d_model)  # (g * d, d_model)
    g_v = g_v.view(g, h // g, d, d_model).sum(1).reshape(g * d, d_model)  # (g * d, d_model)
    torch.testing.assert_close(m.q_proj.weight.grad, g_q, **F32_GRAD)
    torch.testing.assert_close(m.k_proj.weight.grad, g_k, **F32_GRAD)
    torch.testing.assert_close(m.v_proj.weight.grad, g_v, **F32_GRAD)
    torch.testing.assert_close(m.o_proj.weight.grad, ref.out_proj.weight.grad, **F32_GRAD)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert getattr(m, name).weight.grad.abs().sum() > 0, name


def test_no_name_is_both_an_additive_and_a_boolean_mask():
    """mhalib.causal_mask (NumPy) is additive; the torch boolean mask has a name of its own."""
    import numpy as np

    import mhalib
    from mhalib import attention

    additive = mhalib.causal_mask(3)
    assert additive.dtype == np.float64 and additive[0, 1] == -np.inf and additive[1, 0] == 0
    assert not hasattr(attention, "causal_mask") and attention.causal_allowed(3).dtype == torch.bool


@pytest.mark.parametrize("g", [4, 2, 1])
def test_each_attention_implementation_gives_the_same_numbers_and_uses_its_kernel(g, monkeypatch):
    """eager always goes through grouped_attention, sdpa through the fused kernel (except
    for the weights), auto as measured; prefill and a decoding step with a cache agree."""
    from mhalib import attention
    from mhalib.kv_cache import KVCache

    torch.manual_seed(0)
    x = torch.randn(2, 7, 32)  # (B, N, d_model)
    outputs, calls = {}, []
    real_sdpa = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append("sdpa") or real_sdpa(*a, **k))
    for kind in attention.ATTN_IMPLEMENTATIONS:
        torch.manual_seed(1)
        layer = attention.GroupedQueryAttention(32, 4, g, attn_implementation=kind).eval()
        calls.clear()
        with torch.no_grad():
            cache = KVCache()
            prefill = layer(x[:, :6], causal=True, kv_cache=cache)  # several queries
            step = layer(x[:, 6:], causal=True, kv_cache=cache)  # one decoding query
            _, weights = layer(x, causal=True, need_weights=True)
        outputs[kind] = torch.cat([prefill, step], dim=1)
        expected = {"eager": [], "sdpa": ["sdpa", "sdpa"], "auto": ["sdpa"]}[kind]
        assert calls == expected, (kind, calls)
        assert weights.shape == (2, 4, 7, 7)
    for kind in ("sdpa", "auto"):
        torch.testing.assert_close(outputs[kind], outputs["eager"], **F32_OUT)
    assert "attn_implementation='sdpa'" in repr(attention.GroupedQueryAttention(32, 4, g, attn_implementation="sdpa"))


def test_an_unknown_attention_implementation_is_a_clear_error():
    from mhalib.attention import MultiHeadAttention

    with pytest.raises(ValueError, match="attn_implementation must be one of 'auto', 'eager', 'sdpa'; got 'flash'"):
        MultiHeadAttention(32, 4, attn_implementation="flash")


def test_check_positive_int_takes_integers_and_names_what_it_refuses():
    from mhalib.validation import check_positive_int

    assert check_positive_int(3, "n") == 3 and check_positive_int(np.int64(2), "n") == 2
    for bad in (0, -1, True, 2.0, "3", None):
        with pytest.raises(ValueError, match=r"n must be a positive integer; got n="):
            check_positive_int(bad, "n")
