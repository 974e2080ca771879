"""Notebook 10's explorer: every slider position draws a view or says in words why it cannot.

The measurements are made up here (``fake_results``), so the test holds the render logic (the
name a position maps to, the frontier, the ringed point) apart from what training measured.
"""

import itertools

import pytest

from mhalib.variants.model import FIXED_WIDTH, variant_config
from mhalib.variants.measure import cache_bytes
from mhalib.widgets.tradeoff import (KV_OPTIONS, LATENT_OPTIONS, METRICS, WINDOW_OPTIONS, configuration_name,
                                     render_tradeoff)


def fake_results():
    recall = {"MHA": 1.0, "GQA-4": 0.99, "GQA-2": 0.995, "MQA": 0.98, "MLA-16": 0.97, "MLA-32": 0.999,
              "SWA-8": 0.3, "SWA-16": 0.5, "SWA-8+sink": 0.31, "SWA-16+sink": 0.52}
    runs = {v: {str(s): {"recall": r - 0.001 * s, "loss": 2.0 + (1 - r), "coreference": r} for s in range(5)}
            for v, r in recall.items()}
    shapes = {v: {"cache_bytes_64": cache_bytes(variant_config(v), 64)} for v in recall}
    return {"runs": runs, "shapes": shapes}


def test_every_slider_position_draws_or_explains():
    results = fake_results()
    drawn = set()
    for g, latent, window, metric in itertools.product(KV_OPTIONS, LATENT_OPTIONS, WINDOW_OPTIONS, METRICS):
        view = render_tradeoff(g, latent, window, metric, results=results)
        name, why = configuration_name(g, latent, window)
        if name is None:
            assert not view.ok and view.figure is None and why.split(":")[0] in view.text, view.text
            assert "Measured: MHA" in view.text
        else:
            assert view.ok, (g, latent, window, view.text)
            assert view.data["name"] == name and name in view.text and view.alt
            drawn.add(name)
    assert drawn == set(FIXED_WIDTH)  # every measured variant is reachable with the sliders


def test_the_ringed_point_and_the_frontier():
    results = fake_results()
    view = render_tradeoff(1, "none", "none", "recall", results=results)
    assert view.data["name"] == "MQA" and view.data["cost"] == cache_bytes(variant_config("MQA"), 64)
    # MQA (4,096 bytes, 0.98) is beaten by nothing as cheap: on the frontier; GQA-4 (0.99 at twice GQA-2's
    # bytes) is beaten by GQA-2 (0.995): off it
    assert view.data["on_front"] and "on the frontier" in view.text
    assert not render_tradeoff(4, "none", "none", "recall", results=results).data["on_front"]
    # for the loss, lower is better: the same ordering of variants, the same frontier
    loss = render_tradeoff(4, "none", "none", "loss", results=results)
    assert loss.data["frontier"] == view.data["frontier"]


@pytest.mark.parametrize("args", [(3, "none", "none", "recall"), (8, 64, "none", "recall"),
                                  (8, "none", 12, "recall"), (8, "none", "none", "speed")])
def test_bad_values_get_a_message_not_a_traceback(args):
    view = render_tradeoff(*args, results=fake_results())
    assert not view.ok and view.figure is None
    assert "must be one of" in view.text or "Unknown quantity" in view.text


def test_missing_measurements_are_a_message():
    results = fake_results()
    del results["runs"]["MQA"]
    view = render_tradeoff(1, "none", "none", "recall", results=results)
    assert not view.ok and "MQA was not trained" in view.text and "Traceback" not in view.text
    broken = render_tradeoff(8, "none", "none", "recall", results={"nothing": 1})
    assert not broken.ok and "could not be drawn" in broken.text


def test_moving_one_slider_always_changes_what_is_shown():
    """A keyboard user moving any one slider sees the view change (the browser test walks them so)."""
    results = fake_results()
    options = {"num_kv_heads": KV_OPTIONS, "latent": LATENT_OPTIONS, "window": WINDOW_OPTIONS, "metric": tuple(METRICS)}
    for g, latent, window, metric in itertools.product(KV_OPTIONS, LATENT_OPTIONS, WINDOW_OPTIONS, METRICS):
        here = {"num_kv_heads": g, "latent": latent, "window": window, "metric": metric}
        shown = render_tradeoff(**here, results=results).text
        for name, values in options.items():
            for value in values:
                if value != here[name]:
                    moved = dict(here, **{name: value})
                    assert render_tradeoff(**moved, results=results).text != shown, (here, name, value)
