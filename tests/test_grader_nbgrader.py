"""The course as an nbgrader course (``python -m mhalib.grade.nbgrader``).

The source notebooks carry one locked test cell per graded check, worth the grader's
points, whose ``mhalib.check.score`` returns the points earned (nbgrader's partial
credit). With nbgrader 0.9.6 itself: ``generate_assignment`` makes the blank exercise,
``validate`` fails on it and passes on the solution, ``autograde`` gives the solution the
course's points, the blank zero and a half-right answer what lies between.

nbgrader is not one of the course's packages. The nbgrader test uses the one named by
``MHALIB_NBGRADER`` (an ``nbgrader`` executable whose Python also finds ``mhalib``, NumPy
and torch), else the one ``make nbgrader`` installs, else one on PATH; under CI (the variable CI set) it installs nbgrader 0.9.6
into a virtual environment of its own that sees this one's packages; else it is skipped.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest

from mhalib.check import score
from mhalib.grade import exercises as registry
from mhalib.grade.nbgrader import source_notebook

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_source_notebook_carries_the_graders_points(solution):
    ex, nb = source_notebook(solution)
    grades = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert [c.metadata.nbgrader.points for c in grades] == [g.points for g in ex.graded]
    assert sum(c.metadata.nbgrader.points for c in grades) == ex.max_score
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells if "nbgrader" in c.metadata]
    assert len(ids) == len(set(ids))
    for cell, graded in zip(grades, ex.graded):
        assert cell.metadata.nbgrader.locked and not cell.metadata.nbgrader.solution
        assert f"score({graded.name!r}, {graded.lookup})" in cell.source
    answers = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert answers and all("points" not in c.metadata.nbgrader for c in answers)
    nbformat.validate(nb)


def test_score_gives_partial_credit(capsys):
    import numpy as np

    def right(n):
        if n < 1:
            raise ValueError(f"n={n}")
        return np.where(np.triu(np.ones((n, n), bool), 1), -np.inf, 0.0)

    def small_only(n):  # right for n < 5 only
        return right(n) if n < 5 else np.zeros((n, n))

    def not_written(n):
        raise NotImplementedError

    assert score("causal_mask", right, seed=1) == 2.5
    assert score("causal_mask (n < 1)", right, seed=1) == 0.5
    assert 0 < score("causal_mask", small_only, seed=1) < 2.5
    assert score("causal_mask", not_written, seed=1) == 0
    assert "not written yet" in capsys.readouterr().out


def _nbgrader(tmp_path_factory):
    made = ROOT / ".venv" / "nbgrader" / "bin" / "nbgrader"  # make nbgrader
    named = os.environ.get("MHALIB_NBGRADER") or (str(made) if made.exists() else shutil.which("nbgrader"))
    if named:
        return named
    if not os.environ.get("CI"):
        pytest.skip("nbgrader is not installed (set MHALIB_NBGRADER, or CI to install nbgrader 0.9.6 here)")
    venv = tmp_path_factory.mktemp("nbgrader") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "nbgrader==0.9.6"], check=True, timeout=900)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # this environment's packages (numpy, torch) and the course, after nbgrader's own
    Path(purelib, "course.pth").write_text(f"{ROOT}\n{sysconfig.get_paths()['purelib']}\n")
    return str(venv / "bin" / "nbgrader")


@pytest.fixture(scope="module")
def nbgrader(tmp_path_factory):
    return _nbgrader(tmp_path_factory)


def _run(nbgrader, *args, cwd):
    env = dict(os.environ, PATH=f"{Path(nbgrader).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([nbgrader, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("key, wrong", [
    ("01_single_head_attention", ("scaled_dot_product_attention", "    return q, q\n")),
    ("08_mha_to_gqa", ("mean_pool_kv", "    return weight * 0\n")),
])
@pytest.mark.network  # installs nbgrader under CI
def test_nbgrader_validates_and_autogrades(nbgrader, tmp_path, key, wrong):
    ex = registry.get(key)
    proc = subprocess.run([sys.executable, "-m", "mhalib.grade.nbgrader", str(tmp_path), key], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    proc = _run(nbgrader, "generate_assignment", key, "--create", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    blank, source = tmp_path / "release" / key / f"{key}.ipynb", tmp_path / "source" / key / f"{key}.ipynb"
    proc = _run(nbgrader, "validate", str(blank), cwd=tmp_path)
    assert "VALIDATION FAILED" in proc.stdout, proc.stdout + proc.stderr
    proc = _run(nbgrader, "validate", str(source), cwd=tmp_path)
    assert "Success! Your notebook passes all the tests." in proc.stdout, proc.stdout + proc.stderr
    # three students: the solution, the blank exercise, and the solution with one function wrong
    half = nbformat.read(source, as_version=4)
    name, body = wrong
    for cell in half.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == name:
            head = cell.source.split("### BEGIN SOLUTION")[0]
            cell.source = head + "### BEGIN SOLUTION\n" + body + "    ### END SOLUTION\n"
    for student, notebook in (("ada", source.read_text()), ("bob", blank.read_text()),
                              ("cy", nbformat.writes(half))):
        folder = tmp_path / "submitted" / student / key
        folder.mkdir(parents=True)
        (folder / f"{key}.ipynb").write_text(notebook)
    proc = _run(nbgrader, "autograde", key, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _run(nbgrader, "export", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    scores = {row["student_id"]: (float(row["score"]), float(row["max_score"]))
              for row in csv.DictReader((tmp_path / "grades.csv").open())}
    assert scores["ada"] == (ex.max_score, ex.max_score)
    assert scores["bob"] == (0.0, ex.max_score)
    points = sum(g.points for g in ex.graded if g.lookup == name)
    assert scores["cy"][0] == ex.max_score - points, scores
