"""The language of notebook 05: grammar by construction, the model against PyTorch's own
attention, ablation of exactly one head, and the shipped weights on seeds the notebook
does not use (the notebook uses seed 1, the training script seed 0; these tests seed 2).

The grammar's answers are checked against rules written here from English, not with the
grammar's own helpers: a noun's number from its ending, a name's gender from its list.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mhalib.language import (VOCAB, Bigram, LanguageConfig, decode, encode, head_scores, lm_loss,
                             load_language_model, make_probe_set, new_language_model, probe_accuracy,
                             probe_margins, sample_sequences, train_language)
from mhalib.language import grammar as G

TEST_SEED = 2  # neither the notebook's (1) nor the training script's evaluation seed (0)

MALE = {"he", "king", "boy", "man", "john", "tom", "paul", "mark", "peter", "david"}
FEMALE = {"she", "queen", "girl", "woman", "mary", "anna", "lucy", "kate", "emma", "sara"}
THINGS_SG = {"dog", "cat", "bird", "horse", "key", "cabinet", "street", "house", "car", "box", "tree", "table", "it"}
THINGS_PL = {"dogs", "cats", "birds", "horses", "keys", "cabinets", "streets", "houses", "cars", "boxes", "trees",
             "tables", "they"}


def noun_features(word):
    """(number, gender) of a subject or antecedent word, from the lists above."""
    if word in MALE:
        return "sg", "m"
    if word in FEMALE:
        return "sg", "f"
    if word in THINGS_SG:
        return "sg", None
    if word in THINGS_PL:
        return "pl", None
    raise AssertionError(f"{word!r} is not a noun, name or pronoun")


def verb_number(word):
    """English: "is", "does" and third-person forms in -s are singular."""
    verb = word.split("-")[0]
    if verb in ("is", "does"):
        return "sg"
    if verb in ("are", "do"):
        return "pl"
    return "sg" if verb.endswith("s") and verb != "cross" else "pl"


def pronoun_for(number, gender, word):
    """The pronoun English uses for an antecedent, as a subject or after a verb."""
    if "-" in word:
        return "them" if number == "pl" else {"m": "him", "f": "her", None: "it"}[gender]
    return "they" if number == "pl" else {"m": "he", "f": "she", None: "it"}[gender]


def sentences(words):
    """(start, words) of every sentence, split at ".", <bos> left out."""
    out, start = [], 1
    for i, w in enumerate(words):
        if w == ".":
            out.append((start, words[start:i]))
            start = i + 1
    if start < len(words):
        out.append((start, words[start:]))
    return out


def subject_position(start, sentence):
    """A sentence's subject: its first word, or the noun after "the"."""
    return start + (1 if sentence[0] == "the" else 0)


def sentence_index(spans, position):
    return max(i for i, (start, _) in enumerate(spans) if start <= position)


@pytest.fixture(scope="module")
def sample():
    return [G.Grammar().sequence(G.make_rng(TEST_SEED, 9), 64) for _ in range(300)]


def test_every_verb_agrees_with_the_subject_of_its_own_sentence(sample):
    checked = 0
    for words, events, _, _ in sample:
        spans = sentences(words)
        for e in (e for e in events if e.relation == "agreement"):
            start, sentence = spans[sentence_index(spans, e.target)]
            assert e.key == subject_position(start, sentence), (words, e)
            assert words[e.target] == e.correct
            assert verb_number(e.correct) == noun_features(words[e.key])[0], (words, e)
            assert verb_number(e.wrong) != verb_number(e.correct)
            checked += 1
    assert checked > 1000


def test_every_pronoun_matches_the_subject_of_the_previous_main_clause(sample):
    kinds = set()
    for words, events, _, _ in sample:
        spans = sentences(words)
        for e in (e for e in events if e.relation == "coreference"):
            k = sentence_index(spans, e.target)
            start, sentence = spans[k]
            in_because = "because" in sentence and e.target > start + sentence.index("because")
            antecedent_sentence = spans[k] if in_because else spans[k - 1]  # the previous main clause
            assert e.key == subject_position(*antecedent_sentence), (words, e)
            word = words[e.target]
            assert word == e.correct
            number, gender = noun_features(words[e.key])
            assert word.split("-")[-1] == pronoun_for(number, gender, word), (words, e)
            kinds.add("because" if in_because else "fused" if "-" in word else "initial")
    assert kinds == {"because", "fused", "initial"}


def test_repeated_sentences_are_copies(sample):
    found = 0
    for words, _, repeats, _ in sample:
        for copy, original, length in repeats:
            end = min(copy + length, len(words))
            assert words[copy:end] == words[original:original + end - copy]
            found += 1
    assert found > 50


def test_same_seed_same_text_other_seed_or_stream_other_text():
    a, b = sample_sequences(8, 5), sample_sequences(8, 5)
    assert np.array_equal(a.tokens, b.tokens)
    assert all(np.array_equal(a.relations[k], b.relations[k]) for k in a.relations)
    assert not np.array_equal(a.tokens, sample_sequences(8, 6).tokens)
    assert not np.array_equal(a.tokens, sample_sequences(8, 5, stream=1).tokens)
    assert (a.tokens[:, 0] == VOCAB.index("<bos>")).all() and (a.tokens[:, 1:] != 0).all()
    p, q = make_probe_set("coreference", 20, 3), make_probe_set("coreference", 20, 3)
    assert np.array_equal(p.tokens, q.tokens) and np.array_equal(p.correct, q.correct)
    assert not np.array_equal(p.tokens, make_probe_set("coreference", 20, 4).tokens)


def test_encode_and_decode_are_inverse():
    words = "<bos> the keys near the cabinet are red . she greets-them .".split()
    assert decode(encode(words)) == words
    assert decode(torch.tensor(encode(words))) == words


@pytest.mark.parametrize("kind", ["agreement", "coreference"])
def test_every_probe_item_has_a_competitor_between_key_and_target(kind):
    probes = make_probe_set(kind, 200, TEST_SEED)
    assert set(probes.constructions) == ({"pp", "orc", "src"} if kind == "agreement" else {"initial", "because", "fused"})
    for i in range(len(probes)):
        words = decode(probes.tokens[i])
        target, key = probes.positions[i], probes.keys[i]
        right, wrong = VOCAB[probes.correct[i]], VOCAB[probes.wrong[i]]
        assert words[target] == right and key < target
        number, gender = noun_features(words[key])
        between = [noun_features(w) for w in words[key + 1:target] if w in MALE | FEMALE | THINGS_SG | THINGS_PL]
        if kind == "agreement":
            assert verb_number(right) == number and verb_number(wrong) != number
            assert any(n != number for n, _ in between), "an attractor of the other number"
        else:
            assert right.split("-")[-1] == pronoun_for(number, gender, right) != wrong.split("-")[-1]
            rival = (lambda n, g: g is not None and g != gender) if gender else (lambda n, g: g is None and n != number)
            assert any(rival(n, g) for n, g in between), "a competitor for the antecedent"


# --- the model -----------------------------------------------------------------------


def reference_forward(model, tokens):
    """The model's forward pass written out, with PyTorch's nn.MultiheadAttention for attention.

    Returns logits (B, N, V) and attention weights (B, L, H, N, N).
    """
    c = model.config
    n = tokens.shape[1]
    x = model.embed.weight[tokens] + model.pos.weight[:n]  # (B, N, d_model)
    causal_block = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = may not attend
    weights = []
    for block in model.blocks:
        mha = torch.nn.MultiheadAttention(c.d_model, c.num_heads, bias=False, batch_first=True)
        with torch.no_grad():
            a = block.attn
            mha.in_proj_weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            mha.out_proj.weight.copy_(a.o_proj.weight)
        h = F.layer_norm(x, (c.d_model,), block.ln_1.weight, block.ln_1.bias)
        out, w = mha(h, h, h, attn_mask=causal_block, need_weights=True, average_attn_weights=False)
        weights.append(w)  # (B, H, N, N)
        x = x + out
        h = F.layer_norm(x, (c.d_model,), block.ln_2.weight, block.ln_2.bias)
        x = x + block.mlp[2](F.gelu(block.mlp[0](h)))
    x = F.layer_norm(x, (c.d_model,), model.ln_f.weight, model.ln_f.bias)
    return x @ model.unembed.weight.T, torch.stack(weights, dim=1)


@pytest.fixture(scope="module")
def shipped():
    return load_language_model()


@pytest.fixture(scope="module")
def tokens():
    return torch.as_tensor(sample_sequences(6, TEST_SEED, stream=1).tokens)


@pytest.mark.parametrize("which", ["fresh", "shipped"])
def test_model_equals_a_written_out_forward_with_torch_attention(which, shipped, tokens):
    model = shipped if which == "shipped" else new_language_model(3, num_heads=8).eval()
    with torch.no_grad():
        logits, weights = model(tokens, return_weights=True)
        fast = model(tokens)  # the fused attention kernel, no weights
        ref_logits, ref_weights = reference_forward(model, tokens)
    assert weights.shape == (6, model.num_layers, model.num_heads, 64, 64)
    torch.testing.assert_close(weights, ref_weights, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fast, ref_logits, atol=1e-4, rtol=1e-4)


def capture_head_outputs(model, tokens, ablate=None):
    """What each layer's o_proj receives: the heads' outputs side by side, (B, N, H, d_head)."""
    seen = []
    hooks = [b.attn.o_proj.register_forward_hook(lambda m, inp, out: seen.append(inp[0])) for b in model.blocks]
    with torch.no_grad():
        logits = model(tokens, ablate=ablate)
    for h in hooks:
        h.remove()
    c = model.config
    return logits, [z.reshape(*z.shape[:2], c.num_heads, c.head_dim) for z in seen]


def test_ablation_zeroes_exactly_one_head_and_nothing_else(shipped, tokens):
    logits, intact = capture_head_outputs(shipped, tokens)
    for layer, head in [(0, 1), (1, 2)]:
        ablated_logits, ablated = capture_head_outputs(shipped, tokens, ablate=[(layer, head)])
        assert torch.equal(ablated[layer][:, :, head], torch.zeros_like(ablated[layer][:, :, head]))
        assert intact[layer][:, :, head].abs().max() > 1e-3, "the head did contribute before"
        others = [h for h in range(shipped.num_heads) if h != head]
        torch.testing.assert_close(ablated[layer][:, :, others], intact[layer][:, :, others], atol=1e-6, rtol=0)
        for earlier in range(layer):  # layers before it see nothing different
            torch.testing.assert_close(ablated[earlier], intact[earlier], atol=1e-6, rtol=0)
        assert (ablated_logits - logits).abs().max() > 1e-3


def test_ablate_takes_numpy_indices(shipped, tokens):
    layer, head = np.unravel_index(np.argmax(np.arange(8).reshape(2, 4) == 6), (2, 4))  # NumPy ints (1, 2)
    with torch.no_grad():
        assert torch.equal(shipped(tokens, ablate=[(layer, head)]), shipped(tokens, ablate=[(1, 2)]))


def test_ablating_nothing_is_the_intact_model(shipped):
    probes = make_probe_set("agreement", 50, TEST_SEED)
    assert np.array_equal(probe_margins(shipped, probes, ablate=[]), probe_margins(shipped, probes))
    assert lm_loss(shipped, 8, TEST_SEED, ablate=None) == lm_loss(shipped, 8, TEST_SEED, ablate=[])


def test_same_seed_same_training_other_seed_other_training():
    runs = [train_language(new_language_model(5), 15, batch_size=8, seed=5, progress=False) for _ in range(2)]
    assert runs[0] == runs[1]
    other = train_language(new_language_model(6), 15, batch_size=8, seed=6, progress=False)
    assert other["loss"] != runs[0]["loss"]
    assert runs[0]["loss"][-1] < runs[0]["loss"][0]


# --- the shipped weights, on seeds the notebook does not use -----------------------------


def test_shipped_model_has_the_recipe_it_says(shipped):
    meta = shipped.metadata
    assert (shipped.num_layers, shipped.num_heads) == (meta["recipe"]["num_layers"], meta["recipe"]["num_heads"])
    assert meta["recipe"]["dropout"] == 0.0 and meta["recipe"]["threads"] == 1
    assert sum(p.numel() for p in shipped.parameters()) * 4 < 1_000_000, "weights well under 1 MB"


@pytest.mark.parametrize("kind", ["agreement", "coreference"])
def test_shipped_model_passes_both_probes_and_beats_the_bigram(shipped, kind):
    probes = make_probe_set(kind, 400, TEST_SEED)
    accuracy = probe_accuracy(shipped, probes)
    assert accuracy >= 0.9
    tolerance = shipped.metadata["tolerance"]["probe"]
    assert abs(accuracy - shipped.metadata["measured"]["probes"][kind]) <= max(tolerance, 0.03)
    assert Bigram(1024, TEST_SEED).probe_accuracy(probes) < 0.7


def test_the_shipped_run_starts_again_as_recorded(shipped):
    """The recipe in the JSON, rerun for its first 30 steps, gives the recorded training losses.

    (``python -m mhalib.language check`` reruns all of it and compares the measured numbers
    within the JSON's ``tolerance``: probe accuracy 0.02, loss 1%.)
    """
    from mhalib.language.__main__ import train_recipe

    recorded = shipped.metadata["history"]["first_steps"][:30]
    _, history, _ = train_recipe(shipped.metadata["recipe"], "rerun", steps=30, progress=False)
    np.testing.assert_allclose(history["loss"], recorded, atol=1e-3)
    assert recorded[0] - recorded[-1] > 0.5, "the loss falls in the first steps"


def test_shipped_model_loss_is_close_to_the_recorded_one(shipped):
    recorded = shipped.metadata["measured"]["loss"]["all"]
    assert abs(lm_loss(shipped, 64, TEST_SEED) / recorded - 1) < 0.03


def test_heads_the_notebook_names_have_their_scores(shipped):
    scores = head_scores(shipped, 96, TEST_SEED)
    # notebook 05 names the head of each relation by its score on seed 1; the same head
    # wins on this seed, by a margin
    for name, minimum in (("agreement", 0.5), ("coreference", 0.4)):
        s = scores[name]
        best = np.unravel_index(s.argmax(), s.shape)
        assert best[0] == 1 and s[best] >= minimum, (name, s)
        assert s[best] - np.sort(s.ravel())[-2] > 0.1


# --- clear errors --------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors(shipped, tokens):
    with pytest.raises(ValueError, match="'agreement', 'coreference'"):
        make_probe_set("syntax", 10, 0)
    with pytest.raises(ValueError, match=r"layer in 0 \.\. 1 and head in 0 \.\. 3"):
        shipped(tokens, ablate=[(2, 0)])
    with pytest.raises(ValueError, match=r"head in 0 \.\. 3.*\(0, 4\)"):
        probe_accuracy(shipped, make_probe_set("agreement", 5, 0), ablate=[(0, 4)])
    with pytest.raises(ValueError, match=r"write \[\(1, 2\)\]"):
        lm_loss(shipped, 4, 0, ablate=(1, 2))
    with pytest.raises(ValueError, match="int64 tensor"):
        shipped(tokens.float())
    with pytest.raises(ValueError, match="not in the vocabulary"):
        encode("the unicorn sleeps")
    with pytest.raises(ValueError, match="choose one of 1, 2, 4, 8, 16"):
        LanguageConfig(d_model=64, num_heads=7)
    with pytest.raises(ValueError, match="ProbeSet"):
        probe_accuracy(shipped, [1, 2, 3])
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        lm_loss(shipped, 4, -1)


def test_exercise_05_references_are_the_librarys_numbers_on_the_shipped_model(shipped):
    """The grader's NumPy references for exercise 05 agree with mhalib.language on real data."""
    from mhalib.grade.exercises import ex05_heads_in_language as ex
    from mhalib.language import attention_weights, relation_score, sample_sequences, token_losses

    batch = sample_sequences(16, seed=11)
    weights = attention_weights(shipped, batch.tokens)  # (B, L, H, N, N)
    pairs = batch.relations["agreement"]
    library = relation_score(weights, pairs)  # (L, H)
    for layer in range(shipped.num_layers):
        np.testing.assert_allclose(ex.reference_relation_score(weights[:, layer], pairs), library[layer])
    probes = make_probe_set("coreference", 64, seed=11)
    from mhalib.training import num_threads

    with torch.no_grad(), num_threads(1):  # as the library runs the model
        logits = shipped(torch.as_tensor(probes.tokens)).numpy()
        ablated = shipped(torch.as_tensor(probes.tokens), ablate=[(1, 2)]).numpy()
    args = (probes.positions, probes.correct, probes.wrong)
    assert ex.reference_probe_accuracy(logits, *args) == probe_accuracy(shipped, probes)
    drop, rise = ex.reference_ablation_effect(logits, ablated, probes.tokens, *args)
    assert drop == probe_accuracy(shipped, probes) - probe_accuracy(shipped, probes, [(1, 2)]) > 0.2
    losses = np.nanmean(token_losses(shipped, probes.tokens, [(1, 2)])) - np.nanmean(token_losses(shipped, probes.tokens))
    assert rise == pytest.approx(losses, abs=1e-5) and rise > 0
