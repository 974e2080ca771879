"""The grader on the course's own notebooks: every solution full marks, every exercise zero."""

from __future__ import annotations

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


def test_cli_writes_results_and_csv_and_exits_zero(tmp_path):
    if not SOLUTIONS:
        pytest.skip("no solution notebooks yet")
    sol = SOLUTIONS[0]
    bad = tmp_path / "not_a_notebook.ipynb"
    bad.write_text("{ this is not json")
    results, table = tmp_path / "results.json", tmp_path / "class.csv"
    cmd = [sys.executable, "-m", "mhalib.grade", str(sol), str(bad), "--results", str(results),
           "--csv", str(table), "--jobs", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "TOTAL" in proc.stdout
    data = json.loads(results.read_text())
    first, second = data["submissions"]
    assert first["score"] > 0 and all(t["status"] == "passed" for t in first["tests"])
    assert second["score"] == 0 and "not a valid notebook" in second["output"]
    rows = table.read_text().splitlines()
    assert rows[0].startswith("submission,exercise,score") and len(rows) == 3
    proc = subprocess.run(cmd[:4] + ["--results", str(results), "--csv", str(table)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0
    single = json.loads(results.read_text())
    assert set(single) >= {"score", "tests"} and all(
        set(t) >= {"name", "score", "max_score", "status", "output"} for t in single["tests"])
    assert len(table.read_text().splitlines()) == 4  # appended, header once


def test_gradescope_autograder_zip(tmp_path):
    """tools/build_autograder.py: a reproducible zip whose entry point grades a submission."""
    import zipfile

    if not SOLUTIONS:
        pytest.skip("no solution notebooks yet")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_autograder
    finally:
        sys.path.pop(0)
    first, second = tmp_path / "a.zip", tmp_path / "b.zip"
    build_autograder.build(first)
    build_autograder.build(second)
    assert first.read_bytes() == second.read_bytes(), "the zip must be reproducible"
    with zipfile.ZipFile(first) as zf:
        names = set(zf.namelist())
        assert {"setup.sh", "run_autograder", "grade_submission.py", "mhalib/grade/_worker.py",
                "requirements/lock.txt"} <= names
        assert (zf.getinfo("run_autograder").external_attr >> 16) & 0o111
        assert "/autograder/results/results.json" in zf.read("run_autograder").decode()
        zf.extractall(tmp_path / "source")
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "my_work.ipynb").write_bytes(SOLUTIONS[0].read_bytes())
    results = tmp_path / "results" / "results.json"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "source")}
    proc = subprocess.run([sys.executable, "grade_submission.py", str(submission), str(results)],
                          cwd=tmp_path / "source", env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(results.read_text())
    assert data["score"] > 0 and all(t["status"] == "passed" for t in data["tests"])
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "grade_submission.py", str(empty), str(results)],
                          cwd=tmp_path / "source", env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and json.loads(results.read_text())["score"] == 0


@pytest.mark.parametrize("metadata, filename, key", [
    ({"mhalib": {"exercise": "02_multi_head_attention"}}, "whatever.ipynb", "02_multi_head_attention"),
    ({"mhalib": {"exercise": "99_unknown"}}, "03_mha_in_pytorch_alice.ipynb", "03_mha_in_pytorch"),
    ({}, "ex01.ipynb", "01_single_head_attention"),
    (None, "exercise_6 (1).ipynb", "06_mqa_gqa"),
    ({}, "5_kv_cache_bob.ipynb", "05_kv_cache"),
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
    assert result.exercise is None and result.score == 0
    assert "could not tell which exercise" in result.text()
    assert result.gradescope()["score"] == 0
