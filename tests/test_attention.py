"""The torch modules against independent oracles: nn.MultiheadAttention, SDPA with
enable_gqa, and the NumPy reference."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import mhalib
from mhalib import np_attention as npa
from mhalib.attention import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
    causal_mask,
    grouped_attention,
    repeat_kv,
    to_nn_multihead_attention,
)
from mhalib.validation import divisors


def numpy_weights(module):
    return [getattr(module, p).weight.detach().double().numpy().T for p in ("q_proj", "k_proj", "v_proj", "o_proj")]


def test_import_mhalib_does_not_load_torch_or_plotting():
    import subprocess
    import sys

    code = "import sys, mhalib; print(sorted(m for m in ('torch', 'matplotlib', 'ipywidgets') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert mhalib.GroupedQueryAttention is GroupedQueryAttention  # lazy export works


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
    ref = to_nn_multihead_attention(ours)
    x = torch.randn(b, n, d_model)
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1) if causal else None  # True = blocked, torch MHA convention
    with torch.no_grad():
        out, w = ours(x, causal=causal, need_weights=True)
        fast = ours(x, causal=causal)
        ref_out, ref_w = ref(x, x, x, attn_mask=mask, average_attn_weights=False)
    assert out.shape == (b, n, d_model) and w.shape == (b, h, n, n)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.sampled_from([8, 12, 16, 24]), st.booleans(), st.data())
def test_gqa_matches_sdpa_enable_gqa(b, n, d_model, causal, data):
    h = data.draw(st.sampled_from(divisors(d_model)))
    g = data.draw(st.sampled_from(divisors(h)))
    torch.manual_seed(n * 31 + d_model)
    m = GroupedQueryAttention(d_model, h, g).eval()
    x = torch.randn(b, n, d_model)
    with torch.no_grad():
        q, k, v = m.project(x)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # (B, H, N, d)
        ref = m.o_proj(ref.transpose(1, 2).reshape(b, n, d_model))
        out = m(x, causal=causal)
        out_w, _ = m(x, causal=causal, need_weights=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_w, ref, atol=1e-5, rtol=1e-5)


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


def test_gqa_ends_are_mha_and_mqa():
    torch.manual_seed(1)
    x = torch.randn(2, 6, 32)
    gqa = GroupedQueryAttention(32, 4, 4)
    mha = MultiHeadAttention(32, 4)
    mha.load_state_dict(gqa.state_dict())
    torch.testing.assert_close(gqa(x, causal=True), mha(x, causal=True))

    gqa1 = GroupedQueryAttention(32, 4, 1)
    mqa = MultiQueryAttention(32, 4)
    assert mqa.k_proj.weight.shape == (8, 32)
    mqa.load_state_dict(gqa1.state_dict())
    torch.testing.assert_close(gqa1(x), mqa(x))
    # MQA = MHA whose K/V heads are all copies of the one shared head
    wide = MultiHeadAttention(32, 4)
    with torch.no_grad():
        wide.q_proj.weight.copy_(mqa.q_proj.weight)
        wide.o_proj.weight.copy_(mqa.o_proj.weight)
        wide.k_proj.weight.copy_(mqa.k_proj.weight.repeat(4, 1))
        wide.v_proj.weight.copy_(mqa.v_proj.weight.repeat(4, 1))
    torch.testing.assert_close(wide(x, causal=True), mqa(x, causal=True), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_conversion_to_nn_multihead_attention_keeps_biases(bias):
    torch.manual_seed(6)
    m = GroupedQueryAttention(16, 4, 2, bias=bias).eval()
    ref = to_nn_multihead_attention(m)
    assert (ref.in_proj_bias is not None) == bias and ref.batch_first
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(m(x, causal=True), ref(x, x, x, attn_mask=causal_mask(5).logical_not())[0],
                                   atol=1e-5, rtol=1e-5)


def test_repeat_kv_is_repeat_interleave_not_tile():
    x = torch.arange(2 * 3 * 1 * 1).reshape(2, 3, 1, 1).float()
    torch.testing.assert_close(repeat_kv(x, 2), torch.repeat_interleave(x, 2, dim=1))
    assert repeat_kv(x, 2)[0, :, 0, 0].tolist() == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("n_q,n_k", [(1, 7), (3, 7), (5, 5)])
@pytest.mark.parametrize("h,g", [(8, 8), (8, 2), (8, 1)])
def test_grouped_attention_matches_sdpa_including_bottom_right_causal(n_q, n_k, h, g):
    torch.manual_seed(2)
    q = torch.randn(2, h, n_q, 16)
    k, v = torch.randn(2, g, n_k, 16), torch.randn(2, g, n_k, 16)
    for causal in (False, True):
        ours = grouped_attention(q, k, v, causal=causal)
        mask = causal_mask(n_q, n_k) if causal else None  # bottom-right aligned, True = attend
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_causal_mask_is_bottom_right_aligned():
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_mask(3).equal(torch.ones(3, 3, dtype=torch.bool).tril())
    with pytest.raises(ValueError, match="1 <= n_q <= n_k"):
        causal_mask(4, 2)


def test_bool_float_and_4d_masks_agree():
    torch.manual_seed(3)
    m = GroupedQueryAttention(16, 4, 2).eval()
    x = torch.randn(2, 5, 16)
    keep = torch.rand(5, 5) > 0.3
    keep[:, 0] = True
    additive = torch.zeros(5, 5).masked_fill(~keep, float("-inf"))
    with torch.no_grad():
        a = m(x, attn_mask=keep)
        b = m(x, attn_mask=additive)
        c = m(x, attn_mask=keep[None, None].expand(2, 1, 5, 5))
        _, w = m(x, attn_mask=keep, need_weights=True)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)
    assert torch.all(w[:, :, ~keep] == 0)


def test_a_batch_specific_mask_is_applied_to_its_own_batch_element():
    torch.manual_seed(4)
    m = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 4, 8)
    keep = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    keep[1, :, :, 2:] = False  # only batch element 1 is restricted
    with torch.no_grad():
        _, w = m(x, attn_mask=keep, need_weights=True)
    assert torch.all(w[1, :, :, 2:] == 0)
    assert torch.all(w[0, :, :, 2:] > 0)


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


def test_gradients_flow_through_every_projection():
    torch.manual_seed(5)
    m = GroupedQueryAttention(16, 4, 2)
    m(torch.randn(2, 3, 16), causal=True).sum().backward()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert getattr(m, name).weight.grad.abs().sum() > 0, name
