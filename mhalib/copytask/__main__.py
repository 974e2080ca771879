"""Train notebook 04's copy-task model on ten seeds, and measure every claim the notebook makes on each.

Usage (from the repository root)::

    python -m mhalib.copytask seeds     # train seeds 0-9 of notebook 04's recipe (and its two 1-layer controls)
    python -m mhalib.copytask measure   # notebook 04's claims on the ten seeds and ten untrained models (no training)
    python -m mhalib.copytask measure --recount   # count them again on the stored measurements
    python -m mhalib.copytask uptrain   # notebook 08's conversions and uptraining, on each of the ten seeds

The rule, fixed before any seed was trained: every seed follows :data:`RECIPE` (the
recipe notebook 04 trains live, seed 0), with the seed the only change. Seed 0's weights
are the shipped ``induction_2layer`` (the command retrains it to record its training and
says whether it reproduced the shipped weights bit for bit; it never overwrites them);
seeds 1-9 ship as ``induction_2layer_seed{s}``. No seed was chosen by its result.

``seeds`` records what only training can show (the loss and accuracy of every step, the
head scores every 25 steps, the 1-layer controls) in ``mhalib/data/copytask_training.json``;
``measure`` records what the trained weights show (head scores, ablation of every head
under three baselines, the induction heads together, the no-repeat probe, and the same
for an untrained model of each seed: the null) with the counts of notebook 04's claims in
``mhalib/data/copytask_claims.json`` (:mod:`mhalib.copytask.claims`); ``uptrain`` converts
each seed to GQA-2 and MQA three ways, uptrains for 20% of its steps and compares its heads
pair by pair (notebook 08), in ``mhalib/data/copytask_uptraining.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from mhalib.checkpoints import load_model, save_model
from mhalib.copytask.model import PRETRAINED
from mhalib.copytask.tasks import distinct_tokens, fixed_offset_task, make_generator, variable_offset_task
from mhalib.copytask.training import evaluate, new_model, steps_to, train
from mhalib.data import DATA_DIR
from mhalib.interpret import head_scores, offset_score, attention_weights

#: Notebook 04's recipe (section 3), and its two controls (section 6).
RECIPE = {"steps": 1500, "batch_size": 64, "lr": 3e-3, "threads": 1, "score_every": 25, "watch_seed": 99,
          "watch_size": 64}
CONTROLS = {"1 layer, variable offset": {"num_layers": 1, "task": "variable", "steps": 1000},
            "1 layer, fixed offset": {"num_layers": 1, "task": "fixed", "steps": 400}}
SEEDS = tuple(range(10))
TRAINING_JSON = "copytask_training.json"
CLAIMS_JSON = "copytask_claims.json"
UPTRAINING_JSON = "copytask_uptraining.json"
#: Notebook 08's uptraining: 20% of the recipe's steps, evaluated at these steps (5% is step 75).
UPTRAIN = {"steps": 300, "eval_at": [0, 15, 30, 45, 60, 75, 100, 150, 200, 250, 300],
           "methods": ["mean", "first", "random"], "groups": [2, 1]}


def seed_path(seed):
    """Where seed ``seed`` of notebook 04's recipe ships (without ``.pt``/``.json``)."""
    if seed not in SEEDS:
        raise ValueError(f"seed {seed!r} does not ship; the shipped seeds are {SEEDS}")
    return DATA_DIR / (PRETRAINED if seed == 0 else f"{PRETRAINED}_seed{seed}")


def _r(x, digits):
    return [round(float(v), digits) for v in np.asarray(x).ravel()]


def train_seed(seed, progress=False):
    """Train one seed of :data:`RECIPE`, scoring the heads every 25 steps; returns ``(model, record)``."""
    task = variable_offset_task()
    watch, _ = task.sample(RECIPE["watch_size"], make_generator(RECIPE["watch_seed"]))
    log = {"step": [], "previous": [], "induction": []}

    def log_scores(step, model):
        if step % RECIPE["score_every"] == 0:
            s = head_scores(model, watch)
            log["step"].append(step)
            for name in ("previous", "induction"):
                log[name].append(np.round(s[name], 3).tolist())

    model = new_model(seed)
    start = time.perf_counter()
    history = train(model, task, RECIPE["steps"], batch_size=RECIPE["batch_size"], lr=RECIPE["lr"], seed=seed,
                    threads=RECIPE["threads"], progress=progress, desc=f"seed {seed}", callback=log_scores)
    seconds = time.perf_counter() - start
    record = {"seed": seed, "seconds": round(seconds, 1), "loss": _r(history["loss"], 4),
              "accuracy 0.9 at": steps_to(history, 0.9),  # the first step the 20-step mean accuracy reaches 0.9
              "accuracy, steps 281-300": round(float(np.mean(history["accuracy"][280:300])), 4),
              "scores": log, "controls": {}}
    fixed = fixed_offset_task()
    for name, c in CONTROLS.items():
        control = new_model(seed, num_layers=c["num_layers"])
        h = train(control, task if c["task"] == "variable" else fixed, c["steps"], seed=seed,
                  threads=RECIPE["threads"], progress=progress, desc=name)
        record["controls"][name] = {"on variable offset": evaluate(control, task),
                                    "on fixed offset": evaluate(control, fixed)}
        if c["task"] == "variable":  # the null of the claims about notebook 04's training curve
            record["controls"][name]["loss"] = _r(h["loss"], 4)
        if c["task"] == "fixed":  # notebook 04, section 6: does it look 7 back with nothing to copy?
            probe, _ = fixed.sample(256, make_generator(7))
            plain = distinct_tokens(256, make_generator(8))
            w_fixed = attention_weights(control, probe)[:, 0]
            w_plain = attention_weights(control, plain)[:, 0]
            record["controls"][name]["previous, with a copy"] = _r(offset_score(w_fixed, 1), 4)
            record["controls"][name]["7 back, with a copy"] = _r(offset_score(w_fixed, 7), 4)
            record["controls"][name]["7 back, no repeats"] = _r(offset_score(w_plain, 7), 4)
    return model, record


def cmd_seeds(args):
    """Train the recipe's seeds (``--seeds``, default 0-9) and write their weights and training records."""
    seeds = args.seeds or list(SEEDS)
    out = Path(args.out) if args.out else DATA_DIR
    records = {}
    path = out / TRAINING_JSON
    if path.exists():
        records = json.loads(path.read_text())["runs"]
    for seed in seeds:
        torch.set_num_threads(RECIPE["threads"])
        model, record = train_seed(seed)
        records[str(seed)] = record
        if seed == 0:
            shipped = load_model(PRETRAINED)
            same = all(torch.equal(a, b) for a, b in zip(shipped.state_dict().values(), model.state_dict().values()))
            record["same_weights_as_shipped"] = same
            print(f"seed 0: the same weights as the shipped {PRETRAINED}, bit for bit: {same}")
        else:
            target = out / seed_path(seed).name
            save_model(model, target, seed=seed, task=variable_offset_task().config(),
                       trained_by="python -m mhalib.copytask seeds",
                       **{k: RECIPE[k] for k in ("steps", "batch_size", "lr", "threads")})
        print(f"seed {seed}: trained in {record['seconds']:.0f} s, final loss {record['loss'][-1]:.4f}", flush=True)
        out.mkdir(parents=True, exist_ok=True)
        _dump(path, {"recipe": RECIPE, "controls": CONTROLS, "made_by": "python -m mhalib.copytask seeds",
                     "runs": dict(sorted(records.items(), key=lambda kv: int(kv[0])))})


def load_seed(seed):
    """Seed ``seed`` of notebook 04's recipe (0 is the shipped ``induction_2layer``)."""
    return load_model(seed_path(seed), "; train it with: python -m mhalib.copytask seeds")


def _dump(path, data):
    path.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {path}")


def cmd_measure(args):
    """Measure notebook 04's claims on every shipped seed and on untrained models, and write the counts."""
    from mhalib.copytask.claims import MEASURE, count_claims, curve_facts, measure_seed, uniform_seen

    torch.set_num_threads(1)
    training = json.loads((DATA_DIR / TRAINING_JSON).read_text())["runs"]
    missing = [s for s in SEEDS if str(s) not in training]
    if missing:
        raise SystemExit(f"no training record of seeds {missing} in {TRAINING_JSON}: "
                         "run python -m mhalib.copytask seeds")
    seen = uniform_seen()
    measured, untrained = {}, {}
    if args.recount:  # count again on the stored measurements
        stored = json.loads((DATA_DIR / CLAIMS_JSON).read_text())
        measured, untrained = stored["measured"], stored["untrained"]
    for seed in [] if args.recount else SEEDS:
        measured[str(seed)] = measure_seed(load_seed(seed))
        untrained[str(seed)] = measure_seed(new_model(seed))
        print(f"seed {seed}: measured", flush=True)
    seeds = [{"measured": measured[str(s)], "training": training[str(s)], "uniform_seen": seen,
              "curve": curve_facts(training[str(s)]["loss"], training[str(s)]["scores"])} for s in SEEDS]
    counts = count_claims(seeds, list(untrained.values()))
    _dump(DATA_DIR / CLAIMS_JSON, {"measure": MEASURE, "seeds": list(SEEDS), "uniform_seen": seen,
                                   "curves": {str(s): d["curve"] for s, d in zip(SEEDS, seeds)},
                                   "measured": measured, "untrained": untrained, "counts": counts,
                                   "made_by": "python -m mhalib.copytask measure"})
    for key, c in counts.items():
        print(f"{key:28s} " + "; ".join(f"{how} {v['count']} of {len(SEEDS)} (null {v['expected']:.1f}, "
                                         f"p {v['p_value']:.3f})" for how, v in c["by"].items()))


def _swap_heads(model, layer, a, b):
    """A copy of an MHA model with heads a and b of one layer exchanged (the same function)."""
    import copy

    out = copy.deepcopy(model)
    attn = out.blocks[layer].attn
    order = list(range(attn.num_heads))
    order[a], order[b] = order[b], order[a]
    rows = torch.cat([torch.arange(h * attn.head_dim, (h + 1) * attn.head_dim) for h in order])
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            proj.weight.copy_(proj.weight[rows])
        attn.o_proj.weight.copy_(attn.o_proj.weight[:, rows])
    return out


def head_pairs(model, fresh, probe, task):
    """Every pair of heads of each layer compared: K cosine, QK-circuit cosine (and a fresh model's), attention
    total variation, and the loss with that pair's K and V mean-pooled (notebook 08, section 2)."""
    import copy

    d_head, d_model, heads = model.config.head_dim, model.config.d_model, model.config.num_heads

    def block(m, layer, name, h):
        return getattr(m.blocks[layer].attn, name).weight.detach().double().view(-1, d_head, d_model)[h]

    def qk(m, layer, h):
        return block(m, layer, "q_proj", h).T @ block(m, layer, "k_proj", h)

    def cos(a, b):
        return float((a.flatten() @ b.flatten()) / (a.norm() * b.norm()))

    weights = attention_weights(model, probe)
    out = {}
    for layer in range(model.num_layers):
        for a in range(heads):
            for b in range(a + 1, heads):
                pooled = copy.deepcopy(model)
                with torch.no_grad():
                    for name in ("k_proj", "v_proj"):
                        w = getattr(pooled.blocks[layer].attn, name).weight.view(heads, d_head, d_model)
                        w[a] = w[b] = (w[a] + w[b]) / 2
                out[f"L{layer} {a}-{b}"] = {
                    "k": round(cos(block(model, layer, "k_proj", a), block(model, layer, "k_proj", b)), 6),
                    "qk": round(cos(qk(model, layer, a), qk(model, layer, b)), 6),
                    "fresh qk": round(cos(qk(fresh, layer, a), qk(fresh, layer, b)), 6),
                    "tv": round(float(0.5 * np.abs(weights[:, layer, a] - weights[:, layer, b]).sum(-1).mean()), 6),
                    "pooled loss": round(evaluate(pooled, task)["loss"], 6)}
    return out


def uptrain_seed(seed):
    """Notebook 08 on seed ``seed``: head pairs, the six conversions before and while uptraining, the lottery."""
    from mhalib.convert import convert_kv
    from mhalib.interpret import head_scores

    task = variable_offset_task()
    mha = load_seed(seed)
    probe, _ = task.sample(256, make_generator(7))
    prev = int(np.argmax(head_scores(mha, probe)["previous"][0]))
    fresh = new_model(1000 + seed)
    out = {"base": evaluate(mha, task), "previous head": prev, "pairs": head_pairs(mha, fresh, probe, task),
           "at start": {}, "curves": {}, "after": {}}
    for g in UPTRAIN["groups"]:
        for m in UPTRAIN["methods"]:
            key = f"{'GQA-2' if g == 2 else 'MQA'} {m}"
            model = convert_kv(mha, g, m, seed=seed)
            out["at start"][key] = evaluate(model, task)
            curve = {0: out["at start"][key]["loss"]}

            def record(step, model, curve=curve):
                if step in UPTRAIN["eval_at"]:
                    curve[step] = evaluate(model, task)["loss"]

            train(model, task, UPTRAIN["steps"], seed=seed + 1, callback=record, progress=False)
            out["curves"][key] = {str(k): round(v, 6) for k, v in sorted(curve.items())}
            out["after"][key] = evaluate(model, task)
    first_slot = prev - prev % 2
    out["previous head first in its group"] = prev == first_slot
    out["first, previous-token head swapped in"] = evaluate(convert_kv(_swap_heads(mha, 0, prev, first_slot), 2,
                                                                       "first"), task)
    return out


def cmd_uptrain(args):
    """Run notebook 08 on each seed (its conversions before and while uptraining) and write the measurements."""
    torch.set_num_threads(1)
    path = DATA_DIR / UPTRAINING_JSON
    runs = json.loads(path.read_text())["runs"] if path.exists() and args.seeds else {}
    for seed in args.seeds or SEEDS:
        start = time.perf_counter()
        runs[str(seed)] = uptrain_seed(seed)
        print(f"seed {seed}: uptrained in {time.perf_counter() - start:.0f} s", flush=True)
        _dump(path, {"uptrain": UPTRAIN, "runs": dict(sorted(runs.items(), key=lambda kv: int(kv[0]))),
                     "made_by": "python -m mhalib.copytask uptrain"})


def main(argv=None):
    """Run one command of ``python -m mhalib.copytask``."""
    parser = argparse.ArgumentParser(prog="python -m mhalib.copytask", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("seeds", "measure", "uptrain"))
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds, uptrain: only these seeds (default 0-9)")
    parser.add_argument("--out", help="seeds: write here instead of mhalib/data")
    parser.add_argument("--recount", action="store_true",
                        help="measure: measure nothing, count the claims again on the stored measurements")
    args = parser.parse_args(argv)
    {"seeds": cmd_seeds, "measure": cmd_measure, "uptrain": cmd_uptrain}[args.command](args)


if __name__ == "__main__":
    main()
