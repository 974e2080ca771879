"""The NumPy core against independent oracles: torch's own attention and explicit loops."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mhalib import np_attention as npa
from mhalib.validation import divisors
from tolerance import float_tol


def rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- softmax and masks

def test_softmax_rows_sum_to_one_and_match_torch():
    x = rng().normal(size=(3, 4, 5)) * 10
    ours = npa.softmax(x, axis=-1)
    np.testing.assert_allclose(ours.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(ours, torch.softmax(torch.from_numpy(x), -1).numpy(), atol=1e-12)


def test_softmax_is_stable_for_huge_scores():
    out = npa.softmax(np.array([1000.0, 1001.0, -1000.0]))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, [1 / (1 + np.e), np.e / (1 + np.e), 0.0], atol=1e-12)


def test_softmax_of_a_fully_masked_row_is_zero_not_nan():
    out = npa.softmax(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]))
    np.testing.assert_array_equal(out, [[0.0, 0.0], [1.0, 0.0]])


def test_causal_mask_values():
    m = npa.causal_mask(4)
    assert m.shape == (4, 4)
    assert np.all(m[np.tril_indices(4)] == 0)
    assert np.all(np.isneginf(m[np.triu_indices(4, k=1)]))
    expected = torch.zeros(4, 4).masked_fill(torch.triu(torch.ones(4, 4, dtype=torch.bool), 1), float("-inf"))
    np.testing.assert_array_equal(m, expected.numpy())


def test_causal_mask_rejects_nonpositive_n():
    with pytest.raises(ValueError, match="n >= 1"):
        npa.causal_mask(0)


# ---------------------------------------------------------------- single head

def test_worked_example_of_notebook_01():
    x = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]], dtype=float)
    w1 = np.array([[1, 0], [0, 1], [0, 0], [0, 0]], dtype=float)
    w2 = np.array([[0, 0], [0, 0], [1, 0], [0, 1]], dtype=float)
    mask = npa.causal_mask(3)
    head1, a1 = npa.scaled_dot_product_attention(x @ w1, x @ w1, x @ w1, mask=mask)
    head2, _ = npa.scaled_dot_product_attention(x @ w2, x @ w2, x @ w2, mask=mask)
    np.testing.assert_allclose(a1, [[1, 0, 0], [0.330, 0.670, 0], [0.248, 0.248, 0.503]], atol=1e-3)
    np.testing.assert_allclose(head1, [[1, 0], [0.330, 0.670], [0.752, 0.752]], atol=1e-3)
    np.testing.assert_allclose(head2, [[1, 0], [0.330, 0.670], [0.333, 0.333]], atol=1e-3)


@pytest.mark.parametrize("n_q,n_k", [(1, 1), (3, 5), (6, 6)])
def test_sdpa_matches_torch_with_and_without_mask(n_q, n_k):
    r = rng(1)
    q, k, v = r.normal(size=(2, 3, n_q, 4)), r.normal(size=(2, 3, n_k, 4)), r.normal(size=(2, 3, n_k, 5))
    mask = np.where(r.random((n_q, n_k)) < 0.3, -np.inf, 0.0)
    mask[:, 0] = 0.0  # every row keeps one key
    for m in (None, mask):
        out, w = npa.scaled_dot_product_attention(q, k, v, mask=m)
        ref = F.scaled_dot_product_attention(
            *(torch.from_numpy(a) for a in (q, k, v)),
            attn_mask=None if m is None else torch.from_numpy(m),
        )
        np.testing.assert_allclose(out, ref.numpy(), atol=1e-10)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12)


def test_sdpa_boolean_mask_means_keep():
    r = rng(2)
    q, k, v = (r.normal(size=(4, 3)) for _ in range(3))
    keep = np.tril(np.ones((4, 4), dtype=bool))
    a, wa = npa.scaled_dot_product_attention(q, k, v, mask=keep)
    b, wb = npa.scaled_dot_product_attention(q, k, v, mask=npa.causal_mask(4))
    np.testing.assert_allclose(a, b)
    assert np.all(wa[~keep] == 0)


def test_sdpa_errors_name_the_shapes():
    with pytest.raises(ValueError, match=r"share their last dimension.*\(3, 4\).*\(3, 5\)"):
        npa.scaled_dot_product_attention(np.ones((3, 4)), np.ones((3, 5)), np.ones((3, 5)))
    with pytest.raises(ValueError, match="same number of positions"):
        npa.scaled_dot_product_attention(np.ones((3, 4)), np.ones((3, 4)), np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 2\) does not broadcast"):
        npa.scaled_dot_product_attention(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 4)), mask=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        npa.scaled_dot_product_attention(np.ones(4), np.ones(4), np.ones(4))


# ---------------------------------------------------------------- heads

def loop_mha(x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads, mask=None):
    """Oracle: an explicit loop over heads, slicing columns, as notebook 02 first teaches."""
    d_model = x.shape[-1]
    d = d_model // num_heads
    group = num_heads // num_kv_heads
    outs, weights = [], []
    for h in range(num_heads):
        kv = h // group
        q = x @ w_q[:, h * d:(h + 1) * d]
        k = x @ w_k[:, kv * d:(kv + 1) * d]
        v = x @ w_v[:, kv * d:(kv + 1) * d]
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
        if mask is not None:
            s = s + mask
        s = s - s.max(-1, keepdims=True)
        a = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
        outs.append(a @ v)
        weights.append(a)
    return np.concatenate(outs, axis=-1) @ w_o, np.stack(weights, axis=-3)


def random_weights(r, d_model, kv_dim):
    return (r.normal(size=(d_model, d_model)) / np.sqrt(d_model), r.normal(size=(d_model, kv_dim)) / np.sqrt(d_model),
            r.normal(size=(d_model, kv_dim)) / np.sqrt(d_model), r.normal(size=(d_model, d_model)) / np.sqrt(d_model))


def test_split_heads_shape_trace_from_the_spec():
    x = rng().normal(size=(2, 5, 64))  # (B, N, d_model)
    q_h = npa.split_heads(x, 8)
    assert q_h.shape == (2, 8, 5, 8)  # (B, H, N, d_head)
    for h in range(8):  # head h is columns 8h .. 8h + 7 of every position
        np.testing.assert_array_equal(q_h[:, h], x[:, :, 8 * h:8 * (h + 1)])
    assert npa.merge_heads(q_h).shape == (2, 5, 64)


def test_merge_heads_concatenates_the_heads_in_order():
    z = rng(5).normal(size=(2, 4, 3, 5))  # (B, H, N, d_head)
    want = np.concatenate([z[:, h] for h in range(4)], axis=-1)  # (B, N, H * d_head): head 0 first
    np.testing.assert_array_equal(npa.merge_heads(z), want)
    np.testing.assert_array_equal(npa.merge_heads(z[0]), want[0])  # (H, N, d_head) -> (N, H * d_head)


def test_split_heads_puts_columns_of_one_head_together():
    x = np.arange(2 * 6).reshape(2, 6)  # N=2, d_model=6
    heads = npa.split_heads(x, 3)  # (3, 2, 2)
    np.testing.assert_array_equal(heads[1], [[2, 3], [8, 9]])  # head 1 = columns 2..3 of every row
    wrong = x.reshape(3, 2, 2)  # the silent bug: mixes positions into heads
    assert not np.array_equal(heads, wrong)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.sampled_from([4, 6, 8, 12]), st.data())
def test_merge_inverts_split(batch, n, d_model, data):
    num_heads = data.draw(st.sampled_from(divisors(d_model)))
    x = rng(n).normal(size=(batch, n, d_model))
    np.testing.assert_array_equal(npa.merge_heads(npa.split_heads(x, num_heads)), x)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([None, 2, 3]), st.integers(1, 7), st.sampled_from([4, 8, 12, 16]), st.booleans(), st.data())
def test_gqa_equals_explicit_loop(batch, n, d_model, causal, data):
    num_heads = data.draw(st.sampled_from(divisors(d_model)))
    num_kv_heads = data.draw(st.sampled_from(divisors(num_heads)))
    r = rng(d_model * 100 + n)
    shape = (n, d_model) if batch is None else (batch, n, d_model)
    x = r.normal(size=shape)
    ws = random_weights(r, d_model, num_kv_heads * (d_model // num_heads))
    mask = npa.causal_mask(n) if causal else None
    out, w = npa.grouped_query_attention(x, *ws, num_heads, num_kv_heads, mask=mask)
    ref_out, ref_w = loop_mha(x, *ws, num_heads, num_kv_heads, mask=mask)
    assert out.shape == shape and w.shape == shape[:-2] + (num_heads, n, n)
    np.testing.assert_allclose(out, ref_out, atol=1e-10)
    np.testing.assert_allclose(w, ref_w, atol=1e-12)


def test_mha_matches_torch_multihead_attention():
    r = rng(3)
    d_model, num_heads, n = 16, 4, 6
    x = r.normal(size=(2, n, d_model)).astype(np.float32)
    mha = torch.nn.MultiheadAttention(d_model, num_heads, bias=False, batch_first=True)
    w_in = mha.in_proj_weight.detach().numpy()  # (3 d_model, d_model), rows: q, k, v
    w_q, w_k, w_v = (w_in[i * d_model:(i + 1) * d_model].T for i in range(3))
    w_o = mha.out_proj.weight.detach().numpy().T
    mask = npa.causal_mask(n).astype(np.float32)
    ours, our_w = npa.multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=mask)
    ref, ref_w = mha(*(torch.from_numpy(x),) * 3, attn_mask=torch.from_numpy(mask), average_attn_weights=False)
    np.testing.assert_allclose(ours, ref.detach().numpy(), **float_tol(np.float32, 3 * d_model + 2 * n))
    np.testing.assert_allclose(our_w, ref_w.detach().numpy(), **float_tol(np.float32, 2 * d_model + n))


def test_gqa_with_one_kv_head_shares_keys_across_all_heads():
    r = rng(4)
    d_model, num_heads = 8, 4
    x = r.normal(size=(5, d_model))
    w_q, w_k, w_v, w_o = random_weights(r, d_model, 2)
    _, w = npa.grouped_query_attention(x, np.tile(w_q[:, :2], 4), w_k, w_v, w_o, num_heads, 1)
    for h in range(1, num_heads):  # same queries, same shared keys -> same maps
        np.testing.assert_allclose(w[h], w[0])


@pytest.mark.parametrize("d_model,num_heads", [(7, 2), (64, 7)])
def test_mha_refuses_indivisible_d_model(d_model, num_heads):
    x = np.zeros((3, d_model))
    w = np.zeros((d_model, d_model))
    with pytest.raises(ValueError, match=rf"d_model={d_model} is not divisible by num_heads={num_heads}; choose one of 1"):
        npa.multi_head_attention(x, w, w, w, w, num_heads)


def test_gqa_refuses_indivisible_groups_and_wrong_shapes():
    x = np.zeros((3, 8))
    w = np.zeros((8, 8))
    with pytest.raises(ValueError, match="num_heads=4 is not divisible by num_kv_heads=3; choose one of 1, 2, 4"):
        npa.grouped_query_attention(x, w, w, w, w, 4, 3)
    with pytest.raises(ValueError, match=r"w_k must have shape \(8, 4\)"):
        npa.grouped_query_attention(x, w, w, w, w, 4, 2)
    with pytest.raises(ValueError, match="x must be"):
        npa.multi_head_attention(np.zeros((1, 2, 3, 8)), w, w, w, w, 2)
    with pytest.raises(ValueError, match="does not broadcast"):
        npa.multi_head_attention(x, w, w, w, w, 2, mask=np.zeros((4, 4)))
