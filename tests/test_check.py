"""The learners' self-check: specific feedback, True/False, never an exception."""

from __future__ import annotations

import numpy as np
import pytest

import mhalib.np_attention as ref
from mhalib.check import check, graded_names
from mhalib.grade.exercises import _numpy_variants as wrong


def _sdpa_ok(q, k, v, mask=None):
    scores = np.einsum("...qd,...kd->...qk", q, k) / np.sqrt(q.shape[-1])
    if mask is not None:
        mask = np.asarray(mask)
        if np.broadcast_shapes(mask.shape, scores.shape) != scores.shape:
            raise ValueError(f"mask {mask.shape} does not fit the scores {scores.shape}")
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
    top = scores.max(-1, keepdims=True)
    w = np.exp(scores - np.where(np.isinf(top), 0.0, top))
    total = w.sum(-1, keepdims=True)
    w = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    return w @ v, w


def _mask_ok(n):
    if n < 1:
        raise ValueError(f"causal_mask needs n >= 1, got n={n}")
    return np.where(np.tril(np.ones((n, n), bool)), 0.0, -np.inf).astype(np.float32)


def test_correct_functions_pass(capsys):
    assert check("causal_mask", _mask_ok) is True
    assert check("scaled_dot_product_attention", _sdpa_ok) is True

    def split_heads(x, num_heads):
        if x.shape[-1] % num_heads:
            raise ValueError(f"d_model={x.shape[-1]} is not divisible by num_heads={num_heads}")
        return wrong.split(x, num_heads)

    assert check("split_heads", split_heads) is True
    out = capsys.readouterr().out
    # causal_mask is two checks: the mask, and the ValueError for n < 1
    assert out.count("\u2714") == 4 and "\u2718" not in out and "visible tests pass" in out


class _PositionsError(ValueError):
    pass


def _mask_no_refusal(n):
    return np.where(np.tril(np.ones((n, n), bool)), 0.0, -np.inf)


def _mask_asserts(n):
    if n < 1:
        raise AssertionError("n must be positive")  # what `assert n >= 1, ...` raises
    return _mask_no_refusal(n)


def _mask_subclass(n):
    if n < 1:
        raise _PositionsError(f"n={n}; need n >= 1")
    return _mask_no_refusal(n)


def test_causal_mask_must_refuse_n_below_one(capsys):
    """The exercise asks for ValueError when n < 1: check() tests it as a check of its own."""
    assert check("causal_mask", _mask_no_refusal) is False
    out = capsys.readouterr().out
    assert "\u2714 causal_mask: all 4 visible tests pass" in out  # the mask itself is right
    assert "\u2718 causal_mask (n < 1)" in out
    assert "(causal_mask(0)): returned an array of shape (0, 0)" in out and "it should raise ValueError" in out

    assert check("causal_mask", _mask_asserts) is False
    out = capsys.readouterr().out
    assert "raised AssertionError: n must be positive; it should raise ValueError" in out

    assert check("causal_mask", _mask_subclass) is True  # a subclass of ValueError is a ValueError
    assert "\u2718" not in capsys.readouterr().out


@pytest.mark.parametrize("fn, name, expected", [
    (lambda n: np.triu(np.full((n, n), -np.inf), 0), "causal_mask", "-inf on the diagonal"),
    (lambda n: np.tril(np.full((n, n), -np.inf), -1), "causal_mask", "below the diagonal"),
    (lambda n: np.triu(np.ones((n, n), bool), 1), "causal_mask", "booleans"),
    (lambda n: np.triu(np.full((n, n), -1e9), 1), "causal_mask", "not a large finite number"),
    (lambda q, k, v, mask=None: wrong.sdpa(q, k, v, mask, scale="none"), "scaled_dot_product_attention",
     "not divided by sqrt(d_k)"),
    (lambda q, k, v, mask=None: wrong.sdpa(q, k, v, mask, axis=-2), "scaled_dot_product_attention",
     "softmax over the wrong axis"),
    (lambda q, k, v, mask=None: wrong.sdpa(q, k, v, mask, use_mask=False), "scaled_dot_product_attention",
     "mask is not applied"),
    (lambda q, k, v, mask=None: wrong.sdpa(q, k, v, mask)[::-1], "scaled_dot_product_attention",
     "in this order"),
    (lambda q, k, v, mask=None: (wrong.sdpa(q, k, v, mask)[0], np.exp(q @ np.swapaxes(k, -1, -2))),
     "scaled_dot_product_attention", "rows do not sum to 1"),
    (lambda x, num_heads: wrong.split(x, num_heads, "reshape_only"), "split_heads",
     "heads come out in the wrong order"),
    (lambda x, num_heads: wrong.split(x, num_heads, "no_transpose"), "split_heads",
     "move the head axis in front of N"),
    (lambda x: wrong.merge(x, "reshape_only"), "merge_heads", "positions and heads are mixed"),
    (lambda x, w_q, w_k, w_v, w_o, num_heads, mask=None:
     wrong.gqa(x, w_q, w_k, w_v, w_o, num_heads, num_heads, mask, scale="model"),
     "multi_head_attention", "sqrt(d_model)"),
    (lambda x, w_q, w_k, w_v, w_o, num_heads, mask=None:
     wrong.gqa(x, w_q, w_k, w_v, w_o, num_heads, num_heads, mask, use_wo=False),
     "multi_head_attention", "w_o is not applied"),
    (lambda x, w_q, w_k, w_v, w_o, num_heads, mask=None:
     wrong.gqa(x, w_q, w_k, w_v, w_o, num_heads, num_heads, mask, split_how="reshape_only"),
     "multi_head_attention", "check reshape before transpose"),
    (lambda x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads, mask=None:
     wrong.gqa(x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads, mask, repeat="tile"),
     "grouped_query_attention", "not np.tile"),
])
def test_common_mistakes_are_named(capsys, fn, name, expected):
    assert check(name, fn) is False
    out = capsys.readouterr().out
    assert expected in out, out


def _mha(**mistake):
    def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):
        return wrong.gqa(x, w_q, w_k, w_v, w_o, num_heads, num_heads, mask, **mistake)
    return multi_head_attention


@pytest.mark.parametrize("mistake, expected", [
    ({"axis": -2}, "softmax over the wrong axis: the weights are normalised over the queries (axis -2)"),
    ({"axis": -3}, "softmax over the wrong axis: the weights are normalised over the heads (axis -3)"),
    # the sum (N, d_head) @ w_o (d_model, d_model) raises; the message names the sum, not NumPy's error only
    ({"combine": "sum"}, "the heads were summed instead of concatenated: their sum is (..., N, d_head)"),
    ({"combine": "mean"}, "the heads were averaged instead of concatenated"),
    ({"combine": "sum", "use_wo": False}, "the heads were summed instead of concatenated: out is (..., N, d_head)"),
    ({"combine": "none"}, "the heads were never merged"),
    ({"split_how": "reshape_only"}, "heads come out in the wrong order"),
    ({"merge_how": "reshape_only"}, "heads are merged in the wrong order"),
])
def test_multi_head_attention_mistakes_are_named(capsys, mistake, expected):
    assert check("multi_head_attention", _mha(**mistake)) is False
    out = capsys.readouterr().out
    assert expected in out, out
    if "axis" not in mistake:  # a split or merge mistake is not blamed on the softmax, nor the reverse
        assert "wrong axis" not in out, out
    else:
        assert "split" not in out and "merge" not in out, out


def test_a_shape_error_that_is_not_a_sum_is_not_called_one(capsys):
    """K left unsplit also fails in a product, with the same sizes; it must not be blamed on a sum."""
    def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):
        q = wrong.split(x @ w_q, num_heads)  # (..., H, N, d_head)
        k = x @ w_k  # (..., N, d_model): not split
        return q @ np.swapaxes(k, -1, -2), None

    assert check("multi_head_attention", multi_head_attention) is False
    out = capsys.readouterr().out
    assert "raised ValueError" in out and "summed" not in out and "never merged" not in out, out


def test_grouped_query_attention_summed_heads_are_named(capsys):
    def grouped_query_attention(x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads, mask=None):
        return wrong.gqa(x, w_q, w_k, w_v, w_o, num_heads, num_kv_heads, mask, combine="sum")

    assert check("grouped_query_attention", grouped_query_attention) is False
    assert "the heads were summed instead of concatenated" in capsys.readouterr().out


def test_stub_exception_wrong_signature_and_library_call_never_raise(capsys):
    def causal_mask(n):
        raise NotImplementedError("causal_mask is not written yet")

    assert check("causal_mask", causal_mask) is False
    assert "not written yet" in capsys.readouterr().out

    def boom(q, k, v, mask=None):
        raise ZeroDivisionError("oops")

    assert check("scaled_dot_product_attention", boom) is False
    assert "raised ZeroDivisionError: oops" in capsys.readouterr().out

    def sdpa_no_mask(q, k, v):
        return _sdpa_ok(q, k, v)

    assert check("scaled_dot_product_attention", sdpa_no_mask) is False
    assert "wrong signature" in capsys.readouterr().out

    assert check("scaled_dot_product_attention", ref.scaled_dot_product_attention) is False
    assert "does not allow" in capsys.readouterr().out

    def exits(n):
        raise SystemExit(3)

    assert check("causal_mask", exits) is False
    assert "SystemExit" in capsys.readouterr().out

    assert check("causal_mask", lambda n: object()) is False
    assert "type object" in capsys.readouterr().out

    def mutates(x, num_heads):
        x[...] = 0
        return wrong.split(x, num_heads)

    assert check("split_heads", mutates) is False
    assert "changed its input x in place" in capsys.readouterr().out


def test_unknown_or_undefined_names(capsys):
    assert check("no_such_function", print) is False
    out = capsys.readouterr().out
    assert "no graded function called 'no_such_function'" in out and "causal_mask" in out
    assert check("merge_heads") is False  # not defined in this module's globals
    assert "not defined yet" in capsys.readouterr().out


def test_names_cover_the_exercise_interface():
    names = graded_names()
    for name in ("causal_mask", "scaled_dot_product_attention", "split_heads", "merge_heads",
                 "multi_head_attention", "MultiHeadAttention", "to_torch_mha", "previous_token_score",
                 "induction_score", "ablate_head", "kv_cache_bytes", "decode_step",
                 "grouped_query_attention", "multi_query_attention", "mean_pool_kv"):
        assert name in names


@pytest.fixture(scope="module")
def answers():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("answers_mod", Path(__file__).with_name("test_grader_exercises.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def load(key):
        ns = {}
        exec(mod.ANSWERS[key], ns)  # noqa: S102 - test code written in this repository
        return ns
    return load


def test_torch_module_checks(answers, capsys):
    ns = answers("03_mha_in_pytorch")
    assert check("MultiHeadAttention", ns["MultiHeadAttention"]) is True
    assert check("to_torch_mha", ns["to_torch_mha"]) is True
    capsys.readouterr()

    exec("class Lazy(MultiHeadAttention):\n"  # noqa: S102
         "    def forward(self, x, causal=False, use_sdpa=False):\n"
         "        return to_torch_mha(self)(x, x, x, need_weights=False)[0]\n", ns)
    assert check("MultiHeadAttention", ns["Lazy"]) is False
    assert "calls torch.nn.MultiheadAttention" in capsys.readouterr().out

    exec("class NoScale(MultiHeadAttention):\n"  # noqa: S102
         "    def forward(self, x, causal=False, use_sdpa=False):\n"
         "        b, n, d = x.shape\n"
         "        split = lambda t: t.reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)\n"
         "        q, k, v = split(self.W_Q(x)), split(self.W_K(x)), split(self.W_V(x))\n"
         "        s = q @ k.transpose(-1, -2) / math.sqrt(d)\n"
         "        return self.W_O((s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d))\n", ns)
    assert check("MultiHeadAttention", ns["NoScale"]) is False
    assert "sqrt(d_model)" in capsys.readouterr().out

    exec("def to_torch_mha_t(module):\n"  # noqa: S102
         "    mha = to_torch_mha(module)\n"
         "    with torch.no_grad():\n"
         "        mha.in_proj_weight.copy_(torch.cat([module.W_Q.weight.T, module.W_K.weight.T, module.W_V.weight.T]))\n"
         "    return mha\n", ns)
    assert check("to_torch_mha", ns["to_torch_mha_t"]) is False
    assert "transposed" in capsys.readouterr().out


def test_other_exercises_name_their_mistakes(answers, capsys):
    ns = answers("04_what_heads_learn")
    assert check("previous_token_score", ns["previous_token_score"]) is True
    assert check("induction_score", ns["induction_score"]) is True
    assert check("ablate_head", ns["ablate_head"]) is True
    capsys.readouterr()

    def next_token(weights):
        w = np.asarray(weights, float).reshape((-1,) + np.shape(weights)[-3:])
        return np.diagonal(w, offset=1, axis1=-2, axis2=-1).mean(axis=(0, 2))

    assert check("previous_token_score", next_token) is False
    assert "next token" in capsys.readouterr().out

    def ablate_in_place(z, head):
        z[..., head, :, :] = 0
        return z

    assert check("ablate_head", ablate_in_place) is False
    assert "changed its input z in place" in capsys.readouterr().out

    ns = answers("06_kv_cache")
    assert check("kv_cache_bytes", ns["kv_cache_bytes"]) is True
    assert check("decode_step", ns["decode_step"]) is True
    capsys.readouterr()
    assert check("kv_cache_bytes", lambda *a, **k: ns["kv_cache_bytes"](*a, **k) * 8) is False
    assert "that is bits" in capsys.readouterr().out
    assert check("kv_cache_bytes", lambda *a, **k: float(ns["kv_cache_bytes"](*a, **k))) is False
    assert "not a float" in capsys.readouterr().out

    def no_append(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads):
        out, _, _ = ns["decode_step"](x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads)
        return out, k_cache, v_cache

    assert check("decode_step", no_append) is False
    assert "append the new token" in capsys.readouterr().out

    ns = answers("08_mha_to_gqa")
    assert check("mean_pool_kv", ns["mean_pool_kv"]) is True
    capsys.readouterr()

    def strided(weight, num_heads, num_kv_heads):
        rows, d = weight.shape
        dh = rows // num_heads
        return weight.view(num_heads // num_kv_heads, num_kv_heads, dh, d).mean(dim=0).reshape(-1, d)

    assert check("mean_pool_kv", strided) is False
    assert "consecutive heads" in capsys.readouterr().out


def test_library_call_from_a_thread_is_seen(capsys):
    import threading

    def scaled_dot_product_attention(q, k, v, mask=None):
        box = {}
        worker = threading.Thread(target=lambda: box.setdefault("r", ref.scaled_dot_product_attention(q, k, v, mask)))
        worker.start()
        worker.join()
        return box["r"]

    assert check("scaled_dot_product_attention", scaled_dot_product_attention) is False
    assert "calls mhalib.np_attention.scaled_dot_product_attention" in capsys.readouterr().out


def test_check_and_the_grader_share_one_judging_step(monkeypatch, capsys):
    """check() judges each case with the grader's own judge_outcome (no loop of its own)."""
    import numpy as np

    from mhalib.grade import grader

    seen = []
    real = grader.judge_outcome

    def spy(graded, case, outcome, call_again):
        seen.append((graded.name, outcome.status))
        return real(graded, case, outcome, call_again)

    monkeypatch.setattr(grader, "judge_outcome", spy)

    def causal_mask(n):
        if n < 1:
            raise ValueError(f"n must be at least 1; got n={n}")
        return np.triu(np.full((n, n), -np.inf), k=1)

    assert check("causal_mask", causal_mask), capsys.readouterr().out
    assert seen and {name for name, _ in seen} == {"causal_mask", "causal_mask (n < 1)"}
    assert ("causal_mask", "ok") in seen


def test_an_error_message_is_judged_on_the_values_it_names(capsys):
    """A ValueError passes when its message names the values given, in any words; one without them
    fails, and the feedback never calls the learner's own message NumPy's; NumPy's own message
    (no check at all) is named as such."""
    def own_words(x, num_heads):
        if x.shape[-1] % num_heads:
            raise ValueError(f"{x.shape[-1]} columns do not split into {num_heads} equal heads")
        return wrong.split(x, num_heads)

    def vague(x, num_heads):
        if x.shape[-1] % num_heads:
            raise ValueError("that number of heads is not divisible into the model width")
        return wrong.split(x, num_heads)

    def unchecked(x, num_heads):
        *lead, n, d = x.shape
        return np.swapaxes(x.reshape(*lead, n, num_heads, d // num_heads), -3, -2)

    assert check("split_heads", own_words) is True
    assert "\u2718" not in capsys.readouterr().out
    assert check("split_heads", vague) is False
    out = capsys.readouterr().out
    assert "but the message does not name what was given (" in out and "NumPy" not in out, out
    assert check("split_heads", unchecked) is False
    assert "that is the message NumPy or PyTorch writes for shapes that do not fit" in capsys.readouterr().out
