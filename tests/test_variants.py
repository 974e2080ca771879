"""The attention variants of notebook 10: the decoder's window, latent attention and MLP width;
the recall task; the caches each variant really keeps; the measures and the frontier.

Oracles: a windowed model against the plain model given the same band mask by hand; latent
attention inside the decoder against :class:`~mhalib.mla.MultiHeadLatentAttention` run alone;
each variant decoded token by token through its own cache against its full forward pass
(float64, so equality is to rounding); the frontier against a brute-force definition.
"""

import numpy as np
import pytest
import torch

from mhalib.decoder import Decoder, DecoderConfig
from mhalib.sliding_window import sliding_window_mask
from mhalib.variants.compare import paired_against, pareto_front, summarize
from mhalib.variants.measure import cache_bytes, decode_with_caches, recall_accuracy
from mhalib.variants.model import (BASE, FIXED_PARAMS, VARIANTS, matched_mlp_width, new_variant_model,
                                   parameter_count, variant_config)
from mhalib.variants.recall import KEY_IDS, NUM_KEYS, PAIR_IDS, PAIRS, VALUE_IDS, VOCAB_SIZE, make_recall
from tolerance import float_tol


def small(seed=0, **kw):
    torch.manual_seed(seed)
    return Decoder(DecoderConfig(vocab_size=30, seq_len=24, d_model=32, num_heads=4, **kw)).double().eval()


@pytest.mark.parametrize("window,sinks", [(4, 0), (6, 1), (3, 2), (50, 0)])
def test_a_window_is_the_band_mask_applied_by_hand(window, sinks):
    model = small(window=window, num_sinks=sinks)
    plain = small()
    plain.load_state_dict(model.state_dict())
    x = torch.randint(0, 30, (2, 20), generator=torch.Generator().manual_seed(1))
    mask = sliding_window_mask(20, window, num_sinks=sinks)  # (N, N) bool
    seen = []

    def hook(weights):  # the plain model's weights, re-normalised over the band
        w = weights.masked_fill(~mask, 0.0)
        seen.append(True)
        return w / w.sum(-1, keepdim=True)

    h = plain.embed(x) + plain.pos.weight[:20]
    for block in plain.blocks:
        a = block.attn(block.ln_1(h), causal=True, pattern_hook=hook)
        h = h + a
        h = h + block.mlp(block.ln_2(h))
    expected = plain.unembed(plain.ln_f(h))
    got, weights = model(x, return_weights=True)
    torch.testing.assert_close(got, expected, **float_tol(torch.float64, 200))
    assert seen and not (weights[:, :, :, ~mask] != 0).any()  # nothing outside the band


def test_a_latent_attention_block_is_the_mla_module_alone():
    model = small(kv_lora_rank=8, rope_head_dim=4)
    x = torch.randint(0, 30, (2, 12), generator=torch.Generator().manual_seed(2))
    h = model.embed(x) + model.pos.weight[:12]
    for block in model.blocks:
        h = h + block.attn(block.ln_1(h), causal=True)
        h = h + block.mlp(block.ln_2(h))
    torch.testing.assert_close(model(x), model.unembed(model.ln_f(h)), **float_tol(torch.float64, 200))


def test_latent_attention_refuses_hooks_and_kv_caches_by_name():
    model = small(kv_lora_rank=8)
    x = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="latent-attention block.*z_hook"):
        model(x, ablate=[(0, 1)])


@pytest.mark.parametrize("kw,match", [
    (dict(num_sinks=1), "num_sinks needs a window"),
    (dict(window=4, num_sinks=4), "num_sinks needs a window larger"),
    (dict(window=0), "window must be None or a positive int"),
    (dict(kv_lora_rank=8, num_kv_heads=2), "leave num_kv_heads at num_heads"),
    (dict(kv_lora_rank=8, positions="queries_keys"), "positions='residual'"),
    (dict(rope_head_dim=3), "rope_head_dim must be an even int"),
    (dict(mlp=False, mlp_width=10), "mlp=False"),
])
def test_bad_variant_fields_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        DecoderConfig(vocab_size=30, seq_len=24, d_model=32, num_heads=4, **kw)


def test_an_old_checkpoint_config_still_loads_with_the_new_fields_at_their_defaults():
    from mhalib.language.model import load_language_model

    model = load_language_model()
    assert (model.config.window, model.config.kv_lora_rank, model.config.mlp_width) == (None, None, None)
    assert model.blocks[0].mlp[0].out_features == 4 * model.config.d_model


def test_the_parameter_matched_variants_are_within_one_percent_of_mha():
    target = parameter_count(variant_config("MHA"))
    for name in FIXED_PARAMS:
        count = parameter_count(variant_config(name))
        assert abs(count - target) <= 0.01 * target, (name, count, target)
        smaller = parameter_count(variant_config(name.replace(" =params", "")))
        assert smaller < target - 0.02 * target  # and the fixed-width one really is smaller
    assert matched_mlp_width({}) == 4 * BASE["d_model"]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_decodes_through_its_own_cache_to_its_full_forward(name):
    model = new_variant_model(name, seed=3).double().eval()
    batch = make_recall(2, 5, (4, 24), stream=7)
    full = model(torch.from_numpy(batch.tokens))
    steps, caches = decode_with_caches(model, batch.tokens)
    torch.testing.assert_close(steps, full, **float_tol(torch.float64, 400))
    held = sum(c.nbytes for c in caches)  # float64: 8 bytes a number, batch of 2
    assert held == 2 * cache_bytes(model.config, batch.tokens.shape[1], bytes_per_element=8)


def test_cache_bytes_of_the_variants_at_64_tokens():
    per = {name: cache_bytes(variant_config(name), 64) for name in VARIANTS}
    # MHA: 2 layers x 64 tokens x 2 (K and V) x 8 heads x 8 numbers x 2 bytes
    assert per["MHA"] == 2 * 64 * 2 * 8 * 8 * 2
    assert per["GQA-4"] * 2 == per["MHA"] and per["MQA"] * 8 == per["MHA"]
    assert per["MLA-16"] == 2 * 64 * (16 + 4) * 2
    assert per["SWA-8"] == per["SWA-8+sink"] == per["MHA"] // 8
    assert cache_bytes(variant_config("SWA-16"), 10) == cache_bytes(variant_config("MHA"), 10)


def test_recall_sequences_hold_what_the_task_says():
    batch = make_recall(50, 0, PAIRS)
    assert batch.tokens.shape == (50, 64) and (batch.tokens[:, 0] == 0).all()
    key_of = {int(PAIR_IDS[k, v]): int(KEY_IDS[k]) for k in range(NUM_KEYS) for v in range(PAIR_IDS.shape[1])}
    value_of = {int(PAIR_IDS[k, v]): int(VALUE_IDS[v]) for k in range(NUM_KEYS) for v in range(PAIR_IDS.shape[1])}
    for row, p in zip(range(50), batch.pairs):
        pairs = batch.tokens[row, 1:1 + p]
        assert np.isin(pairs, PAIR_IDS).all()
        keys = [key_of[t] for t in pairs]
        assert len(set(keys)) == p  # distinct keys
        lookup = {key_of[t]: value_of[t] for t in pairs}
        asked = batch.tokens[row, 1 + p:]
        assert np.isin(asked, np.concatenate([KEY_IDS, VALUE_IDS])).all()
        for i in np.flatnonzero(batch.mask[row]):  # every answer is the value of the key before it
            assert batch.tokens[row, i] == lookup[batch.tokens[row, i - 1]]
            d = batch.distance[row, i]
            assert key_of[batch.tokens[row, i - 1 - d]] == batch.tokens[row, i - 1] and 1 <= i - 1 - d <= p
    assert batch.tokens.max() < VOCAB_SIZE and set(batch.pairs) == set(PAIRS)
    again = make_recall(50, 0, PAIRS)
    assert np.array_equal(again.tokens, batch.tokens)
    assert not np.array_equal(make_recall(50, 1, PAIRS).tokens, batch.tokens)


@pytest.mark.parametrize("pairs", [0, 62, NUM_KEYS + 1, [4, True], "8"])
def test_bad_pair_counts_are_named(pairs):
    with pytest.raises(ValueError, match="pairs must be"):
        make_recall(2, 0, pairs)


def test_recall_accuracy_reads_the_logits_one_position_early():
    batch = make_recall(4, 0, 8)
    model = new_variant_model("MHA", 0).eval()
    accuracy, correct = recall_accuracy(model, batch)
    logits = model(torch.from_numpy(batch.tokens)).detach().numpy()
    guess = logits[:, :-1].argmax(-1)
    expected = (guess == batch.tokens[:, 1:])[batch.mask[:, 1:]].mean()
    assert accuracy == pytest.approx(expected) and correct.sum() == round(expected * batch.mask.sum())


def brute_front(costs, qualities):
    keep = []
    for i in range(len(costs)):
        beaten = any(costs[j] <= costs[i] and qualities[j] >= qualities[i]
                     and (costs[j] < costs[i] or qualities[j] > qualities[i]) for j in range(len(costs)))
        keep.append(not beaten)
    return np.array(keep)


def test_the_frontier_against_its_definition():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        c, q = rng.integers(0, 5, n).astype(float), rng.integers(0, 5, n).astype(float)  # many ties
        assert np.array_equal(pareto_front(c, q), brute_front(c, q)), (c, q)
    assert pareto_front([1.0, 1.0], [0.5, 0.5]).all()  # two equal points: neither beats the other
    with pytest.raises(ValueError, match="1-D arrays of one length"):
        pareto_front([1.0, 2.0], [0.5])


def test_paired_counts_and_their_null():
    runs = {"MHA": {str(s): {"recall": 0.9, "loss": 1.0} for s in range(5)},
            "X": {str(s): {"recall": 0.9 - 0.01 * (s + 1), "loss": 1.1} for s in range(5)}}
    out = paired_against(runs, "recall")["X"]
    assert (out["worse"], out["better"], out["n"]) == (5, 0, 5)
    assert out["p_worse"] == pytest.approx(1 / 32)
    assert paired_against(runs, "loss")["X"]["worse"] == 5  # a higher loss is worse
    table = summarize(runs, "recall")["X"]
    assert table["n"] == 5 and table["min"] == pytest.approx(0.85) and table["max"] == pytest.approx(0.89)


def test_the_shipped_run_measures_as_stored():
    """The weights exercise 10 measures give, measured again now, what variants.json stored for them
    (accuracies to one item in a thousand: an argmax between two nearly equal logits may flip on
    another processor; the loss to float32 rounding over the evaluation text)."""
    import json

    from mhalib.data import DATA_DIR
    from mhalib.variants import load_variant, measure_quality

    stored = json.loads((DATA_DIR / "variants.json").read_text())["runs"]["SWA-32"]["0"]
    again = measure_quality(load_variant("SWA-32", 0))
    assert again["loss"] == pytest.approx(stored["loss"], rel=1e-4)
    for key in ("agreement", "coreference", "recall"):
        assert abs(again[key] - stored[key]) <= 1e-3, key
    for p, value in stored["recall_by_pairs"].items():
        assert abs(again["recall_by_pairs"][p] - value) <= 2e-3, p


def test_every_stored_variant_has_five_seeds_and_its_shape():
    import json

    from mhalib.data import DATA_DIR
    from mhalib.variants.model import FIXED_PARAMS, FIXED_WIDTH

    results = json.loads((DATA_DIR / "variants.json").read_text())
    for name in list(FIXED_WIDTH) + list(FIXED_PARAMS):
        assert sorted(results["runs"][name]) == ["0", "1", "2", "3", "4"], name
        config = variant_config(name)
        assert results["shapes"][name]["parameters"] == parameter_count(config)
        assert results["shapes"][name]["cache_bytes_64"] == cache_bytes(config, 64)
