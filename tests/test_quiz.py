"""Quizzes: the marked answers are right (checked by computing them), and every choice explains itself."""

import math
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
from torch import nn

from mhalib import np_attention as npa
from mhalib.quiz import QUESTIONS, Choice, Question, grade_answer, questions, quiz
from mhalib.widgets.mha import parameter_count
from tolerance import float_tol


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
        torch.testing.assert_close(out, layer(x, x, x, need_weights=False)[0], **float_tol(torch.float32, 3 * 64 + 8 + 2 * 5))
        assert torch.equal(qkv[..., :64], x @ w_q.T)


# Every notebook has a quiz: notebooks 01, 04, 05 and 08 included.

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {p.name[:2]: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
NEW = ("01", "04", "05", "08", "09", "10")


def test_the_course_has_ten_notebooks_and_every_question_names_one():
    assert sorted(NOTEBOOKS) == ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10"]
    assert {qid.split(".")[0] for qid in QUESTIONS} == set(NOTEBOOKS)


@pytest.mark.parametrize("nb", ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10"])
def test_every_notebook_has_a_quiz_of_at_least_three_checked_questions(nb):
    qs = questions(nb)
    assert len(qs) >= 3
    assert len(quiz(nb).children) == len(qs)  # quiz("01") etc. builds, one box per question
    for q in qs:
        assert 3 <= len(q.choices) <= 4, q.id
        wrong = [c for c in q.choices if not c.correct]
        assert len(wrong) == len(q.choices) - 1
        whys = [c.why.strip() for c in wrong]
        assert all(whys) and len(set(whys)) == len(whys), f"{q.id}: wrong choices need distinct explanations"
        assert grade_answer(q.id, q.answer).correct
        assert all(not grade_answer(q.id, i).correct for i, c in enumerate(q.choices) if not c.correct)


def _notebook_text(nb, *, outputs_only=False):
    book = nbformat.read(NOTEBOOKS[nb], as_version=4)
    parts = []
    for cell in book.cells:
        if not outputs_only:
            parts.append(cell.source)
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            text = out.get("data", {}).get("text/plain", "")
            parts.append("".join(text))
    return "\n".join(parts)


def _section_numbers(nb):
    book = nbformat.read(NOTEBOOKS[nb], as_version=4)
    return {int(m) for c in book.cells if c.cell_type == "markdown"
            for m in re.findall(r"^## (\d+)\.", c.source, flags=re.M)}


@pytest.mark.parametrize("nb", NEW)
def test_new_questions_name_sections_their_notebook_has(nb):
    sections = _section_numbers(nb)
    for q in questions(nb):
        head = re.match(r"Sections? ([\d ,and()a-z]+?):", q.prompt)
        assert head, f"{q.id}: the prompt must start with the section it is about"
        named = {int(n) for n in re.findall(r"\d+", head.group(1))}
        assert named and named <= sections, f"{q.id}: sections {named} not among {sorted(sections)}"


# The measured numbers the new questions quote: (as the question writes it, as the notebook
# prints it in a stored output). Only numbers that no processor changes: results of training
# (notebook 04 trains its model; notebook 08 uptrains) are quoted as the bounds the notebook
# asserts, listed in ASSERTED.
PRINTED = {
    "01.sqrt_dk": [("0.815", "0.815")],
    "01.causal_row": [("0.33", "0.33"), ("0.67", "0.67")],
    "01.score_memory": [("4 MiB at n = 1,024", "n =  1024: score matrix (1024, 1024), float32, 4.00 MiB"),
                        ("0.062 GiB", "0.062 GiB")],
    "04.two_layers": [("after 1,000 steps", "1000/1000")],
    "04.ablation": [("0.82", "0.82")],
    "04.redundant": [("4.16", "4.16")],
    "05.baselines": [],
    "05.plural": [],
    "05.patching": [],
    "08.methods": [("3.86", "3.86"), ("2.74", "2.74")],
    "08.first_order": [("2.47", "2.47"), ("3.86", "3.86")],
    "08.why_uptrain": [("2.74", "2.74"), ("0.013", "0.013"), ("0.998", "0.998"), ("0.82", "0.82"),
                       ("0.98", "0.98"), ("0.837", "0.837"), ("0.37", "+0.37"), ("0.79", "+0.79")],
    "09.rope_cache": [("positions restarting at 0", "positions restarting at 0 : differs from the full pass: True"),
                      ("rotating after caching", "rotating after caching    : differs from the full pass: True")],
    "09.window_bytes": [("4 GiB", "32,768       4 GiB"), ("512 MiB", "512 MiB"), ("128 KiB", "128 KiB per token"),
                        ("2 GiB", "+     2 GiB")],
    "09.merge": [("0.25", "merged = 0.25 o1 + 0.75 o2"), ("0.75", "[0.25, 0.75]"),
                 ("merge without the max", "merge without the max: [nan, nan]")],
    "09.absorb": [("576", "MLA (DeepSeek-V3)                      576")],
    "10.latent_bytes": [("5,120", "5,120 (0.156)"), ("0.156", "(0.156)"), ("32,768", "32,768 (1.000)")],
    "10.window_learned": [("0.296", "1-7: 0.296"), ("1.000", "1-7: 1.000"),
                          ("19%", "window 16: the pair in view for 19% of the answers"),
                          ("0.245", "1-7: 0.245")],
    "10.many_tests": [("0.031", "5 of 5 (p 0.031)"), ("66 one-sided comparisons", "66 one-sided comparisons"),
                      ("2.1", "about 2.1 would reach 5 of 5"), ("22 of 25", "22 of 25 seed pairs"),
                      ("4 of 5", "4 of 5 (p 0.188)")],
    "09.crossover": [("25,205", "crossover at batch x context = 25,205 tokens"),
                     ("1.17", "a step 1.17x smaller at batch 1 x 1,024 tokens"),
                     ("805,306,368", "805,306,368 fewer parameters (12.0%)"), ("12.0", "(12.0%)"),
                     ("1.5 GiB", "W_k, W_v 1.5 GiB less, cache 384 MiB less"), ("384 MiB", "cache 384 MiB less"),
                     ("3.59", "a step 3.59x smaller at batch 128 x 4,096 tokens"),
                     ("1.03", "counting only the cache, as if W_k and W_v stayed: 1.03x")],
}
# (as the question writes it, the assertion in the notebook's code that backs it)
ASSERTED = {
    "04.ablation": [("more than 2", "by_head[(0, PREV_HEAD)] > base + 2.0")],
    "04.redundant": [("less than 0.1", "max(by_head[(1, h)] - base for h in INDUCTION_HEADS) < 0.1"),
                     ("more than 2", 'all_induction["loss"] > base + 2.0')],
    "08.methods": [("a loss above 2", 'curves[(2, "random")][STEPS_5] > 2.0')],
}


def test_printed_numbers_table_covers_every_new_question():
    assert set(PRINTED) == {q.id for nb in NEW for q in questions(nb)}


@pytest.mark.parametrize("qid", sorted(PRINTED))
def test_numbers_in_new_questions_are_ones_their_notebook_prints_or_asserts(qid):
    q = QUESTIONS[qid]
    text = " ".join([q.prompt] + [c.text + " " + c.why for c in q.choices])
    printed = _notebook_text(qid[:2], outputs_only=True)
    source = _notebook_text(qid[:2])
    for quoted, shown in PRINTED[qid]:
        assert quoted in text, f"{qid} does not quote {quoted!r}"
        assert shown in printed, f"notebook {qid[:2]} prints no {shown!r}: the question is out of date"
    for quoted, assertion in ASSERTED.get(qid, []):
        assert quoted in text, f"{qid} does not say {quoted!r}"
        assert assertion in source, f"notebook {qid[:2]} no longer asserts {assertion!r}"
    decimals = re.compile(r"(?<![\d.])[-+]?\d+\.\d+")
    known = {d for quoted, _ in PRINTED[qid] + ASSERTED.get(qid, []) for d in decimals.findall(quoted)}
    for decimal in decimals.findall(text):
        assert decimal in known, f"{qid} writes {decimal}, which the notebook neither prints nor asserts"


# Notebook 01: the answers, recomputed.

def test_sqrt_dk_answer_variance_grows_with_d_k_and_the_unscaled_softmax_saturates():
    from mhalib import softmax

    q = QUESTIONS["01.sqrt_dk"]
    assert q.choices[q.answer].text.startswith("The variance of q.k is d_k = 64")
    rng = np.random.default_rng(0)
    d = 64
    dots = (rng.standard_normal((20_000, d)) * rng.standard_normal((20_000, d))).sum(-1)
    assert abs(dots.var() / d - 1) < 0.05  # Var(q.k) = d_k
    assert abs((dots / math.sqrt(d)).var() - 1) < 0.05  # the right choice: back to 1
    assert abs((dots / d).var() * d - 1) < 0.05  # dividing by d_k leaves 1 / d_k: rows flatten
    # the notebook's own measurement (same seed, same order of draws): 0.815 at d_k = 64
    rng = np.random.default_rng(2)
    for dim in [1, 2, 4, 8, 16, 32, 64]:
        qs = rng.standard_normal((500, 1, dim))
        ks = rng.standard_normal((500, 32, dim))
        scores = (qs * ks).sum(axis=-1)  # (500, 32)
        unscaled = softmax(scores)
    assert f"{unscaled.max(axis=-1).mean():.3f}" == "0.815"
    # the wrong reasons: rows sum to 1 at any scale, and the max-subtracted softmax never overflows
    np.testing.assert_allclose(unscaled.sum(-1), 1.0)
    np.testing.assert_allclose(softmax(scores / 8).sum(-1), 1.0)
    assert np.isfinite(softmax(np.array([1e4, 0.0, -1e4]))).all()


def test_causal_row_answer_on_the_worked_example():
    from mhalib.np_attention import causal_mask, scaled_dot_product_attention

    q = QUESTIONS["01.causal_row"]
    assert q.choices[q.answer].text.endswith("[0.33, 0.67, 0].")
    x = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]], dtype=float)
    q1 = x[:, :2]  # head 1 keeps dims 0 and 1: Q = K = V
    _, a1 = scaled_dot_product_attention(q1, q1, q1, mask=causal_mask(3))
    assert a1.shape == (3, 3)  # still square
    assert a1[1, 2] == 0.0  # exactly 0, not tiny
    np.testing.assert_allclose(a1[1, :2], [0.33, 0.67], atol=5e-3)
    np.testing.assert_allclose(a1.sum(-1), 1.0)
    # the tempting wrong recipe: zero after the softmax, and the rows no longer sum to 1
    _, unmasked = scaled_dot_product_attention(q1, q1, q1)
    zeroed_after = unmasked * np.tri(3)
    assert zeroed_after[1].sum() < 0.99


def test_score_memory_answer_and_the_miscounts_behind_the_wrong_ones():
    q = QUESTIONS["01.score_memory"]
    mib = 2**20
    n0, n, d_k = 1024, 4096, 64
    assert np.zeros((n0, n0), dtype=np.float32).nbytes == 4 * mib
    assert np.zeros((n, n), dtype=np.float32).nbytes == 64 * mib
    miscount = {
        "16 MiB": 4 * mib * n // n0,  # linear in n
        "64 MiB": 4 * n * n,  # right: n x n x 4 bytes
        "32 MiB": 2 * n * n,  # float16
        "4 GiB": 4 * n * n * d_k,  # times d_k
    }
    assert {c.text for c in q.choices} == set(miscount)
    for c in q.choices:
        value, unit = c.text.split()
        assert miscount[c.text] == int(value) * {"MiB": mib, "GiB": 2**30}[unit]
        assert (miscount[c.text] == 4 * n * n) == c.correct


# Notebook 04: the claims, on the shipped notebook-04 model.

@pytest.fixture(scope="module")
def shipped():
    from mhalib.copytask import evaluate, load_pretrained, make_generator, variable_offset_task

    model, meta = load_pretrained()
    task = variable_offset_task()
    probe, _ = task.sample(256, make_generator(7))
    from mhalib.interpret import head_scores

    scores = head_scores(model, probe)
    return {"model": model, "meta": meta, "task": task, "probe": probe, "scores": scores,
            "base": evaluate(model, task)}


def _layer_keys(model, tokens):
    """Every layer's keys (B, H, N, d_head), computed from the residual stream by hand."""
    import torch

    keys = []
    with torch.no_grad():
        x = model.embed(tokens)
        pos = model.pos.weight[: tokens.shape[1]]
        for layer in model.blocks:
            a = layer.attn
            b, n, d = x.shape
            keys.append(a.k_proj(x + pos).view(b, n, a.num_kv_heads, a.head_dim).transpose(1, 2))
            x = x + layer(x, pos)
    return keys


def test_two_layers_answer_layer_0_keys_cannot_see_the_previous_token(shipped):
    import torch

    q = QUESTIONS["04.two_layers"]
    assert "previous-token head in an earlier layer" in q.choices[q.answer].text
    model, probe, scores = shipped["model"], shipped["probe"], shipped["scores"]
    tokens = probe[:8].clone()
    j = 10
    changed = tokens.clone()
    changed[:, j - 1] = (changed[:, j - 1] + 1) % 64  # change only the token before position j
    k0, k1 = _layer_keys(model, tokens)
    c0, c1 = _layer_keys(model, changed)
    assert torch.equal(k0[:, :, j], c0[:, :, j])  # a layer-0 key knows its own token and position only
    assert (k1[:, :, j] - c1[:, :, j]).abs().max() > 1e-3  # a layer-1 key reads the previous token
    assert scores["induction"][0].max() < 0.2 and scores["induction"][1].max() >= 0.8


def _ablated(shipped, layer, heads):
    from mhalib.interpret import ablation_hook
    from mhalib.copytask.training import evaluate

    return evaluate(shipped["model"], shipped["task"], z_hook=ablation_hook(layer, heads))


def test_ablation_answer_ablating_the_previous_token_head_breaks_the_model(shipped):
    import torch
    from mhalib.interpret import ablation_hook

    q = QUESTIONS["04.ablation"]
    assert q.choices[q.answer].text.startswith("Whether the model needs the head")
    prev = int(shipped["scores"]["previous"][0].argmax())
    assert prev == 1 and shipped["scores"]["previous"][0, prev] >= 0.5  # "layer 0 head 1" in the prompt
    base = shipped["base"]["loss"]
    assert _ablated(shipped, 0, prev)["loss"] > base + 2.0
    # an ablation leaves the head's attention weights as they were: it zeroes the output after them
    model, tokens = shipped["model"], shipped["probe"][:16]
    with torch.no_grad():
        _, w = model(tokens, return_weights=True)
        _, w_ablated = model(tokens, return_weights=True, z_hook=ablation_hook(0, prev))
    assert torch.equal(w[:, 0], w_ablated[:, 0])


def test_redundant_answer_induction_heads_matter_only_together(shipped):
    import torch
    from mhalib.interpret import ablation_hook

    q = QUESTIONS["04.redundant"]
    assert q.choices[q.answer].text.startswith("They do the same job redundantly")
    induction = [h for h in range(4) if shipped["scores"]["induction"][1, h] >= 0.5]
    assert induction == [1, 2, 3]
    base = shipped["base"]["loss"]
    rises = [_ablated(shipped, 1, h)["loss"] - base for h in induction]
    together = _ablated(shipped, 1, induction)["loss"] - base
    assert max(rises) < 0.1 and together > 2.0
    assert sum(rises) < 0.05 * together  # the single rises do not add up to the joint one
    model, tokens = shipped["model"], shipped["probe"][:16]
    with torch.no_grad():
        _, w = model(tokens, return_weights=True)
        _, w_ablated = model(tokens, return_weights=True, z_hook=ablation_hook(1, induction))
    assert torch.equal(w[:, 0], w_ablated[:, 0])  # layer 0, the previous-token head included, is untouched


# Notebook 08: conversions of the shipped model.

def _swap_heads(model, layer, a, b):
    import copy

    import torch

    out = copy.deepcopy(model)
    attn = out.blocks[layer].attn
    d = attn.head_dim
    order = list(range(attn.num_heads))
    order[a], order[b] = order[b], order[a]
    rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in order])
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            proj.weight.copy_(proj.weight[rows])
        attn.o_proj.weight.copy_(attn.o_proj.weight[:, rows])
    return out


def test_methods_answer_mean_first_random_before_and_after_five_percent(shipped):
    from mhalib.convert import convert_kv
    from mhalib.copytask.training import evaluate, train

    q = QUESTIONS["08.methods"]
    assert q.choices[q.answer].text.startswith("mean < first < random")
    model, task = shipped["model"], shipped["task"]
    steps = shipped["meta"]["steps"] * 5 // 100
    assert steps == 75
    start, after = {}, {}
    for method in ("mean", "first", "random"):
        converted = convert_kv(model, 2, method, seed=0)
        start[method] = evaluate(converted, task)["loss"]
        train(converted, task, steps, seed=1, progress=False)
        after[method] = evaluate(converted, task)["loss"]
    assert start["mean"] < start["first"] < start["random"]
    assert after["mean"] < after["first"] < after["random"]
    assert after["random"] > 2.0  # still on the plateau at 5%


def test_first_order_answer_first_depends_on_head_order_mean_does_not(shipped):
    import torch
    from mhalib.convert import convert_kv
    from mhalib.copytask.training import evaluate

    q = QUESTIONS["08.first_order"]
    assert q.choices[q.answer].text.startswith("'first' keeps whichever head sits first")
    model, task, probe = shipped["model"], shipped["task"], shipped["probe"]
    swapped = _swap_heads(model, 0, 0, 1)
    with torch.no_grad():
        torch.testing.assert_close(swapped(probe), model(probe), atol=1e-4, rtol=0)  # same function
    as_trained = evaluate(convert_kv(model, 2, "first"), task)["loss"]
    lucky = evaluate(convert_kv(swapped, 2, "first"), task)["loss"]
    assert lucky < as_trained - 0.5
    # 'first' draws nothing, and mean pooling ignores the order within a group
    for name in ("k_proj", "v_proj"):
        a = getattr(convert_kv(model, 2, "first", seed=0).blocks[0].attn, name).weight
        b = getattr(convert_kv(model, 2, "first", seed=1).blocks[0].attn, name).weight
        assert torch.equal(a, b)
        m0 = getattr(convert_kv(model, 2, "mean").blocks[0].attn, name).weight
        m1 = getattr(convert_kv(swapped, 2, "mean").blocks[0].attn, name).weight
        torch.testing.assert_close(m0, m1)


def test_why_uptrain_answer_pooling_the_previous_token_pair_costs_most_and_every_method_breaks(shipped):
    import copy

    import torch
    from mhalib.convert import convert_kv
    from mhalib.copytask.training import evaluate

    q = QUESTIONS["08.why_uptrain"]
    assert q.choices[q.answer].text.startswith("With 4 heads each has its own job")
    model, task = shipped["model"], shipped["task"]
    h, d_head, d_model = model.config.num_heads, model.config.head_dim, model.config.d_model
    base = shipped["base"]["loss"]
    prev = int(shipped["scores"]["previous"][0].argmax())

    def pooled(layer, a, b):  # only heads a and b of one layer share their mean K and V
        m = copy.deepcopy(model)
        with torch.no_grad():
            for name in ("k_proj", "v_proj"):
                w = getattr(m.blocks[layer].attn, name).weight.view(h, d_head, d_model)
                w[a] = w[b] = (w[a] + w[b]) / 2
        return evaluate(m, task)["loss"]

    losses = {(layer, a): pooled(layer, a, a + 1) for layer in range(2) for a in (0, 2)}  # the GQA-2 groups
    worst = (0, prev - prev % 2)
    assert losses[worst] > base + 0.5 and max(losses, key=losses.get) == worst
    assert losses[(0, 2)] < base + 0.01
    for method in ("mean", "first", "random"):
        assert evaluate(convert_kv(model, 2, method), task)["loss"] > base + 1.0
    assert 64 // 8 > h // 2  # the paper's groups are larger than ours, not smaller


def test_why_uptrain_wrong_choice_k_cosine_is_blind_to_a_change_of_basis(shipped):
    import copy

    import torch

    q = QUESTIONS["08.why_uptrain"]
    assert any(c.text.startswith("The K weights of the heads") and not c.correct for c in q.choices)
    model, probe = shipped["model"], shipped["probe"]
    h, d_head, d_model = model.config.num_heads, model.config.head_dim, model.config.d_model
    a = torch.linalg.qr(torch.randn(d_head, d_head, generator=torch.Generator().manual_seed(3)))[0]
    rotated = copy.deepcopy(model)
    with torch.no_grad():
        for name in ("q_proj", "k_proj"):
            w = getattr(rotated.blocks[0].attn, name).weight.view(h, d_head, d_model)
            w[1] = a.T @ w[1]  # W_q -> W_q A, W_k -> W_k A, A orthogonal
        _, before = model(probe, return_weights=True)
        _, after = rotated(probe, return_weights=True)
    torch.testing.assert_close(after, before, **float_tol(torch.float32, 2 * d_model + 2 * d_head))  # the same attention
    k0 = model.blocks[0].attn.k_proj.weight.view(h, d_head, d_model)[1].flatten()
    k1 = rotated.blocks[0].attn.k_proj.weight.view(h, d_head, d_model)[1].flatten()
    assert abs(float(k0 @ k1 / (k0.norm() * k1.norm()))) < 0.5  # far from the 1 of the same head


def test_cpu_floor_quotes_no_measured_speedup_and_the_notebook_prints_both_estimates():
    # the speedups are measured on the reader's machine, so the question quotes none of them
    q = QUESTIONS["07.cpu_floor"]
    text = " ".join([q.prompt] + [c.text + " " + c.why for c in q.choices])
    assert not re.search(r"\d+\.\d+|\d+ to \d+ times", text), "07.cpu_floor quotes a measured number"
    source = _notebook_text("07")
    assert "4 * 32 * 8192 * 128 / (2 * 1 * 8192 * 128 * 4) == 16" in source  # the 16 FLOP/byte it quotes
    assert "roofline ceiling" in source and "reads then arithmetic" in source
    assert "measured above its ceiling" in source  # a disturbed run is named, not printed silently


def test_the_question_file_is_checked_as_it_is_read(tmp_path):
    import json

    from mhalib import quiz as Q

    one = {"id": "99.x", "prompt": "?", "choices": [{"text": "a", "correct": True, "why": "because"},
                                                    {"text": "b", "correct": False, "why": "not so"}]}
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({"questions": [one, one]}))
    two_right = tmp_path / "two_right.json"
    two_right.write_text(json.dumps({"questions": [dict(one, choices=[dict(c, correct=True) for c in one["choices"]])]}))
    saved = dict(Q.QUESTIONS)
    try:
        Q.QUESTIONS.clear()
        with pytest.raises(ValueError, match="appears twice"):
            Q._load(twice)
        Q.QUESTIONS.clear()
        with pytest.raises(ValueError, match="exactly one correct choice"):
            Q._load(two_right)
    finally:
        Q.QUESTIONS.clear()
        Q.QUESTIONS.update(saved)
