"""The facts about PyTorch that notebook 03 teaches, pinned down by tests (masks, shapes,
attention dropout, cross-attention), and its quiz cell, which must not print the answers.

If a PyTorch upgrade changes one of them (a mask convention, a shape rule, the result
of a fully masked row), these tests fail before the notebook's prose goes stale.
"""

import math
import re
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mhalib
from tolerance import float_tol

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "03_mha_in_pytorch.ipynb"
B, N, D_MODEL, H = 2, 5, 16, 4
P = 0.1  # attention dropout
# float32 against torch's own kernels: two projections over d_model, scores over d_head, the
# softmax and the weighted sum over at most 8 keys (cross-attention's), in another order
F32 = float_tol(torch.float32, 2 * D_MODEL + D_MODEL // H + 2 * 8)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@pytest.fixture
def x():
    torch.manual_seed(0)
    return torch.randn(B, N, D_MODEL)  # (B, N, d_model)


@pytest.fixture
def mha():
    torch.manual_seed(1)
    return nn.MultiheadAttention(D_MODEL, H, bias=False, batch_first=True)


def blocked_above_diagonal(n):
    return torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)  # (n, n), True = future


def explicit_attention(x, mha, allowed):
    """Loop over batch and heads with an explicit softmax; ``allowed`` is (B, H, N, N) bool."""
    w_q, w_k, w_v = mha.in_proj_weight.chunk(3)  # each (d_model, d_model)
    d_head = D_MODEL // H
    out = torch.zeros(B, N, D_MODEL)
    for b in range(B):
        heads = []
        for h in range(H):
            rows = slice(h * d_head, (h + 1) * d_head)
            q, k, v = x[b] @ w_q[rows].T, x[b] @ w_k[rows].T, x[b] @ w_v[rows].T  # (N, d_head)
            scores = (q @ k.T / math.sqrt(d_head)).masked_fill(~allowed[b, h], float("-inf"))
            heads.append(scores.softmax(-1) @ v)  # (N, d_head)
        out[b] = torch.cat(heads, -1) @ mha.out_proj.weight.T  # (N, d_model)
    return out


def test_batch_first_defaults_to_false_and_misuse_runs_with_wrong_values(x):
    torch.manual_seed(1)
    seq_first = nn.MultiheadAttention(D_MODEL, H, bias=False)
    assert seq_first.batch_first is False
    wrong, w_wrong = seq_first(x, x, x)  # (B, N, d) read as (N, B, d)
    xt = x.transpose(0, 1)  # (N, B, d)
    right, w_right = seq_first(xt, xt, xt)
    right = right.transpose(0, 1)  # (B, N, d)
    assert wrong.shape == right.shape == x.shape
    assert w_wrong.shape == (N, B, B) and w_right.shape == (B, N, N)
    assert (wrong - right).abs().max() > 0.1
    # the wrong layout mixes the sentences of the batch
    x2 = x.clone()
    x2[1] += 1.0
    assert (seq_first(x2, x2, x2)[0][0] - wrong[0]).abs().max() > 0.01


def test_boolean_mask_true_means_blocked_in_nn_multihead_attention(x, mha):
    blocked = blocked_above_diagonal(N)
    allowed = (~blocked).expand(B, H, N, N)
    oracle = explicit_attention(x, mha, allowed)
    out_bool, w = mha(x, x, x, attn_mask=blocked)
    out_float, _ = mha(x, x, x, attn_mask=torch.zeros(N, N).masked_fill(blocked, float("-inf")))
    torch.testing.assert_close(out_bool, oracle, **F32)
    torch.testing.assert_close(out_float, oracle, **F32)
    assert torch.all(w[:, blocked] == 0)


def test_boolean_mask_true_means_allowed_in_sdpa():
    torch.manual_seed(2)
    q, k, v = torch.randn(3, B, H, N, 4).unbind(0)  # each (B, H, N, d_head)
    blocked = blocked_above_diagonal(N)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=~blocked), causal)
    assert (F.scaled_dot_product_attention(q, k, v, attn_mask=blocked) - causal).abs().max() > 0.1


def test_causal_mask_from_triu_is_the_one_nn_transformer_builds():
    float_mask = torch.triu(torch.full((N, N), float("-inf")), diagonal=1)
    assert torch.equal(nn.Transformer.generate_square_subsequent_mask(N), float_mask)


def test_a_fully_masked_row_gives_zeros_in_sdpa_and_nan_in_nn_multihead_attention(x, mha):
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 1, 1, N, 4).unbind(0)
    allowed_future = blocked_above_diagonal(N)  # read by SDPA as "allowed": last row allows nothing
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed_future)
    assert torch.all(out[..., -1, :] == 0)
    _, w = mha(x, x, x, attn_mask=~blocked_above_diagonal(N))  # last row: everything blocked
    assert torch.isnan(w[:, -1]).all()


def test_2d_mask_broadcasts_and_3d_mask_must_be_batch_times_heads(x, mha):
    blocked = blocked_above_diagonal(N)
    out_2d, _ = mha(x, x, x, attn_mask=blocked)
    out_3d, _ = mha(x, x, x, attn_mask=blocked.expand(B * H, N, N))
    torch.testing.assert_close(out_2d, out_3d)
    with pytest.raises(RuntimeError, match="3D attn_mask"):
        mha(x, x, x, attn_mask=blocked.expand(B, N, N))


def test_3d_mask_order_is_batch_major_repeat_interleave(x, mha):
    padding = torch.tensor([[False] * N, [False] * (N - 2) + [True] * 2])  # (B, N)
    oracle, _ = mha(x, x, x, key_padding_mask=padding)
    also = explicit_attention(x, mha, (~padding)[:, None, None, :].expand(B, H, N, N))
    torch.testing.assert_close(oracle, also, **F32)
    per_sentence = padding[:, None, :].expand(B, N, N)  # (B, N, N)
    good, _ = mha(x, x, x, attn_mask=per_sentence.repeat_interleave(H, dim=0))
    tiled, _ = mha(x, x, x, attn_mask=per_sentence.repeat(H, 1, 1))
    torch.testing.assert_close(good, oracle, **F32)
    assert (tiled - oracle).abs().max() > 0.01


def test_per_head_weights_average_to_the_default(x, mha):
    _, avg = mha(x, x, x)
    _, per_head = mha(x, x, x, average_attn_weights=False)
    assert avg.shape == (B, N, N) and per_head.shape == (B, H, N, N)
    torch.testing.assert_close(per_head.mean(dim=1), avg)


def test_in_proj_weight_is_q_k_v_stacked_and_splits_as_3_then_heads(x, mha):
    d_head = D_MODEL // H
    qkv = x @ mha.in_proj_weight.T  # (B, N, 3 d_model)
    q, k, v = qkv.view(B, N, 3, H, d_head).permute(2, 0, 3, 1, 4)  # each (B, H, N, d_head)
    out = F.scaled_dot_product_attention(q, k, v)  # (B, H, N, d_head)
    out = out.transpose(1, 2).reshape(B, N, D_MODEL) @ mha.out_proj.weight.T  # (B, N, d_model)
    torch.testing.assert_close(out, mha(x, x, x)[0], **F32)
    q_wrong, k_wrong, v_wrong = qkv.view(B, N, H, 3, d_head).permute(3, 0, 2, 1, 4)
    wrong = F.scaled_dot_product_attention(q_wrong, k_wrong, v_wrong)
    wrong = wrong.transpose(1, 2).reshape(B, N, D_MODEL) @ mha.out_proj.weight.T
    assert (wrong - out).abs().max() > 0.01


def test_3d_mask_in_hand_written_code_is_silently_misread_when_batch_equals_heads():
    torch.manual_seed(3)
    b = h = 2
    q, k, v = torch.randn(3, b, h, N, 4).unbind(0)  # each (B, H, N, d_head)
    padding = torch.tensor([[False] * N, [False] * (N - 2) + [True] * 2])  # (B, N)
    add = torch.zeros(b, N, N).masked_fill(padding[:, None, :], float("-inf"))  # (B, N, N)
    scores = q @ k.transpose(-2, -1) / 2.0  # (B, H, N, N)
    right = (scores + add[:, None]).softmax(-1)  # mask (B, 1, N, N)
    wrong = (scores + add).softmax(-1)  # mask read as (1, B, N, N): no error
    assert right[1][..., -2:].sum() == 0
    assert wrong[1, 0][:, -2:].sum() > 0.01  # sentence 1, head 0 reads its padding
    assert torch.all(wrong[0, 1][:, -2:] == 0)  # sentence 0, head 1 loses two real tokens
    with pytest.raises(RuntimeError):
        torch.randn(3, h, N, N) + torch.zeros(3, N, N)  # B = 3 != H = 2: loud


def test_mhalib_refuses_3d_masks_and_matches_nn_multihead_attention(x):
    torch.manual_seed(4)
    ours = mhalib.MultiHeadAttention(D_MODEL, H)
    ref = nn.MultiheadAttention(D_MODEL, H, bias=False, batch_first=True)
    ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))  # (3 d, d)
    ref.out_proj.weight.copy_(ours.o_proj.weight)  # (d_model, d_model)
    blocked = blocked_above_diagonal(N)
    out, w = ours(x, causal=True, need_weights=True)
    out_ref, w_ref = ref(x, x, x, attn_mask=blocked, average_attn_weights=False)
    torch.testing.assert_close(out, out_ref, **F32)
    torch.testing.assert_close(w, w_ref, **F32)
    torch.testing.assert_close(ours(x, attn_mask=~blocked), out_ref, **F32)
    with pytest.raises(ValueError, match="ambiguous"):
        ours(x, attn_mask=torch.ones(B, N, N, dtype=torch.bool))


# ---- attention dropout and cross-attention (sections 10 and 11)

@pytest.fixture
def drop_mha():
    torch.manual_seed(1)
    return nn.MultiheadAttention(D_MODEL, H, dropout=P, bias=False, batch_first=True)


def test_train_mode_calls_differ_and_eval_mode_calls_are_equal(x, drop_mha):
    assert drop_mha.training
    first, _ = drop_mha(x, x, x)
    second, _ = drop_mha(x, x, x)
    assert (first - second).abs().max() > 0.01
    drop_mha.eval()
    first, _ = drop_mha(x, x, x)
    second, _ = drop_mha(x, x, x)
    assert torch.equal(first, second)


def test_dropout_acts_on_the_weights_before_the_weighted_sum_of_v(x, drop_mha):
    out_train, w_train = drop_mha(x, x, x, average_attn_weights=False)  # (B, N, d), (B, H, N, N)
    drop_mha.eval()
    _, w_eval = drop_mha(x, x, x, average_attn_weights=False)
    kept = w_train > 0
    assert (~kept).any() and kept.any()
    torch.testing.assert_close(w_train[kept], w_eval[kept] / (1 - P), **F32)
    # the returned (dropped) weights are the ones that multiplied V
    d_head = D_MODEL // H
    w_v = drop_mha.in_proj_weight.chunk(3)[2]  # (d_model, d_model)
    v = (x @ w_v.T).view(B, N, H, d_head).transpose(1, 2)  # (B, H, N, d_head)
    by_hand = (w_train @ v).transpose(1, 2).reshape(B, N, D_MODEL) @ drop_mha.out_proj.weight.T
    torch.testing.assert_close(by_hand, out_train, **F32)


def test_mean_over_dropout_draws_is_the_eval_output(x, drop_mha):
    draws = 4000
    many = x.repeat(draws, 1, 1)  # (draws * B, N, d_model)
    outs = drop_mha(many, many, many, need_weights=False)[0].view(draws, B, N, D_MODEL)
    drop_mha.eval()
    expected, _ = drop_mha(x, x, x)
    mean = outs.mean(dim=0)
    std_err = outs.std(dim=0) / math.sqrt(draws)
    assert ((mean - expected).abs() < 6 * std_err).all()
    assert (mean * (1 - P) - expected).abs().max() > 10 * std_err.max()  # the 1/(1-p) matters


def test_sdpa_dropout_has_no_eval_mode():
    torch.manual_seed(2)
    q, k, v = torch.randn(3, B, H, N, 4).unbind(0)  # each (B, H, N, d_head)
    plain = F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(F.scaled_dot_product_attention(q, k, v, dropout_p=0.0), plain)

    class AlwaysDrops(nn.Module):  # forgets `if self.training else 0.0`
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=P)

    module = AlwaysDrops().eval()
    assert (module(q, k, v) - module(q, k, v)).abs().max() > 0.01


def test_transformer_encoder_layer_passes_its_dropout_to_attention():
    layer = nn.TransformerEncoderLayer(D_MODEL, H, dropout=0.2, batch_first=True)
    assert layer.self_attn.dropout == 0.2 == layer.dropout1.p == layer.dropout2.p


@pytest.fixture
def cross():
    torch.manual_seed(3)
    return nn.MultiheadAttention(D_MODEL, H, kdim=12, vdim=10, bias=False, batch_first=True)


def test_kdim_vdim_keep_three_separate_projections(cross):
    shapes = {name: tuple(p.shape) for name, p in cross.named_parameters()}
    assert shapes == {"q_proj_weight": (16, 16), "k_proj_weight": (16, 12),
                      "v_proj_weight": (16, 10), "out_proj.weight": (16, 16)}
    assert cross.in_proj_weight is None


def test_cross_attention_matches_an_explicit_loop_with_key_padding(cross):
    torch.manual_seed(4)
    n_q, n_k = 5, 7
    dec = torch.randn(B, n_q, D_MODEL)  # (B, N_q, d_model)
    key = torch.randn(B, n_k, 12)  # (B, N_k, kdim)
    value = torch.randn(B, n_k, 10)  # (B, N_k, vdim)
    padding = torch.tensor([[False] * n_k, [False] * 5 + [True] * 2])  # (B, N_k)
    out, w = cross(dec, key, value, key_padding_mask=padding, average_attn_weights=False)
    assert out.shape == (B, n_q, D_MODEL) and w.shape == (B, H, n_q, n_k)
    d_head = D_MODEL // H
    expected = torch.zeros(B, n_q, D_MODEL)
    for b in range(B):
        heads = []
        for h in range(H):
            rows = slice(h * d_head, (h + 1) * d_head)
            q = dec[b] @ cross.q_proj_weight[rows].T  # (N_q, d_head)
            k = key[b] @ cross.k_proj_weight[rows].T  # (N_k, d_head)
            v = value[b] @ cross.v_proj_weight[rows].T  # (N_k, d_head)
            scores = (q @ k.T / math.sqrt(d_head)).masked_fill(padding[b], float("-inf"))  # (N_q, N_k)
            heads.append(scores.softmax(-1) @ v)  # (N_q, d_head)
        expected[b] = torch.cat(heads, -1) @ cross.out_proj.weight.T  # (N_q, d_model)
    torch.testing.assert_close(out, expected, **F32)
    assert torch.all(w[1, ..., 5:] == 0)


def test_cross_attention_mask_must_be_nq_by_nk_and_a_triu_one_runs(cross):
    torch.manual_seed(5)
    dec, key, value = torch.randn(B, 5, D_MODEL), torch.randn(B, 7, 12), torch.randn(B, 7, 10)
    with pytest.raises(RuntimeError, match="should be"):
        cross(dec, key, value, attn_mask=torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1))
    _, w = cross(dec, key, value, attn_mask=torch.triu(torch.ones(5, 7, dtype=torch.bool), diagonal=1))
    assert (w[0] > 0).sum(-1).tolist() == [1, 2, 3, 4, 5]


def test_the_stored_notebook_prints_no_quiz_answer():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    quiz = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and 'quiz("03")' in c.source]
    assert len(quiz) == 1
    after = nb.cells[quiz[0] + 1]
    text = "".join(o.get("text", "") for o in after.get("outputs", []))
    assert "4 of 4 answers checked by code" in text
    assert not re.search(r"answer [A-D]\b|\b[A-D]\)", text)
    headings = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown"]
    order = [next(i for i, h in enumerate(headings) if h.startswith(prefix))
             for prefix in ("## 10. Dropout", "## 11. Cross-attention", "## 12. Quiz", "## Summary")]
    assert order == sorted(order)
