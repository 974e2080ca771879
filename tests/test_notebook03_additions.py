"""Notebook 03's sections on attention dropout and cross-attention: the PyTorch facts they
teach, pinned down by tests, and the quiz cell that must not print the answers.

If a PyTorch upgrade moves where dropout acts, how the train/eval switch works, or how
kdim/vdim projections are stored, these tests fail before the notebook's prose goes stale.
"""

import math
import re
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "03_mha_in_pytorch.ipynb"
B, N, D_MODEL, H, P = 2, 6, 16, 4, 0.1


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@pytest.fixture
def x():
    torch.manual_seed(0)
    return torch.randn(B, N, D_MODEL)  # (B, N, d_model)


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
    torch.testing.assert_close(w_train[kept], w_eval[kept] / (1 - P), atol=1e-6, rtol=1e-5)
    # the returned (dropped) weights are the ones that multiplied V
    d_head = D_MODEL // H
    w_v = drop_mha.in_proj_weight.chunk(3)[2]  # (d_model, d_model)
    v = (x @ w_v.T).view(B, N, H, d_head).transpose(1, 2)  # (B, H, N, d_head)
    by_hand = (w_train @ v).transpose(1, 2).reshape(B, N, D_MODEL) @ drop_mha.out_proj.weight.T
    torch.testing.assert_close(by_hand, out_train, atol=1e-5, rtol=0)


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
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
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
