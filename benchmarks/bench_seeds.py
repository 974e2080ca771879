"""How reproducible is the phase change? Steps to accuracy 0.9 for the notebook's seed and three more.

Trains the notebook-04 model (2 layers, 4 heads, variable-offset copy task, Adam 3e-3,
batch 64, one thread) from seed 0 (the notebook's) and seeds 1, 2, 3. Each run stops
once held-out accuracy reaches 0.95 (checked every 25 steps) or after 3,000 steps.
Reported: the step at which the 20-step mean training accuracy first reached 0.9 (the
notebook's measure), its ratio to the notebook seed's, and the best previous-token
(layer 0) and induction (layer 1) scores at the end of the run.

Run: python benchmarks/bench_seeds.py   (a minute or two on one free core)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import print_table  # noqa: E402

from mhalib.interpret import head_scores  # noqa: E402
from mhalib.copytask.tasks import make_generator, variable_offset_task  # noqa: E402
from mhalib.copytask.training import evaluate, new_model, steps_to, train  # noqa: E402

NOTEBOOK_SEED = 0
SEEDS = [NOTEBOOK_SEED, 1, 2, 3]
MAX_STEPS = 3000


def stop_when_learned(task, every=25, target=0.95):
    """A train() callback: True (stop) once held-out accuracy reaches ``target``."""
    def callback(step, model):
        return step % every == 0 and evaluate(model, task, batch_size=256)["accuracy"] >= target
    return callback


def main():
    task = variable_offset_task()
    probe, _ = task.sample(256, make_generator(7))
    rows, reference = [], None
    for seed in SEEDS:
        model = new_model(seed)
        history = train(model, task, MAX_STEPS, seed=seed, progress=False, callback=stop_when_learned(task))
        reached = steps_to(history, 0.9)
        if seed == NOTEBOOK_SEED:
            reference = reached
        scores = head_scores(model, probe)
        rows.append([
            f"{seed}{' (notebook)' if seed == NOTEBOOK_SEED else ''}",
            "not reached" if reached is None else str(reached),
            "-" if reached is None or reference is None else f"{reached / reference:.2f}",
            str(len(history["loss"])),
            f"{evaluate(model, task)['accuracy']:.3f}",
            f"{scores['previous'][0].max():.2f}",
            f"{scores['induction'][1].max():.2f}",
        ])
        print(f"seed {seed} done", file=sys.stderr, flush=True)
    print(f"Steps until the 20-step mean training accuracy reaches 0.9 (runs stop at held-out "
          f"accuracy 0.95 or {MAX_STEPS} steps)")
    print_table(["seed", "steps to 0.9", "ratio to notebook seed", "steps run", "eval accuracy",
                 "best prev-token L0", "best induction L1"], rows)


if __name__ == "__main__":
    main()
