"""Probes: does the model prefer the right form of a verb or a pronoun?

A probe item is a sequence of the grammar and one position in it where the grammar fixes
a word's form. The model passes the item when it gives the right form a higher
probability than the wrong one (the same verb with the other number, the same pronoun
with the other gender), as in Linzen et al. (2016) and Marvin & Linzen (2018). Only the
two forms are compared, so the model's uncertainty about *which* verb comes next does
not count.

* ``"agreement"``: a main verb, with an attractor of the *other* number between it and
  its subject ("the key near the cabinets | is"); constructions ``"pp"``, ``"orc"``
  (object relative clause), ``"src"`` (subject relative clause).
* ``"coreference"``: the pronoun of the antecedent against the pronoun of a competitor
  placed between them: "he" against "she" when the antecedent is a person and the
  competitor a person of the other gender, "it" against "they" when it is a thing and the
  competitor a thing of the other number (likewise "greets-him" against "greets-her");
  constructions ``"initial"`` (the next sentence's subject), ``"because"`` (notebook
  01's sentence in this grammar), ``"fused"`` (a verb carrying its object pronoun).

Probe sets for other questions, by construction name (:func:`make_probe_set`'s ``constructions``):
:data:`CONTROL` (no attractor), :data:`HELD_OUT` (two phrases: never in the training text),
:data:`SAME_NUMBER` (an attractor of the subject's own number: with the default's other-number
attractors they measure attraction, split by :func:`attractor_matches`), :data:`STRUCTURE` (the
verb inside a relative clause, and inside a clause within a clause: the first noun outside
phrases does not decide them), :data:`ADVERB` (an adverb before the verb: held out),
:data:`ACROSS` (a phrase inside a relative clause: held out) and :data:`CHAIN` (a pronoun whose
antecedent is a pronoun). :func:`balanced_probe_set` mixes two halves so that every rule below
scores one half; :func:`finite_state_rules` are rules that still pass it.

Baselines that use no syntax: :class:`Bigram` (the next word from the previous word),
:class:`NGram` (from the previous n - 1 words, with back-off) and :func:`shallow_baselines`
(first noun, first noun outside phrases, nearest noun, majority class, second-nearest noun,
opposite of the nearest noun, a noun a fixed 5 words back, majority of the nouns, the last
finite verb). These are the rules tried, not every shallow rule: some of them pass some
sets (the second-nearest noun, and the opposite of the nearest, both pass the default
agreement probe, where exactly one attractor of the other number stands right before the
verb); a set that a rule passes shows only what that rule cannot tell apart.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

from mhalib.language.grammar import (ADVERBS, BOS, INTRANSITIVE, NAMES, PEOPLE, PREPOSITIONS, SEQ_LEN, SUBORDINATORS,
                                     THINGS, TRANSITIVE, VOCAB, WITH_OBJECT_PRONOUN, WORD_TO_ID, Grammar, _OBJECT_FORMS,
                                     _fused, _plural, _verb, decode, encode, make_rng, other_number, sample_sequences,
                                     Event)
from mhalib.language.training import TRAIN_STREAM
from mhalib.runtime import measuring

__all__ = ["PROBE_KINDS", "HELD_OUT", "CONTROL", "SAME_NUMBER", "STRUCTURE", "ADVERB", "ACROSS", "BALANCED_POOL",
           "BALANCE_BAND", "ProbeSet", "make_probe_set", "balanced_probe_set", "concat_probe_sets", "subset_probe_set",
           "rule_votes", "finite_state_rules",
           "shallow_baselines", "shallow_votes", "attractor_matches", "probe_tokens", "probe_margins", "margins_from_logits",
           "probe_accuracy", "Bigram", "NGram"]

PROBE_KINDS = ("agreement", "coreference")
_STREAM = {"agreement": 2, "coreference": 3}
_OTHER = {"m": "f", "f": "m", "sg": "pl", "pl": "sg"}


@dataclass
class ProbeSet:
    """Probe items: sequences, the position to predict, the right and the wrong word.

    Attributes:
        kind: "agreement" or "coreference".
        tokens: ``(n, N)`` int64 NumPy array of whole sequences (only the tokens before
            ``positions`` matter: the model is causal).
        positions: ``(n,)`` position of the word to predict (predicted from position - 1).
        correct, wrong: ``(n,)`` token ids of the right form and of the other form.
        keys: ``(n,)`` position of the word the form depends on (subject or antecedent).
        constructions: ``(n,)`` array of construction names (see the module docstring).
        answers: ``(n,)`` the feature that decides the right form: the subject's number
            ("sg", "pl") for agreement; the antecedent's gender ("m", "f") or, for a
            thing, its number ("sg", "pl") for coreference.
        second_keys: ``(n,)`` for a word with two dependencies (a verb carrying its object
            pronoun, "greet-it"), the position of the *other* word its form depends on
            (its subject, for a coreference item); -1 for every other item.
    """

    kind: str
    tokens: np.ndarray
    positions: np.ndarray
    correct: np.ndarray
    wrong: np.ndarray
    keys: np.ndarray
    constructions: np.ndarray
    answers: np.ndarray
    second_keys: np.ndarray = None

    def __post_init__(self):
        if self.second_keys is None:
            self.second_keys = np.full(len(self.positions), -1, dtype=np.int64)

    def __len__(self):
        return len(self.positions)

    def prefix(self, i):
        """The words of item ``i`` up to the word to predict, then ``right | wrong``."""
        words = decode(self.tokens[i, : self.positions[i]])
        return " ".join(words) + f" [{VOCAB[self.correct[i]]} | {VOCAB[self.wrong[i]]}]"


AGREEMENT_CONSTRUCTIONS = ("pp", "orc", "src")
COREFERENCE_CONSTRUCTIONS = ("initial", "because", "fused")
#: Constructions the training text never has, built only for probes: two prepositional
#: phrases as the attractor ("pp_pp"), or two introductory phrases before the subject
#: (or antecedent) ("intro_pp2").
HELD_OUT = {"agreement": ("pp_pp", "intro_pp2"), "coreference": ("intro_pp2",)}
#: A control: agreement with nothing between subject and verb ("none").
CONTROL = {"agreement": ("none",)}
#: The constructions of the default agreement probe with an attractor of the *same* number as
#: the subject ("the key near the cabinet | is"): beside the default (other number) they
#: measure attraction. The training text has both (its attractors' numbers are drawn freely).
SAME_NUMBER = {"agreement": ("pp_same", "orc_same", "src_same")}
#: Agreement where the deciding noun is neither the first noun of the sentence outside its
#: phrases nor the nearest noun; every other noun has a number drawn independently:
#: ``"orc_verb"``, the verb *inside* an object relative clause ("the dog that the cats |
#: chase", in the training text; the nearest noun decides it) and ``"centre"``, the verb of
#: a relative clause with another one inside it ("the dog that the cats that the bird sees |
#: chase", never in the training text: neither first-noun rule, the nearest noun nor an n-gram decides it;
#: the second-nearest noun and the noun 5 words back do, and so does a finite-state counter of "that"s).
STRUCTURE = {"agreement": ("orc_verb", "centre")}
#: An adverb between the subject (or its attractor) and the verb ("the birds behind the tree
#: now | run"); the training text puts adverbs only after verbs. ``"adverb_pp"`` has a
#: prepositional attractor of a number drawn at random, ``"adverb"`` none.
ADVERB = {"agreement": ("adverb_pp", "adverb")}
#: The verb inside an object relative clause whose subject has a prepositional phrase of its
#: own ("the dog that the cats near the house | chase"): never in the training text (its
#: relative clauses have no phrases inside them). The nearest noun, the first noun outside
#: phrases and the noun 5 words back all have numbers drawn apart from the answer.
ACROSS = {"agreement": ("orc_verb_pp",)}
#: Coreference whose antecedent is itself a pronoun: the antecedent's sentence, then one whose
#: subject is a pronoun for it, then the pronoun to predict ("mary runs . she sees the king .
#: | she"). In ``"chain"`` the middle sentence's object competes (the other gender, or a thing
#: of the other number), so the first noun outside phrases of the sentence before the pronoun
#: is that competitor; ``"chain_free"`` has no competitor. The training text has such chains
#: (a pronoun subject refers to the previous subject, pronoun or not).
CHAIN = {"coreference": ("chain", "chain_free")}
#: Constructions built word by word for probes only (:func:`_built_item`), not by the grammar.
_BUILT = STRUCTURE["agreement"] + ADVERB["agreement"] + ACROSS["agreement"]
#: What :func:`balanced_probe_set` draws its pool from, in two halves (every construction in
#: the training text): main verbs across an attractor of either number, and verbs inside an
#: object relative clause; pronouns whose antecedent is a noun, and pronouns whose antecedent
#: is itself a pronoun (:data:`CHAIN`).
BALANCED_POOL = {"agreement": (AGREEMENT_CONSTRUCTIONS + SAME_NUMBER["agreement"], ("orc_verb",)),
                 "coreference": (COREFERENCE_CONSTRUCTIONS, CHAIN["coreference"])}
#: What the two halves of each pool are, in words.
BALANCED_HALVES = {"agreement": ("main verbs", "verbs in a clause"),
                   "coreference": ("antecedent a noun", "antecedent a pronoun")}
#: How far from 1/2 a rule may score on a balanced set (:func:`balanced_probe_set`). The
#: search aims 0.01 inside it and stops when every rule is there, so several rules end near
#: 0.54: the verbs inside a clause are right for every local rule and the main verbs for
#: both first-noun rules, so about half of each is needed, and little room is left.
BALANCE_BAND = 0.05
#: :func:`balanced_probe_set` draws ``POOL_FACTOR * n`` items of each half of its pool.
POOL_FACTOR = 3


def _agreement_item(grammar, rng, construction):
    number = grammar._choice(rng, ("sg", "pl"))  # balanced: half the subjects are plural
    subject = "thing" if number == "pl" else grammar._choice(rng, {"thing": 0.5, "person": 0.25, "name": 0.25})
    predicate = grammar._choice(rng, ("intransitive", "copula", "transitive", "because", "fused"))
    same = construction.endswith("_same")
    attractor = {"pp_pp": "pp2", "intro_pp2": "pp"}.get(construction, construction.removesuffix("_same"))
    intro = "pp2" if construction == "intro_pp2" else grammar._choice(rng, ("pp", "clause"))
    intro_np = {"kind": "thing", "number": grammar._choice(rng, ("sg", "pl"))}
    target = dict(subject=subject, subject_number=number, attractor=attractor,
                  attractor_number=number if same else _OTHER[number], predicate=predicate, intro=intro,
                  intro_np=intro_np)
    forced = [None] * int(rng.random() < 0.5)
    if predicate == "fused":  # its object pronoun needs a singular person before it
        forced.append(dict(subject=grammar._choice(rng, ("person", "name"))))
    return forced + [target], number


def _built_item(grammar, rng, construction, seq_len):
    """One item of a construction the grammar does not generate (:data:`STRUCTURE`, :data:`ADVERB`).

    Every noun is a thing ("the dog", "the cats"), so every noun has a number, drawn on its
    own: the deciding noun's number is the answer (half singular), the others' numbers are
    independent of it. The sentence opens with no introduction, a phrase or a clause (drawn),
    follows one free sentence in half the items, and free sentences fill the sequence.

    Returns:
        ``(words, target, key, answer)``.
    """
    def thing(number=None):
        number = number or grammar._choice(rng, ("sg", "pl"))
        noun = grammar._choice(rng, THINGS)
        return ["the", noun if number == "sg" else _plural(noun)], number

    answer = grammar._choice(rng, ("sg", "pl"))
    intro_kind = grammar._choice(rng, ("none", "pp", "clause"))
    words, _ = grammar.intro(rng, intro_kind, {"kind": "thing", "number": grammar._choice(rng, ("sg", "pl"))})
    if construction in ("orc_verb", "centre", "orc_verb_pp"):
        outer, outer_number = thing()
        words += outer + ["that"]
        key = len(words) + 1
        inner, _ = thing(answer)
        words += inner
        if construction == "orc_verb_pp":  # "the dog that the cats near the house | chase"
            words += [grammar._choice(rng, PREPOSITIONS)] + thing()[0]
        if construction == "centre":  # "the dog that the cats that the bird sees | chase"
            third, third_number = thing()
            words += ["that"] + third + [_verb(grammar._choice(rng, TRANSITIVE), third_number)]
        target = len(words)
        words += [_verb(grammar._choice(rng, TRANSITIVE), answer), _verb(grammar._choice(rng, INTRANSITIVE),
                                                                         outer_number), "."]
    elif construction in ("adverb_pp", "adverb"):  # "the birds (behind the tree) now | run"
        subject, _ = thing(answer)
        key = len(words) + 1
        words += subject
        if construction == "adverb_pp":
            words += [grammar._choice(rng, PREPOSITIONS)] + thing()[0]
        words.append(grammar._choice(rng, ADVERBS))
        target = len(words)
        if rng.random() < 0.5:
            words += [_verb(grammar._choice(rng, INTRANSITIVE), answer), "."]
        else:
            words += [_verb(grammar._choice(rng, TRANSITIVE), answer)] + thing()[0] + ["."]
    else:
        raise ValueError(f"no built construction {construction!r}; built ones: {_BUILT}")
    sequence = [BOS]
    if rng.random() < 0.5:
        sequence += grammar.sentence(rng, 1, None).words
    start = len(sequence)
    sequence += words
    while len(sequence) < seq_len:
        sequence += grammar.sentence(rng, len(sequence), None).words
    if start + target >= seq_len:
        raise ValueError(f"seq_len={seq_len} is too short for a {construction!r} item")
    return sequence[:seq_len], start + target, start + key, answer


def _coreference_item(grammar, rng, construction):
    kind = grammar._choice(rng, grammar.subject_kinds)  # the antecedent: a thing, a person, a name
    intro = "pp2" if construction == "intro_pp2" else grammar._choice(rng, ("pp", "clause"))
    if kind == "thing":  # "it" against "they": a thing of the other number competes
        answer = grammar._choice(rng, ("sg", "pl"))
        antecedent = dict(subject=kind, subject_number=answer, distractor=("number", _OTHER[answer]))
        intro_np = {"kind": "thing", "number": grammar._choice(rng, ("sg", "pl"))}
    else:  # "he" against "she": a person of the other gender competes
        answer = grammar._choice(rng, ("m", "f"))
        antecedent = dict(subject=kind, subject_gender=answer, distractor=("gender", _OTHER[answer]))
        intro_np = {"kind": grammar._choice(rng, ("person", "name")), "gender": grammar._choice(rng, ("m", "f"))}
    antecedent.update(intro=intro, intro_np=intro_np)  # a noun before the antecedent
    if construction != "because":  # no pronoun in the antecedent's sentence to copy
        antecedent["predicate"] = grammar._choice(rng, ("intransitive", "copula", "transitive"))
    forced = [None] * int(rng.random() < 0.5)
    if construction in CHAIN["coreference"]:  # "mary runs . she sees the king . | she"
        competitor = antecedent.pop("distractor")
        middle = dict(subject="pronoun", predicate="transitive", distractor=competitor) if construction == "chain" \
            else dict(subject="pronoun", predicate=grammar._choice(rng, ("intransitive", "copula")))
        forced += [antecedent, middle, dict(subject="pronoun")]
    elif construction in ("initial", "intro_pp2"):
        forced += [antecedent, dict(subject="pronoun")]
    elif construction == "because":
        forced += [dict(antecedent, predicate="because")]
    elif construction == "fused":
        forced += [antecedent, dict(subject=grammar._choice(rng, grammar.subject_kinds), predicate="fused")]
    return forced, answer


def make_probe_set(kind, n, seed, seq_len=SEQ_LEN, constructions=None):
    """``n`` probe items of ``kind`` drawn with ``seed``; the same arguments give the same set.

    Args:
        kind: "agreement" or "coreference".
        n: number of items.
        seed: seed of this probe set's own stream (different from the training text's).
        seq_len: tokens per sequence.
        constructions: which constructions to draw from (uniformly). Default: the
            constructions of the module docstring. Also allowed: :data:`HELD_OUT` (never in
            the training text), :data:`CONTROL` (agreement without an attractor),
            :data:`SAME_NUMBER`, :data:`STRUCTURE`, :data:`ADVERB`, :data:`ACROSS` and :data:`CHAIN`.

    Returns:
        a :class:`ProbeSet`. Every item has a noun before the subject (agreement) or before
        the antecedent (coreference), in an introductory phrase or clause, whose number or
        gender is drawn independently of the answer; agreement subjects are half singular,
        half plural. Half the items start with one free sentence before the forced ones.
    """
    if kind not in PROBE_KINDS:
        raise ValueError(f"kind must be one of {PROBE_KINDS}; got {kind!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int; got {n!r}")
    default = AGREEMENT_CONSTRUCTIONS if kind == "agreement" else COREFERENCE_CONSTRUCTIONS
    # (new constructions go at the end: a set's stream number comes from this order)
    allowed = default + HELD_OUT[kind] + CONTROL.get(kind, ()) + SAME_NUMBER.get(kind, ()) + \
        STRUCTURE.get(kind, ()) + ADVERB.get(kind, ()) + ACROSS.get(kind, ()) + CHAIN.get(kind, ())
    constructions = default if constructions is None else tuple(constructions)
    if not constructions or any(c not in allowed for c in constructions):
        raise ValueError(f"constructions for {kind!r} must be a non-empty list from {allowed}; got {constructions!r}")
    stream = _STREAM[kind] + (0 if constructions == default else 10 + allowed.index(constructions[0]))
    rng = make_rng(seed, stream)
    grammar = Grammar()
    make_item = _agreement_item if kind == "agreement" else _coreference_item
    rows, positions, correct, wrong, keys, built, answers, second = [], [], [], [], [], [], [], []
    for _ in range(n):
        construction = grammar._choice(rng, constructions)
        if construction in _BUILT:
            words, target, key, answer = _built_item(grammar, rng, construction, seq_len)
            right = words[target]
            event = Event("agreement", target, key, right, other_number(right))
            second.append(-1)
        else:
            forced, answer = make_item(grammar, rng, construction)
            words, events, _, marks = grammar.sequence(rng, seq_len, forced)
            # the main verb (not the verb of an introductory clause), or the pronoun
            event = next(e for e in events[marks[-1]:] if e.relation == kind and (kind == "coreference" or e.across))
            other = [e.key for e in events[marks[-1]:] if e.target == event.target and e.relation != kind]
            second.append(other[0] if other else -1)
        rows.append(encode(words))
        positions.append(event.target)
        correct.append(encode([event.correct])[0])
        wrong.append(encode([event.wrong])[0])
        keys.append(event.key)
        built.append(construction)
        answers.append(answer)
    as_int = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    return ProbeSet(kind, as_int(rows), as_int(positions), as_int(correct), as_int(wrong), as_int(keys),
                    np.array(built), np.array(answers), as_int(second))


#: The per-item arrays of a :class:`ProbeSet`, in the order its constructor takes them.
_ITEM_FIELDS = tuple(f.name for f in fields(ProbeSet) if f.name != "kind")


def concat_probe_sets(sets):
    """One :class:`ProbeSet` of the items of ``sets`` (of one kind and one sequence length), in order."""
    sets = list(sets)
    if not sets or any(not isinstance(p, ProbeSet) for p in sets):
        raise ValueError("sets must be a non-empty list of ProbeSet")
    if len({p.kind for p in sets}) > 1 or len({p.tokens.shape[1] for p in sets}) > 1:
        raise ValueError(f"sets must share one kind and one sequence length; got "
                         f"{sorted({(p.kind, p.tokens.shape[1]) for p in sets})}")
    return ProbeSet(sets[0].kind, *(np.concatenate([getattr(p, f) for p in sets]) for f in _ITEM_FIELDS))


def subset_probe_set(probes, index):
    """The items ``index`` (an array of item numbers, or a boolean mask) of ``probes``."""
    _check_probes(probes)
    return ProbeSet(probes.kind, *(getattr(probes, f)[index] for f in _ITEM_FIELDS))


_RULE_MODELS = {}


def rule_votes(probes):
    """Item by item, what every rule without syntax scores: :func:`shallow_votes` and the n-grams.

    The bigram and the 5-gram are counted on the training text (:class:`Bigram`,
    :class:`NGram` with their defaults, built once and kept); a tie counts 1/2.

    Returns:
        dict rule -> ``(n,)`` float array of 1, 0 or 1/2.
    """
    if not _RULE_MODELS:
        _RULE_MODELS.update(bigram=Bigram(), ngram=NGram())
    votes = shallow_votes(probes)
    margins = _RULE_MODELS["bigram"].margins(probes)
    votes["bigram"] = (margins > 0) + 0.5 * (margins == 0)
    votes["5-gram"] = _RULE_MODELS["ngram"].votes(probes)
    return votes


def balanced_probe_set(n, seed, seq_len=SEQ_LEN, kind="agreement"):
    """``n`` items of ``kind`` on which every rule of :func:`rule_votes` scores 1/2 +- :data:`BALANCE_BAND`.

    A probe that one rule without syntax passes cannot tell a model that uses the rule from
    one that follows the grammar. This set is built so that none passes: a pool of
    ``2 * POOL_FACTOR * n`` items is drawn in two halves (:data:`BALANCED_POOL`), and ``n`` of
    them, half from each half of the pool, are kept by a seeded search that swaps one item in
    for one item out of the same half whenever that brings every rule's score, and within
    each half the share of the first answer of each pair ("sg" of "sg"/"pl", "m" of
    "m"/"f"), no further from a band a little inside :data:`BALANCE_BAND`.

    * agreement: main verbs across an attractor of either number ("the key near the
      cabinets | is") and verbs inside an object relative clause ("the dog that the cats |
      chase"). The main verb follows the first noun outside phrases and the second-nearest
      noun; the verb in the clause follows the nearest noun and the previous word; so a set
      that defeats each of them needs both, with the other nouns' numbers chosen against
      whichever rule the rest favour;
    * coreference: pronouns whose antecedent is a noun (the default constructions) and
      pronouns whose antecedent is itself a pronoun (:data:`CHAIN`: "mary runs . she sees
      the king . | she"), where the first noun outside phrases of the sentence before is a
      competitor. Only few antecedents are things: for a thing the last finite verb of the
      sentence before has the antecedent's number, so that rule passes unless most answers
      are "he" or "she" (a gender, which no verb shows).

    What it does not defeat: every rule above is right on one half and wrong on the other,
    so any rule that tells the halves apart passes, for instance those of
    :func:`finite_state_rules` (1.000). They are finite-state, and so is the language. The
    selection looks at these rules only, never at a model.

    Args:
        n: number of items (at least 100).
        seed: seed of the pool and of the search; the same arguments give the same set.
        seq_len: tokens per sequence.
        kind: "agreement" or "coreference".

    Returns:
        a :class:`ProbeSet` whose ``constructions`` name each item's construction.

    Raises:
        RuntimeError: when the search cannot bring a rule into the band (it names the rule).
    """
    if kind not in PROBE_KINDS:
        raise ValueError(f"kind must be one of {PROBE_KINDS}; got {kind!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 100:
        raise ValueError(f"n must be an int of at least 100 (fewer items leave the search too little room); got {n!r}")
    main, inner = BALANCED_POOL[kind]
    size = POOL_FACTOR * n
    pool = concat_probe_sets([make_probe_set(kind, size, seed, seq_len, constructions=main),
                              make_probe_set(kind, size, seed, seq_len, constructions=inner)])
    votes = rule_votes(pool)
    rules = [r for r in votes if r != "majority"]  # the majority: the answers' shares, below
    # Half the kept items from each half of the pool, and within each half as many answers of
    # each form: otherwise "in a clause say singular" could pass a set where every rule above
    # is balanced overall.
    half = np.arange(2 * size) >= size  # False: the first half of BALANCED_POOL; True: the second
    first = np.isin(pool.answers, ("sg", "m")).astype(float)
    columns = rules + [f"first answers of a pair among {h}" for h in BALANCED_HALVES[kind]]
    scores = np.stack([votes[r] for r in rules] + [first * ~half, first * half], axis=1)
    kept = np.array([n // 2] * len(rules) + [n // 2, n - n // 2], dtype=float)  # what each column is a share of
    scores[:, :len(rules)] /= n
    scores[:, len(rules):] /= kept[len(rules):]
    rng = np.random.default_rng([seed, 29])
    parts = []
    for h, count in ((False, n // 2), (True, n - n // 2)):
        order = rng.permutation(np.flatnonzero(half == h))
        parts.append([order[:count].copy(), order[count:].copy()])

    aim = 0.8 * BALANCE_BAND  # aim inside the band, so that the scores do not end on its edge

    def distance(share):  # how far the shares lie outside the aimed band, squared and summed
        return float((np.maximum(np.abs(share - 0.5) - aim, 0.0) ** 2).sum())

    share = sum(scores[inside].sum(axis=0) for inside, _ in parts)
    cost = distance(share)
    for _ in range(200 * n):
        if cost == 0.0:
            break
        inside, outside = parts[rng.integers(2)]  # one item in for one out, of the same half
        i, o = rng.integers(len(inside)), rng.integers(len(outside))
        swapped = share - scores[inside[i]] + scores[outside[o]]
        new = distance(swapped)
        if new <= cost:
            inside[i], outside[o] = outside[o], inside[i]
            share, cost = swapped, new
    if np.abs(share - 0.5).max() > BALANCE_BAND + 1e-9:
        off = {c: round(float(v), 3) for c, v in zip(columns, share) if abs(v - 0.5) > BALANCE_BAND}
        raise RuntimeError(f"no balanced set of {n} items found for seed {seed}: outside 0.5 +- {BALANCE_BAND}: {off}")
    inside = np.concatenate([parts[0][0], parts[1][0]])
    return subset_probe_set(pool, np.sort(inside))


def _check_probes(probes):
    if not isinstance(probes, ProbeSet):
        raise ValueError(f"probes must be a ProbeSet from make_probe_set(kind, n, seed); got {type(probes).__name__}")


def probe_tokens(probes):
    """The probe sequences cut after the last position any item predicts: ``(n, N')`` int64 tensor.

    The model is causal, so the tokens after that change nothing; patches passed to
    :func:`probe_margins` must have this length ``N'``.
    """
    _check_probes(probes)
    return torch.as_tensor(probes.tokens[:, : int(probes.positions.max())])  # (n, N')


def probe_margins(model, probes, ablate=None, *, threads=1, replace_z=None, replace_weights=None):
    """``log p(right) - log p(wrong)`` for every item: positive means the model is right.

    Args:
        model: a :class:`~mhalib.decoder.Decoder`.
        probes: a :class:`ProbeSet`.
        ablate: list of ``(layer, head)`` pairs whose outputs are zeroed.
        replace_z, replace_weights: patches, as in :meth:`~mhalib.decoder.Decoder.forward`, over
            the tokens of :func:`probe_tokens`.

    Returns:
        NumPy ``(n,)`` float64, in nats.
    """
    tokens = probe_tokens(probes)  # (n, N')
    with measuring(model, threads):
        logits = model(tokens, ablate=ablate, replace_z=replace_z, replace_weights=replace_weights)  # (n, N', V)
    return margins_from_logits(logits.numpy(), probes.positions, probes.correct, probes.wrong)


def margins_from_logits(logits, positions, correct, wrong):
    """``logit(right) - logit(wrong)`` where each item's word is predicted: NumPy ``(n,)`` float64.

    Args:
        logits: ``(n, N, V)``, one row of items each.
        positions: ``(n,)`` where each item's word stands; it is predicted at ``position - 1``.
        correct, wrong: ``(n,)`` token ids of the two forms.

    Equal to ``log p(right) - log p(wrong)``: softmax's normaliser cancels.
    """
    x = np.asarray(logits, dtype=np.float64)
    rows = np.arange(x.shape[0])
    at = x[rows, np.asarray(positions) - 1]  # (n, V): the predicting position
    return at[rows, correct] - at[rows, wrong]


def probe_accuracy(model, probes, ablate=None):
    """Fraction of items where the model gives the right form the higher probability.

    Args:
        model: a :class:`~mhalib.decoder.Decoder`.
        probes: a :class:`ProbeSet` from :func:`make_probe_set`.
        ablate: list of ``(layer, head)`` pairs whose outputs are zeroed, e.g. ``[(1, 2)]``.

    Returns:
        float in [0, 1].
    """
    return float((probe_margins(model, probes, ablate) > 0).mean())


def _noun_features():
    """word -> (number, gender) for every noun; gender None for things."""
    features = {}
    for noun in THINGS:
        features[noun], features[_plural(noun)] = ("sg", None), ("pl", None)
    for gender in "mf":
        for word in PEOPLE[gender] + NAMES[gender]:
            features[word] = ("sg", gender)
    return features


_NOUN = {WORD_TO_ID[w]: f for w, f in _noun_features().items()}
_PERIOD, _BECAUSE = WORD_TO_ID["."], WORD_TO_ID["because"]


_SKIP_AFTER = {WORD_TO_ID[w] for w in PREPOSITIONS + SUBORDINATORS + ("because",)}
_THE = WORD_TO_ID["the"]
_NOT = WORD_TO_ID["not"]


def _finite_verb_numbers():
    """word id -> number ("sg", "pl") for every finite verb form (a form after "not" is not finite)."""
    forms = {"is": "sg", "are": "pl", "does": "sg", "do": "pl"}
    for number in ("sg", "pl"):
        for lemma in INTRANSITIVE + TRANSITIVE:
            forms[_verb(lemma, number)] = number
        for lemma in WITH_OBJECT_PRONOUN:
            for pronoun in _OBJECT_FORMS:
                forms[_fused(lemma, number, pronoun)] = number
    return {WORD_TO_ID[w]: n for w, n in forms.items()}


_VERB_NUMBER = _finite_verb_numbers()
#: How far back the "noun k words back" rule looks: 5, the offset that scores best on the
#: default agreement probe among k = 1..8 (chosen on the probe itself: an upper bound on
#: what a fixed position gives there).
FIXED_OFFSET = 5


def shallow_baselines(probes):
    """Accuracy of rules that use position or surface form, not syntax.

    * ``"first noun"``: agreement: the verb takes the number of the first noun of its
      sentence; coreference: the pronoun refers to the first noun of the previous
      sentence, or of its own sentence when a "because" comes before it. On the first
      version of this grammar (subjects always first) both scored 1.0;
    * ``"first noun outside phrases"``: the same, skipping every noun that follows a
      preposition or a subordinator ("when", "while", "because"; a "the" in between is
      skipped too). A finite-state rule over word categories: it solves the default probes
      (the grammar puts every subject there) and fails :data:`STRUCTURE`;
    * ``"nearest noun"``: the noun closest before the word to predict;
    * ``"majority"``: always the more frequent answer of each pair of forms in this set
      ("sg" or "pl"; "m" or "f");
    * ``"second-nearest noun"``: the noun before the nearest one;
    * ``"opposite of the nearest noun"``: the form the nearest noun does *not* ask for (on a
      set built so that the nearest noun always misleads, this rule is always right);
    * ``"noun 5 words back"``: the word :data:`FIXED_OFFSET` positions before the word to
      predict, when it is a noun (a fixed position);
    * ``"majority of nouns"``: the form most nouns of the sentence (the scope of "first
      noun") ask for;
    * ``"last finite verb"``: the number of the last finite verb in that scope (for
      coreference, the previous sentence's, or its own after "because"); a gender answer
      gets 1/2.

    A noun that says nothing about the two forms (a thing for "he"/"she") counts 1/2, and
    so does a rule that finds no noun (or a tie).

    Returns:
        dict rule -> accuracy in [0, 1]: the mean of :func:`shallow_votes`.
    """
    return {rule: float(np.mean(votes)) for rule, votes in shallow_votes(probes).items()}


_TRANSITIVE_FORMS = {WORD_TO_ID[_verb(v, number)] for v in TRANSITIVE for number in ("sg", "pl")}
_THAT = WORD_TO_ID["that"]


_SUBJECT_PRONOUNS = {WORD_TO_ID["he"]: ("sg", "m"), WORD_TO_ID["she"]: ("sg", "f"), WORD_TO_ID["it"]: ("sg", None),
                     WORD_TO_ID["they"]: ("pl", None)}


def _scope(row, t, kind):
    """The positions a rule reads for the word at ``t``: its sentence up to it; for a pronoun, the
    previous sentence, or its own sentence when a "because" comes before the pronoun."""
    periods = [i for i in range(t) if row[i] == _PERIOD]
    start = periods[-1] + 1 if periods else 1
    if kind == "coreference" and _BECAUSE not in row[start:t]:
        return range(periods[-2] + 1 if len(periods) > 1 else 1, start)  # the previous sentence
    return range(start, t)


def _previous_subject(probes):
    """Coreference: the first noun or subject pronoun outside phrases of the antecedent's clause."""
    out = []
    for row, t, answer in zip(probes.tokens, probes.positions, probes.answers):
        scope = _scope(row, t, "coreference")
        words = [int(row[i]) for i in scope if (int(row[i]) in _NOUN or int(row[i]) in _SUBJECT_PRONOUNS)
                 and not _after_phrase_word(row, i, scope.start)]
        feature = (_NOUN.get(words[0]) or _SUBJECT_PRONOUNS[words[0]]) if words else None
        out.append(_vote(feature, answer, "coreference") if feature else 0.5)
    return np.asarray(out, dtype=float)


def finite_state_rules(probes):
    """Item by item, rules over word categories that switch on what they read, unlike the table's.

    Every rule of :func:`shallow_baselines` picks one noun by one criterion. These switch
    criterion by what the words around the target are, with no tree and no memory beyond a
    few words (finite-state, as the language is).

    For coreference, one rule: the pronoun of the subject of the clause before (of the
    previous sentence, or of its own main clause after "because"), read as its first noun or
    subject pronoun outside phrases: the grammar's own rule.

    For agreement, two rules that tell a main verb from a verb in a clause:

    * ``"clause: nearest noun, else first noun outside phrases"``: when the three words
      before the verb are "that the <noun>", the nearest noun; otherwise the first noun
      outside phrases (:func:`shallow_baselines`);
    * ``"last noun after no phrase word or verb, before no verb"``: the last noun of the
      sentence that does not follow a preposition, a subordinator or a transitive verb (a
      "the" in between is skipped) and does not stand right before a finite verb.

    All pass :func:`balanced_probe_set` (1.000); the two agreement rules differ on
    constructions the training text never has (:data:`STRUCTURE`'s ``"centre"``, :data:`ACROSS`), where the second is
    right and the first is a coin flip.

    Returns:
        dict rule -> ``(n,)`` float array of 1, 0 or 1/2 (no such noun).
    """
    _check_probes(probes)
    if probes.kind == "coreference":
        return {"subject of the clause before: first noun or pronoun outside phrases": _previous_subject(probes)}
    clause, free = [], []
    outside = shallow_votes(probes)["first noun outside phrases"]
    for i, (row, t, answer) in enumerate(zip(probes.tokens, probes.positions, probes.answers)):
        row = [int(w) for w in row]
        if t >= 4 and row[t - 3] == _THAT and row[t - 2] == _THE and row[t - 1] in _NOUN:
            clause.append(_vote(_NOUN[row[t - 1]], answer, "agreement"))
        else:
            clause.append(outside[i])
        scope = _scope(row, t, "agreement")
        kept = []
        for j in scope:
            if row[j] not in _NOUN:
                continue
            before = j - 1 - (row[j - 1] == _THE)
            after_phrase = before >= scope.start and (row[before] in _SKIP_AFTER or row[before] in _TRANSITIVE_FORMS)
            if not after_phrase and not (j + 1 < t and row[j + 1] in _VERB_NUMBER):
                kept.append(row[j])
        free.append(_vote(_NOUN[kept[-1]], answer, "agreement") if kept else 0.5)
    return {"clause: nearest noun, else first noun outside phrases": np.asarray(clause, dtype=float),
            "last noun after no phrase word or verb, before no verb": np.asarray(free, dtype=float)}


def shallow_votes(probes):
    """Item by item, what each rule of :func:`shallow_baselines` scores: 1, 0 or 1/2.

    Returns:
        dict rule -> ``(n,)`` float array (the ``"majority"`` rule votes for the more frequent
        answer of this set).
    """
    _check_probes(probes)
    kind = probes.kind
    first, outside, nearest = [], [], []
    second, opposite, offset, most, verb = [], [], [], [], []
    for row, t, answer in zip(probes.tokens, probes.positions, probes.answers):
        scope = _scope(row, t, kind)
        nouns = [int(row[i]) for i in scope if int(row[i]) in _NOUN]
        first.append(_vote(_NOUN[nouns[0]], answer, kind) if nouns else 0.5)
        free = [int(row[i]) for i in scope if int(row[i]) in _NOUN and not _after_phrase_word(row, i, scope.start)]
        outside.append(_vote(_NOUN[free[0]], answer, kind) if free else 0.5)
        before = [int(row[i]) for i in range(1, t) if int(row[i]) in _NOUN]
        nearest.append(_vote(_NOUN[before[-1]], answer, kind) if before else 0.5)
        second.append(_vote(_NOUN[before[-2]], answer, kind) if len(before) > 1 else 0.5)
        opposite.append(1.0 - nearest[-1])
        back = int(row[t - FIXED_OFFSET]) if t - FIXED_OFFSET >= 1 else None
        offset.append(_vote(_NOUN[back], answer, kind) if back in _NOUN else 0.5)
        votes = [v for v in (_vote(_NOUN[n], answer, kind) for n in nouns) if v != 0.5]
        most.append(0.5 if not votes or np.mean(votes) == 0.5 else float(np.mean(votes) > 0.5))
        verbs = [int(row[i]) for i in scope if int(row[i]) in _VERB_NUMBER and row[i - 1] != _NOT]
        verb.append(float(_VERB_NUMBER[verbs[-1]] == answer) if verbs and answer in ("sg", "pl") else 0.5)
    answers = list(probes.answers)
    majority = np.zeros(len(answers))
    for pair in (("sg", "pl"), ("m", "f")):
        counts = [answers.count(a) for a in pair]
        winner = pair[int(np.argmax(counts))]
        majority += np.array([a == winner for a in answers], dtype=float)
    as_array = lambda v: np.asarray(v, dtype=float)  # noqa: E731
    return {"first noun": as_array(first), "first noun outside phrases": as_array(outside),
            "nearest noun": as_array(nearest), "majority": majority,
            "second-nearest noun": as_array(second), "opposite of the nearest noun": as_array(opposite),
            f"noun {FIXED_OFFSET} words back": as_array(offset), "majority of nouns": as_array(most),
            "last finite verb": as_array(verb)}


def _after_phrase_word(row, i, start):
    """True when the noun at ``i`` follows a preposition or subordinator ("near the cats", "when mary")."""
    j = i - 1
    if j >= start and row[j] == _THE:
        j -= 1
    return j >= start and int(row[j]) in _SKIP_AFTER


def attractor_matches(probes):
    """For every item, the noun nearest before the word other than its key: does it ask for the same form?

    Returns:
        ``(n,)`` array of ``"same"`` (that noun has the answer's number, or gender), ``"other"``
        (it asks for the other form) or ``"none"`` (no such noun, or one that says nothing
        about the two forms, e.g. a thing for "he"/"she"). Attraction is the difference
        between the model on "same" and on "other" items.
    """
    _check_probes(probes)
    out = []
    for row, t, key, answer in zip(probes.tokens, probes.positions, probes.keys, probes.answers):
        before = [i for i in range(1, t) if int(row[i]) in _NOUN and i != key]
        vote = _vote(_NOUN[int(row[before[-1]])], answer, probes.kind) if before else 0.5
        out.append({1.0: "same", 0.0: "other"}.get(vote, "none"))
    return np.array(out)


def _vote(feature, answer, kind):
    """1, 0 or 1/2: does a noun with ``feature`` (number, gender) give the right form?"""
    number, gender = feature
    if answer in ("m", "f"):  # "he" against "she": only a person's gender decides
        return 0.5 if gender is None else float(gender == answer)
    if kind == "coreference" and gender is not None:  # "it" against "they": a person is neither
        return 0.5
    return float(number == answer)


class Bigram:
    """The next word from the previous word alone: counts with add-one smoothing.

    Args:
        n: sequences of training text to count (``sample_sequences(n, seed, stream=0)``,
            the stream the models train on).
        seed: seed of that text.

    Attributes:
        log_probs: ``(V, V)``: ``log_probs[a, b] = log p(next = b | previous = a)``.
    """

    def __init__(self, n=4096, seed=0):
        tokens = sample_sequences(n, seed, stream=TRAIN_STREAM).tokens  # (n, N)
        v = len(VOCAB)
        counts = np.ones((v, v))
        np.add.at(counts, (tokens[:, :-1].ravel(), tokens[:, 1:].ravel()), 1)
        self.log_probs = np.log(counts / counts.sum(axis=1, keepdims=True))

    def margins(self, probes):
        """``log p(right) - log p(wrong)`` given the previous word, for every item: ``(n,)``."""
        _check_probes(probes)
        previous = probes.tokens[np.arange(len(probes)), probes.positions - 1]
        return self.log_probs[previous, probes.correct] - self.log_probs[previous, probes.wrong]

    def probe_accuracy(self, probes):
        """Fraction right; a tie (the previous word says nothing) counts as a coin flip, 1/2."""
        m = self.margins(probes)
        return float(((m > 0) + 0.5 * (m == 0)).mean())

    def loss(self, tokens):
        """Average next-token loss on ``tokens`` ``(B, N)`` (every token after the first)."""
        t = np.asarray(tokens)
        return float(-self.log_probs[t[:, :-1], t[:, 1:]].mean())


class NGram:
    """The next word from the ``order - 1`` words before it: counts on training text, with back-off.

    For a probe item the two forms are compared on the longest context (at most ``order - 1``
    words before the word, never crossing ``<bos>``) after which either form was seen in the
    training text; the more frequent form wins, a tie is a coin flip (1/2). A 5-gram sees
    "the cats near the box | ?" as "cats near the box | ?": it decides every item whose
    deciding noun stands within four words of the verb.

    Args:
        order: n (default 5: four words of context).
        n: sequences of training text to count (``sample_sequences(n, seed, stream=0)``).
        seed: seed of that text.
    """

    def __init__(self, order=5, n=4096, seed=0):
        if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or not 2 <= order <= 8:
            raise ValueError(f"order must be an int in 2 .. 8; got {order!r}")
        self.order = int(order)
        tokens = sample_sequences(n, seed, stream=TRAIN_STREAM).tokens  # (n, N)
        self._tables = []  # per context length k = 0 .. order - 1: sorted codes and their counts
        for k in range(self.order):
            codes = self._codes(tokens, k)  # (n, N - k): context of k words, then the word
            keys, counts = np.unique(codes.ravel(), return_counts=True)
            self._tables.append((keys, counts))

    @staticmethod
    def _codes(tokens, k):
        n, length = tokens.shape
        code = np.zeros((n, length - k), dtype=np.int64)
        for j in range(k + 1):  # 7 bits per word: the vocabulary has fewer than 128 words
            code = code * 128 + tokens[:, j:length - k + j]
        return code

    def _count(self, k, context, word):
        keys, counts = self._tables[k]
        code = 0
        for w in list(context) + [word]:
            code = code * 128 + int(w)
        i = np.searchsorted(keys, code)
        return int(counts[i]) if i < len(keys) and keys[i] == code else 0

    def votes(self, probes):
        """1 (right form more frequent), 0 (wrong) or 1/2 (tie) for every item: ``(n,)``."""
        _check_probes(probes)
        out = []
        for row, t, right, wrong in zip(probes.tokens, probes.positions, probes.correct, probes.wrong):
            vote = 0.5
            for k in range(min(self.order - 1, t - 1), -1, -1):  # position 0 is <bos>: context starts at 1
                context = row[t - k:t]
                a, b = self._count(k, context, right), self._count(k, context, wrong)
                if a or b:
                    vote = 1.0 if a > b else 0.0 if b > a else 0.5
                    break
            out.append(vote)
        return np.array(out)

    def probe_accuracy(self, probes):
        """Fraction right; a tie counts as a coin flip, 1/2."""
        return float(self.votes(probes).mean())
