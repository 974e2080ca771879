"""Notebook 05's claims, each tested on every seed, under every ablation, against a null.

A claim about "the model" is a claim about one draw of a random process. This module
keeps notebook 05 honest in four ways:

* :func:`measure_seed` measures one model the same way for every seed: probe accuracy
  and margins on every probe set (split by answer, construction and attractor), the head
  scores, each head removed under the three :data:`~mhalib.interpret.ABLATIONS` (zero, mean,
  resample), activation patching of the subject's number, and path patching of the
  costliest layer-0 head;
* :data:`CLAIMS` states each claim as a test of one seed's measurements, with its null:
  the chance that a seed passes it by accident, either a *permutation* null (the head the
  claim names were any head of its layer or of the model: 1/2 for "is in layer 1", 1/4 for
  "is this one of the four layer-1 heads", 1/3 for "is this one of three paths") or the
  *untrained* null (the share of untrained models, same recipe and seeds, that pass it);
* :func:`count_claims` counts each claim over the seeds (``"in N of 10"``) under each
  ablation, with the binomial chance of that count under the null
  (:func:`mhalib.interpret.count_null`);
* :data:`FINDING`: a claim that holds in at least 8 of 10 seeds under every ablation it is
  tested in, more often than its null (P <= 0.05), is stated as a finding; in fewer, but
  still more often than its null, as a tendency; a count that chance alone would give
  (P > 0.05), however high, as "not above its null" (:func:`mhalib.interpret.claim_status`).

``python -m mhalib.language claims`` measures the ten shipped seeds and ten untrained
models and writes ``mhalib/data/language_claims.json``; notebook 05 reads it, and
``tests/test_language_claims.py`` measures the shipped weights again on other probe seeds.
"""

from __future__ import annotations


import numpy as np

from mhalib.interpret import ABLATIONS, Claim, ablation_kwargs, claim_status, count_null, record_heads
from mhalib.language.grammar import sample_sequences
from mhalib.language.heads import grammar_head_scores, number_patching, path_patching
from mhalib.language.probes import (ADVERB, CONTROL, HELD_OUT, SAME_NUMBER, STRUCTURE, attractor_matches,
                                    make_probe_set, probe_margins, probe_tokens)
from mhalib.language.training import EVAL_STREAM, loss_by_role

__all__ = ["MEASURE", "PROBE_SETS", "probe_sets", "measure_seed", "Claim", "CLAIMS", "FINDING", "count_claims",
           "HEADS"]

#: How every model is measured: the probe seed (notebook 05's), items per set, sequences of
#: text for the loss and the mean/resample references (another seed of the evaluation stream).
MEASURE = {"seed": 1, "n_probes": 1000, "n_extra": 400, "n_text": 256, "reference_seed": 1001, "n_patch": 400}
HEADS = [(layer, head) for layer in range(2) for head in range(4)]
#: A claim stated as a finding holds in at least this many of the ten seeds, under every
#: ablation it is tested in; below it, a tendency.
FINDING = 8

#: name -> (kind, which items, size): the probe sets every model is measured on.
PROBE_SETS = {
    "agreement": ("agreement", None, "n_probes"),
    "coreference": ("coreference", None, "n_probes"),
    "agreement control": ("agreement", CONTROL["agreement"], "n_extra"),
    "agreement held-out: two phrases after the subject": ("agreement", ("pp_pp",), "n_extra"),
    "agreement held-out: two phrases before it": ("agreement", ("intro_pp2",), "n_extra"),
    "coreference held-out: two phrases before the antecedent": ("coreference", HELD_OUT["coreference"], "n_extra"),
    "agreement, attractor of the same number": ("agreement", SAME_NUMBER["agreement"], "n_extra"),
    "verb inside a relative clause": ("agreement", ("orc_verb",), "n_extra"),
    "held-out: relative clause inside a relative clause": ("agreement", ("centre",), "n_extra"),
    "held-out: adverb before the verb, after a phrase": ("agreement", ("adverb_pp",), "n_extra"),
    "held-out: adverb before the verb": ("agreement", ("adverb",), "n_extra"),
}
#: The sets measured under every single-head ablation (the others only intact).
ABLATED_SETS = ("agreement", "agreement control", "coreference")


def probe_sets(seed=MEASURE["seed"], n_probes=MEASURE["n_probes"], n_extra=MEASURE["n_extra"]):
    """Every set of :data:`PROBE_SETS`, drawn with ``seed``: dict name -> ProbeSet."""
    sizes = {"n_probes": n_probes, "n_extra": n_extra}
    return {name: make_probe_set(kind, sizes[size], seed, constructions=c)
            for name, (kind, c, size) in PROBE_SETS.items()}


def _r(x):
    return round(float(x), 6)


def _split(margins, probes):
    """Accuracy and mean margin, overall and split by answer, construction and attractor."""
    right = margins > 0
    out = {"accuracy": _r(right.mean()), "margin": _r(margins.mean())}
    fields = {"answer": probes.answers, "construction": probes.constructions, "attractor": attractor_matches(probes)}
    for field, values in fields.items():
        for v in np.unique(values):
            sel = values == v
            out[f"{field} {v}"] = {"accuracy": _r(right[sel].mean()), "margin": _r(margins[sel].mean()),
                                   "items": int(sel.sum())}
    return out


def measure_seed(model, seed=MEASURE["seed"], *, n_probes=MEASURE["n_probes"], n_extra=MEASURE["n_extra"],
                 n_text=MEASURE["n_text"], n_patch=MEASURE["n_patch"], reference_seed=MEASURE["reference_seed"],
                 hows=ABLATIONS):
    """Everything :data:`CLAIMS` reads, for one model: a JSON-ready dict.

    ``"probes"``: every set intact (:func:`_split`); ``"scores"``: the five head scores
    (``n_text`` sequences); ``"ablation"``: for each way in ``hows``, one row per head
    (``"L0H2"``...) plus ``"none"``: loss (all, relation and other tokens), agreement
    (overall, singular, plural subjects), control, coreference; ``"patching"``: the share
    of verbs flipped by each head's output from the number-flipped twin; ``"paths"``: for
    each way, the path patching of the layer-0 head whose removal (that way) costs
    agreement most.
    """
    sets = probe_sets(seed, n_probes, n_extra)
    out = {"probes": {name: _split(probe_margins(model, p), p) for name, p in sets.items()},
           "scores": {k: np.round(v, 6).tolist() for k, v in grammar_head_scores(model, n_text, seed).items()}}
    reference = sample_sequences(n_text, reference_seed, model.config.seq_len, stream=EVAL_STREAM).tokens
    reference_z = record_heads(model, reference)["z"]  # (R, L, H, N, d_head)
    text_shape = (n_text, model.config.seq_len)

    def row(how, heads):
        def kw(b, n):
            return ablation_kwargs(heads, how, b, n, reference_z, seed=seed) if heads else {}
        loss = loss_by_role(model, n_text, seed, kw(*text_shape).get("ablate"),
                            replace_z=kw(*text_shape).get("replace_z"))
        r = {"loss": _r(loss["all"]), "loss relation": _r(loss["relation"]), "loss other": _r(loss["other"])}
        for name in ABLATED_SETS:
            p = sets[name]
            t = probe_tokens(p)
            right = probe_margins(model, p, **kw(*t.shape)) > 0
            r[name] = _r(right.mean())
            if name == "agreement":
                r["agreement sg"] = _r(right[p.answers == "sg"].mean())
                r["agreement pl"] = _r(right[p.answers == "pl"].mean())
        return r

    out["ablation"] = {how: {"none": row(how, []), **{_name(h): row(how, [h]) for h in HEADS}} for how in hows}
    patch = make_probe_set("agreement", n_patch, seed)
    carried = number_patching(model, patch)
    out["patching"] = {(k if isinstance(k, str) else _name(k)): _r(v) for k, v in carried.items()}
    out["paths"] = {}
    for how in hows:
        table = out["ablation"][how]
        upstream = min((h for h in HEADS if h[0] == 0), key=lambda h: table[_name(h)]["agreement"])
        result = path_patching(model, patch, upstream, [h for h in HEADS if h[0] == 1], how=how,
                               reference_z=reference_z, seed=seed)
        out["paths"][how] = {"head": _name(upstream), **{k: _r(v["accuracy"]) for k, v in result.items()}}
    return out


def _name(head):
    return "L{}H{}".format(*head)


# ----------------------------------------------------------------------------- the claims
def _argmax(d):
    return max(d, key=d.get)


def _drops(m, how, probe):
    t = m["ablation"][how]
    return {h: t["none"][probe] - t[_name(h)][probe] for h in HEADS}


def _rises(m, how):
    t = m["ablation"][how]
    return {h: t[_name(h)]["loss"] / t["none"]["loss"] - 1 for h in HEADS}


def _top(m, relation):
    s = np.array(m["scores"][relation])
    return tuple(int(i) for i in np.unravel_index(s.argmax(), s.shape))


def _costliest(m, how, probe, layer=None):
    d = _drops(m, how, probe)
    return _argmax({h: v for h, v in d.items() if layer is None or h[0] == layer})


def _claim_holds(m, how, probe, drop=0.2, rise=0.10):
    d, r = _drops(m, how, probe), _rises(m, how)
    return any(d[h] >= drop and r[h] <= rise for h in HEADS)


def _plural_fallback(m, how):
    t = m["ablation"][how]
    return any(t[_name(h)]["agreement pl"] < 0.75 and t[_name(h)]["agreement sg"] >= 0.9 for h in HEADS if h[0] == 1)


def _carrier(m):
    p = m["patching"]
    return max((h for h in HEADS if h[0] == 1), key=lambda h: p[_name(h)])


def _path_costs(m, how):
    p = m["paths"][how]
    full = p["intact"] - p["ablated"]
    return full, {k: p["intact"] - p[k] for k in ("query/key path", "value path", "other paths")}


_ALL = ABLATIONS
_RANDOM_HEAD = "the named head were any of the 8 heads"

CLAIMS = [
    # section 3: probes
    Claim("probes", "agreement >= 0.99 for singular and for plural subjects, coreference >= 0.95, the control >= 0.99",
          lambda m, how: min(m["probes"]["agreement"]["answer sg"]["accuracy"],
                             m["probes"]["agreement"]["answer pl"]["accuracy"],
                             m["probes"]["agreement control"]["accuracy"]) >= 0.99
          and m["probes"]["coreference"]["accuracy"] >= 0.95,
          "untrained", "untrained models of the same seeds", section="3"),
    Claim("held out", "every held-out construction of the first notebook (two phrases after the subject or before "
          "it) >= 0.8", lambda m, how: min(m["probes"][k]["accuracy"] for k in m["probes"]
                                           if k.startswith(("agreement held-out", "coreference held-out"))) >= 0.8,
          "untrained", "untrained models", section="3"),
    Claim("inner verb", "the verb inside a relative clause (no first-noun rule decides it) >= 0.95",
          lambda m, how: m["probes"]["verb inside a relative clause"]["accuracy"] >= 0.95,
          "untrained", "untrained models", section="3"),
    Claim("centre", "a relative clause inside a relative clause (no first-noun, nearest-noun or n-gram rule "
          "decides it): at most 0.75",
          lambda m, how: m["probes"]["held-out: relative clause inside a relative clause"]["accuracy"] <= 0.75,
          "untrained", "untrained models", section="3"),
    Claim("adverb", "an adverb between subject and verb: plural subjects at 0.25 or below (the model answers "
          "singular)", lambda m, how: m["probes"]["held-out: adverb before the verb"]["answer pl"]["accuracy"] <= 0.25,
          "untrained", "untrained models", section="3"),
    Claim("attraction", "an attractor of the other number lowers the margin (against one of the same number)",
          lambda m, how: m["probes"]["agreement"]["margin"] < m["probes"]["agreement, attractor of the same number"][
              "margin"], 0.5, "either direction equally likely (a coin flip per seed)", section="3"),
    # section 4: scores
    Claim("scores in layer 1", "the top verb -> subject and pronoun -> antecedent scores are in layer 1, and no "
          "layer-0 head scores 0.15 on either",
          lambda m, how: _top(m, "agreement")[0] == 1 and _top(m, "coreference")[0] == 1
          and max(np.max(m["scores"]["agreement"][0]), np.max(m["scores"]["coreference"][0])) < 0.15,
          "untrained", "untrained models", section="4"),
    Claim("no sink", "no <bos> sink, previous-token or induction head (every score < 0.3)",
          lambda m, how: max(np.max(m["scores"][k]) for k in ("bos", "previous", "induction")) < 0.3,
          "untrained", "untrained models", section="12"),
    # section 6: ablation
    Claim("costliest in layer 0", "the costliest head for agreement is in layer 0",
          lambda m, how: _costliest(m, how, "agreement")[0] == 0, 0.5, "4 of the 8 heads are in layer 0",
          _ALL, "6"),
    Claim("layer-0 cost", "... and costs >= 0.25 of agreement while the control stays >= 0.99",
          lambda m, how: (lambda h: h[0] == 0 and _drops(m, how, "agreement")[h] >= 0.25
                          and m["ablation"][how][_name(h)]["agreement control"] >= 0.99)(
              _costliest(m, how, "agreement")), "untrained", "untrained models", _ALL, "6"),
    Claim("top is not costliest", "the top-scoring head (verb -> subject) is not the costliest for agreement",
          lambda m, how: _top(m, "agreement") != _costliest(m, how, "agreement"), 7 / 8,
          "the costliest were any of the 8 heads: 7 of 8 are not the top-scoring one", _ALL, "6"),
    Claim("top is costliest in layer 1", "among layer-1 heads, the top-scoring head is the costliest for agreement",
          lambda m, how: _top(m, "agreement") == _costliest(m, how, "agreement", layer=1), 1 / 4,
          "layer-matched: the costliest layer-1 head were any of the 4", _ALL, "6"),
    Claim("plural fallback", "removing some layer-1 head leaves plural subjects < 0.75 and singular >= 0.9",
          lambda m, how: _plural_fallback(m, how), "untrained", "untrained models", _ALL, "6"),
    Claim("coreference in layer 1", "the costliest head for coreference is in layer 1",
          lambda m, how: _costliest(m, how, "coreference")[0] == 1, 0.5, "4 of the 8 heads are in layer 1", _ALL, "6"),
    Claim("textbook agreement", "the textbook's claim for agreement: some head costs >= 0.2 at <= +10% loss",
          lambda m, how: _claim_holds(m, how, "agreement"), "untrained", "untrained models", _ALL, "6"),
    Claim("textbook coreference", "the textbook's claim for coreference",
          lambda m, how: _claim_holds(m, how, "coreference"), "untrained", "untrained models", _ALL, "6"),
    Claim("costly head", "some head raises the loss by 10% or more",
          lambda m, how: max(_rises(m, how).values()) >= 0.10, "untrained", "untrained models", _ALL, "6"),
    Claim("cheap heads", "at least 5 of the 8 heads each cost less than 2% of the loss",
          lambda m, how: sum(v < 0.02 for v in _rises(m, how).values()) >= 5, "untrained", "untrained models",
          _ALL, "6"),
    # section 7: interventions
    Claim("carrier", "patching one layer-1 head's output flips >= 0.5 of the verbs, no layer-0 head's > 0.05",
          lambda m, how: max(m["patching"][_name(h)] for h in HEADS if h[0] == 1) >= 0.5
          and max(m["patching"][_name(h)] for h in HEADS if h[0] == 0) <= 0.05, "untrained", "untrained models",
          section="7"),
    Claim("carrier is not top", "the head that carries most number is not the top-scoring head",
          lambda m, how: _carrier(m) != _top(m, "agreement"), 3 / 4,
          "layer-matched: the carrier were any of the 4 layer-1 heads", section="7"),
    Claim("layer-0 everywhere", "removing the costliest layer-0 head everywhere costs >= 0.25 of agreement",
          lambda m, how: _path_costs(m, how)[0] >= 0.25, "untrained", "untrained models", _ALL, "7"),
    Claim("query/key path small", "removing it from the query/key path alone costs less than a third of that",
          lambda m, how: (lambda full, c: c["query/key path"] < full / 3)(*_path_costs(m, how)), 5 / 9,
          "the cost split at random among the three paths (uniform shares): P(share < 1/3) = 5/9; it assumes "
          "the three path costs add up to the full cost, which the measured costs do not", _ALL, "7"),
    Claim("other paths", "removing it from the other paths alone costs more than half of that",
          lambda m, how: (lambda full, c: c["other paths"] > full / 2)(*_path_costs(m, how)), 1 / 4,
          "uniform shares: P(share > 1/2) = 1/4 (assumes the path costs add up)", _ALL, "7"),
    Claim("no single path", "no single path costs more than half of that",
          lambda m, how: (lambda full, c: max(c.values()) <= full / 2)(*_path_costs(m, how)), 1 / 4,
          "uniform shares: P(every share <= 1/2) = 1/4 (assumes the path costs add up)", _ALL, "7"),
]


def _status(by):
    """A claim's verdict under every ablation it was counted in (:func:`mhalib.interpret.claim_status`)."""
    return claim_status(by, FINDING)


def count_claims(trained, untrained, claims=CLAIMS):
    """Count every claim over the seeds, under each of its ablations, with its null.

    Args:
        trained: list of :func:`measure_seed` dicts, one per seed.
        untrained: the same for untrained models (the ``"untrained"`` null).

    Returns:
        dict key -> {"text", "section", "null_text", "seeds": len(trained), "by": {how: {"count",
        "per_seed" (list of bools), "p_null", "expected", "p_value"}}, "finding": bool}; ``p_value``
        is the chance of a count at least this large under the null (at most this large when
        the count is below the null's expectation); for the untrained null, a share of ten
        models, it is computed with that share's 95% bound (``p_bound``,
        :func:`mhalib.interpret.null_bound`: 0 of 10 untrained models is a chance of up to
        0.26, not 0). ``"status"``: :func:`mhalib.interpret.claim_status`; ``"finding"``: the
        status is ``"finding"`` under every ablation.
    """
    out = {}
    for c in claims:
        by = {}
        for how in c.ablations:
            per_seed = [bool(c.test(m, how)) for m in trained]
            k, n = sum(per_seed), len(per_seed)
            estimated = c.null == "untrained"  # a share of untrained models: its bound, not 0, is the null
            p = float(np.mean([bool(c.test(m, how)) for m in untrained])) if estimated else float(c.null)
            tail = "at least" if k >= n * p else "at most"
            null = count_null(k, n, p, tail, estimated_from=len(untrained) if estimated else None)
            by[how] = {"count": k, "per_seed": per_seed, "p_null": p, "tail": tail, **null}
        out[c.key] = {"text": c.text, "section": c.section, "null_text": c.null_text, "seeds": len(trained), "by": by,
                      "status": _status(by)}
        out[c.key]["finding"] = out[c.key]["status"] == "finding"
    return out
