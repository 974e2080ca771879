"""Exercise 09 end to end: an answer written here independently of mhalib gets full marks,
the stubs get zero, each rule misread (the mutation table) loses points with feedback
that names the mistake, and right answers written another way (``RIGHT``: angles in float32
as Hugging Face computes them, an error message in the learner's own words) keep full marks."""

from __future__ import annotations

import numpy as np
import pytest

from mhalib.grade.grader import grade_notebook
from mhalib.grade.sandbox import Limits
from notebook_files import one_cell_notebook

KEY = "09_beyond_gqa"
LIMITS = Limits(call_timeout_s=60, cell_timeout_s=120)

ANSWER = '''
import numpy as np

def apply_rope(x, positions, base=10000.0):
    x = np.asarray(x)
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"head_dim={d} is odd; RoPE rotates pairs")
    half = d // 2
    freq = np.power(float(base), -np.arange(half) * 2.0 / d)
    ang = np.outer(np.asarray(positions, dtype=float), freq)
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

def gqa_rope_decode_step(x_new, k_cache, v_cache, w_q, w_k, w_v, w_o, num_heads, num_kv_heads):
    if num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads={num_kv_heads} does not divide num_heads={num_heads}")
    b, _, d_model = x_new.shape
    dh = d_model // num_heads
    t = k_cache.shape[2]
    pos = [t]
    q = apply_rope((x_new @ w_q).reshape(b, num_heads, 1, dh), pos)
    k = apply_rope((x_new @ w_k).reshape(b, num_kv_heads, 1, dh), pos)
    v = (x_new @ w_v).reshape(b, num_kv_heads, 1, dh)
    k_cache = np.concatenate([k_cache, k], axis=2)
    v_cache = np.concatenate([v_cache, v], axis=2)
    group = num_heads // num_kv_heads
    out = np.empty((b, num_heads, dh))
    for h in range(num_heads):
        kh, vh = k_cache[:, h // group], v_cache[:, h // group]
        sc = np.einsum("bd,btd->bt", q[:, h, 0], kh) / np.sqrt(dh)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[:, h] = np.einsum("bt,btd->bd", p, vh)
    return out.reshape(b, 1, d_model) @ w_o, k_cache, v_cache

def merge_partials(outputs, log_sum_exps):
    top = np.max(log_sum_exps, axis=0)
    w = np.exp(log_sum_exps - top)
    total = w.sum(axis=0)
    return np.einsum("s...,s...d->...d", w, outputs) / total[..., None], top + np.log(total)
'''

# what the learner misread: (the replacements that misread it, {check that must lose points: words its
# feedback must contain}); every other check keeps full marks
MUTATIONS = {
    "rotating the keys after caching": (
        [("k = apply_rope((x_new @ w_k).reshape(b, num_kv_heads, 1, dh), pos)",
          "k = (x_new @ w_k).reshape(b, num_kv_heads, 1, dh)"),
         ("k_cache = np.concatenate([k_cache, k], axis=2)",
          "k_cache = apply_rope(np.concatenate([k_cache, k], axis=2), [t] * (t + 1))")],
        {"gqa_rope_decode_step": "the keys were rotated after caching"}),
    "positions restarting at 0": (
        [("pos = [t]", "pos = [0]")], {"gqa_rope_decode_step": "positions restarted at 0"}),
    "repeat for repeat_interleave": (
        [("k_cache[:, h // group], v_cache[:, h // group]", "k_cache[:, h % num_kv_heads], v_cache[:, h % num_kv_heads]")],
        {"gqa_rope_decode_step": "must read K/V head h // (H // g)"}),
    "merge without the max": (
        [("top = np.max(log_sum_exps, axis=0)", "top = np.zeros_like(np.max(log_sum_exps, axis=0))")],
        {"merge_partials": "merge without the max"}),
    "centring the log-sum-exps on their mean, not their max": (
        # right wherever every chunk has a key (exp of the differences cannot overflow), NaN where a
        # chunk was fully masked (lse -inf): the mean is -inf, and -inf - -inf is NaN
        [("top = np.max(log_sum_exps, axis=0)", "top = np.mean(log_sum_exps, axis=0)")],
        {"merge_partials": "fully masked"}),
    "interleaved pairs": (
        [("a, b = x[..., :half], x[..., half:]\n    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)",
          "a, b = x[..., 0::2], x[..., 1::2]\n    return np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(x.shape)")],
        # the decode step calls the learner's apply_rope, so it inherits the pairing
        {"apply_rope": "paired neighbours", "gqa_rope_decode_step": "neighbouring pairs"}),
}


# Right answers written another way: (what differs, the replacements); full marks from both judges.
HF_ROPE = '''def apply_rope(x, positions, base=10000.0):
    x = np.asarray(x)
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"head_dim={d} is odd; RoPE rotates pairs")
    # as Hugging Face's Llama computes it: inverse frequencies, angles, cos and sin in float32,
    # then cast to x's dtype; rotate_half pairs x[i] with x[i + d/2]
    inv_freq = (1.0 / (np.float32(base) ** (np.arange(0, d, 2).astype(np.float32) / np.float32(d)))).astype(np.float32)
    freqs = np.outer(np.asarray(positions).astype(np.float32), inv_freq).astype(np.float32)  # (N, d/2)
    emb = np.concatenate([freqs, freqs], axis=-1)  # (N, d)
    cos, sin = np.cos(emb).astype(x.dtype), np.sin(emb).astype(x.dtype)
    rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * cos + rotated * sin
'''
RIGHT = {
    "angles in float32, as Hugging Face computes them": [
        (ANSWER[ANSWER.index("def apply_rope"):ANSWER.index("def gqa_rope_decode_step")], HF_ROPE + "\n")],
    "a ValueError that names H and g in its own words": [
        ('raise ValueError(f"num_kv_heads={num_kv_heads} does not divide num_heads={num_heads}")',
         'raise ValueError(f"cannot split {num_heads} query heads into {num_kv_heads} equal groups")')],
}


def _notebook(path, source):
    return one_cell_notebook(path, KEY, source)


def mutate(source, replacements):
    for old, new in replacements:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


def test_independent_answer_gets_full_marks(tmp_path):
    result = grade_notebook(_notebook(tmp_path / f"{KEY}.ipynb", ANSWER), limits=LIMITS)
    assert result.exercise == KEY
    assert result.score == result.max_score == 10, result.text()


@pytest.mark.parametrize("mistake", sorted(MUTATIONS))
def test_each_misread_rule_loses_points_and_is_named(mistake, tmp_path):
    replacements, named = MUTATIONS[mistake]
    result = grade_notebook(_notebook(tmp_path / f"{KEY}.ipynb", mutate(ANSWER, replacements)), limits=LIMITS, seed=11)
    for c in result.checks:
        if c.name in named:
            assert c.score < c.max_score, c.output
            assert named[c.name] in c.output, c.output
        else:  # the mistake costs only the checks it belongs to
            assert c.score == c.max_score, result.text()


@pytest.mark.parametrize("mistake", sorted(MUTATIONS))
def test_check_rejects_each_misread_rule_as_the_grader_does(mistake, capsys):
    """check(), the notebook's self-check, fails every mutant on the checks the grader takes points from."""
    from mhalib.check import check
    from mhalib.grade import exercises as registry

    replacements, named = MUTATIONS[mistake]
    ns = {}
    exec(compile(mutate(ANSWER, replacements), "<answer>", "exec"), ns)  # noqa: S102  (the test's own answer)
    for graded in registry.get(KEY).graded:
        if graded.name in named:
            assert check(graded.lookup, ns[graded.lookup]) is False, (mistake, graded.name)
            assert f"\u2718 {graded.name}" in capsys.readouterr().out


@pytest.mark.parametrize("what", sorted(RIGHT))
def test_a_right_answer_written_another_way_gets_full_marks(what, tmp_path, capsys):
    """The grader and check() give full marks; no feedback calls the learner's error NumPy's."""
    from mhalib.check import check
    from mhalib.grade import exercises as registry

    source = mutate(ANSWER, RIGHT[what])
    ns = {}
    exec(compile(source, "<answer>", "exec"), ns)  # noqa: S102  (the test's own answer)
    for graded in registry.get(KEY).graded:
        assert check(graded.lookup, ns[graded.lookup]) is True, capsys.readouterr().out
    result = grade_notebook(_notebook(tmp_path / f"{KEY}.ipynb", source), limits=LIMITS, seed=11)
    assert result.score == result.max_score == 10, result.text()
    assert "NumPy" not in result.text()


def test_angles_in_float32_pass_on_every_draw():
    """apply_rope with float32 angles, as Hugging Face computes them, lost 0.4 of 2 points on 47 of
    1,000 draws (a difference of 4.6e-5 at positions near 4,000 against a tolerance of about
    4e-5): the tolerance now allows float32's rounding at the case's largest position
    (ex09.rope_tolerance). Judged in this process, 300 draws."""
    from mhalib.grade import exercises as registry

    ns = {"np": np}
    exec(compile(HF_ROPE, "<answer>", "exec"), ns)  # noqa: S102  (the test's own answer)
    graded = next(g for g in registry.get(KEY).graded if g.name == "apply_rope")
    largest = 0.0
    for seed in range(300):
        for case in graded.cases(np.random.default_rng(seed)):
            if case.raises:
                continue
            got = ns["apply_rope"](*case.args, **case.kwargs)
            assert graded.judge(case, got) is None, (seed, case.label, graded.judge(case, got))
            largest = max(largest, float(np.abs(got - case.expected).max()))
    assert largest > 1e-5  # the float32 angles do differ, by more than the old absolute tolerance
