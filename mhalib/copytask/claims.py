"""Notebook 04's claims about the copy-task model, tested on ten seeds, under three ablations, against nulls.

Notebook 04 trains seed 0 of its recipe live and reads its heads. Whether what it finds
is a property of the recipe or of that one run is a question of seeds:
``python -m mhalib.copytask seeds`` trains seeds 0-9 of the same recipe and records what
only training can show (the loss of every step, the head scores every 25 steps, the
1-layer controls); :func:`measure_seed` measures the trained weights (head scores, each
head removed under zero, mean and resample ablation, the induction heads together, the
no-repeat probe) and ``python -m mhalib.copytask measure`` writes both, for the ten seeds
and ten untrained models, to ``mhalib/data/copytask_claims.json``.

:data:`CLAIMS` states each of the notebook's claims as a test of one seed, with a null:
``"untrained"`` (the share of untrained models that pass), ``"1 layer"`` (the share of
the 1-layer variable-offset controls, which cannot form an induction circuit, that pass
the same test of their training curve), ``"window"`` (a formation step drawn uniformly
from the logged steps: the share of them inside the claimed window, seed by seed), or a
number (a permutation null over heads). :func:`count_claims` counts them
(:func:`mhalib.interpret.count_null`).
"""

from __future__ import annotations


import numpy as np

from mhalib.copytask.tasks import distinct_tokens, fixed_offset_task, make_generator, variable_offset_task
from mhalib.copytask.training import evaluate
from mhalib.interpret import (ABLATIONS, Claim, ablation_kwargs, attention_weights, claim_status, count_null, head_scores,
                              offset_score, record_heads)

__all__ = ["MEASURE", "measure_seed", "curve_facts", "Claim", "CLAIMS", "FINDING", "count_claims", "uniform_seen"]

#: The probe and reference batches (notebook 04's probe seed 7; the no-repeat probe seed 8;
#: the mean/resample reference a seed of its own).
MEASURE = {"probe_seed": 7, "probe_size": 256, "no_repeat_seed": 8, "reference_seed": 4242, "reference_size": 1024,
           "eval_seed": 12345, "eval_size": 1024}
FINDING = 8
HEADS = [(layer, head) for layer in range(2) for head in range(4)]


def _r(x, digits=6):
    return round(float(x), digits)


def _name(head):
    return "L{}H{}".format(*head)


def measure_seed(model, **seeds):
    """Everything :data:`CLAIMS` reads from one trained (or untrained) copy-task model: a JSON-ready dict.

    ``seeds`` overrides entries of :data:`MEASURE` (e.g. ``eval_seed=7``: other evaluation sequences).
    """
    unknown = set(seeds) - set(MEASURE)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; allowed: {sorted(MEASURE)}")
    M = dict(MEASURE, **seeds)
    task, fixed = variable_offset_task(), fixed_offset_task()
    probe, _ = task.sample(M["probe_size"], make_generator(M["probe_seed"]))
    scores = head_scores(model, probe)
    prev = int(np.argmax(scores["previous"][0]))
    induction = [h for h in range(4) if scores["induction"][1, h] >= 0.5]
    reference, _ = task.sample(M["reference_size"], make_generator(M["reference_seed"]))
    reference_z = record_heads(model, reference)["z"]  # (R, L, H, N, d_head)
    ablation = {}
    for how in ABLATIONS:
        def run(heads, how=how):
            kw = ablation_kwargs(heads, how, M["eval_size"], task.seq_len, reference_z, seed=0) if heads else {}
            r = evaluate(model, task, batch_size=M["eval_size"], seed=M["eval_seed"], **kw)
            return {"loss": _r(r["loss"]), "accuracy": _r(r["accuracy"])}
        ablation[how] = {"none": run([]), **{_name(h): run([h]) for h in HEADS},
                         "induction heads": run([(1, h) for h in induction]) if induction else None}
    plain = distinct_tokens(256, make_generator(M["no_repeat_seed"]))
    w_plain = attention_weights(model, plain)[:, 1]  # (256, 4, N, N): layer 1, nothing repeats
    shown = induction or list(range(4))
    fixed_probe, _ = fixed.sample(256, make_generator(M["probe_seed"]))
    w0_plain = attention_weights(model, plain)[:, 0]  # (256, 4, N, N): layer 0
    w0_fixed = attention_weights(model, fixed_probe)[:, 0]
    return {"scores": {k: np.round(v, 6).tolist() for k, v in scores.items()}, "previous head": prev,
            "layer 0, 7 back, no repeats": _r(offset_score(w0_plain, 7).max()),
            "layer 0, previous, fixed offset": _r(offset_score(w0_fixed, 1).max()),
            "induction heads": induction, "ablation": ablation,
            "no repeats, largest weight on one offset": _r(max(offset_score(w_plain, k)[shown].max()
                                                               for k in range(1, task.seq_len))),
            "on fixed offset": {k: _r(v) for k, v in evaluate(model, fixed, batch_size=M["eval_size"],
                                                              seed=M["eval_seed"]).items()}}


def uniform_seen(n=2048, seed=1):
    """Notebook 04's second reference loss: uniform over the distinct tokens already seen, at each scored position."""
    task = variable_offset_task()
    probe, mask = task.sample(n, make_generator(seed))
    seen = [len(set(row[:i].tolist())) for row, m in zip(probe, mask) for i in np.nonzero(m.numpy())[0]]
    return float(np.log(seen).mean())


def curve_facts(loss, scores=None, *, window=20, span=100):
    """Notebook 04's reading of a training curve, computed the notebook's way.

    Returns:
        dict: ``"ratio"`` (the steepest ``span`` steps after the first ``span``, against the
        ``span`` steps before them), ``"k"`` (where the steepest window starts, an index of the
        20-step running mean), ``"at 400"`` (the running mean ending at step 400), and with
        ``scores`` (the logged head scores) ``"previous on"``/``"induction on"`` (the first
        logged step with a layer-0 previous-token / layer-1 induction score >= 0.5, or None)
        and ``"logged"`` (the logged steps).
    """
    loss = np.asarray(loss, dtype=float)
    run = np.convolve(loss, np.ones(window) / window, mode="valid")
    drops = run[:-span] - run[span:]
    k = int(drops[span:].argmax()) + span
    out = {"ratio": float(drops[k] / drops[k - span]) if drops[k - span] > 0 else float("inf"), "k": k,
           "at 400": float(run[400 - window])}
    if scores is not None:
        steps = np.array(scores["step"])
        for name, layer in (("previous", 0), ("induction", 1)):
            best = np.array([np.max(s[layer]) for s in scores[name]])
            on = np.nonzero(best >= 0.5)[0]
            out[f"{name} on"] = int(steps[on[0]]) if len(on) else None
        out["logged"] = steps.tolist()
    return out


def _loss_change(m, how, key):
    t = m["ablation"][how]
    return t[key]["loss"] - t["none"]["loss"] if t.get(key) else 0.0


def _in_window(f, name):
    on = f[f"{name} on"]
    return on is not None and f["k"] - 100 <= on <= f["k"] + 150


def _window_chance(f):
    steps = np.array(f["logged"])
    return float(((steps >= f["k"] - 100) & (steps <= f["k"] + 150)).mean())


_ALL = ABLATIONS


def _controls(d, name, where):
    return d["training"]["controls"][name][where]


CLAIMS = [
    Claim("steeper fall", "the steepest 100 steps lose more than 5 times as much loss as the 100 steps before",
          lambda d, how: d["curve"]["ratio"] > 5, "1 layer",
          "the same test on the training curves of the 1-layer controls", section="3"),
    Claim("plateau at 400", "at step 400 the loss is still between 'uniform over tokens seen' and 3.8",
          lambda d, how: d["uniform_seen"] < d["curve"]["at 400"] < 3.8, "1 layer",
          "the same test on the 1-layer controls' curves", section="3"),
    Claim("learns", "accuracy passes 0.9 within the 1,500 steps and ends above 0.9",
          lambda d, how: d["training"]["accuracy 0.9 at"] is not None
          and d["measured"]["ablation"]["zero"]["none"]["accuracy"] > 0.9, "1 layer",
          "the 1-layer controls (their accuracy on the variable-offset task)", section="3"),
    Claim("induction forms in the fall", "the best layer-1 induction score first reaches 0.5 during the fall "
          "(from 100 steps before the steepest window to 150 after its start)",
          lambda d, how: _in_window(d["curve"], "induction"), "window",
          "a formation step drawn uniformly from the logged steps: the share inside each seed's window", section="3"),
    Claim("previous forms in the fall", "so does the best layer-0 previous-token score",
          lambda d, how: _in_window(d["curve"], "previous"), "window", "as above", section="3"),
    Claim("heads by score", "a layer-0 head with previous-token score >= 0.5, a layer-1 head with induction score "
          ">= 0.8, and no layer-0 induction score >= 0.2",
          lambda d, how: np.max(d["measured"]["scores"]["previous"][0]) >= 0.5
          and np.max(d["measured"]["scores"]["induction"][1]) >= 0.8
          and np.max(d["measured"]["scores"]["induction"][0]) < 0.2, "untrained", "untrained models", section="4"),
    Claim("previous head needed", "removing the previous-token head raises the loss by more than 2",
          lambda d, how: _loss_change(d["measured"], how, _name((0, d["measured"]["previous head"]))) > 2,
          "untrained", "untrained models", _ALL, "5"),
    Claim("previous head costliest", "the previous-token head is the costliest head",
          lambda d, how: max(HEADS, key=lambda h: _loss_change(d["measured"], how, _name(h)))
          == (0, d["measured"]["previous head"]), 1 / 8, "the costliest were any of the 8 heads", _ALL, "5"),
    Claim("induction heads together", "removing all induction heads together raises the loss by more than 2",
          lambda d, how: _loss_change(d["measured"], how, "induction heads") > 2, "untrained", "untrained models",
          _ALL, "5"),
    Claim("induction heads redundant", "there are two or more induction heads, and removing any one alone raises "
          "the loss by less than 0.1",
          lambda d, how: len(d["measured"]["induction heads"]) >= 2
          and max(_loss_change(d["measured"], how, _name((1, h))) for h in d["measured"]["induction heads"]) < 0.1,
          "untrained", "untrained models", _ALL, "5"),
    Claim("other heads cheap", "every other head costs less than 0.1 of loss",
          lambda d, how: max([_loss_change(d["measured"], how, _name(h)) for h in HEADS
                              if h != (0, d["measured"]["previous head"])
                              and not (h[0] == 1 and h[1] in d["measured"]["induction heads"])] or [0]) < 0.1,
          "untrained", "untrained models", _ALL, "5"),
    Claim("one layer fails", "a 1-layer model on the variable offset stays above loss 2.5 and below accuracy 0.5",
          lambda d, how: _controls(d, "1 layer, variable offset", "on variable offset")["loss"] > 2.5
          and _controls(d, "1 layer, variable offset", "on variable offset")["accuracy"] < 0.5, "untrained",
          "untrained models (which fail too: failing is the default)", section="6"),
    Claim("shortcut", "a 1-layer model solves the fixed offset (> 0.95) and fails the variable one (< 0.5)",
          lambda d, how: _controls(d, "1 layer, fixed offset", "on fixed offset")["accuracy"] > 0.95
          and _controls(d, "1 layer, fixed offset", "on variable offset")["accuracy"] < 0.5, "untrained",
          "untrained models", section="6"),
    Claim("shortcut looks 7 back", "the fixed-offset model puts > 0.5 on 7 back with nothing to copy, and its "
          "previous-token scores stay < 0.3",
          lambda d, how: max(d["training"]["controls"]["1 layer, fixed offset"]["7 back, no repeats"]) > 0.5
          and max(d["training"]["controls"]["1 layer, fixed offset"]["previous, with a copy"]) < 0.3, "untrained",
          "untrained models (their largest weight 7 back with nothing to copy)", section="6"),
    Claim("induction solves fixed", "the 2-layer induction model also solves the fixed offset (> 0.95)",
          lambda d, how: d["measured"]["on fixed offset"]["accuracy"] > 0.95, "untrained", "untrained models",
          section="6"),
]


def _untrained_view(m):
    """An untrained model as a seed dict: its measurements, and no curve (curve claims have other nulls)."""
    return {"measured": m, "training": {"controls": {
        "1 layer, variable offset": {"on variable offset": m["ablation"]["zero"]["none"]},
        "1 layer, fixed offset": {"on fixed offset": m["on fixed offset"],
                                  "on variable offset": m["ablation"]["zero"]["none"],
                                  "7 back, no repeats": [m["layer 0, 7 back, no repeats"]],
                                  "previous, with a copy": [m["layer 0, previous, fixed offset"]]}},
        "accuracy 0.9 at": None}}


def _status(by):
    """A claim's verdict under every ablation it was counted in (:func:`mhalib.interpret.claim_status`)."""
    return claim_status(by, FINDING)


def count_claims(seeds, untrained, claims=CLAIMS):
    """Count every claim over the seeds (dicts of :class:`Claim`), with its null; see the module docstring.

    A null measured on models (``"untrained"``, ``"1 layer"``: ten of them) is a share with an
    error: its P-value is computed with the share's 95% bound (``p_bound``,
    :func:`mhalib.interpret.null_bound`), so 0 of 10 untrained models is a chance of up to
    0.26, not 0. ``"status"`` is :func:`mhalib.interpret.claim_status`.
    """
    one_layer = [{"curve": curve_facts(d["training"]["controls"]["1 layer, variable offset"]["loss"]),
                  "uniform_seen": d["uniform_seen"],
                  "training": {"accuracy 0.9 at": None},
                  "measured": {"ablation": {"zero": {"none": d["training"]["controls"]["1 layer, variable offset"][
                      "on variable offset"]}}}} for d in seeds]
    out = {}
    for c in claims:
        by = {}
        for how in c.ablations:
            per_seed = [bool(c.test(d, how)) for d in seeds]
            k, n = sum(per_seed), len(per_seed)
            models = None  # for a null measured on models: how many (its bound, not the share, is the null)
            if c.null == "untrained":
                p, models = float(np.mean([bool(c.test(_untrained_view(m), how)) for m in untrained])), len(untrained)
            elif c.null == "1 layer":
                p, models = float(np.mean([_one_layer_passes(c, d) for d in one_layer])), len(one_layer)
            elif c.null == "window":
                p = [_window_chance(d["curve"]) for d in seeds]
            else:
                p = float(c.null)
            expected = float(np.sum(p)) if np.ndim(p) else n * p
            tail = "at least" if k >= expected else "at most"
            by[how] = {"count": k, "per_seed": per_seed, "p_null": p, "tail": tail,
                       **count_null(k, n, p, tail, estimated_from=models)}
        status = _status(by)
        out[c.key] = {"text": c.text, "section": c.section, "null_text": c.null_text, "seeds": len(seeds), "by": by,
                      "finding": status == "finding", "status": status}
    return out


def _one_layer_passes(claim, d):
    if claim.key == "learns":  # its accuracy on the variable task, measured after training
        return d["measured"]["ablation"]["zero"]["none"]["accuracy"] > 0.9
    return bool(claim.test(d, "none"))
