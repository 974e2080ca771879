"""The grader on the course's own notebooks: every solution full marks, every exercise zero."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mhalib.grade import exercises as registry
from mhalib.grade import release
from mhalib.grade.grader import grade_notebook, load_notebook

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))


def _ids(paths):
    return [p.stem for p in paths]


@pytest.mark.parametrize("path", SOLUTIONS + EXERCISES, ids=_ids(SOLUTIONS) + _ids(EXERCISES))
def test_every_notebook_has_a_grader_spec(path):
    nb = load_notebook(path)
    ex, how = registry.recognise(nb.get("metadata"), path)
    assert ex is not None, f"{path.name}: no grader spec in mhalib/grade/exercises for this exercise"
    assert nb["metadata"].get("mhalib", {}).get("exercise") == ex.key, how


@pytest.mark.parametrize("path", SOLUTIONS, ids=_ids(SOLUTIONS))
def test_solution_grades_full_marks(path):
    result = grade_notebook(path)
    assert result.exercise is not None
    assert result.score == result.max_score > 0, result.text()


@pytest.mark.parametrize("path", SOLUTIONS, ids=_ids(SOLUTIONS))
def test_solution_points_match_the_grader(path):
    """The points a solution notebook announces in its nbgrader metadata are the grader's."""
    nb = load_notebook(path)
    ex, _ = registry.recognise(nb.get("metadata"), path)
    graded_points = {}
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution") and "points" in meta:
            graded_points[meta["grade_id"]] = meta["points"]
    spec_points = {}
    for g in ex.graded:
        spec_points[g.lookup] = spec_points.get(g.lookup, 0) + g.points
    for name, points in graded_points.items():
        assert name in spec_points, f"{path.name}: graded cell {name!r} is not graded by the grader"
        assert points == spec_points[name], (
            f"{path.name}: {name} is worth {points} points in the notebook, {spec_points[name]} in the grader")


@pytest.mark.parametrize("path", SOLUTIONS, ids=_ids(SOLUTIONS))
def test_untouched_exercise_grades_zero(path, tmp_path):
    """The exercise made from the solution (as `make exercises` makes it) scores zero."""
    exercise = tmp_path / path.name
    exercise.write_text(release.render(path), encoding="utf-8")
    result = grade_notebook(exercise)
    assert result.exercise is not None
    assert result.score == 0 and result.max_score > 0, result.text()
    for check in result.checks:
        assert "not written yet" in check.output, check.output


@pytest.mark.parametrize("path", EXERCISES, ids=_ids(EXERCISES))
def test_committed_exercise_grades_zero(path):
    result = grade_notebook(path)
    assert result.score == 0 and result.max_score > 0, result.text()


def test_every_exercise_spec_is_consistent():
    exercises = registry.all_exercises()
    assert exercises, "no exercise specs found"
    for key, ex in exercises.items():
        assert key[:2].isdigit() and key[2] == "_"
        assert ex.graded and all(g.points > 0 for g in ex.graded)
        names = [g.name for g in ex.graded]
        assert len(names) == len(set(names)), f"{key}: duplicate graded names"
        for g in ex.graded:
            cases = g.visible_cases()
            assert len(cases) >= 2, f"{key}.{g.name}: too few cases"
            a = g.make_cases(np.random.default_rng(12345))
            b = g.make_cases(np.random.default_rng(54321))
            assert any(repr(x.args) != repr(y.args) for x, y in zip(a, b)), (
                f"{key}.{g.name}: the inputs do not depend on the grading seed")


def test_cli_writes_results_and_csv_and_exits_one_for_a_file_not_graded(tmp_path):
    if not SOLUTIONS:
        pytest.skip("no solution notebooks yet")
    sol = SOLUTIONS[0]
    bad = tmp_path / "not_a_notebook.ipynb"  # no exercise number: not graded
    bad.write_text("{ this is not json")
    broken = tmp_path / f"{sol.stem}_broken.ipynb"  # a known exercise, truncated: graded, 0
    broken.write_text(sol.read_text()[:500])
    results, table = tmp_path / "results.json", tmp_path / "class.csv"
    cmd = [sys.executable, "-m", "mhalib.grade", str(sol), str(bad), str(broken), "--results", str(results),
           "--csv", str(table), "--jobs", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 1, proc.stderr  # not_a_notebook.ipynb was not graded, broken is not readable
    assert "TOTAL" in proc.stdout
    data = json.loads(results.read_text())
    first, second = data["submissions"]
    assert first["score"] > 0 and all(t["status"] == "passed" for t in first["tests"])
    assert second["score"] == 0 and second["submission"] == str(broken)
    # the file that is no exercise is reported apart, and the mean leaves it out
    (unknown,) = data["not_graded"]
    assert unknown["submission"] == str(bad) and "not a valid notebook" in unknown["reason"]
    assert data["mean_score"] == pytest.approx(first["score"] / 2)
    assert f"graded 2 submissions; mean score {first['score'] / 2:.2f}" in proc.stdout, proc.stdout
    assert f"not graded, left out of the mean (1): {bad}" in proc.stdout, proc.stdout
    rows = list(csv.reader(table.read_text().splitlines()))
    assert rows[0][:4] == ["submission", "exercise", "score", "max_score"] and len(rows) == 4
    by_path = {row["submission"]: row for row in csv.DictReader(table.read_text().splitlines())}
    assert by_path[str(broken)]["score"] == "0" and by_path[str(sol)]["score"] == f"{first['score']:g}"
    assert [by_path[str(bad)][k] for k in ("exercise", "score", "max_score")] == ["", "", ""], \
        "a file that is not graded has no score to average"
    assert by_path[str(bad)]["checks"].startswith("not graded: ")
    proc = subprocess.run(cmd[:4] + ["--results", str(results), "--csv", str(table)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0
    single = json.loads(results.read_text())
    assert set(single) >= {"score", "tests"} and all(
        set(t) >= {"name", "score", "max_score", "status", "output"} for t in single["tests"])
    assert len(table.read_text().splitlines()) == 4  # the solution's row replaced, the others kept


@pytest.mark.parametrize("metadata, filename, key", [
    ({"mhalib": {"exercise": "02_multi_head_attention"}}, "whatever.ipynb", "02_multi_head_attention"),
    ({"mhalib": {"exercise": "99_unknown"}}, "03_mha_in_pytorch_alice.ipynb", "03_mha_in_pytorch"),
    ({}, "ex01.ipynb", "01_single_head_attention"),
    (None, "exercise_7 (1).ipynb", "07_mqa_gqa"),
    ({}, "6_kv_cache_bob.ipynb", "06_kv_cache"),
    ({}, "homework.ipynb", None),
])
def test_recognise_by_metadata_then_file_name(metadata, filename, key):
    ex, how = registry.recognise(metadata, filename)
    assert (ex.key if ex else None) == key
    if ex is not None:
        assert ("metadata" in how) == bool(metadata and metadata["mhalib"]["exercise"] == key)


def test_unrecognised_submission_is_reported_not_crashed(tmp_path):
    path = tmp_path / "homework.ipynb"
    path.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    result = grade_notebook(path)
    assert result.exercise is None and result.score == 0 and not result.graded
    assert "could not tell which exercise" in result.text()
    assert "NOT GRADED" in result.text() and "TOTAL" not in result.text()
    assert result.gradescope()["score"] == 0


def _submission(tmp_path, solution, grade_id, source):
    """The solution notebook with the answer cell ``grade_id`` replaced by ``source``."""
    nb = load_notebook(ROOT / "solutions" / solution)
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            cell["source"] = source
            break
    else:
        raise AssertionError(f"{solution} has no cell {grade_id!r}")
    path = tmp_path / solution
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


_MHA = """def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):
    q, k, v = (split_heads(x @ w, num_heads) for w in (w_q, w_k, w_v))  # (..., H, N, d_head)
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (..., H, N, N)
    if mask is not None:
        scores = scores + mask
    {weights}
    return {out}, weights
"""
_SOFTMAX = "weights = softmax(scores)"
_KEYS_AXIS = ("e = np.exp(scores - scores.max(axis=-2, keepdims=True))\n"
              "    weights = e / e.sum(axis=-2, keepdims=True)  # over the queries")
_MASK = """def causal_mask(n):
    {refuse}
    return np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, 0.0)
"""
_SPLIT_WRONG = _MHA.replace("(split_heads(x @ w, num_heads) for w in (w_q, w_k, w_v))",
                            "((x @ w).reshape(*x.shape[:-2], num_heads, x.shape[-2], -1) for w in (w_q, w_k, w_v))")

# (solution, answer cell, its source, graded check, words its feedback must contain, words it must not);
# the sources are written here, as a learner would write them
MISTAKES = {
    "softmax_wrong_axis": ("02_multi_head_attention.ipynb", "multi_head_attention",
                           _MHA.format(weights=_KEYS_AXIS, out="merge_heads(weights @ v) @ w_o"),
                           "multi_head_attention", "softmax over the wrong axis", "split"),
    "heads_summed": ("02_multi_head_attention.ipynb", "multi_head_attention",
                     _MHA.format(weights=_SOFTMAX, out="(weights @ v).sum(axis=-3) @ w_o"),
                     "multi_head_attention", "the heads were summed instead of concatenated", "wrong axis"),
    "heads_summed_no_w_o": ("02_multi_head_attention.ipynb", "multi_head_attention",
                            _MHA.format(weights=_SOFTMAX, out="(weights @ v).sum(axis=-3)"),
                            "multi_head_attention", "the heads were summed instead of concatenated", "wrong axis"),
    "split_wrong": ("02_multi_head_attention.ipynb", "multi_head_attention",
                    _SPLIT_WRONG.format(weights=_SOFTMAX, out="merge_heads(weights @ v) @ w_o"),
                    "multi_head_attention", "heads come out in the wrong order", "wrong axis"),
    # n = 0 returns an empty mask; n = -3 makes NumPy raise a ValueError of its own, which does not
    # name the -3 that was given, so it does not count as the check the exercise asks for
    "no_value_error": ("01_single_head_attention.ipynb", "causal_mask", _MASK.format(refuse="pass"),
                       "causal_mask (n < 1)", ("(causal_mask(0)): returned an array of shape (0, 0) and dtype "
                                               "float64; it should raise ValueError",
                                               "(causal_mask(-3)): causal_mask raised ValueError: negative "
                                               "dimensions are not allowed",
                                               "but the message does not name what was given (-3)"),
                       "(causal_mask(0)): causal_mask raised"),
    "assert_not_value_error": ("01_single_head_attention.ipynb", "causal_mask",
                               _MASK.format(refuse="assert n >= 1, 'n must be positive'"),
                               "causal_mask (n < 1)", ("raised AssertionError: n must be positive",
                                                       "it should raise ValueError"), "returned"),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_grader_names_the_mistake(mistake, tmp_path):
    solution, grade_id, source, check_name, words, not_words = MISTAKES[mistake]
    result = grade_notebook(_submission(tmp_path, solution, grade_id, source), seed=11)
    by_name = {c.name: c for c in result.checks}
    failed = by_name[check_name]
    assert failed.status == "failed", failed.output
    for expected in (words,) if isinstance(words, str) else words:
        assert expected in failed.output, failed.output
    assert not_words not in failed.output, failed.output
    # the mistake costs only the check it belongs to
    for c in result.checks:
        if c.name != check_name:
            assert c.score == c.max_score, result.text()


def test_grader_counts_a_value_error_subclass_as_a_value_error(tmp_path):
    source = ("class PositionsError(ValueError):\n    pass\n\n\n"
              + _MASK.format(refuse="if n < 1:\n        raise PositionsError(f'n={n}; need n >= 1')"))
    result = grade_notebook(_submission(tmp_path, "01_single_head_attention.ipynb", "causal_mask", source), seed=11)
    assert result.score == result.max_score, result.text()


def test_instructors_guide_lists_what_each_exercise_forbids():
    """The guide's table of forbidden calls and the exercises' lists agree."""
    import re

    from mhalib.grade.worker import FRIENDLY_NAMES

    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    table = guide[guide.index("What each exercise forbids:"):].split("\n\n")[1]
    rows = {}
    for line in table.splitlines()[2:]:
        numbers, forbidden = line.strip("|").split("|")[:2]
        for number in re.findall(r"\d\d", numbers):
            rows[number] = forbidden
    assert set(rows) == {key[:2] for key in registry.all_exercises()}
    for key, ex in registry.all_exercises().items():
        in_code = {FRIENDLY_NAMES.get(rule, rule) for g in ex.graded for rule in g.forbidden if rule.startswith("torch")}
        in_guide = set(re.findall(r"`(torch\.[\w.]+)`", rows[key[:2]]))
        allowed = {"torch.nn.functional.scaled_dot_product_attention"} if "allowed" in rows[key[:2]] else set()
        assert in_guide - allowed == in_code, f"exercise {key}: the guide says {in_guide}, the code {in_code}"
        assert "`mhalib`" in rows[key[:2]]


@pytest.mark.parametrize("notebook", [
    {"cells": [{"cell_type": "code", "metadata": [], "source": ["import numpy as np\n", 7]}], "metadata": {}},
    {"cells": [{"cell_type": "code", "metadata": {"tags": "self-check"}, "source": None}, 3, None], "metadata": []},
    {"cells": [], "metadata": {"mhalib": "01"}, "nbformat": 4, "nbformat_minor": 5},
    {"cells": [{"cell_type": "code"}], "metadata": {"mhalib": {"exercise": ["01"]}}, "nbformat": 99},
    {"cells": "many", "nbformat": 4, "nbformat_minor": 5},
], ids=["odd-metadata", "odd-cells", "odd-mhalib", "odd-version", "cells-not-a-list"])
def test_malformed_notebooks_are_results_not_errors(notebook, tmp_path):
    """A notebook of a known exercise (by its name) that is JSON of the wrong shape: graded
    or refused with a reason, never an internal error."""
    notebook = {"nbformat": 4, "nbformat_minor": 5, **notebook}
    path = tmp_path / "01_odd.ipynb"
    path.write_text(json.dumps(notebook))
    result = grade_notebook(path, seed=1)
    assert result.exercise == "01_single_head_attention" and result.score == 0, result.text()
    assert len(result.checks) == 3 and "internal grader error" not in result.text()


IPYTHON_CELLS = [
    "%matplotlib inline\n!echo this shell command does not run\nlisting = !ls\n%time OFFSET = 1",
    "%%time\n# the body of a timed cell runs as the cell\nLABEL = (\"%d heads\"\n         % 4)",
    "%%bash\necho a cell that is not Python: skipped\nexit 1",
    "causal_mask?",
    "  \n\r\n%%time\nTIMED_CELL = 1",
    "%timeit -n 3 -r 1 TIMED = OFFSET + 1\n%prun -s cumulative PROFILED = 3",
    "\n\n_solution_mask = causal_mask\n\ndef causal_mask(n):\n    assert OFFSET == 1 and LABEL == \"4 heads\" and listing is None\n"
    "    assert TIMED_CELL == 1 and TIMED == 2 and PROFILED == 3\n"
    "    return _solution_mask(n)\n",
]


def test_ipython_syntax_runs_as_jupyter_runs_it(tmp_path):
    """Magics, shell commands, help and cell magics in a finished notebook: IPython's own
    transformer turns them into Python (a ``%`` that starts a continuation line inside
    brackets is left alone; ``%time``'s statement runs; ``%%bash`` is skipped), so the
    answers keep their full marks; a real syntax error after a cell magic keeps its line."""
    from mhalib.grade.grader import syntax_errors, to_python

    nb = json.loads((ROOT / "solutions" / "01_single_head_attention.ipynb").read_text(encoding="utf-8"))
    nb["cells"] += [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": source}
                    for source in IPYTHON_CELLS]
    path = tmp_path / "ipython_syntax.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    result = grade_notebook(path, seed=3)
    assert result.score == result.max_score == 8 and not result.syntax_errors, result.text()
    assert to_python("%%bash\necho hi") is None
    assert syntax_errors([(7, to_python("\n%%time\nx = 1\ny = (\n"))]) == [(7, 4, syntax_errors([(7, "y = (\n")])[0][2])]


def test_ipython_conversion_is_bounded():
    """A cell too large, or with too many magics, and every cell once the notebook's few
    seconds of IPython are spent, are converted line by line: IPython re-reads a cell once
    per magic, which a submission could otherwise turn into minutes of the grader's time."""
    import time

    from mhalib.grade.grader import IPYTHON_MAX_MAGICS, _approximate_python, to_python

    many = "\n".join(["x = !ls"] * (IPYTHON_MAX_MAGICS + 1) + ["y = 1"])
    assert to_python(many) == _approximate_python(many) and "x = None" in to_python(many)
    few = "x = !ls\ny = 1"
    assert "getoutput" in to_python(few)  # IPython's conversion
    assert to_python(few, deadline=time.monotonic() - 1) == _approximate_python(few)
    assert to_python("y = 1\nz = 2") == "y = 1\nz = 2"  # plain Python: left as it is
