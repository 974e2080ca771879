"""A seeded grammar of English-like sentences whose agreement and antecedents are known.

The language of notebook 05, generated here so that nothing is downloaded and the right
answer at every verb and pronoun is fixed by construction:

* **number agreement**: nouns are singular or plural ("dog", "dogs"); a main verb takes
  the number of its subject ("sleeps", "sleep"), across an *attractor* in between:
  a prepositional phrase ("the dog near the cats sleeps"), an object relative clause
  ("the dog that the cats chase sleeps") or a subject relative clause ("the dog that
  chases the cats sleeps");
* **gender and antecedents**: names ("john", "mary") and people ("the king", "the
  queen") are masculine or feminine and singular; things are neither ("it", "they").
  The grammar's one rule for pronouns: *a pronoun refers to the subject of the previous
  main clause*: the sentence before ("mary sees the king . she sleeps ."), or, in a
  because-clause, the main clause of its own sentence ("the king does not see mary
  because he is tired ."). English leaves this open ("it" in notebook 01's sentence
  needs knowledge of animals and streets); here it is fixed, so every pronoun has one
  right form;
* **a word with two dependencies**: two verbs carry their object pronoun ("greets-him",
  "greet-them"), as verbs do in languages that mark both subject and object on the verb.
  The verb's number comes from its own subject, the pronoun from the previous sentence's
  subject: one position needs two earlier positions at once, and when both are things
  it needs the *number* of each, the same feature from two places;
* **position does not give the answer**: a main clause may open with an introductory
  phrase or clause that has a noun of its own ("near the cats the dog sleeps", "when the
  birds sing the dogs run"), so the subject of a sentence, and so the antecedent of the
  next pronoun, is not always its first noun. A rule "the verb agrees with the first noun
  of its sentence" is right only where that noun has the subject's number;
* a ``<bos>`` token, then sentences ended by ``"."`` until the sequence is full;
  some sentences repeat an earlier one word for word, which gives an induction head
  something to do.

:func:`sample_sequences` returns token ids with the positions each relation links
(verb -> subject, pronoun -> antecedent, repeat -> earlier copy), for head scores and
for losses by token role. :mod:`mhalib.language.probes` builds probe sets from the same
grammar with chosen constructions.

All randomness comes from ``numpy.random.default_rng``: the same seed gives the same text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

__all__ = [
    "VOCAB",
    "WORD_TO_ID",
    "BOS",
    "SEQ_LEN",
    "encode",
    "decode",
    "Grammar",
    "LanguageBatch",
    "Event",
    "sample_sequences",
    "make_rng",
    "other_number",
    "other_pronoun",
]

SEQ_LEN = 64  # tokens per training sequence, <bos> included

THINGS = ("dog", "cat", "bird", "horse", "key", "cabinet", "street", "house", "car", "box", "tree", "table")
PEOPLE = {"m": ("king", "boy", "man"), "f": ("queen", "girl", "woman")}
NAMES = {"m": ("john", "tom", "paul", "mark", "peter", "david"), "f": ("mary", "anna", "lucy", "kate", "emma", "sara")}
INTRANSITIVE = ("sleep", "run", "wait", "sing", "fall")
TRANSITIVE = ("see", "like", "chase", "follow", "cross", "find")
WITH_OBJECT_PRONOUN = ("greet", "help")  # verb and object pronoun in one word: "greets-him"
ADJECTIVES = ("tired", "happy", "old", "small", "red", "big")
PREPOSITIONS = ("near", "behind", "with", "under", "by", "beside")
ADVERBS = ("today", "again", "often", "here", "there", "now")
SUBORDINATORS = ("when", "while")  # an introductory clause: "when the cats sleep the dog runs"
SUBJECT_PRONOUN = {"m": "he", "f": "she", None: "it"}  # singular; plural: "they"
OBJECT_PRONOUN = {"m": "him", "f": "her", None: "it"}  # singular; plural: "them"
BOS = "<bos>"


def _plural(noun):
    return noun + ("es" if noun.endswith(("x", "s")) else "s")


def _third_person(verb):
    return verb + ("es" if verb.endswith(("ss", "sh", "ch", "x")) else "s")


def _verb(lemma, number):
    """The present-tense form of ``lemma`` for a subject of ``number`` ("sg" or "pl")."""
    return _third_person(lemma) if number == "sg" else lemma


def _pronoun(number, gender):
    """Subject pronoun for an antecedent: he, she, it (singular), they (plural)."""
    return "they" if number == "pl" else SUBJECT_PRONOUN[gender]


def _object_pronoun(number, gender):
    return "them" if number == "pl" else OBJECT_PRONOUN[gender]


def _fused(lemma, number, pronoun):
    """Verb with its object pronoun: ``("greet", "sg", "her") -> "greets-her"``."""
    return f"{_verb(lemma, number)}-{pronoun}"


_OBJECT_FORMS = ("him", "her", "it", "them")


def _build_vocab():
    words = [BOS, ".", "the", "that", "because", "does", "do", "not", "is", "are", "he", "she", "it", "they"]
    words += list(SUBORDINATORS)
    words += [w for noun in THINGS for w in (noun, _plural(noun))]
    words += [w for g in "mf" for w in PEOPLE[g]] + [w for g in "mf" for w in NAMES[g]]
    words += [w for lemma in INTRANSITIVE + TRANSITIVE for w in (_verb(lemma, "sg"), lemma)]
    words += [_fused(lemma, n, o) for lemma in WITH_OBJECT_PRONOUN for n in ("sg", "pl") for o in _OBJECT_FORMS]
    words += list(ADJECTIVES + PREPOSITIONS + ADVERBS)
    assert len(set(words)) == len(words)
    return tuple(words)


#: Every word of the language; a word's id is its index. ``VOCAB[0]`` is ``"<bos>"``.
VOCAB = _build_vocab()
WORD_TO_ID = {w: i for i, w in enumerate(VOCAB)}

def _build_swaps():
    """Two dicts: a verb -> its form for the other number; a pronoun -> its competitor."""
    number = {"is": "are", "are": "is", "does": "do", "do": "does"}
    pronoun = {"he": "she", "she": "he", "it": "they", "they": "it"}
    object_swap = {"him": "her", "her": "him", "it": "them", "them": "it"}
    for lemma in INTRANSITIVE + TRANSITIVE:
        number[_verb(lemma, "sg")], number[lemma] = lemma, _verb(lemma, "sg")
    for lemma in WITH_OBJECT_PRONOUN:
        for n, other_n in (("sg", "pl"), ("pl", "sg")):
            for o in _OBJECT_FORMS:
                number[_fused(lemma, n, o)] = _fused(lemma, other_n, o)
                pronoun[_fused(lemma, n, o)] = _fused(lemma, n, object_swap[o])
    return number, pronoun


_OTHER_NUMBER, _OTHER_PRONOUN = _build_swaps()


def other_number(word):
    """The same verb for the other number: ``"sleeps" <-> "sleep"``, ``"greets-her" <-> "greet-her"``."""
    if word not in _OTHER_NUMBER:
        raise ValueError(f"{word!r} is not a verb with a number; verbs look like 'sleeps', 'is', 'greets-him'")
    return _OTHER_NUMBER[word]


def other_pronoun(word):
    """The pronoun a wrong antecedent would give: the other gender for people, the other number for things.

    ``"he" <-> "she"``, ``"it" <-> "they"``, ``"greets-him" <-> "greets-her"``,
    ``"greets-it" <-> "greets-them"``.
    """
    if word not in _OTHER_PRONOUN:
        raise ValueError(f"{word!r} is not a pronoun; pronouns are 'he', 'she', 'it', 'they' and verbs "
                         f"like 'greets-him'")
    return _OTHER_PRONOUN[word]


def encode(words):
    """Token ids of a list of words (or of a string split at spaces)."""
    if isinstance(words, str):
        words = words.split()
    unknown = [w for w in words if w not in WORD_TO_ID]
    if unknown:
        raise ValueError(f"words not in the vocabulary: {unknown[:5]}; the {len(VOCAB)} words are "
                         f"mhalib.language.VOCAB")
    return [WORD_TO_ID[w] for w in words]


def decode(ids):
    """Words of a sequence of token ids (list, array or 1-D tensor)."""
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    bad = [i for i in ids if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer))
           or not 0 <= i < len(VOCAB)]
    if bad:
        raise ValueError(f"token ids must be ints in 0 .. {len(VOCAB) - 1}; got {bad[:5]}")
    return [VOCAB[int(i)] for i in ids]


def make_rng(seed, stream):
    """``numpy.random.default_rng([seed, stream])``: one independent stream per use of a seed.

    Training data, probe sets and evaluation sets use different ``stream`` numbers, so
    seed 1 of the training data and seed 1 of a probe set are different text.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int; got {seed!r}")
    return np.random.default_rng([int(seed), int(stream)])


@dataclass
class _Subject:
    """The subject of a main clause: where its head word is, its number and gender."""

    position: int
    number: str
    gender: str | None


class Event(NamedTuple):
    """One place where the grammar fixes a word's form.

    ``relation`` is "agreement" or "coreference"; ``target`` the position of the word,
    ``key`` the position it depends on (the subject's head noun, or the antecedent);
    ``correct`` the word, ``wrong`` the same verb with the other number (agreement) or
    the pronoun of the other gender or number (coreference, :func:`other_pronoun`);
    ``across``: another noun stands before the verb in its clause (an attractor between
    subject and verb, or an introductory phrase or clause before the subject).
    """

    relation: str
    target: int
    key: int
    correct: str
    wrong: str
    across: bool = False


@dataclass
class _Sentence:
    words: list
    subject: _Subject  # position relative to the sentence start
    events: list  # Events; agreement keys relative to the sentence, coreference keys absolute
    has_pronoun: bool


@dataclass
class LanguageBatch:
    """Sequences of the grammar with the positions their relations link.

    Attributes:
        tokens: ``(B, N)`` int64 NumPy array of token ids; ``tokens[:, 0]`` is ``<bos>``.
        relations: dict relation -> ``(M, 3)`` int array of ``(sequence, target, key)``:
            ``"agreement"``: a main verb across an attractor (target) and its subject's
            head noun (key); ``"coreference"``: a pronoun, or a verb carrying one, and
            its antecedent; ``"induction"``: a token of a repeated sentence (target)
            and the same token in the earlier copy (key). The word at ``target`` is
            *predicted* at ``target - 1``: that is the query that needs the key.
        roles: dict role -> ``(B, N)`` bool mask of the tokens whose form the relation
            fixes: ``"agreement"`` every main verb, ``"coreference"`` every pronoun and
            verb carrying one (a verb like "greets-him" is in both).
    """

    tokens: np.ndarray
    relations: dict
    roles: dict = field(default_factory=dict)

    def words(self, i):
        """The words of sequence ``i``."""
        return decode(self.tokens[i])


class Grammar:
    """The sentence generator. Use :func:`sample_sequences` unless you need forced choices.

    Probabilities of the free choices are class attributes; the forced choices that probe
    sets need are keyword arguments of :meth:`sentence`.
    """

    subject_kinds = {"thing": 0.5, "person": 0.25, "name": 0.25}
    pronoun_subject = 0.2  # a sentence's subject is a pronoun (when there is an antecedent)
    attractors = {"none": 0.4, "pp": 0.3, "orc": 0.15, "src": 0.15}
    intros = {"none": 0.5, "pp": 0.25, "clause": 0.25}  # "pp2" (two phrases) only when forced
    predicates = {"intransitive": 0.25, "copula": 0.15, "transitive": 0.25, "because": 0.15, "fused": 0.2}
    repeat = 0.15  # a sentence repeats an earlier pronoun-free one of the same sequence
    adverb = 0.4

    @staticmethod
    def _choice(rng, options):
        """One of ``options``: a sequence (uniform) or a dict option -> weight.

        One ``rng.random()`` per choice (NumPy's ``choice`` is ten times slower per call,
        and the grammar makes about 70 choices per sequence).
        """
        u = rng.random()
        if isinstance(options, dict):
            u *= sum(options.values())
            for key, weight in options.items():
                u -= weight
                if u < 0:
                    return key
            return key
        return options[int(u * len(options))]

    def noun_phrase(self, rng, kind=None, number=None, gender=None):
        """``(words, head index, number, gender)`` for a noun phrase.

        ``kind``: "thing" ("the dog(s)"), "person" ("the king") or "name" ("mary").
        """
        if kind is None:
            kind = self._choice(rng, {"thing": 0.6, "person": 0.2, "name": 0.2})
        if kind == "thing":
            number = number or self._choice(rng, ("sg", "pl"))
            noun = self._choice(rng, THINGS)
            return ["the", noun if number == "sg" else _plural(noun)], 1, number, None
        gender = gender or self._choice(rng, ("m", "f"))
        if kind == "person":
            return ["the", self._choice(rng, PEOPLE[gender])], 1, "sg", gender
        return [self._choice(rng, NAMES[gender])], 0, "sg", gender

    def _other_np(self, rng, number=None, gender=None, thing=False):
        """A non-subject noun phrase of the given number or gender (a gender: a person or name)."""
        if gender is not None:
            return self.noun_phrase(rng, self._choice(rng, ("person", "name")), gender=gender)
        if number == "pl" or thing:
            return self.noun_phrase(rng, "thing", number=number)
        np_ = self.noun_phrase(rng)
        if number is not None and np_[2] != number:
            return self.noun_phrase(rng, "thing", number=number)
        return np_

    def intro(self, rng, kind, np_spec=None):
        """Words of an introductory phrase or clause and the events inside it.

        ``kind``: "none", "pp" ("near the cats"), "clause" ("when the cats sleep": its verb
        agrees with its own subject) or "pp2" (two phrases, "near the cats behind the box":
        never drawn in training text, a held-out construction for probes). ``np_spec``:
        keywords for :meth:`noun_phrase` of the (first) noun. Returns ``(words, events)``
        with event positions relative to the start of the phrase.
        """
        spec = dict(np_spec or {})
        if kind == "none":
            return [], []
        if kind in ("pp", "pp2"):
            words = [self._choice(rng, PREPOSITIONS)] + self.noun_phrase(rng, **spec)[0]
            if kind == "pp2":
                words += [self._choice(rng, PREPOSITIONS)] + self.noun_phrase(rng, **spec)[0]
            return words, []
        if kind == "clause":
            np_words, head, number, _ = self.noun_phrase(rng, **spec)
            verb = _verb(self._choice(rng, INTRANSITIVE), number)
            words = [self._choice(rng, SUBORDINATORS)] + np_words + [verb]
            return words, [Event("agreement", len(words) - 1, 1 + head, verb, other_number(verb))]
        raise ValueError(f"intro must be one of 'none', 'pp', 'clause', 'pp2'; got {kind!r}")

    def sentence(self, rng, start, previous, *, subject=None, subject_number=None, subject_gender=None,
                 attractor=None, attractor_number=None, distractor=None, predicate=None, intro=None,
                 intro_np=None):
        """One sentence, ending with ".", as a :class:`_Sentence`.

        Args:
            rng: a NumPy generator.
            start: position of the sentence's first word in the sequence.
            previous: the :class:`_Subject` of the previous main clause (absolute position),
                or None at the start of a sequence (then no pronoun can be used).
            subject: "thing", "person", "name" or "pronoun" (None: drawn).
            subject_number, subject_gender: forced features of a noun subject.
            attractor: "none", "pp", "orc" or "src".
            attractor_number: forced number of the attractor noun.
            distractor: ``("gender", "m" or "f")`` or ``("number", "sg" or "pl")``: put a
                person of that gender, or a thing of that number, in the attractor or the
                object (where the predicate has one), to compete with the antecedent.
            predicate: "intransitive", "copula", "transitive", "because" or "fused".
            intro: "none", "pp", "clause" or "pp2" (see :meth:`intro`).
            intro_np: keywords for :meth:`noun_phrase` of the introduction's noun, e.g.
                ``{"kind": "thing", "number": "pl"}``.
        """
        if intro is None:
            intro = self._choice(rng, self.intros)
        words, events = self.intro(rng, intro, intro_np)
        has_pronoun = False
        if subject is None:
            can_pronoun = previous is not None and rng.random() < self.pronoun_subject
            subject = "pronoun" if can_pronoun else self._choice(rng, self.subject_kinds)
        if subject == "pronoun":
            if previous is None:
                raise ValueError("a pronoun subject needs a previous main clause")
            pronoun = _pronoun(previous.number, previous.gender)
            subj = _Subject(len(words), previous.number, previous.gender)
            events.append(Event("coreference", len(words), previous.position, pronoun, other_pronoun(pronoun)))
            words.append(pronoun)
            has_pronoun = True
            attractor = "none"
        else:
            np_words, head, number, gender = self.noun_phrase(rng, subject, subject_number, subject_gender)
            subj = _Subject(len(words) + head, number, gender)
            words += np_words
        # a competitor for the antecedent: in the object or the attractor
        place_distractor = None
        if distractor is not None:
            if distractor[0] not in ("gender", "number"):
                raise ValueError(f"distractor must be ('gender', 'm'/'f') or ('number', 'sg'/'pl'); got {distractor!r}")
            object_ok = predicate in (None, "transitive", "because")
            attractor_ok = attractor != "none"
            if object_ok and (not attractor_ok or attractor is None and rng.random() < 0.5):
                place_distractor = "object"
                predicate = predicate or self._choice(rng, ("transitive", "because"))
            elif attractor_ok:
                place_distractor = "attractor"
                attractor = attractor or self._choice(rng, ("pp", "orc", "src"))
            else:
                raise ValueError(f"no place for a distractor with attractor={attractor!r}, predicate={predicate!r}")
        if attractor is None:
            attractor = self._choice(rng, self.attractors)
        def other_np(where, number=None):
            if place_distractor == where:
                feature, value = distractor
                return self._other_np(rng, gender=value) if feature == "gender" else \
                    self._other_np(rng, number=value, thing=True)
            return self._other_np(rng, number)

        if attractor == "pp":
            np_words, _, _, _ = other_np("attractor", attractor_number)
            words += [self._choice(rng, PREPOSITIONS)] + np_words
        elif attractor == "orc":  # the dog that the cats chase
            np_words, _, number, _ = other_np("attractor", attractor_number)
            words += ["that"] + np_words + [_verb(self._choice(rng, TRANSITIVE), number)]
        elif attractor == "src":  # the dog that chases the cats
            np_words, _, _, _ = other_np("attractor", attractor_number)
            words += ["that", _verb(self._choice(rng, TRANSITIVE), subj.number)] + np_words
        elif attractor == "pp2":  # held out: the key near the cabinets behind the boxes
            for _ in range(2):
                np_words, _, _, _ = other_np("attractor", attractor_number)
                words += [self._choice(rng, PREPOSITIONS)] + np_words
        elif attractor != "none":
            raise ValueError(f"attractor must be one of 'none', 'pp', 'orc', 'src', 'pp2'; got {attractor!r}")
        across = attractor != "none" or intro != "none"

        if predicate is None:
            options = dict(self.predicates)
            if previous is None or subject == "pronoun":
                options.pop("fused")  # its pronoun needs an antecedent other than the subject's
            predicate = self._choice(rng, options)
        verb_at = len(words)

        def agree(word):
            events.append(Event("agreement", verb_at, subj.position, word, other_number(word), across))

        if predicate == "intransitive":
            word = _verb(self._choice(rng, INTRANSITIVE), subj.number)
            agree(word)
            words.append(word)
        elif predicate == "copula":
            word = "is" if subj.number == "sg" else "are"
            agree(word)
            words += [word, self._choice(rng, ADJECTIVES)]
        elif predicate == "transitive":
            word = _verb(self._choice(rng, TRANSITIVE), subj.number)
            agree(word)
            words += [word] + other_np("object")[0]
        elif predicate == "because":  # notebook 01's sentence, in this grammar
            word = "does" if subj.number == "sg" else "do"
            agree(word)
            words += [word, "not", self._choice(rng, TRANSITIVE)] + other_np("object")[0]
            pronoun = _pronoun(subj.number, subj.gender)
            words.append("because")
            events.append(Event("coreference", len(words), start + subj.position, pronoun, other_pronoun(pronoun)))
            words += [pronoun, "is" if subj.number == "sg" else "are", self._choice(rng, ADJECTIVES)]
            has_pronoun = True
        elif predicate == "fused":
            if previous is None:
                raise ValueError("a verb carrying its object pronoun needs a previous main clause")
            pronoun = _object_pronoun(previous.number, previous.gender)
            word = _fused(self._choice(rng, WITH_OBJECT_PRONOUN), subj.number, pronoun)
            agree(word)
            events.append(Event("coreference", verb_at, previous.position, word, other_pronoun(word)))
            words.append(word)
            has_pronoun = True
        else:
            raise ValueError(f"predicate must be one of {sorted(self.predicates)}; got {predicate!r}")
        if predicate in ("intransitive", "transitive", "fused") and rng.random() < self.adverb:
            words.append(self._choice(rng, ADVERBS))
        words.append(".")
        return _Sentence(words, subj, events, has_pronoun)

    def sequence(self, rng, seq_len=SEQ_LEN, forced=()):
        """One sequence of ``seq_len`` tokens: ``<bos>``, then sentences until it is full.

        Args:
            rng: a NumPy generator.
            seq_len: tokens in the sequence (the last sentence is cut off there).
            forced: keyword dicts for :meth:`sentence`, used in order for the first
                sentences (None: a free sentence); the rest are drawn freely.

        Returns:
            ``(words, events, repeats, marks)``: the words; the :class:`Event` list with
            absolute positions; the repeats ``(start of copy, start of original, length)``;
            and for every forced sentence the index of its first event in ``events``.
        """
        words, events, repeats, marks = [BOS], [], [], []
        previous = None
        done = []  # (start, sentence) of pronoun-free sentences, for repeats
        forced = list(forced)
        while len(words) < seq_len:
            start = len(words)
            spec = forced.pop(0) if forced else None
            if spec is not None:
                marks.append(len(events))
                sentence = self.sentence(rng, start, previous, **spec)
                original = None
            elif done and rng.random() < self.repeat:
                original, sentence = self._choice(rng, done)
            else:
                sentence = self.sentence(rng, start, previous)
                original = None
            for e in sentence.events:
                key = start + e.key if e.relation == "agreement" else e.key  # the subject is in this sentence
                events.append(e._replace(target=start + e.target, key=key))
            if original is not None:
                repeats.append((start, original, len(sentence.words)))
            elif not sentence.has_pronoun:
                done.append((start, sentence))
            words += sentence.words
            previous = _Subject(start + sentence.subject.position, sentence.subject.number,
                                sentence.subject.gender)
        if forced:
            raise ValueError(f"{len(forced)} forced sentences did not fit in seq_len={seq_len}")
        words = words[:seq_len]
        events = [e for e in events if e.target < seq_len]
        return words, events, repeats, marks


def sample_sequences(n, seed, seq_len=SEQ_LEN, *, stream=0):
    """``n`` sequences of the grammar with their relations, from ``make_rng(seed, stream)``.

    Args:
        n: number of sequences.
        seed: the seed; the same seed (and stream) always gives the same sequences.
        seq_len: tokens per sequence, ``<bos>`` included.
        stream: which independent stream of that seed (training uses 0, evaluation 1,
            see :func:`make_rng`).

    Returns:
        a :class:`LanguageBatch`.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int; got {n!r}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 8:
        raise ValueError(f"seq_len must be an int >= 8; got {seq_len!r}")
    rng = make_rng(seed, stream)
    grammar = Grammar()
    tokens = np.zeros((n, seq_len), dtype=np.int64)
    pairs = {"agreement": [], "coreference": [], "induction": []}
    roles = {"agreement": np.zeros((n, seq_len), bool), "coreference": np.zeros((n, seq_len), bool)}
    for b in range(n):
        words, events, repeats, _ = grammar.sequence(rng, seq_len)
        tokens[b] = encode(words)
        for e in events:
            roles[e.relation][b, e.target] = True
            if e.relation == "coreference" or e.across:  # agreement: only across an attractor
                pairs[e.relation].append((b, e.target, e.key))
        for copy, original, length in repeats:
            for j in range(1, length):  # target copy + j is predicted at copy + j - 1 from original + j
                if copy + j < seq_len:
                    pairs["induction"].append((b, copy + j, original + j))
    relations = {k: np.array(v, dtype=np.int64).reshape(-1, 3) for k, v in pairs.items()}
    return LanguageBatch(tokens, relations, roles)
