"""Quizzes: the marked answers are right (checked by computing them), and every choice explains itself."""

import numpy as np
import pytest
from torch import nn

from mhalib import np_attention as npa
from mhalib.quiz import QUESTIONS, Choice, Question, grade_answer, questions, quiz
from mhalib.widgets.mha import parameter_count


def test_every_question_has_one_right_answer_and_every_choice_a_reason():
    assert QUESTIONS
    for q in QUESTIONS.values():
        assert sum(c.correct for c in q.choices) == 1
        assert len(q.choices) >= 3
        texts = [c.text for c in q.choices]
        assert len(set(texts)) == len(texts)
        for i, c in enumerate(q.choices):
            fb = grade_answer(q.id, i)
            assert fb.correct == c.correct
            assert fb.message.startswith("Correct." if c.correct else "Not quite.")
            assert c.why in fb.message
        whys = [c.why for c in q.choices]
        assert len(set(whys)) == len(whys), f"{q.id}: two choices share one explanation"


def test_notebook_02_covers_the_spec_questions():
    ids = [q.id for q in questions("02")]
    assert {"02.d_head", "02.why_heads", "02.shape_before_wo"} <= set(ids)


def test_d_head_answer_is_d_model_over_h():
    q = QUESTIONS["02.d_head"]
    x = np.zeros((5, 12))
    assert npa.split_heads(x, 3).shape[-1] == int(q.choices[q.answer].text) == 12 // 3


def test_shape_before_w_o_is_n_by_d_model():
    q = QUESTIONS["02.shape_before_wo"]
    n, d_model, h = 5, 12, 3
    heads = npa.split_heads(np.zeros((n, d_model)), h)  # (H, N, d_head)
    merged = npa.merge_heads(heads)
    assert q.choices[q.answer].text == "(N, d_model)"
    assert merged.shape == (n, d_model)
    assert heads.shape == (h, n, d_model // h)  # the tempting wrong choice really is the unmerged stack


def test_parameter_answer_matches_the_count():
    q = QUESTIONS["02.params"]
    counted = {h: sum(p.numel() for p in nn.MultiheadAttention(64, h, bias=False).parameters()) for h in (1, 8)}
    assert counted[1] == counted[8] == parameter_count(64, 8)["total"] == parameter_count(64, 1)["total"]
    assert f"{counted[8]:,}" in q.choices[q.answer].text


def test_wrong_split_answer_really_is_the_only_correct_split():
    q = QUESTIONS["02.wrong_split"]
    rng = np.random.default_rng(0)
    b, n, h, d_head = 2, 5, 4, 3
    x = rng.normal(size=(b, n, h * d_head))
    reference = np.stack([np.stack([x[:, :, i * d_head:(i + 1) * d_head][j] for i in range(h)]) for j in range(b)])
    candidates = {
        "Q.reshape(B, N, H, d_head).transpose(0, 2, 1, 3)": x.reshape(b, n, h, d_head).transpose(0, 2, 1, 3),
        "Q.reshape(B, H, N, d_head)": x.reshape(b, h, n, d_head),
        "Q.transpose(0, 2, 1).reshape(B, H, N, d_head)": x.transpose(0, 2, 1).reshape(b, h, n, d_head),
    }
    for c in q.choices:
        assert np.allclose(candidates[c.text], reference) == c.correct, c.text


def test_answers_by_letter_text_or_index_agree():
    q = QUESTIONS["02.d_head"]
    assert grade_answer("02.d_head", "c") == grade_answer(q, 2) == grade_answer(q, "4")
    assert grade_answer(q, "C").correct and q.answer == 2
    assert grade_answer(q, "B").correct is False


@pytest.mark.parametrize("answer", [7, -1, "Z", "", None, True, 1.0])
def test_answers_naming_no_choice_are_refused_with_the_allowed_forms(answer):
    with pytest.raises(ValueError, match="is not one of the choices"):
        grade_answer("02.d_head", answer)


def test_unknown_question_is_refused():
    with pytest.raises(ValueError, match="unknown question"):
        grade_answer("99.nothing", 0)
    with pytest.raises(ValueError, match="no question matches"):
        quiz("99")


def test_a_question_needs_exactly_one_correct_choice_and_reasons():
    with pytest.raises(ValueError, match="exactly one correct"):
        Question("x", "?", (Choice("a", True, "because"), Choice("b", True, "because")))
    with pytest.raises(ValueError, match="needs a 'why'"):
        Question("x", "?", (Choice("a", True, "because"), Choice("b", False, "")))


def _find(widget, cls):
    found = [widget] if isinstance(widget, cls) else []
    for child in getattr(widget, "children", ()):
        found += _find(child, cls)
    return found


def test_quiz_widget_buttons_give_feedback():
    import ipywidgets as w

    box = quiz("02.d_head", "02.shape_before_wo")
    assert "mhalib-quiz" in box._dom_classes
    first = box.children[0]
    buttons = _find(first, w.Button)
    (feedback,) = [h for h in _find(first, w.HTML) if "mhalib-quiz-feedback" in h._dom_classes]
    assert [b.description for b in buttons] == ["A", "B", "C", "D"]
    buttons[1].click()
    assert "Not quite" in feedback.value and buttons[1].button_style == "warning"
    buttons[2].click()  # "4"
    assert "Correct" in feedback.value and buttons[2].button_style == "success"
    assert buttons[1].button_style == ""
    assert len(quiz("02").children) == len(questions("02"))


def test_notebook_03_has_its_four_questions():
    assert [q.id for q in questions("03")] == ["03.batch_first", "03.bool_mask", "03.mask_3d", "03.in_proj"]
    assert len(quiz("03").children) == 4  # the notebook's quiz("03") shows all four


def test_batch_first_answer_runs_and_mixes_the_sentences():
    import torch
    from torch import nn

    q = QUESTIONS["03.batch_first"]
    assert q.choices[q.answer].text.startswith("It runs, reads x as 8 positions of 20 sentences")
    torch.manual_seed(0)
    layer = nn.MultiheadAttention(64, 8, bias=False)  # batch_first=False, the default
    x = torch.randn(8, 20, 64)  # 8 sentences of 20 tokens, batch first
    with torch.no_grad():
        out, weights = layer(x, x, x)
        assert out.shape == (8, 20, 64) and weights.shape == (20, 8, 8)  # no error, "right" shape
        x2 = x.clone()
        x2[1] = torch.randn(20, 64)  # change sentence 1 only
        moved = (layer(x2, x2, x2)[0][0] - out[0]).abs().max().item()
    assert moved > 1e-3  # sentence 0's output depends on sentence 1: the sentences are mixed


def test_bool_mask_answer_is_the_only_causal_call():
    import torch
    import torch.nn.functional as F
    from torch import nn

    q = QUESTIONS["03.bool_mask"]
    torch.manual_seed(0)
    n, d_model = 6, 8
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
    layer = nn.MultiheadAttention(d_model, 1, bias=False, batch_first=True)
    x = torch.randn(1, n, d_model)
    with torch.no_grad():
        _, w_mha = layer(x, x, x, attn_mask=mask)
        qh, kh, vh = torch.randn(3, 1, 1, n, 4).unbind(0)
        sdpa_ok = torch.allclose(F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask),
                                 F.scaled_dot_product_attention(qh, kh, vh, is_causal=True))
    mha_ok = bool((w_mha[0].triu(diagonal=1) == 0).all())
    works = {"F.scaled_dot_product_attention(q, k, v, attn_mask=mask)": sdpa_ok,
             "nn.MultiheadAttention(..., attn_mask=mask)": mha_ok}
    assert works == {c.text: c.correct for c in q.choices if c.text in works}
    assert not q.choices[2].correct and not q.choices[3].correct  # "both" and "neither" are wrong


def test_mask_3d_answer_is_the_only_accepted_shape():
    import torch
    from torch import nn

    q = QUESTIONS["03.mask_3d"]
    layer = nn.MultiheadAttention(64, 8, bias=False, batch_first=True)
    x = torch.randn(4, 10, 64)  # B 4, N 10, H 8
    accepted = {}
    for c in q.choices:
        shape = tuple(int(s) for s in c.text.split(")")[0].strip("(").split(","))
        try:
            with torch.no_grad():
                layer(x, x, x, attn_mask=torch.zeros(shape, dtype=torch.bool))
            accepted[c.text] = True
        except (RuntimeError, AssertionError):
            accepted[c.text] = False
    assert accepted == {c.text: c.correct for c in q.choices}


def test_in_proj_answer_matches_the_stored_layout():
    import torch
    from torch import nn

    q = QUESTIONS["03.in_proj"]
    assert "(192, 64)" in q.choices[q.answer].text and "W_Q, then W_K, then W_V" in q.choices[q.answer].text
    torch.manual_seed(0)
    layer = nn.MultiheadAttention(64, 8, bias=False, batch_first=True)
    assert tuple(layer.in_proj_weight.shape) == (192, 64)
    x = torch.randn(1, 5, 64)
    w_q = layer.in_proj_weight[:64]  # the first 64 rows are W_Q, applied as x @ W_Q.T
    with torch.no_grad():
        # rebuild the output from the rows-stacked reading: it matches the module
        qkv = x @ layer.in_proj_weight.T  # (1, 5, 192)
        qs, ks, vs = (t.view(1, 5, 8, 8).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs)
        out = out.transpose(1, 2).reshape(1, 5, 64) @ layer.out_proj.weight.T
        torch.testing.assert_close(out, layer(x, x, x, need_weights=False)[0], atol=1e-5, rtol=0)
        assert torch.equal(qkv[..., :64], x @ w_q.T)
