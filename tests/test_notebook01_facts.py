"""Facts notebook 01 and its exercise rely on, checked against independent oracles.

* the worked example (T=3, d=4, two heads of size 2, causal mask) has the values the
  notebook prints, computed by an explicit loop and by torch's fused SDPA;
* the published attention weights the notebook asks learners to check are not the
  softmax of the example's scores at any single scale, and the notebook names where they
  were published;
* the notebook defines a head (Q, K, V, value vectors) before it argues what one head
  cannot do, and defines each term of that argument where it first uses it;
* the solution notebook's graded functions behave like the library's reference, and
  the generated exercise's stubs raise NotImplementedError.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mhalib.np_attention import causal_mask, scaled_dot_product_attention

ROOT = Path(__file__).resolve().parents[1]
NAME = "01_single_head_attention.ipynb"

X = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]], dtype=float)  # (3, 4)
W1 = np.array([[1, 0], [0, 1], [0, 0], [0, 0]], dtype=float)  # (4, 2)
W2 = np.array([[0, 0], [0, 0], [1, 0], [0, 1]], dtype=float)  # (4, 2)

EXPECTED = {
    "S1": [[0.707, 0, 0.707], [0, 0.707, 0.707], [0.707, 0.707, 1.414]],
    "A1": [[1, 0, 0], [0.330, 0.670, 0], [0.248, 0.248, 0.503]],
    "head1": [[1, 0], [0.330, 0.670], [0.752, 0.752]],
    "head2": [[1, 0], [0.330, 0.670], [0.333, 0.333]],
}
PUBLISHED_A1_ROWS = {1: [0.414, 0.586, 0.0], 2: [0.221, 0.221, 0.558]}  # 0-based rows


def loop_attention(q, k, v):
    """Causal attention with explicit loops over queries and keys (math module only)."""
    n, d_k = q.shape
    out = np.zeros((n, v.shape[1]))
    weights = np.zeros((n, n))
    for i in range(n):
        scores = [sum(q[i, t] * k[j, t] for t in range(d_k)) / math.sqrt(d_k) for j in range(i + 1)]
        e = [math.exp(s) for s in scores]
        for j in range(i + 1):
            weights[i, j] = e[j] / sum(e)
            out[i] += weights[i, j] * v[j]
    return out, weights


def test_worked_example_by_explicit_loop():
    q1, q2 = X @ W1, X @ W2  # (3, 2) each
    head1, a1 = loop_attention(q1, q1, q1)
    head2, _ = loop_attention(q2, q2, q2)
    np.testing.assert_allclose(q1 @ q1.T / math.sqrt(2), EXPECTED["S1"], atol=5e-4)
    np.testing.assert_allclose(a1, EXPECTED["A1"], atol=5e-4)
    np.testing.assert_allclose(head1, EXPECTED["head1"], atol=5e-4)
    np.testing.assert_allclose(head2, EXPECTED["head2"], atol=5e-4)


@pytest.mark.parametrize("w, key", [(W1, "head1"), (W2, "head2")])
def test_worked_example_library_and_torch_sdpa(w, key):
    q = X @ w  # (3, 2)
    out, _ = scaled_dot_product_attention(q, q, q, mask=causal_mask(3))
    qt = torch.tensor(q)
    fused = F.scaled_dot_product_attention(qt, qt, qt, is_causal=True).numpy()
    np.testing.assert_allclose(out, EXPECTED[key], atol=5e-4)
    np.testing.assert_allclose(out, fused, atol=1e-12)


def test_published_rows_are_no_softmax_of_the_scores():
    q1 = X @ W1
    raw = q1 @ q1.T  # (3, 3) unscaled scores
    _, a1 = scaled_dot_product_attention(q1, q1, q1, mask=causal_mask(3))
    implied = []
    for row, values in PUBLISHED_A1_ROWS.items():
        values = np.array(values)
        assert np.isclose(values.sum(), 1.0)  # they look like attention weights...
        assert np.abs(values - a1[row]).max() > 0.02  # ...but are not ours
        # for a softmax, log(w_a / w_b) = c (s_a - s_b): solve for the scale c
        implied.append(math.log(values[row] / values[0]) / (raw[row, row] - raw[row, 0]))
    assert abs(implied[0] - implied[1]) > 0.5  # no single scale explains both rows
    assert all(abs(c - 1 / math.sqrt(2)) > 0.2 for c in implied)


def _markdown(path):
    return [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "markdown"]


def test_the_published_example_is_named_where_the_notebook_shows_it():
    shown = [source for source in _markdown(ROOT / "notebooks" / NAME) if "0.414" in source]
    assert shown, "no markdown cell shows the published A1"
    text = " ".join(shown[0].split())  # prose wraps lines anywhere
    for part in ("GPT Explained", "Ju Lin", "2026", "The Matrix: Worked Example"):
        assert part in text, f"the cell that shows the published A1 does not name {part!r}"


# The terms of the argument for several heads, each as it is defined (in italics) where first used.
ARGUMENT_TERMS = {"value vector": r"value vector", "bilinear form": r"bilinear", "convex mix": r"convex",
                  "rank": r"\brank\b"}


def test_notebook_01_defines_a_head_before_it_argues_for_several():
    cells = _markdown(ROOT / "notebooks" / NAME)

    def first(pattern):
        found = [i for i, source in enumerate(cells) if re.search(pattern, source)]
        assert found, f"notebook 01 never mentions {pattern!r}"
        return found[0]

    recipe = first(r"V = X W_v")  # the cell that defines the projections Q, K, V
    argument = first(r"What one head can hold")
    assert recipe < argument, "the argument for several heads comes before the recipe of one head"
    for term, pattern in ARGUMENT_TERMS.items():
        at = first(pattern)
        assert at >= recipe, f"{term!r} is used (markdown cell {at}) before Q, K, V are defined (cell {recipe})"
        assert f"*{term}*" in cells[at], f"{term!r} is not defined where it is first used (markdown cell {at})"
    assert first(r"W_v") >= recipe


def _functions_from(path, names):
    nb = nbformat.read(path, as_version=4)
    namespace = {}
    exec("import numpy as np", namespace)
    found = set()
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.cell_type == "code" and grade_id in names:
            exec(cell.source, namespace)
            found.add(grade_id)
    assert found == set(names), f"{path.name}: graded cells found {sorted(found)}"
    return [namespace[n] for n in names]


@pytest.fixture(scope="module")
def solution():
    path = ROOT / "solutions" / NAME
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["mhalib"]["exercise"] == "01_single_head_attention"
    return _functions_from(path, ["causal_mask", "scaled_dot_product_attention"])


@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_solution_causal_mask_matches_reference(solution, n):
    mask = solution[0](n)
    assert mask.shape == (n, n) and np.issubdtype(mask.dtype, np.floating)
    np.testing.assert_array_equal(mask, causal_mask(n))


def test_solution_causal_mask_rejects_zero(solution):
    with pytest.raises(ValueError):
        solution[0](0)


MASKS = {
    "none": lambda b, h, n: None,
    "causal (N, N)": lambda b, h, n: causal_mask(n),
    "per batch (B, 1, N, N)": lambda b, h, n: np.where(
        np.random.default_rng(1).random((b, 1, n, n)) < 0.3, -np.inf, 0.0) + causal_mask(n),
    "boolean (N, N)": lambda b, h, n: np.tril(np.ones((n, n), dtype=bool)),
    "row fully blocked": lambda b, h, n: np.where(np.arange(n)[:, None] == 0, -np.inf, causal_mask(n)),
}


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_solution_sdpa_matches_reference(solution, mask_name, dtype):
    sdpa = solution[1]
    rng = np.random.default_rng(0)
    b, h, n, d_k, d_v = 2, 3, 6, 4, 5
    q = rng.standard_normal((b, h, n, d_k)).astype(dtype)
    k = rng.standard_normal((b, h, n, d_k)).astype(dtype)
    v = rng.standard_normal((b, h, n, d_v)).astype(dtype)
    mask = MASKS[mask_name](b, h, n)
    out, weights = sdpa(q, k, v, mask=mask)
    ref_out, ref_weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert out.shape == (b, h, n, d_v) and weights.shape == (b, h, n, n)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(weights, ref_weights, atol=tol)
    np.testing.assert_allclose(out, ref_out, atol=tol)
    assert not np.isnan(weights).any()


def test_solution_sdpa_matches_torch_with_cross_attention_shapes(solution):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 3))  # (B, N_q, d_k)
    k = rng.standard_normal((2, 7, 3))  # (B, N_k, d_k)
    v = rng.standard_normal((2, 7, 5))  # (B, N_k, d_v)
    out, weights = solution[1](q, k, v)
    fused = F.scaled_dot_product_attention(*map(torch.tensor, (q, k, v))).numpy()
    assert weights.shape == (2, 4, 7)
    np.testing.assert_allclose(out, fused, atol=1e-12)


@pytest.mark.parametrize("mask_shape", [(3, 3), (2, 2, 6, 6), (4, 1, 6, 6)])
def test_solution_sdpa_rejects_masks_that_do_not_fit(solution, mask_shape):
    q = np.zeros((2, 6, 4))  # scores (2, 6, 6)
    with pytest.raises(ValueError):
        solution[1](q, q, q, mask=np.zeros(mask_shape))


def test_exercise_stubs_raise_not_implemented():
    path = ROOT / "exercises" / NAME
    causal, sdpa = _functions_from(path, ["causal_mask", "scaled_dot_product_attention"])
    with pytest.raises(NotImplementedError):
        causal(3)
    with pytest.raises(NotImplementedError):
        sdpa(np.zeros((3, 2)), np.zeros((3, 2)), np.zeros((3, 2)))


def test_course_check_accepts_the_solution_and_rejects_the_stubs(capsys):
    from mhalib.check import check

    causal, sdpa = _functions_from(ROOT / "solutions" / NAME, ["causal_mask", "scaled_dot_product_attention"])
    assert check("causal_mask", causal) is True
    assert check("scaled_dot_product_attention", sdpa) is True
    stub_causal, stub_sdpa = _functions_from(ROOT / "exercises" / NAME,
                                             ["causal_mask", "scaled_dot_product_attention"])
    assert check("causal_mask", stub_causal) is False
    assert check("scaled_dot_product_attention", stub_sdpa) is False
    assert "not written yet" in capsys.readouterr().out
