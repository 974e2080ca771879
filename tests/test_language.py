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

from mhalib.language import (VOCAB, Bigram, decode, encode, grammar_head_scores, language_config, lm_loss,
                             load_language_model, make_probe_set, new_language_model, probe_accuracy,
                             probe_margins, sample_sequences, train_language)
from mhalib.language import grammar as G
from mhalib.language import SHIPPED_SEEDS, flip_subject_number, number_patching, path_patching
from mhalib.language.probes import CONTROL, HELD_OUT, SAME_NUMBER, shallow_baselines
from tolerance import float_tol

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


PREPOSITIONS = {"near", "behind", "with", "under", "by", "beside"}
SUBORDINATORS = {"when", "while"}


def noun_phrase_end(sentence, i):
    """Index after the noun phrase starting at ``i``: "the" + noun, or a name."""
    return i + 2 if i < len(sentence) and sentence[i] == "the" else i + 1


def intro_end(sentence):
    """Index of the first word after an introductory phrase or clause (0 if there is none).

    "near the cats | the dog ...", "when the cats sleep | the dog ..."; the grammar never
    stacks two in its training text.
    """
    if sentence[0] in PREPOSITIONS:
        return noun_phrase_end(sentence, 1)
    if sentence[0] in SUBORDINATORS:
        return noun_phrase_end(sentence, 1) + 1  # its verb
    return 0


def subject_position(start, sentence):
    """A sentence's subject: the first word after the introduction, or the noun after "the"."""
    i = intro_end(sentence)
    return start + i + (1 if sentence[i] == "the" else 0)


def intro_subject_position(start, sentence):
    """The subject of an introductory clause ("when the cats sleep"): the noun after the subordinator."""
    return start + 1 + (1 if sentence[1] == "the" else 0)


def sentence_index(spans, position):
    return max(i for i, (start, _) in enumerate(spans) if start <= position)


@pytest.fixture(scope="module")
def sample():
    rng, grammar = G.make_rng(TEST_SEED, 9), G.Grammar()  # one generator: 300 different sequences
    return [grammar.sequence(rng, 64) for _ in range(300)]


def test_every_verb_agrees_with_the_subject_of_its_own_sentence(sample):
    checked = 0
    for words, events, _, _ in sample:
        spans = sentences(words)
        for e in (e for e in events if e.relation == "agreement"):
            start, sentence = spans[sentence_index(spans, e.target)]
            in_intro = sentence[0] in SUBORDINATORS and e.target < start + intro_end(sentence)
            subject = intro_subject_position if in_intro else subject_position
            assert e.key == subject(start, sentence), (words, e)
            assert words[e.target] == e.correct
            assert verb_number(e.correct) == noun_features(words[e.key])[0], (words, e)
            assert verb_number(e.wrong) != verb_number(e.correct)
            checked += 1
    assert checked > 1000


def test_a_noun_that_is_not_the_subject_often_comes_first(sample):
    """Position does not give the answer: many subjects are not the first noun of their sentence."""
    nouns = MALE | FEMALE | THINGS_SG | THINGS_PL
    main, not_first = 0, 0
    for words, events, _, _ in sample:
        spans = sentences(words)
        for e in (e for e in events if e.relation == "agreement"):
            start, sentence = spans[sentence_index(spans, e.target)]
            if sentence[0] in SUBORDINATORS and e.target < start + intro_end(sentence):
                continue  # the verb of an introductory clause
            first = next(start + i for i, w in enumerate(sentence) if w in nouns)
            main += 1
            not_first += first != e.key
    assert 0.3 < not_first / main < 0.7, not_first / main


def test_the_held_out_constructions_never_occur_in_training_text(sample):
    """Two prepositional phrases in a row ("near the cats behind the box") are built only for probes."""
    for words, _, _, _ in sample:
        for i, w in enumerate(words):
            if w in PREPOSITIONS:
                after = noun_phrase_end(words, i + 1)
                assert after >= len(words) or words[after] not in PREPOSITIONS, words[i:after + 1]
    for kind, held_out in HELD_OUT.items():
        probes = make_probe_set(kind, 60, TEST_SEED, constructions=held_out)
        stacked = 0
        for row in probes.tokens:
            words = decode(row)
            stacked += any(w in PREPOSITIONS and noun_phrase_end(words, i + 1) < len(words)
                           and words[noun_phrase_end(words, i + 1)] in PREPOSITIONS for i, w in enumerate(words))
        assert stacked == len(probes), kind


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
    assert decode([np.int64(i) for i in encode(words)]) == words, "a list of NumPy ints, as indexing gives"
    for bad in ([len(VOCAB)], [-1], [True], [1.0]):
        with pytest.raises(ValueError, match="token ids must be ints"):
            decode(bad)


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
    # float32 against a forward written out here: two layers of projections over d_model = 64
    # (and the MLP's 4 d_model), scores over d_head and sums over 64 positions, in another order
    torch.testing.assert_close(weights, ref_weights, **float_tol(torch.float32, 2 * (3 * 64 + 4 * 64) + 16))
    torch.testing.assert_close(logits, ref_logits, **float_tol(torch.float32, 2 * (3 * 64 + 4 * 64 + 2 * 64) + 64))
    torch.testing.assert_close(fast, ref_logits, **float_tol(torch.float32, 2 * (3 * 64 + 4 * 64 + 2 * 64) + 64))


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
        torch.testing.assert_close(ablated[layer][:, :, others], intact[layer][:, :, others], **float_tol(torch.float32, 64 + 16 + 2 * 64))
        for earlier in range(layer):  # layers before it see nothing different
            torch.testing.assert_close(ablated[earlier], intact[earlier], **float_tol(torch.float32, 64 + 16 + 2 * 64))
        assert (ablated_logits - logits).abs().max() > 1e-3


def _o_proj_input(model, layer, tokens, **patch):
    """What layer ``layer``'s o_proj receives, as (B, N, H, d_head), captured by a forward hook."""
    seen = []
    hook = model.blocks[layer].attn.o_proj.register_forward_hook(lambda m, inp, out: seen.append(inp[0]))
    with torch.no_grad():
        model(tokens, **patch)
    hook.remove()
    return seen[0].reshape(*seen[0].shape[:2], model.num_heads, model.config.head_dim)


def test_replace_z_puts_the_given_output_into_that_head_only(shipped, tokens):
    patch = torch.randn(tokens.shape[0], tokens.shape[1], shipped.config.head_dim, generator=torch.Generator().manual_seed(0))
    z = _o_proj_input(shipped, 1, tokens, replace_z={(1, 2): patch})
    intact = _o_proj_input(shipped, 1, tokens)
    assert torch.equal(z[:, :, 2], patch)
    torch.testing.assert_close(z[:, :, [0, 1, 3]], intact[:, :, [0, 1, 3]], **float_tol(torch.float32, 64 + 16 + 2 * 64))


def test_replace_weights_makes_a_head_average_its_values_with_the_given_weights(shipped, tokens):
    """Uniform causal weights: the head's output is the running mean of its value vectors (computed here)."""
    b, n = tokens.shape
    uniform = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]  # (N, N): rows sum to 1
    z = _o_proj_input(shipped, 0, tokens, replace_weights={(0, 1): uniform.expand(b, n, n)})
    block, d = shipped.blocks[0], shipped.config.head_dim
    with torch.no_grad():
        x = shipped.embed(tokens) + shipped.pos.weight[:n]  # (B, N, d_model)
        v = F.layer_norm(x, (x.shape[-1],), block.ln_1.weight, block.ln_1.bias) @ block.attn.v_proj.weight.T
        v1 = v[:, :, d:2 * d]  # (B, N, d_head): head 1's values
        running_mean = v1.cumsum(dim=1) / torch.arange(1, n + 1)[None, :, None]
    torch.testing.assert_close(z[:, :, 1], running_mean, **float_tol(torch.float32, 64 + 2 * 64))
    record = {}
    with torch.no_grad():
        _, weights = shipped(tokens, return_weights=True)
        shipped(tokens, record=record)
    assert torch.equal(record["weights"], weights) and record["z"].shape == (b, 2, 4, n, d)


def test_flip_subject_number_changes_the_subject_and_nothing_it_does_not_agree_with():
    probes = make_probe_set("agreement", 200, TEST_SEED)
    kept, flipped = flip_subject_number(probes)
    assert 0.5 * len(probes) < len(kept) < len(probes)  # things only: names and people have no plural
    for i in range(len(kept)):
        before, after = decode(kept.tokens[i]), decode(flipped.tokens[i])
        changed = [j for j in range(len(before)) if before[j] != after[j]]
        key = kept.keys[i]
        assert changed[0] == key and noun_features(after[key])[0] != noun_features(before[key])[0]
        assert set(changed) <= {key, key + 2} and all(j < kept.positions[i] for j in changed)
        if key + 2 in changed:  # a subject relative clause: "that chases" -> "that chase"
            assert before[key + 1] == "that" and verb_number(after[key + 2]) == noun_features(after[key])[0]
        assert verb_number(VOCAB[flipped.correct[i]]) == noun_features(after[key])[0]


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


def test_the_top_scoring_heads_are_in_layer_1(shipped):
    scores = grammar_head_scores(shipped, 96, TEST_SEED)
    # notebook 05 reads the relation heads off seed 1's text; on this seed too they are in
    # layer 1, and no layer-0 head scores on a relation
    for relation, minimum in (("agreement", 0.8), ("coreference", 0.5)):
        s = scores[relation]
        best = np.unravel_index(s.argmax(), s.shape)
        assert best[0] == 1 and s[best] >= minimum, (relation, s)
        assert s[0].max() < 0.2


# --- the claims notebook 05 makes about the five shipped seeds, on fresh probe items ------


@pytest.fixture(scope="module")
def seeds():
    return {seed: load_language_model(seed=seed) for seed in SHIPPED_SEEDS}


def first_noun_rule(probes):
    """Accuracy of "the first noun decides", written from English here (not the library's code).

    Agreement: the verb takes the number of the first noun of its sentence. Coreference: the
    pronoun is that of the first noun of the previous sentence, or of its own sentence when
    "because" comes before it. A noun that says nothing about the two forms counts 1/2.
    """
    nouns = MALE | FEMALE | THINGS_SG | THINGS_PL
    votes = []
    for i in range(len(probes)):
        words = decode(probes.tokens[i])
        t, answer = probes.positions[i], probes.answers[i]
        ends = [0] + [j for j in range(t) if words[j] == "."]  # <bos> and every "." before the word
        own = words[ends[-1] + 1:t]
        if probes.kind == "coreference" and "because" not in own:
            own = words[ends[-2] + 1:ends[-1]]  # the previous sentence
        first = next((w for w in own if w in nouns), None)
        number, gender = noun_features(first)
        if answer in ("m", "f"):
            votes.append(0.5 if gender is None else float(gender == answer))
        elif probes.kind == "coreference" and gender is not None:
            votes.append(0.5)
        else:
            votes.append(float(number == answer))
    return float(np.mean(votes))


def first_noun_outside_phrases_rule(probes):
    """Accuracy of "the first noun that does not follow a preposition or a subordinator", from English.

    Like :func:`first_noun_rule`, but a noun right after "near", "when", "because"... (or after
    such a word and "the") is skipped: the nouns of phrases and of introductory clauses.
    """
    nouns = MALE | FEMALE | THINGS_SG | THINGS_PL
    openers = PREPOSITIONS | SUBORDINATORS | {"because"}
    votes = []
    for i in range(len(probes)):
        words = decode(probes.tokens[i])
        t, answer = probes.positions[i], probes.answers[i]
        ends = [0] + [j for j in range(t) if words[j] == "."]
        own = words[ends[-1] + 1:t]
        if probes.kind == "coreference" and "because" not in own:
            own = words[ends[-2] + 1:ends[-1]]
        free = [w for j, w in enumerate(own) if w in nouns and w not in ("he", "she", "it", "they")
                and not (j >= 1 and own[j - 1] in openers) and not (j >= 2 and own[j - 1] == "the"
                                                                     and own[j - 2] in openers)]
        if not free:
            votes.append(0.5)
            continue
        number, gender = noun_features(free[0])
        if answer in ("m", "f"):
            votes.append(0.5 if gender is None else float(gender == answer))
        elif probes.kind == "coreference" and gender is not None:
            votes.append(0.5)
        else:
            votes.append(float(number == answer))
    return float(np.mean(votes))


def nearest_nouns_rule(probes, which):
    """By hand: the vote of the ``which``-th noun back before the word (1: nearest, 2: second-nearest)."""
    votes = []
    for row, t, answer in zip(probes.tokens, probes.positions, probes.answers):
        nouns = [VOCAB[x] for x in row[1:t] if VOCAB[x] in NOUNS - {"he", "she", "it", "they"}]
        if len(nouns) < which:
            votes.append(0.5)
            continue
        noun = nouns[-which]
        if answer in ("m", "f"):
            votes.append(0.5 if noun not in MALE | FEMALE else float((noun in MALE) == (answer == "m")))
        elif probes.kind == "coreference" and noun in MALE | FEMALE:
            votes.append(0.5)
        else:
            votes.append(float((noun in THINGS_PL) == (answer == "pl")))
    return float(np.mean(votes))


FAILING_RULES = ("first noun", "nearest noun", "majority", "majority of nouns")  # on both default probes


@pytest.mark.parametrize("kind", ["agreement", "coreference"])
def test_which_rules_pass_the_default_probes(kind):
    """Position, the nearest noun, the majority and a bigram fail the default probes; a finite-state rule over
    word categories (the first noun outside phrases) passes them, and so do rules that read the attractor the
    probe puts right before the word: the opposite of the nearest noun (and, for agreement, the second-nearest
    noun; for coreference, the last finite verb). The probes are scoped to what those rules cannot tell apart."""
    probes = make_probe_set(kind, 600, TEST_SEED)
    rules = shallow_baselines(probes)
    assert first_noun_rule(probes) == pytest.approx(rules["first noun"])
    assert first_noun_outside_phrases_rule(probes) == pytest.approx(rules["first noun outside phrases"]) == 1.0
    assert nearest_nouns_rule(probes, 1) == pytest.approx(rules["nearest noun"])
    assert nearest_nouns_rule(probes, 2) == pytest.approx(rules["second-nearest noun"])
    assert rules["opposite of the nearest noun"] == pytest.approx(1 - rules["nearest noun"]) and \
        rules["opposite of the nearest noun"] > 0.6, "the nearest noun misleads, so its opposite passes"
    assert max(rules[k] for k in FAILING_RULES) <= 0.6, rules
    if kind == "agreement":
        assert rules["second-nearest noun"] == 1.0, "exactly one attractor of the other number before the verb"
    else:
        assert rules["last finite verb"] > 0.6 and rules["second-nearest noun"] <= 0.6, rules
    assert Bigram(1024, TEST_SEED).probe_accuracy(probes) <= 0.6
    answers = list(probes.answers)
    assert max(answers.count(a) for a in set(answers)) / len(answers) <= 0.6, "balanced answers"


def test_the_control_and_the_same_number_set_fail_the_rules_that_read_the_attractor():
    """What rules those rules out as a model's strategy: without an attractor (the control) or with one of the
    subject's own number, the opposite of the nearest noun is always wrong, and the second-nearest noun is a coin
    flip on the control."""
    control = shallow_baselines(make_probe_set("agreement", 400, TEST_SEED, constructions=CONTROL["agreement"]))
    same = shallow_baselines(make_probe_set("agreement", 400, TEST_SEED, constructions=SAME_NUMBER["agreement"]))
    assert control["opposite of the nearest noun"] == same["opposite of the nearest noun"] == 0.0
    assert control["second-nearest noun"] <= 0.6 and control["last finite verb"] <= 0.6, control


def test_the_centre_embedded_probe_defeats_the_first_and_nearest_noun_rules_but_not_every_rule():
    """A relative clause inside a relative clause: the first-noun rules, the nearest noun, the majority, the
    5-gram and the bigram at most 0.6; the second-nearest noun, the subject of that verb, passes it."""
    from mhalib.language.probes import NGram

    probes = make_probe_set("agreement", 400, TEST_SEED, constructions=["centre"])
    rules = shallow_baselines(probes)
    assert first_noun_outside_phrases_rule(probes) == pytest.approx(rules["first noun outside phrases"])
    assert max(rules[k] for k in ("first noun", "first noun outside phrases", "nearest noun", "majority")) <= 0.6
    assert rules["second-nearest noun"] == rules["noun 5 words back"] == 1.0, rules
    assert Bigram(1024, TEST_SEED).probe_accuracy(probes) <= 0.6
    assert NGram(5, 1024, TEST_SEED).probe_accuracy(probes) <= 0.6


NOUNS = MALE | FEMALE | THINGS_SG | THINGS_PL


@pytest.mark.parametrize("construction", ["orc_verb", "centre", "adverb_pp", "adverb", "pp_same", "orc_same",
                                          "src_same", "orc_verb_pp"])
def test_the_probe_only_constructions_are_what_they_say(construction):
    probes = make_probe_set("agreement", 300, TEST_SEED, constructions=[construction])
    assert set(probes.constructions) == {construction}
    matches, first_free = [], []
    for i in range(len(probes)):
        words = decode(probes.tokens[i])
        target, key = probes.positions[i], probes.keys[i]
        right, wrong = VOCAB[probes.correct[i]], VOCAB[probes.wrong[i]]
        number, _ = noun_features(words[key])
        assert words[target] == right and verb_number(right) == number != verb_number(wrong)
        assert probes.answers[i] == number
        start = max(j for j in range(target) if words[j] in (".", "<bos>")) + 1
        nouns = [j for j in range(start, target) if words[j] in NOUNS]
        others = [j for j in nouns if j != key]
        if construction in ("orc_verb", "centre", "orc_verb_pp"):  # "the dog that the cats (that the bird sees) | chase"
            assert words[key - 2:key] == ["that", "the"]
            assert (nouns[-1] == key) == (construction == "orc_verb")
            if construction == "orc_verb_pp":  # "the dog that the cats near the house | chase"
                assert words[key + 1] in PREPOSITIONS and words[key + 2] == "the" and target == key + 4
            if construction == "centre":
                assert words[key + 1:key + 3] == ["that", "the"] and words[target - 1] not in NOUNS
        if construction.startswith("adverb"):
            assert words[target - 1] in G.ADVERBS and (construction == "adverb") == (nouns[-1] == key)
        if construction.endswith("_same"):
            assert noun_features(words[others[-1]])[0] == number, "the attractor has the subject's number"
        matches.append(noun_features(words[others[-1]])[0] == number if others else None)
        free = [j for j in nouns if words[j - 1] not in PREPOSITIONS | SUBORDINATORS
                and not (words[j - 1] == "the" and words[j - 2] in PREPOSITIONS | SUBORDINATORS)]
        first_free.append(noun_features(words[free[0]])[0] == number)
    assert np.mean(probes.answers == "pl") == pytest.approx(0.5, abs=0.1), "balanced answers"
    if construction in ("orc_verb", "centre", "adverb_pp", "orc_verb_pp"):  # other nouns' numbers drawn on their own
        assert np.mean([m for m in matches if m is not None]) == pytest.approx(0.5, abs=0.1)
    if construction in ("orc_verb", "centre", "orc_verb_pp"):
        assert np.mean(first_free) == pytest.approx(0.5, abs=0.1), "the first noun outside phrases is not the key"


ALL_RULES = ("first noun", "first noun outside phrases", "nearest noun", "majority", "second-nearest noun",
             "opposite of the nearest noun", "noun 5 words back", "majority of nouns", "last finite verb")


@pytest.mark.parametrize("seed", [TEST_SEED, 3])
def test_no_rule_passes_the_balanced_agreement_probe_and_the_shipped_model_does(seed):
    """Every rule without syntax, counted here from the words (the first-noun rules and the nearest nouns by
    this file's own readers, the n-grams on the training text), scores 0.5 +- BALANCE_BAND on the balanced set of
    a probe seed the notebook never uses; the default probe, built the same way, fails that test; every shipped
    seed passes the balanced set (notebook 05 states it for its own probe seed). Every item is what its construction says, and the set is reproducible."""
    from mhalib.language.probes import BALANCE_BAND, BALANCED_POOL, NGram, balanced_probe_set

    balanced = balanced_probe_set(400, seed)
    assert len(balanced) == 400 and set(balanced.constructions) <= set(sum(BALANCED_POOL["agreement"], ()))
    assert {"orc_verb", "pp"} <= set(balanced.constructions), "main verbs and verbs inside a clause"
    again = balanced_probe_set(400, seed)
    assert np.array_equal(balanced.tokens, again.tokens) and np.array_equal(balanced.positions, again.positions)
    scores = dict(shallow_baselines(balanced), bigram=Bigram().probe_accuracy(balanced),
                  **{"5-gram": NGram().probe_accuracy(balanced)})
    assert set(scores) == set(ALL_RULES) | {"bigram", "5-gram"}
    assert first_noun_outside_phrases_rule(balanced) == pytest.approx(scores["first noun outside phrases"])
    assert first_noun_rule(balanced) == pytest.approx(scores["first noun"])
    assert nearest_nouns_rule(balanced, 1) == pytest.approx(scores["nearest noun"])
    assert nearest_nouns_rule(balanced, 2) == pytest.approx(scores["second-nearest noun"])
    assert all(abs(v - 0.5) <= BALANCE_BAND + 1e-12 for v in scores.values()), scores
    in_clause = balanced.constructions == "orc_verb"
    assert in_clause.sum() == 200, "half the items are verbs inside a clause"
    for part in (in_clause, ~in_clause):  # no cue in the construction alone
        assert abs(np.mean(balanced.answers[part] == "sg") - 0.5) <= BALANCE_BAND + 1e-12
    default = make_probe_set("agreement", 400, seed)
    assert first_noun_outside_phrases_rule(default) == 1.0, "the balance is not a property of any probe set"
    assert all(probe_accuracy(load_language_model(seed=s), balanced) >= 0.99 for s in SHIPPED_SEEDS)


def test_two_finite_state_rules_pass_the_balanced_probe_and_part_company_on_the_held_out_clauses():
    """Rules that tell a main verb from a verb in a clause (read here from the words, not with the library's
    readers) pass the balanced set; on the clause inside a clause only the second is right."""
    from mhalib.language.probes import balanced_probe_set, finite_state_rules

    transitive = {w for w in VOCAB if w in G.TRANSITIVE or w[:-1] in G.TRANSITIVE or w[:-2] in G.TRANSITIVE}
    lemmas = G.INTRANSITIVE + G.TRANSITIVE + G.WITH_OBJECT_PRONOUN
    verbs = {w for w in VOCAB if w in ("is", "are", "does", "do") or w.split("-")[0] in lemmas
             or w.split("-")[0][:-1] in lemmas or w.split("-")[0][:-2] in lemmas}
    assert {"sees", "see", "crosses", "cross", "greets-him", "greet-them", "sleeps"} <= verbs
    assert transitive == {f for v in G.TRANSITIVE for f in (v, v + "s", v + "es") if f in VOCAB}

    def by_hand(probes):
        clause, free = [], []
        for i in range(len(probes)):
            words, t, answer = decode(probes.tokens[i]), probes.positions[i], probes.answers[i]
            start = max(j for j in range(t) if words[j] in (".", "<bos>")) + 1
            nouns = [j for j in range(start, t) if words[j] in NOUNS - {"it", "they"}]
            if words[t - 3:t - 1] == ["that", "the"]:
                clause.append(float(noun_features(words[t - 1])[0] == answer))
            else:
                outside = [j for j in nouns if words[j - 1] not in PREPOSITIONS | SUBORDINATORS
                           and not (words[j - 1] == "the" and words[j - 2] in PREPOSITIONS | SUBORDINATORS)]
                clause.append(float(noun_features(words[outside[0]])[0] == answer))
            kept = [j for j in nouns
                    if words[j - 1 - (words[j - 1] == "the")] not in PREPOSITIONS | SUBORDINATORS | transitive
                    and not (j + 1 < t and words[j + 1] in verbs)]
            free.append(float(noun_features(words[kept[-1]])[0] == answer))
        return np.array(clause), np.array(free)

    balanced = balanced_probe_set(200, TEST_SEED)
    centre = make_probe_set("agreement", 200, TEST_SEED, constructions=["centre"])
    names = list(finite_state_rules(balanced))
    for probes in (balanced, centre):
        rules = finite_state_rules(probes)
        for name, hand in zip(names, by_hand(probes)):
            assert np.array_equal(rules[name], hand), name
    assert all(v.mean() == 1.0 for v in finite_state_rules(balanced).values())
    on_centre = finite_state_rules(centre)
    assert on_centre[names[1]].mean() == 1.0 and abs(on_centre[names[0]].mean() - 0.5) <= 0.1


@pytest.mark.parametrize("construction", ["chain", "chain_free"])
def test_a_chain_item_has_a_pronoun_for_its_antecedent_and_the_competitor_where_it_says(construction):
    """"mary runs . she sees the king . | she": the key is the pronoun subject of the sentence before, whose own
    antecedent, the subject of the sentence before that, gives the right form; in "chain" that sentence's object
    is a competitor (the other gender, or a thing of the other number), and it is the first noun outside phrases."""
    probes = make_probe_set("coreference", 150, TEST_SEED, constructions=[construction])
    for i in range(len(probes)):
        words = decode(probes.tokens[i])
        target, key = probes.positions[i], probes.keys[i]
        periods = [j for j in range(target) if words[j] == "."]
        assert periods[-2] < key < periods[-1], "the key is in the sentence before"
        assert words[key] in ("he", "she", "it", "they") and words[target] == VOCAB[probes.correct[i]]
        assert words[key] == words[target], "a pronoun for the same antecedent, in the same form"
        number, gender = noun_features(words[key])
        assert probes.answers[i] == (gender or number)
        middle = words[periods[-2] + 1:periods[-1]]
        free = [w for j, w in enumerate(middle) if w in NOUNS - {"he", "she", "it", "they"}
                and middle[j - 1] not in PREPOSITIONS | SUBORDINATORS
                and not (middle[j - 1] == "the" and middle[j - 2] in PREPOSITIONS | SUBORDINATORS)]
        if construction == "chain":  # the object competes, and is the first noun outside phrases
            assert len(free) == 1, middle
            other = noun_features(free[0])
            assert (other[1] is not None and other[1] != gender) if gender else \
                (other[0] != number and other[1] is None), middle
        else:
            assert not free, middle


def test_no_rule_passes_the_balanced_coreference_probe_and_every_shipped_seed_does():
    """Half pronouns whose antecedent is a noun, half whose antecedent is a pronoun: the first noun outside phrases
    (right on every default item) and every other rule of the table at 0.5 +- BALANCE_BAND, each half as many
    answers of each form; the grammar's own rule (the subject of the clause before, noun or pronoun) at 1.000;
    every shipped seed at least 0.95, on a probe seed the notebook never uses."""
    from mhalib.language.probes import BALANCE_BAND, CHAIN, NGram, balanced_probe_set, finite_state_rules

    balanced = balanced_probe_set(400, TEST_SEED, kind="coreference")
    chained = np.isin(balanced.constructions, CHAIN["coreference"])
    assert chained.sum() == 200
    scores = dict(shallow_baselines(balanced), bigram=Bigram().probe_accuracy(balanced),
                  **{"5-gram": NGram().probe_accuracy(balanced)})
    assert all(abs(v - 0.5) <= BALANCE_BAND + 1e-12 for v in scores.values()), scores
    assert first_noun_outside_phrases_rule(balanced) == pytest.approx(scores["first noun outside phrases"])
    default = make_probe_set("coreference", 400, TEST_SEED)
    assert first_noun_outside_phrases_rule(default) == 1.0
    for part in (chained, ~chained):
        answers = list(balanced.answers[part])
        for pair in (("m", "f"), ("sg", "pl")):
            counts = [answers.count(a) for a in pair]
            assert abs(counts[0] - counts[1]) <= 2 * BALANCE_BAND * len(answers) + 1, (pair, counts)
    assert [v.mean() for v in finite_state_rules(balanced).values()] == [1.0]
    assert all(probe_accuracy(load_language_model(seed=s), balanced) >= 0.95 for s in SHIPPED_SEEDS)


def test_the_balanced_probe_and_its_helpers_refuse_what_they_cannot_build():
    from mhalib.language.probes import balanced_probe_set, concat_probe_sets, subset_probe_set

    with pytest.raises(ValueError, match="kind must be one of"):
        balanced_probe_set(100, TEST_SEED, kind="syntax")
    for n in (99, 0, True, 100.0):
        with pytest.raises(ValueError, match="n must be an int of at least 100"):
            balanced_probe_set(n, TEST_SEED)
    with pytest.raises(ValueError, match="one kind"):
        concat_probe_sets([make_probe_set("agreement", 5, 1), make_probe_set("coreference", 5, 1)])
    with pytest.raises(ValueError, match="non-empty list of ProbeSet"):
        concat_probe_sets([])
    with pytest.raises(ValueError, match="probes must be a ProbeSet"):
        subset_probe_set("items", [0])
    a, b = make_probe_set("agreement", 5, 1), make_probe_set("agreement", 7, 2)
    both = concat_probe_sets([a, b])
    assert len(both) == 12 and np.array_equal(subset_probe_set(both, np.arange(5, 12)).tokens, b.tokens)


def test_attractor_matches_reads_the_nearest_other_noun():
    from mhalib.language.probes import SAME_NUMBER, attractor_matches

    other = make_probe_set("agreement", 100, TEST_SEED)
    same = make_probe_set("agreement", 100, TEST_SEED, constructions=SAME_NUMBER["agreement"])
    assert set(attractor_matches(other)) == {"other"} and set(attractor_matches(same)) == {"same"}
    coref = attractor_matches(make_probe_set("coreference", 100, TEST_SEED))
    assert set(coref) <= {"same", "other", "none"} and "other" in coref


def test_the_n_gram_counts_as_a_loop_over_the_text_does():
    from mhalib.language.probes import NGram

    order, n = 4, 64
    text = sample_sequences(n, TEST_SEED, stream=0).tokens
    counts = {}
    for row in text:
        for t in range(len(row)):
            for k in range(min(order - 1, t) + 1):
                key = tuple(row[t - k:t + 1])
                counts[key] = counts.get(key, 0) + 1
    model = NGram(order, n, TEST_SEED)
    probes = make_probe_set("agreement", 200, TEST_SEED, constructions=["pp", "orc_verb"])
    votes = model.votes(probes)
    for i in range(len(probes)):
        row, t = probes.tokens[i], probes.positions[i]
        vote = 0.5
        for k in range(min(order - 1, t - 1), -1, -1):
            a = counts.get(tuple(row[t - k:t]) + (probes.correct[i],), 0)
            b = counts.get(tuple(row[t - k:t]) + (probes.wrong[i],), 0)
            if a or b:
                vote = 1.0 if a > b else 0.0 if b > a else 0.5
                break
        assert votes[i] == vote, i
    assert model.probe_accuracy(probes) == pytest.approx(votes.mean())
    with pytest.raises(ValueError, match="order must be"):
        NGram(1, 8, 0)


def test_every_seed_passes_per_number_the_control_and_the_held_out_constructions(seeds):
    agreement = make_probe_set("agreement", 400, TEST_SEED)
    coreference = make_probe_set("coreference", 400, TEST_SEED)
    control = make_probe_set("agreement", 200, TEST_SEED, constructions=CONTROL["agreement"])
    for seed, model in seeds.items():
        right = probe_margins(model, agreement) > 0
        for number in ("sg", "pl"):
            assert right[agreement.answers == number].mean() >= 0.98, (seed, number)
        assert probe_accuracy(model, coreference) >= 0.93, seed
        assert probe_accuracy(model, control) >= 0.98, seed
        for kind, constructions in HELD_OUT.items():
            for construction in constructions:
                held = make_probe_set(kind, 150, TEST_SEED, constructions=[construction])
                assert probe_accuracy(model, held) >= 0.75, (seed, kind, construction)


def test_patching_carries_the_number_through_layer_1_in_every_seed(seeds):
    """The twin run flips every verb and no patch of a layer-0 head does, in all ten seeds; one layer-1 head
    flips half of them or more in 9 of 10 (notebook 05, section 7; the tenth, seed 5, flips just under half),
    so at least 8 of 10 on these other items."""
    probes = make_probe_set("agreement", 200, TEST_SEED)
    carriers = 0
    for seed, model in seeds.items():
        flips = number_patching(model, probes)
        assert flips["none"] <= 0.02 and flips["all"] >= 0.98, (seed, flips)
        assert max(flips[(0, h)] for h in range(4)) <= 0.05, (seed, flips)
        assert max(flips[(1, h)] for h in range(4)) >= 0.4, (seed, flips)
        carriers += max(flips[(1, h)] for h in range(4)) >= 0.5
    assert carriers >= 8


# The claims that hold in fewer than all ten seeds (which head costs most, the paths of the layer-0 head,
# the plural fall-back under each ablation) are counted, and counted again on fresh items, in
# tests/test_language_claims.py.


def test_the_shipped_sweeps_have_the_seeds_the_notebook_counts_over():
    """The H sweep has 3 seeds per H, the variants 5 seeds each; each run changes one field of the recipe."""
    import json

    from mhalib.language.__main__ import RECIPE
    from mhalib.data import DATA_DIR

    sweep = json.loads((DATA_DIR / "language_heads.json").read_text())["runs"]
    by_h = {}
    for run in sweep:
        changed = {k for k in RECIPE if run["recipe"][k] != RECIPE[k]} - {"seed"}
        assert changed <= {"num_heads"}, changed
        by_h.setdefault(run["recipe"]["num_heads"], set()).add(run["recipe"]["seed"])
    assert set(by_h) >= {1, 2, 4, 8} and all(len(seeds) >= 3 for seeds in by_h.values()), by_h
    variants = json.loads((DATA_DIR / "language_variants.json").read_text())["runs"]
    groups = {}
    for run in variants.values():
        changed = {k for k in RECIPE if run["recipe"][k] != RECIPE[k]} - {"seed"}
        assert len(changed) == 1, changed
        groups.setdefault(changed.pop(), set()).add(run["recipe"]["seed"])
    assert groups and all(len(seeds) >= 5 for seeds in groups.values()), groups
    for seed in SHIPPED_SEEDS:
        recipe = load_language_model(seed=seed).metadata["recipe"]
        assert recipe == dict(RECIPE, seed=seed)


def test_notebook_05_counts_claims_over_the_seeds_it_ships():
    """Every "N of M seeds" in notebook 05's prose is a count its code prints, over the ten shipped seeds
    (five for the dropout variant, three per H in the H sweep)."""
    import json
    import re
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "05_heads_in_language.ipynb").read_text())
    text = lambda x: "".join(x) if isinstance(x, list) else x  # noqa: E731  (stored as a string or a list of lines)
    prose = " ".join(text(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    printed = " ".join(text(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"])
    claims = re.findall(r"(\d+) of (\d+) seeds", re.sub(r"\s+", " ", prose), flags=re.IGNORECASE)
    assert len(claims) >= 10
    for n, m in claims:
        assert int(m) in (len(SHIPPED_SEEDS), 5, 3), "claims count over the 10 shipped seeds (5 with dropout, 3 per H)"
        assert f"{n} of {m} seeds" in printed, f"the prose counts {n} of {m} seeds, but no cell prints that count"
    assert len(SHIPPED_SEEDS) == 10


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
        language_config(d_model=64, num_heads=7)
    with pytest.raises(ValueError, match="ProbeSet"):
        probe_accuracy(shipped, [1, 2, 3])
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        lm_loss(shipped, 4, -1)


def test_exercise_05_references_are_the_librarys_numbers_on_the_shipped_model(shipped):
    """The grader's NumPy references for exercise 05 agree with mhalib.language on real data."""
    from mhalib.grade.exercises import ex05_heads_in_language as ex
    from mhalib.interpret import attention_weights, relation_score
    from mhalib.language import sample_sequences, token_losses

    batch = sample_sequences(16, seed=11)
    weights = attention_weights(shipped, batch.tokens)  # (B, L, H, N, N)
    pairs = batch.relations["agreement"]
    library = relation_score(weights, pairs)  # (L, H)
    for layer in range(shipped.num_layers):
        np.testing.assert_allclose(ex.reference_relation_score(weights[:, layer], pairs), library[layer])
    probes = make_probe_set("coreference", 64, seed=11)
    from mhalib.runtime import num_threads

    with torch.no_grad(), num_threads(1):  # as the library runs the model
        logits = shipped(torch.as_tensor(probes.tokens)).numpy()
        ablated = shipped(torch.as_tensor(probes.tokens), ablate=[(1, 2)]).numpy()
    args = (probes.positions, probes.correct, probes.wrong)
    from mhalib.language.probes import margins_from_logits

    assert np.array_equal(ex.margins_from_logits(logits, *args), margins_from_logits(logits, *args))  # two readings
    assert not np.array_equal(ex.margins_from_logits(logits, *args), margins_from_logits(logits, args[0], args[2], args[1]))
    assert ex.reference_probe_accuracy(logits, *args) == probe_accuracy(shipped, probes)
    drop, rise = ex.reference_ablation_effect(logits, ablated, probes.tokens, *args)
    assert drop == probe_accuracy(shipped, probes) - probe_accuracy(shipped, probes, [(1, 2)]) > 0.2
    losses = np.nanmean(token_losses(shipped, probes.tokens, [(1, 2)])) - np.nanmean(token_losses(shipped, probes.tokens))
    assert rise == pytest.approx(losses, abs=1e-5) and rise > 0


def test_the_library_measures_the_shipped_model_as_it_did_when_it_was_saved(shipped):
    """Every number ``python -m mhalib.language`` stored with seed 0 (loss by role, every probe set,
    the five head scores, all nine ablations and the claim), measured again now, to float rounding (no
    probe item flips, on the native kernels and on the portable ones): the model
    code, the head scores and the ablation table have not moved since the weights were saved."""
    import json

    from mhalib.language.__main__ import measure
    from mhalib.runtime import num_threads

    with num_threads(1):
        now = json.loads(json.dumps(measure(shipped)))
    saved = shipped.metadata["measured"]

    def walk(a, b, where):
        assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, where
        if isinstance(a, dict):
            assert set(a) == set(b), where
            for k in a:
                walk(a[k], b[k], f"{where}/{k}")
        elif isinstance(a, list):
            assert len(a) == len(b), where
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{where}[{i}]")
        elif isinstance(a, float):
            assert abs(a - b) <= 2e-6 + 1e-5 * abs(b), (where, a, b)  # stored to 6 digits; other CPUs round apart
        else:
            assert a == b, (where, a, b)

    walk(now, saved, "measured")


def test_notebook_05s_counts_about_which_rule_the_models_follow_hold_on_fresh_items():
    """Notebook 05 counts, on its probe seed, the seeds whose choices follow "inside a clause the nearest noun, else
    the first noun outside phrases" on a clause inside a clause (6 of 10), and every seed's choices on the balanced
    set (all follow it); on fresh items the first count stays within two of that, the second exactly."""
    from mhalib.language.probes import balanced_probe_set, finite_state_rules

    models = [load_language_model(seed=s) for s in SHIPPED_SEEDS]

    def follows(probes):
        rule = finite_state_rules(probes)["clause: nearest noun, else first noun outside phrases"]
        picks = rule != 0.5
        chosen = np.stack([probe_margins(m, probes) > 0 for m in models])
        return ((chosen == (rule == 1))[:, picks]).mean(axis=1)

    centre = follows(make_probe_set("agreement", 400, TEST_SEED, constructions=["centre"]))
    assert 4 <= int((centre >= 0.9).sum()) <= 8, centre
    assert follows(balanced_probe_set(400, TEST_SEED)).min() >= 0.99
