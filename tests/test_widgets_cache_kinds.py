"""The cache-kinds explorer of notebook 09: every slider position renders, with the bytes of the
formulas written out here (2 x layers x g x d_k x 2 bytes; (r + d_R) x layers x 2 for MLA)."""

import pytest

from mhalib.widgets.kv import CONTEXT_OPTIONS, WINDOW_OPTIONS, cache_kinds_explorer, render_cache_kinds


@pytest.mark.parametrize("n", CONTEXT_OPTIONS)
@pytest.mark.parametrize("window", WINDOW_OPTIONS)
def test_every_position_has_the_formula_bytes(n, window):
    view = render_cache_kinds(n, window)
    assert view.ok and view.figure is not None, view.text
    totals = list(view.data["total_bytes"].values())
    assert totals == [2 * 32 * 32 * 128 * 2 * n, 2 * 32 * 8 * 128 * 2 * n,
                      2 * 32 * 8 * 128 * 2 * min(n, window), (512 + 64) * 61 * 2 * n]
    assert ("capped at the window" in view.text) == (n > window)


def test_published_numbers_and_batch():
    view = render_cache_kinds(32768, 4096, batch_size=2)
    per = list(view.data["bytes_per_token"].values())
    assert per == [512 * 2**10, 128 * 2**10, 128 * 2**10, 70_272]
    assert list(view.data["total_bytes"].values())[2] == 2 * 512 * 2**20
    assert "68.6 KiB per token" in view.text and "batch 2" in view.text


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, "long"])
def test_bad_values_give_a_message_not_an_exception(bad):
    for args in ((bad, 4096), (4096, bad)):
        view = render_cache_kinds(*args)
        assert not view.ok and "whole number of at least 1" in view.text


def test_explorer_builds_and_redraws():
    import ipywidgets as w

    box = cache_kinds_explorer()
    assert "mhalib-explorer" in box._dom_classes
    sliders = [c for c in box.children if isinstance(c, w.SelectionSlider)] or [
        s for c in box.children for s in getattr(c, "children", ()) if isinstance(s, w.SelectionSlider)]
    assert len(sliders) == 2
    sliders[0].value = 1024  # a redraw must not raise
