"""Train and measure the attention variants of notebook 10.

Usage (from the repository root; each model trains in about 1 to 2 minutes on one CPU thread)::

    python -m mhalib.variants train                 # every variant, seeds 0-4 -> artifacts/variants/
    python -m mhalib.variants train --variants SWA-32 --seeds 0   # exercise 10's configuration (shipped)
    python -m mhalib.variants train --variants MQA SWA-8 --seeds 0 1   # some of them
    python -m mhalib.variants measure               # gather the runs' measurements -> mhalib/data/variants.json
    python -m mhalib.variants measure --again       # measure the trained runs anew
    python -m mhalib.variants convert               # MHA -> GQA by mean pooling, then uptraining, measured
    python -m mhalib.variants time                  # decode time per variant (fused kernel), stored with the machine
    python -m mhalib.variants all                   # all four

Every run follows :data:`~mhalib.variants.training.RECIPE`; seed s draws the weights
(``torch.manual_seed(s)``) and the training text, so seed s of every variant reads the same
batches. No run was chosen by its result: every seed of every variant that trained is measured.
Start two commands with different ``--variants`` to use two cores.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from mhalib.checkpoints import load_model, save_model
from mhalib.convert import convert_kv
from mhalib.data import DATA_DIR
from mhalib.variants.measure import EVAL, cache_bytes, measure_quality, time_decode
from mhalib.variants.model import (FIXED_PARAMS, FIXED_WIDTH, RUNS_DIR, SHIPPED, SHIPPED_DIR, VARIANTS,
                                   new_variant_model, parameter_count, variant_config, variant_path)
from mhalib.variants.training import RECIPE, train_variant

SEEDS = (0, 1, 2, 3, 4)
RESULTS = DATA_DIR / "variants.json"
#: Conversion (notebook 08's recipe on these models): mean-pool MHA's K/V heads, then train on.
CONVERT = {"targets": {"GQA-4": 4, "GQA-2": 2, "MQA": 1}, "uptrain_steps": 150, "lr": 1e-3}
LONG_CONTEXT = 65536  # the long text whose cache the notebook sets beside the 64 tokens trained
DECODE_TOKENS = 32768
#: Decode steps are timed at 16 times the trained widths: heads of 128 numbers (Llama's), latents of
#: 256 and 512 with a rotated key of 64 (DeepSeek's is 512 + 64): the reading, not the fixed costs of
#: rows of 8 floats, is what is timed.
DECODE_SCALE = 16


def _load(path):
    return json.loads(path.read_text()) if path.exists() else {}


def _save(results):
    RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def train(variants, seeds):
    """Train each variant from each seed, measure it, save weights and measurements under RUNS_DIR."""
    RUNS_DIR.mkdir(parents=True, exist_ok=True)
    for name in variants:
        for seed in seeds:
            model = new_variant_model(name, seed)
            start = time.perf_counter()
            history = train_variant(model, seed=seed, progress=False)
            seconds = time.perf_counter() - start
            measured = measure_quality(model)
            facts = dict(variant=name, seed=seed, recipe=RECIPE, train_seconds=round(seconds, 1),
                         final_loss=history["loss"][-1], measured=measured)
            save_model(model, variant_path(name, seed), **facts)
            if (name, seed) in SHIPPED:
                SHIPPED_DIR.mkdir(parents=True, exist_ok=True)
                save_model(model, variant_path(name, seed, shipped=True), **facts)
            print(f"{name} seed {seed}: {seconds:.0f} s, loss {measured['loss']:.4f}, agreement "
                  f"{measured['agreement']:.3f}, coreference {measured['coreference']:.3f}, recall "
                  f"{measured['recall']:.3f}", flush=True)


def measure(variants, seeds, again=False):
    """Gather each run's measurements (taken when it was trained) into RESULTS; ``again``: measure anew.

    A shipped run (:data:`~mhalib.variants.model.SHIPPED`) is read from where it ships."""
    results = _load(RESULTS)
    runs = results.setdefault("runs", {})
    for name in variants:
        config = variant_config(name)
        for seed in seeds:
            model = load_model(variant_path(name, seed, shipped=(name, seed) in SHIPPED))
            row = measure_quality(model) if again else dict(model.metadata["measured"])
            row["train_seconds"] = model.metadata["train_seconds"]
            runs.setdefault(name, {})[str(seed)] = row
            print(f"{name} seed {seed}: loss {row['loss']:.4f}, agreement {row['agreement']:.3f}, "
                  f"coreference {row['coreference']:.3f}, recall {row['recall']:.3f}", flush=True)
        results.setdefault("shapes", {})[name] = {
            "parameters": parameter_count(config), "cache_bytes_64": cache_bytes(config, 64),
            "cache_bytes_long": cache_bytes(config, LONG_CONTEXT), "mlp_width": config.mlp_width or 4 * config.d_model}
    results["eval"], results["recipe"] = EVAL, RECIPE
    results["seeds"] = list(SEEDS)  # the recipe's seeds (a shipped extra run may have fewer)
    _save(results)


def convert(seeds):
    """MHA's seeds mean-pooled to each GQA/MQA target, measured before and after uptraining."""
    results = _load(RESULTS)
    rows = results.setdefault("converted", {})
    for name, g in CONVERT["targets"].items():
        for seed in seeds:
            mha = load_model(variant_path("MHA", seed))
            model = convert_kv(mha, g)
            before = measure_quality(model)
            train_variant(model, seed=100 + seed, steps=CONVERT["uptrain_steps"], lr=CONVERT["lr"], warmup=10,
                          progress=False)
            after = measure_quality(model)
            rows.setdefault(name, {})[str(seed)] = {"pooled": before, "uptrained": after}
            print(f"MHA -> {name} seed {seed}: recall {before['recall']:.3f} -> {after['recall']:.3f}, loss "
                  f"{before['loss']:.4f} -> {after['loss']:.4f}", flush=True)
    results["convert"] = CONVERT
    _save(results)


def time_variants():
    """One decode step's attention per fixed-width variant over DECODE_TOKENS, with the machine."""
    results = _load(RESULTS)
    configs = {name: variant_config(name) for name in FIXED_WIDTH}
    seconds = time_decode(configs, DECODE_TOKENS, threads=1, scale=DECODE_SCALE)
    results["decode"] = {"tokens": DECODE_TOKENS, "threads": 1, "scale": DECODE_SCALE, "seconds": seconds,
                         "machine": f"{platform.processor() or platform.machine()}, torch {torch.__version__}"}
    for name, s in seconds.items():
        print(f"{name}: {s * 1e6:.0f} us per step and layer", flush=True)
    _save(results)


def main(argv=None):
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m mhalib.variants", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("train", "measure", "convert", "time", "all"))
    parser.add_argument("--variants", nargs="+", default=list(FIXED_WIDTH) + list(FIXED_PARAMS), metavar="NAME",
                        help=f"which variants (default all but {', '.join(n for n in VARIANTS if n not in FIXED_WIDTH and n not in FIXED_PARAMS)}): {', '.join(VARIANTS)}")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS), help="which seeds (default 0-4)")
    parser.add_argument("--again", action="store_true", help="measure: measure the weights anew")
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if args.command in ("train", "all"):
        train(args.variants, args.seeds)
    if args.command in ("measure", "all"):
        measure(args.variants, args.seeds, args.again)
    if args.command in ("convert", "all"):
        convert(args.seeds)
    if args.command in ("time", "all"):
        time_variants()
    return 0


if __name__ == "__main__":
    sys.exit(main())
