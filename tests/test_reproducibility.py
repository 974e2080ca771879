"""Training the notebook-04 model from its seed reproduces the induction circuit.

Slow (it trains the model: about 15 s on one free core); still part of `make test`.
"""

import pytest

from mhalib.interpret import head_scores
from mhalib.copytask import evaluate, load_pretrained, make_generator, new_model, steps_to, train, variable_offset_task


def test_same_seed_same_numbers():
    runs = [train(new_model(5), steps=30, seed=5, progress=False) for _ in range(2)]
    assert runs[0] == runs[1]
    other = train(new_model(6), steps=30, seed=6, progress=False)
    assert other["loss"] != runs[0]["loss"]


@pytest.mark.slow
def test_notebook_seed_reaches_the_phase_change_with_an_induction_circuit():
    _, meta = load_pretrained()  # the seed and step count notebook 04 used
    seed, steps = meta["seed"], meta["steps"]
    assert steps <= 3000
    model = new_model(seed)
    history = train(model, variable_offset_task(), steps, batch_size=meta["batch_size"],
                    lr=meta["lr"], seed=seed, threads=meta["threads"], progress=False)
    assert history["loss"][0] > 4.0  # starts near ln 64 = 4.16
    reached = steps_to(history, 0.9)
    assert reached is not None and reached <= 3000
    assert evaluate(model)["accuracy"] >= 0.9
    tokens, _ = variable_offset_task().sample(256, make_generator(7))
    scores = head_scores(model, tokens)
    assert scores["previous"][0].max() >= 0.5  # a previous-token head in layer 0
    assert scores["induction"][1].max() >= 0.8  # an induction head in layer 1
