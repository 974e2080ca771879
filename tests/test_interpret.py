"""Head scores against explicit loops; ablation against zeroed W_O columns."""

import numpy as np
import pytest
import torch

from mhalib.interpret import (
    ablate_head, ablation_hook, ablation_table, duplicate_token_score, head_scores,
    induction_score, offset_score, previous_token_score,
)
from mhalib.copytask import evaluate, load_pretrained, make_generator, variable_offset_task
from tolerance import float_tol


def random_weights(b, h, n, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.random((b, h, n, n)) * np.tri(n)  # causal
    return w / w.sum(-1, keepdims=True)


def loop_induction(w, t, kind):
    b_, h_, n, _ = w.shape
    out = np.zeros(h_)
    count = 0
    for b in range(b_):
        for i in range(n):
            js = [j for j in range(i) if t[b][j] == t[b][i]]
            if not js:
                continue
            count += 1
            keys = [j + 1 for j in js] if kind == "induction" else js
            for h in range(h_):
                out[h] += sum(w[b, h, i, k] for k in keys)
    return out / count


def test_previous_token_score_matches_loop():
    w = random_weights(3, 4, 9)
    expected = [np.mean([w[b, h, i, i - 1] for b in range(3) for i in range(1, 9)]) for h in range(4)]
    np.testing.assert_allclose(previous_token_score(w), expected)
    np.testing.assert_allclose(previous_token_score(w[0]), previous_token_score(w[:1]))
    np.testing.assert_allclose(offset_score(w, 3),
                               [np.mean([w[b, h, i, i - 3] for b in range(3) for i in range(3, 9)]) for h in range(4)])


def test_previous_token_score_extremes():
    n = 6
    shifted = np.eye(n, k=-1)
    shifted[0, 0] = 1.0
    uniform = np.tri(n) / np.arange(1, n + 1)[:, None]
    w = np.stack([shifted, uniform])  # (2, N, N)
    np.testing.assert_allclose(previous_token_score(w), [1.0, np.mean(1 / np.arange(2, n + 1))])
    np.testing.assert_allclose(np.asarray(previous_token_score(torch.tensor(w))),
                               [1.0, np.mean(1 / np.arange(2, n + 1))])


@pytest.mark.parametrize("kind", ["induction", "duplicate"])
def test_induction_and_duplicate_scores_match_loop(kind):
    rng = np.random.default_rng(1)
    t = rng.integers(0, 5, size=(3, 10))  # small vocabulary: many repeats
    w = random_weights(3, 2, 10, seed=2)
    fn = induction_score if kind == "induction" else duplicate_token_score
    np.testing.assert_allclose(fn(w, t), loop_induction(w, t, kind))
    np.testing.assert_allclose(fn(w[1], t[1]), loop_induction(w[1:2], t[1:2], kind))


def test_perfect_induction_head_scores_one():
    t = np.array([5, 1, 2, 3, 9, 1, 2, 3])
    w = np.tri(8) / np.arange(1, 9)[:, None]  # uniform everywhere...
    for i, target in [(5, 2), (6, 3), (7, 4)]:  # ...except the repeats look at what followed
        w[i] = 0
        w[i, target] = 1
    assert induction_score(w[None], t)[0] == pytest.approx(1.0)
    assert induction_score(w[None], np.arange(8))[0] == 0.0  # nothing repeats


def test_score_input_errors():
    with pytest.raises(ValueError, match="weights"):
        previous_token_score(np.ones((4, 3)))
    with pytest.raises(ValueError, match="tokens"):
        induction_score(np.ones((2, 4, 4)), np.arange(5))
    with pytest.raises(ValueError, match="offset"):
        offset_score(np.ones((2, 4, 4)), 4)


def test_ablate_head_numpy_and_torch():
    z = np.arange(2 * 3 * 4 * 2, dtype=float).reshape(2, 3, 4, 2) + 1
    out = ablate_head(z, 1)
    assert (out[:, 1] == 0).all() and np.array_equal(out[:, [0, 2]], z[:, [0, 2]])
    assert (z != 0).all()  # the input is unchanged
    zt = torch.tensor(z)
    out_t = ablate_head(zt, [0, 2])
    assert (out_t[:, [0, 2]] == 0).all() and torch.equal(out_t[:, 1], zt[:, 1])
    assert bool((zt != 0).all())
    with pytest.raises(ValueError, match="0 .. 2"):
        ablate_head(z, 3)
    with pytest.raises(ValueError):
        ablate_head(np.ones(4), 0)


def test_ablation_hook_equals_zeroed_output_columns():
    model, _ = load_pretrained()
    model = model.double()  # float64: the hook and the zeroed columns agree far below any CPU's rounding
    tokens, _ = variable_offset_task().sample(4, make_generator(0))
    layer, head, d = 1, 2, model.config.head_dim
    hooked = model(tokens, z_hook=ablation_hook(layer, head))
    with torch.no_grad():
        model.blocks[layer].attn.o_proj.weight[:, head * d:(head + 1) * d] = 0
    torch.testing.assert_close(hooked, model(tokens), **float_tol(torch.float64, 2 * 4 * 64))


def test_shipped_model_has_the_circuit():
    model, meta = load_pretrained()
    tokens, _ = variable_offset_task().sample(128, make_generator(7))
    scores = head_scores(model, tokens)
    assert scores["previous"].shape == (2, 4)
    assert scores["previous"][0].max() >= 0.5
    assert scores["induction"][1].max() >= 0.8
    rows = ablation_table(model, lambda ablate: evaluate(model, ablate=ablate, batch_size=256))
    base = rows[0]
    assert base["ablate"] == [] and base["accuracy"] >= 0.9
    assert [r["ablate"] for r in rows[1:]] == [[(layer, head)] for layer in range(2) for head in range(4)]
    prev_head = int(scores["previous"][0].argmax())
    ablated = next(r for r in rows if r["ablate"] == [(0, prev_head)])
    assert ablated["loss"] > base["loss"] + 1.0


def test_head_scores_takes_any_score_in_the_order_asked_and_relations_by_name():
    from mhalib.interpret import attention_weights, bos_score, relation_score

    model, _ = load_pretrained()
    tokens, _ = variable_offset_task().sample(16, make_generator(3))
    w = attention_weights(model, tokens)  # (B, L, H, N, N)
    pairs = np.array([[0, 5, 2], [3, 9, 0], [15, 31, 30]])
    scores = head_scores(model, tokens.numpy(), ("bos", "mine", "previous"), relations={"mine": pairs})
    assert list(scores) == ["bos", "mine", "previous"]
    # float32 weights from two forward passes, averaged over up to 16 x 31 positions
    f32 = float_tol(np.float32, 2 * 64 + 16 + 2 * 32 + 16 * 31)
    np.testing.assert_allclose(scores["bos"], w[:, :, :, 1:, 0].mean(axis=(0, 3)), **f32)
    by_loop = np.mean([w[b, :, :, t - 1, k] for b, t, k in pairs], axis=0)  # (L, H)
    np.testing.assert_allclose(scores["mine"], by_loop, **f32)
    np.testing.assert_allclose(relation_score(w, pairs), by_loop, **f32)
    np.testing.assert_allclose(bos_score(w), scores["bos"], **f32)
    np.testing.assert_allclose(scores["previous"], head_scores(model, tokens)["previous"], **f32)
    with pytest.raises(ValueError, match=r"unknown scores \['agreement'\]; allowed"):
        head_scores(model, tokens, ("agreement",))
    with pytest.raises(ValueError, match="pairs must be"):
        relation_score(w, [[0, 3, 3]])
    with pytest.raises(ValueError, match=r"\(B, L, H, N, N\)"):
        bos_score(w[0])


def test_measurements_run_the_model_in_eval_mode_and_give_its_mode_back():
    from mhalib.decoder import Decoder
    from mhalib.interpret import attention_weights, record_heads
    from mhalib.language import language_config

    torch.manual_seed(0)
    model = Decoder(language_config(dropout=0.5)).train()
    t = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(1))
    first, second = attention_weights(model, t), attention_weights(model, t)
    assert model.training and np.array_equal(first, second), "no dropout while measuring"
    model.eval()
    np.testing.assert_array_equal(first, attention_weights(model, t))
    assert not model.training
    model.train()
    record = record_heads(model, t)
    assert model.training and np.array_equal(record["weights"].numpy(), first)
    assert list(head_scores(model, t, "previous")) == ["previous"]


def test_ablation_table_runs_the_measure_intact_then_per_ablation():
    model, _ = load_pretrained()
    asked = []
    rows = ablation_table(model, lambda ablate: asked.append(ablate) or {"n": len(asked)},
                          heads=[[(0, 1)], [(1, 0), (1, 3)]])
    assert asked == [None, [(0, 1)], [(1, 0), (1, 3)]]
    assert rows == [{"ablate": [], "n": 1}, {"ablate": [(0, 1)], "n": 2}, {"ablate": [(1, 0), (1, 3)], "n": 3}]


def test_mean_and_resample_ablation_put_the_reference_outputs_in_place():
    """Mean ablation: each removed head's output is its per-position mean over the reference; resample: the
    output one drawn reference sequence gave. Checked on the copy-task model against outputs recorded here."""
    from mhalib.interpret import ABLATIONS, ablation_kwargs, record_heads

    model, _ = load_pretrained()
    task = variable_offset_task()
    tokens, _ = task.sample(6, make_generator(1))
    reference, _ = task.sample(40, make_generator(2))
    ref_z = record_heads(model, reference)["z"]  # (40, L, H, N, d_head)
    assert ABLATIONS == ("zero", "mean", "resample")
    assert ablation_kwargs([(1, 2)], "zero", 6, 32) == {"ablate": [(1, 2)]}
    mean = ablation_kwargs([(1, 2), (0, 1)], "mean", 6, 20, ref_z)["replace_z"]
    for (layer, head), value in mean.items():
        by_loop = sum(ref_z[r, layer, head, :20] for r in range(40)) / 40  # (20, d_head)
        assert value.shape == (6, 20, ref_z.shape[-1])
        torch.testing.assert_close(value[3], by_loop, **float_tol(torch.float32, 40))
    draws = ablation_kwargs([(1, 2), (0, 1)], "resample", 6, 32, ref_z, seed=5)["replace_z"]
    again = ablation_kwargs([(1, 2), (0, 1)], "resample", 6, 32, ref_z, seed=5)["replace_z"]
    rows = []
    for i in range(6):  # every item got one whole reference sequence, the same for both heads
        match = [r for r in range(40) if torch.equal(draws[(1, 2)][i], ref_z[r, 1, 2])]
        assert match and torch.equal(draws[(0, 1)][i], ref_z[match[0], 0, 1])
        rows.append(match[0])
        assert torch.equal(again[(1, 2)][i], draws[(1, 2)][i]), "a seed gives the same draw"
    assert len(set(rows)) > 1, "different items draw different sequences"
    # the patched run differs from the intact one only through the patched heads
    patched = record_heads(model, tokens, replace_z=draws)["z"]
    assert torch.equal(patched[:, 1, 2], draws[(1, 2)]) and torch.equal(patched[:, 0, 1], draws[(0, 1)])
    zeroed = evaluate(model, task, batch_size=64, replace_z={(0, 1): torch.zeros(64, 32, ref_z.shape[-1])})
    assert zeroed == evaluate(model, task, batch_size=64, ablate=[(0, 1)]), "a patch of zeros is zero ablation"
    with pytest.raises(ValueError, match="how must be one of"):
        ablation_kwargs([(0, 1)], "noise", 6, 32, ref_z)
    with pytest.raises(ValueError, match="needs reference_z"):
        ablation_kwargs([(0, 1)], "mean", 6, 32)
    with pytest.raises(ValueError, match="positions"):
        ablation_kwargs([(0, 1)], "mean", 6, 33, ref_z)


def test_count_null_is_the_binomial_tail_by_enumeration():
    from itertools import product

    from mhalib.interpret import count_null

    def enumerate_tail(count, chances, tail):
        total = 0.0
        for outcome in product((0, 1), repeat=len(chances)):
            prob = np.prod([c if o else 1 - c for o, c in zip(outcome, chances)])
            k = sum(outcome)
            total += prob if (k >= count if tail == "at least" else k <= count) else 0.0
        return total

    for count, chances, tail in [(4, [7 / 8] * 5, "at least"), (3, [3 / 4] * 5, "at most"), (8, [0.5] * 10, "at least"),
                                 (2, [0.1, 0.5, 0.9, 0.3], "at least"), (0, [0.2] * 6, "at most")]:
        p = chances[0] if len(set(chances)) == 1 else chances
        got = count_null(count, len(chances), p, tail)
        assert got["p_value"] == pytest.approx(enumerate_tail(count, chances, tail), abs=1e-12)
        assert got["expected"] == pytest.approx(sum(chances))
    assert count_null(4, 5, 7 / 8)["p_value"] == pytest.approx(0.8793, abs=1e-4)  # "not the costliest in 4 of 5"
    with pytest.raises(ValueError, match="count <= total"):
        count_null(6, 5, 0.5)
    with pytest.raises(ValueError, match="probability"):
        count_null(1, 2, 1.5)
    with pytest.raises(ValueError, match="tail"):
        count_null(1, 2, 0.5, "more")


def test_a_null_measured_on_models_is_read_with_its_bound_not_as_zero():
    """0 of 10 untrained models passing is a chance of up to 1 - 0.05 ** (1/10) = 0.259, not 0: the P-value of a
    count is computed with that bound (the Clopper-Pearson bound, by its definition)."""
    from mhalib.interpret import count_null, null_bound

    assert null_bound(0, 10, "at least") == pytest.approx(1 - 0.05 ** 0.1, abs=1e-9)
    assert null_bound(10, 10, "at most") == pytest.approx(0.05 ** 0.1, abs=1e-9)
    u = null_bound(3, 10, "at least")  # the upper bound: 3 or fewer of 10 has chance 0.05 under it
    assert count_null(3, 10, u, "at most")["p_value"] == pytest.approx(0.05, abs=1e-9) and 0.3 < u < 1
    lo = null_bound(3, 10, "at most")
    assert count_null(3, 10, lo, "at least")["p_value"] == pytest.approx(0.05, abs=1e-9) and 0 < lo < 0.3
    plain = count_null(6, 10, 0.0)
    bounded = count_null(6, 10, 0.0, estimated_from=10)
    assert plain["p_value"] == 0.0 and bounded["p_bound"] == pytest.approx(1 - 0.05 ** 0.1)
    assert bounded["p_value"] == pytest.approx(count_null(6, 10, 1 - 0.05 ** 0.1)["p_value"]) and \
        0.01 < bounded["p_value"] < 0.05
    assert count_null(4, 10, 0.0, estimated_from=10)["p_value"] > 0.05, "4 of 10 against 0 of 10 models: chance"
    with pytest.raises(ValueError, match="estimated_from"):
        count_null(6, 10, 0.25, estimated_from=10)  # 0.25 is no share of 10 models
    with pytest.raises(ValueError, match="passed"):
        null_bound(11, 10, "at least")


def test_claim_status_never_calls_a_count_at_chance_a_tendency():
    from mhalib.interpret import claim_status

    def v(count, p_value, tail="at least"):
        return {"count": count, "p_value": p_value, "tail": tail}

    assert claim_status({"zero": v(9, 0.01), "mean": v(8, 0.03)}, 8) == "finding"
    assert claim_status({"none": v(6, 0.02)}, 8) == "tendency"
    assert claim_status({"zero": v(6, 0.377)}, 8) == "not above its null", "6 of 10 against 5 by chance"
    assert claim_status({"none": v(10, 1.0)}, 8) == "not above its null", "as often as the null, however often"
    assert claim_status({"none": v(4, 0.02, "at most")}, 8) == "below its null"
    assert claim_status({"zero": v(9, 0.011), "mean": v(9, 0.011), "resample": v(8, 0.055)}, 8) == \
        "finding under zero, mean; not above its null under resample"
