"""Every rule an exercise states is graded: one mutation table for exercises 01-08.

Each row takes a correct answer (``ANSWERS`` of test_grader_exercises.py, written there
independently of mhalib), breaks one rule the exercise states the way a learner would, and
asks both judges: the grader (on inputs it draws, in its sandbox) must take points off that
check, and ``check()`` (the visible tests, in this process) must reject it. Both must name
the mistake. The unbroken answers get full marks from both, and so do the right answers
written another way (``RIGHT``). Every mutant fails on every draw, not by chance: the rules
are tested by cases drawn on every seed (``test_every_mutant_loses_points_on_every_draw``).
"""

from __future__ import annotations

import numpy as np
import pytest

from mhalib.check import check
from mhalib.grade import exercises as registry
from mhalib.grade.grader import grade_notebook
from mhalib.grade.sandbox import Limits
import test_grader_ex09 as ex09
from notebook_files import one_cell_notebook
from test_grader_exercises import ANSWERS

LIMITS = Limits(call_timeout_s=60, cell_timeout_s=120)

# A scaled_dot_product_attention that keeps every rule of exercise 01, one line per rule, so
# that each mutant below changes one line.
SDPA = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        mask = np.asarray(mask)
        if np.broadcast_shapes(mask.shape, scores.shape) != scores.shape:
            raise ValueError(f"mask of shape {mask.shape} does not fit the scores of shape {scores.shape}")
        if mask.dtype == bool:
            mask = np.where(mask, 0.0, -np.inf)
        scores = scores + mask
    top = scores.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(scores - top)
    total = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return weights @ v, weights
'''


def sdpa(*edits):
    source = SDPA
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    return source


MASK = '''
def causal_mask(n):
    {refuse}
    return np.where(np.triu(np.ones((n, n), dtype=bool), k={k}), {blocked}, 0.0){astype}
'''
REFUSE = 'if n < 1:\n        raise ValueError(f"n={n}: a mask needs at least one position")'


def mask(refuse=REFUSE, k=1, blocked="-np.inf", astype=""):
    return MASK.format(refuse=refuse, k=k, blocked=blocked, astype=astype)


SPLIT = '''
def split_heads(x, num_heads):
    *lead, n, d = x.shape
    {refuse}
    return {body}
'''
GQA = ANSWERS["07_mqa_gqa"].split("def multi_query_attention")[0]
DECODE = ANSWERS["06_kv_cache"].split("def decode_step")[1]
LOSS = ANSWERS["05_heads_in_language"].split("def _loss")[1].split("def ablation_effect")[0]
MHA03 = ANSWERS["03_mha_in_pytorch"].split("def to_torch_mha")[0]
TO_MHA = "def to_torch_mha" + ANSWERS["03_mha_in_pytorch"].split("def to_torch_mha")[1]


def edit(source, old, new, prefix=""):
    assert old in source, old
    return prefix + source.replace(old, new)


CACHE10 = """
def cache_bytes(num_layers, num_tokens, num_kv_heads=1, head_dim=1, kv_lora_rank=None, rope_head_dim=0, window=None,
                bytes_per_element=2):
    held = num_tokens if window is None else min(num_tokens, window)
    if kv_lora_rank is not None:
        per = kv_lora_rank + rope_head_dim
    else:
        per = 2 * num_kv_heads * head_dim
    return num_layers * held * per * bytes_per_element
"""
RECALL10 = """
def recall_accuracy(logits, tokens, mask):
    logits, tokens, mask = np.asarray(logits), np.asarray(tokens), np.asarray(mask)
    right = logits[:, :-1].argmax(-1) == tokens[:, 1:]
    return float(right[mask[:, 1:]].mean())
"""
FRONT10 = """
def pareto_front(costs, qualities):
    c, q = np.asarray(costs, dtype=float), np.asarray(qualities, dtype=float)
    return np.array([not ((c <= c[i]) & (q >= q[i]) & ((c < c[i]) | (q > q[i]))).any() for i in range(len(c))])
"""


# (exercise, graded check, the rule as the exercise states it, the mutant's source (appended to
# the correct answer, so it replaces one function), words the feedback of both judges contains,
# or (the grader's words, check()'s words) where check() reports an earlier visible test)
MUTANTS = [
    # ------------------------------------------------------------------ 01
    ("01", "causal_mask", "0 on and below the diagonal, -inf above it", mask(k=0), "diagonal"),
    ("01", "causal_mask", "-inf below the diagonal instead (transposed)",
     mask().replace("np.triu(", "np.tril(").replace("k=1", "k=-1"), "below the diagonal"),
    ("01", "causal_mask", "a float (additive) mask, not booleans", mask(blocked="True").replace(", 0.0)", ", False)"),
     "booleans"),
    ("01", "causal_mask", "exactly -inf, not a large finite number", mask(blocked="-1e9"),
     "not a large finite number"),
    ("01", "causal_mask (n < 1)", "ValueError for n < 1 that says what was given", mask(refuse="pass"),
     "it should raise ValueError"),
    ("01", "causal_mask (n < 1)", "ValueError, not an assertion", mask(refuse="assert n >= 1, 'n must be positive'"),
     "raised AssertionError"),
    ("01", "scaled_dot_product_attention", "scores divided by sqrt(d_k)",
     sdpa((" / np.sqrt(q.shape[-1])", "")), "not divided by sqrt(d_k)"),
    ("01", "scaled_dot_product_attention", "softmax over the keys (axis=-1)",
     sdpa(("axis=-1", "axis=-2")), "wrong axis"),
    ("01", "scaled_dot_product_attention", "leading dimensions: transpose the last two axes of k, never k.T",
     sdpa(("np.swapaxes(k, -1, -2)", "k.T")), "`k.T`"),
    ("01", "scaled_dot_product_attention", "a float mask is added to the scores",
     sdpa(("scores = scores + mask", "scores = scores")), "mask is not applied"),
    ("01", "scaled_dot_product_attention", "a boolean mask: True = keep (read the other way round)",
     sdpa(("np.where(mask, 0.0, -np.inf)", "np.where(mask, -np.inf, 0.0)")), "wrong way round"),
    ("01", "scaled_dot_product_attention", "a boolean mask is turned into an additive one",
     sdpa(("        if mask.dtype == bool:\n            mask = np.where(mask, 0.0, -np.inf)\n", "")),
     "added as numbers"),
    ("01", "scaled_dot_product_attention", "a fully masked row's weights are 0, not NaN",
     sdpa(("top = np.where(np.isfinite(top), top, 0.0)", "pass"),
          ("np.divide(e, total, out=np.zeros_like(e), where=total > 0)", "e / total")), "came back as NaN"),
    ("01", "scaled_dot_product_attention", "a stable softmax: subtract each row's maximum",
     sdpa(("np.exp(scores - top)", "np.exp(scores)")), "overflows"),
    ("01", "scaled_dot_product_attention", "a mask that does not fit the scores: ValueError",
     sdpa(("scores.shape:\n            raise", "scores.shape and False:\n            raise")),
     "it should raise ValueError"),
    # ------------------------------------------------------------------ 02
    ("02", "split_heads", "reshape to (..., N, H, d_head), then swap N and H",
     SPLIT.format(refuse="", body="x.reshape(*lead, num_heads, n, d // num_heads)"), "wrong order"),
    ("02", "split_heads", "ValueError saying what was given when num_heads does not divide d_model",
     SPLIT.format(refuse="", body="np.swapaxes(x.reshape(*lead, n, num_heads, d // num_heads), -3, -2)"),
     "shapes that do not fit"),
    ("02", "merge_heads", "swap H and N back before reshaping",
     "\ndef merge_heads(x):\n    *lead, h, n, d = x.shape\n    return x.reshape(*lead, n, h * d)\n", "mixed"),
    ("02", "multi_head_attention", "scores scaled by sqrt(d_head), not sqrt(d_model)",
     edit(ANSWERS["02_multi_head_attention"].split("def _attend")[1].split("def multi_head")[0],
          "np.sqrt(q.shape[-1])", "np.sqrt(q.shape[-1] * q.shape[-3])", "\ndef _attend"), "sqrt(d_model)"),
    ("02", "multi_head_attention", "the mask is added to every head's scores",
     edit(ANSWERS["02_multi_head_attention"].split("def _attend")[1].split("def multi_head")[0],
          "s = s + mask", "s = s", "\ndef _attend"), "mask is not applied"),
    ("02", "multi_head_attention", "softmax over the keys",
     edit(ANSWERS["02_multi_head_attention"].split("def _attend")[1].split("def multi_head")[0],
          "w = np.exp(s - s.max(-1, keepdims=True))\n    w /= w.sum(-1, keepdims=True)",
          "w = np.exp(s - s.max(-2, keepdims=True))\n    w /= w.sum(-2, keepdims=True)", "\ndef _attend"),
     "wrong axis"),
    ("02", "multi_head_attention", "the mask broadcasts as it is: x without a batch axis gets none",
     edit(ANSWERS["02_multi_head_attention"].split("def _attend")[1].split("def multi_head")[0],
          "s = s + mask", "s = s + np.asarray(mask)[None, None]", "\ndef _attend"), "the mask gained axes"),
    ("02", "multi_head_attention", "merge the heads, then multiply by w_o",
     edit(ANSWERS["02_multi_head_attention"].split("def _attend")[0].join(["", ""]) + "def multi_head" +
          ANSWERS["02_multi_head_attention"].split("def multi_head")[1], "merge_heads(z) @ w_o", "merge_heads(z)", "\n"),
     "w_o is not applied"),
    # ------------------------------------------------------------------ 03
    ("03", "MultiHeadAttention", "scores scaled by sqrt(d_head)",
     edit(MHA03, "math.sqrt(self.head_dim)", "math.sqrt(d)", "\n"), "sqrt(d_model)"),
    ("03", "MultiHeadAttention", "__init__ raises ValueError naming d_model and num_heads when H does not divide it",
     edit(MHA03, "if d_model % num_heads:", "if False:", "\n"), "it should raise ValueError"),
    ("03", "MultiHeadAttention (use_sdpa=True)", "use_sdpa=True calls F.scaled_dot_product_attention",
     edit(MHA03, "if use_sdpa:", "if False:", "\n"),
     "never called torch.nn.functional.scaled_dot_product_attention"),
    ("03", "to_torch_mha", "copy the weights as they are, no transpose",
     edit(TO_MHA, "torch.cat([module.W_Q.weight, module.W_K.weight, module.W_V.weight])",
          "torch.cat([module.W_Q.weight.T, module.W_K.weight.T, module.W_V.weight.T])", "\n"), "transpose"),
    # ------------------------------------------------------------------ 04
    ("04", "previous_token_score", "the previous token: column i - 1 of row i",
     "\ndef previous_token_score(weights):\n    w = np.asarray(weights, dtype=float).reshape((-1,) + np.shape(weights)[-3:])\n"
     "    return np.diagonal(w, offset=1, axis1=-2, axis2=-1).mean(axis=(0, 2))\n", "next token"),
    ("04", "previous_token_score", "the mean over the N - 1 positions that have a previous token",
     "\ndef previous_token_score(weights):\n    w = np.asarray(weights, dtype=float).reshape((-1,) + np.shape(weights)[-3:])\n"
     "    return np.diagonal(w, offset=-1, axis1=-2, axis2=-1).sum(axis=-1).mean(axis=0) / w.shape[-1]\n", "N - 1"),
    ("04", "induction_score", "the weight on j + 1, the token after the earlier occurrence",
     edit("def induction_score" + ANSWERS["04_what_heads_learn"].split("def induction_score")[1].split("def ablate_head")[0],
          "w[b, :, i, j + 1]", "w[b, :, i, j]", "\n"), "j + 1"),
    ("04", "ablate_head", "a copy: z itself unchanged",
     "\ndef ablate_head(z, head):\n    z[..., head, :, :] = 0\n    return z\n", "in place"),
    # ------------------------------------------------------------------ 05
    ("05", "relation_score", "the query that predicts the word: row target - 1",
     "\ndef relation_score(weights, pairs):\n    b, t, k = np.asarray(pairs).T\n    return np.asarray(weights, float)[b, :, t, k].mean(0)\n",
     "target - 1"),
    ("05", "probe_accuracy_from_logits", "the right form strictly higher (>), not >=",
     edit("def probe_accuracy_from_logits" + ANSWERS["05_heads_in_language"].split("def probe_accuracy_from_logits")[1].split("def _loss")[0],
          "logits[i, p - 1, c] > logits[i, p - 1, x]", "logits[i, p - 1, c] >= logits[i, p - 1, x]", "\n"), "strictly higher"),
    ("05", "probe_accuracy_from_logits", "the logits at position - 1 predict the word",
     edit("def probe_accuracy_from_logits" + ANSWERS["05_heads_in_language"].split("def probe_accuracy_from_logits")[1].split("def _loss")[0],
          "logits[i, p - 1, c] > logits[i, p - 1, x]", "logits[i, p, c] > logits[i, p, x]", "\n"), "position - 1"),
    ("05", "ablation_effect", "a stable softmax: subtract each row's maximum (logits near 1000)",
     edit("def _loss" + LOSS, "m = row[i].max()", "m = 0.0", "\n"), "not finite"),
    ("05", "ablation_effect", "position i predicts token i + 1",
     edit("def _loss" + LOSS, "for i in range(len(seq) - 1):", "for i in range(len(seq)):", "\n").replace(
         "row[i, seq[i + 1]]", "row[i, seq[i]]"), "tokens[:, 1:]"),
    # ------------------------------------------------------------------ 06
    ("06", "kv_cache_bytes", "keys and values: the factor 2",
     "\ndef kv_cache_bytes(num_layers, num_kv_heads, head_dim, num_tokens, batch_size=1, bytes_per_element=2):\n"
     "    return num_layers * num_kv_heads * head_dim * num_tokens * batch_size * bytes_per_element\n", "multiply by 2"),
    ("06", "kv_cache_bytes", "bytes_per_element as given, not always fp16's 2",
     "\ndef kv_cache_bytes(num_layers, num_kv_heads, head_dim, num_tokens, batch_size=1, bytes_per_element=2):\n"
     "    return 2 * num_layers * num_kv_heads * head_dim * num_tokens * batch_size * 2\n", "not always 2"),
    ("06", "kv_cache_bytes", "an int (a number of bytes)",
     "\ndef kv_cache_bytes(num_layers, num_kv_heads, head_dim, num_tokens, batch_size=1, bytes_per_element=2):\n"
     "    return 2.0 * num_layers * num_kv_heads * head_dim * num_tokens * batch_size * bytes_per_element\n", "return an int"),
    ("06", "decode_step", "the new key and value appended at the end",
     edit("\ndef decode_step" + DECODE, "[k_cache, heads(x_new @ w_k)]", "[heads(x_new @ w_k), k_cache]"), "not the front"),
    ("06", "decode_step", "the newest token attends to itself",
     edit("\ndef decode_step" + DECODE, "s = q @ k_cache.transpose(0, 1, 3, 2)",
          "s = q @ k_cache[:, :, :-1].transpose(0, 1, 3, 2)").replace("p @ v_cache", "p @ v_cache[:, :, :-1]"),
     ("attend to itself", "raised ValueError")),  # check() stops at T = 0, where this mutant raises
    # ------------------------------------------------------------------ 07
    ("07", "grouped_query_attention", "query head h reads K/V head h // (H / g): np.repeat, not np.tile",
     edit(GQA, 'q = (x @ w_q).reshape(*lead, n, num_kv_heads, num_heads // num_kv_heads, dh)',
          'q = np.swapaxes((x @ w_q).reshape(*lead, n, num_heads // num_kv_heads, num_kv_heads, dh), -2, -3)', "\n").replace(
         "z = np.einsum(\"...grqk,...kgd->...qgrd\", wg, v).reshape(*lead, n, d)",
         "z = np.swapaxes(np.einsum(\"...grqk,...kgd->...qgrd\", wg, v), -2, -3).reshape(*lead, n, d)").replace(
         "s = s.reshape(*lead, num_heads, n, n)", "s = np.swapaxes(s, -3, -4).reshape(*lead, num_heads, n, n)").replace(
         "wg = w.reshape(*lead, num_kv_heads, num_heads // num_kv_heads, n, n)",
         "wg = np.swapaxes(w.reshape(*lead, num_heads // num_kv_heads, num_kv_heads, n, n), -3, -4)"), "np.repeat"),
    ("07", "grouped_query_attention", "ValueError that says g does not divide H",
     edit(GQA, "if num_heads % num_kv_heads:", "if False:", "\n"), "shapes that do not fit"),
    ("07", "grouped_query_attention", "ValueError whose message names H and g",
     edit(GQA, 'raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")',
          'raise ValueError("the number of K/V heads must divide the number of query heads")', "\n"),
     "does not name what was given (6, 4)"),
    ("07", "grouped_query_attention", "the mask broadcasts as it is: x without a batch axis gets none",
     edit(GQA, "s = s + mask", "s = s + mask[None, None]", "\n"), "the mask gained axes"),
    ("07", "multi_query_attention", "the mask is applied",
     "\ndef multi_query_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):\n"
     "    return grouped_query_attention(x, w_q, w_k, w_v, w_o, num_heads, 1)\n", "mask is not applied"),
    # ------------------------------------------------------------------ 08
    ("08", "mean_pool_kv", "groups of consecutive heads",
     "\ndef mean_pool_kv(weight, num_heads, num_kv_heads):\n    rows, d_model = weight.shape\n    hd = rows // num_heads\n"
     "    return weight.reshape(num_heads // num_kv_heads, num_kv_heads, hd, d_model).mean(0).reshape(-1, d_model)\n",
     "consecutive"),
    ("08", "mean_pool_kv", "each group replaced by its mean, not its sum",
     "\ndef mean_pool_kv(weight, num_heads, num_kv_heads):\n    rows, d_model = weight.shape\n    hd = rows // num_heads\n"
     "    return weight.reshape(num_kv_heads, num_heads // num_kv_heads, hd, d_model).sum(1).reshape(-1, d_model)\n",
     "mean"),
    # ------------------------------------------------------------------ 10
    ("10", "cache_bytes", "latent attention caches one latent and one rotated key: no factor 2",
     CACHE10.replace("per = kv_lora_rank + rope_head_dim", "per = 2 * (kv_lora_rank + rope_head_dim)"), "no factor 2"),
    ("10", "cache_bytes", "a window holds min(num_tokens, window) positions",
     CACHE10.replace("held = num_tokens if window is None else min(num_tokens, window)", "held = num_tokens"),
     "min(num_tokens, window)"),
    ("10", "cache_bytes", "bytes_per_element as given, not always fp16's 2",
     CACHE10.replace("* bytes_per_element", "* 2"), "not always 2"),
    ("10", "cache_bytes", "the rotated key counted with the latent",
     CACHE10.replace("per = kv_lora_rank + rope_head_dim", "per = kv_lora_rank"), "count the rotated key"),
    ("10", "recall_accuracy", "the logits at position i predict token i + 1",
     RECALL10.replace("logits[:, :-1].argmax(-1) == tokens[:, 1:]", "logits[:, 1:].argmax(-1) == tokens[:, 1:]"),
     "logits[:, :-1]"),
    ("10", "recall_accuracy", "only the answers are scored",
     RECALL10.replace("right[mask[:, 1:]]", "right"), "only the answers"),
    ("10", "recall_accuracy", "every answer weighs alike (not the mean of the rows)",
     RECALL10.replace("return float(right[mask[:, 1:]].mean())",
                      "return float(np.mean([r[m].mean() for r, m in zip(right, mask[:, 1:]) if m.any()]))"),
     "mean of each row"),
    ("10", "pareto_front", "dominated by a point as cheap and better, or cheaper and as good",
     FRONT10.replace("(c <= c[i]) & (q >= q[i]) & ((c < c[i]) | (q > q[i]))", "(c < c[i]) & (q > q[i])"),
     "one inequality strict"),
    ("10", "pareto_front", "two equal points are both kept",
     FRONT10.replace("(c <= c[i]) & (q >= q[i]) & ((c < c[i]) | (q > q[i]))",
                     "(c <= c[i]) & (q >= q[i]) & (np.arange(len(c)) != i)"),
     "keep both"),
    ("10", "pareto_front", "higher quality is better",
     FRONT10.replace("(q >= q[i])", "(q <= q[i])").replace("(q > q[i])", "(q < q[i])"),
     "higher quality is better"),
]
IDS = [f"{ex}-{name}-{rule}"[:90] for ex, name, rule, _, _ in MUTANTS]

# Right answers written in another way than ANSWERS: (exercise, what differs, the source appended to
# the correct answer); each gets full marks from both judges.
RIGHT = [
    ("10", "the byte count as a NumPy integer (np.minimum), which counts as an int",
     CACHE10.replace("held = num_tokens if window is None else min(num_tokens, window)",
                     "held = num_tokens if window is None else np.minimum(num_tokens, window)")),
    ("07", "a ValueError that names H and g in its own words, without 'divisible' or 'multiple'",
     edit(GQA, 'raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")',
          'raise ValueError(f"cannot split {num_heads} query heads into {num_kv_heads} equal groups")', "\n")),
    ("02", "a ValueError that names num_heads and d_model in its own words",
     SPLIT.format(refuse='if d % num_heads:\n        raise ValueError(f"{d} columns do not split into {num_heads} '
                         'equal heads")', body="np.swapaxes(x.reshape(*lead, n, num_heads, d // num_heads), -3, -2)")),
]


def _key(number):
    return registry.get(number).key


def _namespace(source):
    ns = {"__name__": "learner"}
    exec(compile(source, "<answer>", "exec"), ns)  # noqa: S102 - the answers and mutants of this file
    return ns


def test_every_exercise_has_mutants_for_each_graded_check():
    """Each exercise's table covers every graded check the exercise has."""
    for key, ex in registry.all_exercises().items():
        covered = {name for number, name, *_ in MUTANTS if _key(number) == key}
        if key == ex09.KEY:  # exercise 09 keeps its table beside its independent answer
            covered = {name for _, named in ex09.MUTATIONS.values() for name in named}
        expected = {g.name for g in ex.graded} - {"MultiHeadAttention (causal=True)", "MultiHeadAttention (use_sdpa=True)"}
        assert expected <= covered, (key, expected - covered)


@pytest.mark.parametrize("key", sorted(ANSWERS))
def test_correct_answers_pass_check(key, capsys):
    ns = _namespace(ANSWERS[key] + (SDPA if key.startswith("01") else ""))
    for g in registry.get(key).graded:
        assert check(g.lookup, ns[g.lookup]) is True, capsys.readouterr().out


@pytest.mark.parametrize("number, what, source", RIGHT, ids=[f"{n}-{w}"[:60] for n, w, _ in RIGHT])
def test_a_right_answer_written_another_way_gets_full_marks(number, what, source, tmp_path, capsys):
    """Messages are judged on the values they name (6 and 4), not on particular words."""
    key = _key(number)
    ns = _namespace(ANSWERS[key] + source)
    for g in registry.get(key).graded:
        assert check(g.lookup, ns[g.lookup]) is True, capsys.readouterr().out
    result = grade_notebook(one_cell_notebook(tmp_path / f"{key}.ipynb", key, ANSWERS[key] + source), limits=LIMITS)
    assert result.score == result.max_score, result.text()
    assert "NumPy" not in result.text()


def _in_process(graded, fn, cases):
    """``(passed, failures)`` of ``fn`` on ``cases``, judged in this process as check() judges."""
    from mhalib.grade.check import _outcomes

    outcomes = list(_outcomes(graded, fn, cases))
    return sum(status == "ok" for _, status, _ in outcomes), [m for _, s, m in outcomes if s != "ok"]


SEEDS = range(6)


@pytest.mark.parametrize("number, name, rule, mutant, words", MUTANTS, ids=IDS)
def test_every_mutant_loses_points_on_every_draw(number, name, rule, mutant, words, capsys):
    """The rule a mutant breaks is tested by a case on every draw (an edge case that is always
    drawn), so that no resubmission or second upload can draw the mutant full marks. Judged in
    this process on the grader's own cases for 6 seeds."""
    key = _key(number)
    graded = next(g for g in registry.get(key).graded if g.name == name)
    fn = _namespace(ANSWERS[key] + mutant)[graded.lookup]
    for seed in SEEDS:
        cases = graded.cases(np.random.default_rng(seed))
        passed, failures = _in_process(graded, fn, cases)
        assert passed < len(cases), f"seed {seed}: the mutant gets full marks ({rule})"


def test_a_hard_coded_bytes_per_element_loses_points_on_every_draw():
    """The measured attack: kv_cache_bytes with bytes_per_element fixed at 2 scored full marks
    on 1 draw in 9 (two cases drew 2 of {1, 2, 4}), so six uploads, best kept, reached full
    marks about half the time. Every draw now has bytes_per_element 1 and 4."""
    key = _key("06")
    graded = next(g for g in registry.get(key).graded if g.name == "kv_cache_bytes")
    fixed = _namespace("def kv_cache_bytes(num_layers, num_kv_heads, head_dim, num_tokens, batch_size=1, "
                       "bytes_per_element=2):\n    return 2 * num_layers * num_kv_heads * head_dim * num_tokens "
                       "* batch_size * 2\n")["kv_cache_bytes"]
    for seed in range(200):
        cases = graded.cases(np.random.default_rng(seed))
        passed, failures = _in_process(graded, fixed, cases)
        assert passed == len(cases) - 2, (seed, failures)
        assert "use bytes_per_element (here 1), not always 2" in failures[0], failures


def test_the_rule_abiding_sdpa_gets_full_marks(tmp_path, capsys):
    key = _key("01")
    result = grade_notebook(one_cell_notebook(tmp_path / "ok.ipynb", key, ANSWERS[key] + SDPA), limits=LIMITS)
    assert result.score == result.max_score > 0, result.text()
    assert check("scaled_dot_product_attention", _namespace(ANSWERS[key] + SDPA)["scaled_dot_product_attention"])


@pytest.mark.parametrize("number, name, rule, mutant, words", MUTANTS, ids=IDS)
def test_a_broken_rule_loses_points_in_the_grader_and_fails_check(number, name, rule, mutant, words, tmp_path, capsys):
    key = _key(number)
    source = ANSWERS[key] + mutant
    graded = next(g for g in registry.get(key).graded if g.name == name)

    grader_words, check_words = (words, words) if isinstance(words, str) else words
    ns = _namespace(source)
    assert check(graded.lookup, ns[graded.lookup]) is False, f"check() passes a mutant: {rule}"
    out = capsys.readouterr().out
    line = next((ln for ln in out.splitlines() if ln.startswith(f"\u2718 {name}:")), None)
    assert line is not None, out  # this very check is the one that fails
    assert check_words in line, f"check() does not name the mistake ({check_words!r}): {line}"

    result = grade_notebook(one_cell_notebook(tmp_path / f"{key}.ipynb", key, source), limits=LIMITS)
    by_name = {c.name: c for c in result.checks}
    assert by_name[name].score < by_name[name].max_score, f"the grader gives full marks to a mutant: {rule}"
    assert grader_words in by_name[name].output, by_name[name].output
    if name.endswith("(n < 1)"):  # a function that never raises the required ValueError earns none of it
        assert by_name[name].score == 0, by_name[name].output
