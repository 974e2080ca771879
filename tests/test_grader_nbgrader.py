"""The course as an nbgrader course (``python -m mhalib.grade.nbgrader``).

The source notebooks carry one locked test cell per graded check, worth the grader's
points, whose ``mhalib.check.score`` returns the points earned (nbgrader's partial
credit). With nbgrader 0.9.6 itself: ``generate_assignment`` makes the blank exercise,
``validate`` fails on it and passes on the solution, ``autograde`` gives the solution the
course's points, the blank zero and a half-right answer what lies between; a notebook that
is not the released one is named with what to submit instead (the course's
``nbgrader_config.py``: missing test cells put back, and a hook before each student).

nbgrader is not one of the course's packages: these tests use the one that the documented
``make nbgrader`` installs in a copy of the course (``tests/test_documented_commands.py``,
which runs the documented flow first), and run it as the docs do, with no virtual
environment on PATH.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from mhalib.check import score
from mhalib.grade import exercises as registry
from mhalib.grade.nbgrader import check_folder, main, source_notebook
from test_documented_commands import clean_env, nbgrader_program

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
    # the notebook to submit is named in a locked cell after the title, before any other
    # cell of nbgrader's (nbgrader puts a missing test cell back after the cell before it)
    first = next(i for i, c in enumerate(nb.cells) if "nbgrader" in c.metadata)
    assert first == 1 and nb.cells[1].cell_type == "markdown" and nb.cells[1].metadata.nbgrader["locked"]
    assert f"**Submit this notebook**, `{ex.key}.ipynb`" in nb.cells[1].source
    for cell, graded in zip(grades, ex.graded):  # each test cell right after its answer or test cell
        before = nb.cells[nb.cells.index(cell) - 1].metadata.get("nbgrader", {})
        assert before.get("grade_id") in (graded.lookup,) or before.get("grade"), before
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


@pytest.fixture(scope="module")
def nbgrader(tmp_path_factory):
    return nbgrader_program(tmp_path_factory)


def _run(nbgrader, *args, cwd):
    return subprocess.run([str(nbgrader), *args], cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("key, wrong", [
    ("01_single_head_attention", ("scaled_dot_product_attention", "    return q, q\n")),
    ("08_mha_to_gqa", ("mean_pool_kv", "    return weight * 0\n")),
])
@pytest.mark.network  # the nbgrader that make nbgrader installs
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
    students = [("ada", f"{key}.ipynb", source.read_text()), ("bob", f"{key}.ipynb", blank.read_text()),
                ("cy", f"{key}.ipynb", nbformat.writes(half))]
    misfiled = key.startswith("01")  # and, for one exercise, two notebooks nbgrader cannot grade:
    if misfiled:  # another exercise's under this one's name, and the released one under another name
        students += [("dan", f"{key}.ipynb", (ROOT / "solutions" / "07_mqa_gqa.ipynb").read_text()),
                     ("fay", "my_work.ipynb", source.read_text())]
    for student, filename, notebook in students:
        folder = tmp_path / "submitted" / student / key
        folder.mkdir(parents=True)
        (folder / filename).write_text(notebook)
    proc = _run(nbgrader, "autograde", key, cwd=tmp_path)
    # nbgrader reports an error for each student it could not grade, and exits with 1
    assert proc.returncode == (1 if misfiled else 0), proc.stdout + proc.stderr
    log = proc.stdout + proc.stderr
    warned = {m.group(1): m.group(0) for m in re.finditer(rf"WARNING\] submitted/(\w+)/{key}\S*: .*", log)}
    assert set(warned) == ({"dan", "fay"} if misfiled else set()), log[-4000:]
    if misfiled:
        assert "it is exercise 07's notebook (07_mqa_gqa), not exercise 01's" in warned["dan"]
        assert f"rename my_work.ipynb to {key}.ipynb" in warned["fay"]
        assert all(f"ask {s} to submit release/{key}/{key}.ipynb" in warned[s] for s in warned)
    proc = _run(nbgrader, "export", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    scores = {row["student_id"]: (float(row["score"]), float(row["max_score"]))
              for row in csv.DictReader((tmp_path / "grades.csv").open())}
    assert scores["ada"] == (ex.max_score, ex.max_score)
    assert scores["bob"] == (0.0, ex.max_score)
    points = sum(g.points for g in ex.graded if g.lookup == name)
    assert scores["cy"][0] == ex.max_score - points, scores
    if misfiled:
        assert scores["dan"] == scores["fay"] == (0.0, ex.max_score)


# ----------------------------------------------------------------------------- without nbgrader
def _submit(course, student, filename, text, key="01_single_head_attention"):
    folder = course / "submitted" / student / key
    folder.mkdir(parents=True, exist_ok=True)
    (folder / filename).write_text(text, encoding="utf-8")
    return folder


def test_check_names_each_submission_nbgrader_cannot_grade_as_released(tmp_path, capsys):
    key = "01_single_head_attention"
    ex = registry.get(key)
    _, done = source_notebook(ROOT / "solutions" / f"{key}.ipynb")
    released = nbformat.writes(done)
    no_tests = (ROOT / "exercises" / f"{key}.ipynb").read_text(encoding="utf-8")
    def without(grade_id):
        cells = [c for c in done.cells if c.metadata.get("nbgrader", {}).get("grade_id") != grade_id]
        return nbformat.writes(nbformat.from_dict({**done, "cells": cells}))

    one_test_gone, no_answer = without("test_scaled_dot_product_attention"), without("causal_mask")
    _submit(tmp_path, "ada", f"{key}.ipynb", released)
    _submit(tmp_path, "bob", f"{key}.ipynb", no_tests)
    _submit(tmp_path, "cy", f"{key}.ipynb", (ROOT / "solutions" / "07_mqa_gqa.ipynb").read_text(encoding="utf-8"))
    _submit(tmp_path, "dan", "my_work.ipynb", released)
    _submit(tmp_path, "eve", f"{key}.ipynb", "{ not json")
    _submit(tmp_path, "ivy", f"{key}.ipynb", '{"cells": [1, {"metadata": []}], "metadata": {"mhalib": 3}}')
    _submit(tmp_path, "fay", f"{key}.ipynb", one_test_gone)
    _submit(tmp_path, "gus", f"{key}.ipynb", no_answer)
    _submit(tmp_path, "hal", f"{key}.ipynb", released)
    _submit(tmp_path, "hal", "notes.ipynb", released)
    assert main(["--check", str(tmp_path), "01"]) == 1
    out = capsys.readouterr().out
    lines = {m.group(1): m.group(0) for m in re.finditer(r"^\S*submitted/(\w+)/\S*: .*$", out, re.M)}
    assert set(lines) == {"bob", "cy", "dan", "eve", "fay", "gus", "hal", "ivy"}, out
    assert "none of the 3 test cells" in lines["bob"] and "exercises/ folder has none" in lines["bob"]
    assert "exercise 07's notebook (07_mqa_gqa), not exercise 01's" in lines["cy"]
    assert "found my_work.ipynb" in lines["dan"] and f"rename my_work.ipynb to {key}.ipynb" in lines["dan"]
    assert "not a notebook nbgrader can read" in lines["eve"]
    assert "test cells test_scaled_dot_product_attention are missing" in lines["fay"]
    assert "answer cells for causal_mask are missing" in lines["gus"]
    assert "answer cells for causal_mask, scaled_dot_product_attention are missing" in lines["ivy"]
    assert "notes.ipynb is not graded" in lines["hal"]
    for student in set(lines) - {"hal"}:
        assert f"ask {student} to submit release/{key}/{key}.ipynb" in lines[student], lines[student]
    assert "8 problems found" in out
    assert check_folder(tmp_path / "submitted" / "ada" / key, ex) == []
    for student in ("bob", "cy", "dan", "eve", "fay", "gus", "hal", "ivy"):
        shutil.rmtree(tmp_path / "submitted" / student)
    assert main(["--check", str(tmp_path), "01"]) == 0
    assert "0 problems found" in capsys.readouterr().out


def test_the_hook_logs_each_problem_before_autograde(tmp_path, caplog, monkeypatch):
    from mhalib.grade.nbgrader import pre_convert_hook

    key = "01_single_head_attention"
    folder = _submit(tmp_path, "bob", "my_work.ipynb", "{}")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("WARNING"):
        pre_convert_hook(assignment=key, student="*", notebooks=[str(folder / "my_work.ipynb")])
        pre_convert_hook(assignment="homework_1", student="*", notebooks=[str(folder / "my_work.ipynb")])
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [f"submitted/bob/{key}"]
    assert f"no {key}.ipynb" in caplog.records[0].getMessage()


def test_the_course_config_is_written_once_and_never_over_an_instructors(tmp_path, capsys):
    from mhalib.grade import nbgrader as tool

    assert main([str(tmp_path), "01"]) == 0
    config = tmp_path / "nbgrader_config.py"
    from traitlets.config import Config

    namespace = {"get_config": Config}
    exec(compile(config.read_text(), str(config), "exec"), namespace)  # as nbgrader's loader does
    settings = namespace["c"]
    assert settings["OverwriteCells"]["add_missing_cells"] is True
    note = settings["OverwriteCells"]["missing_cell_notification"]
    assert "\n" not in note.rstrip("\n") and note.format(cell_id="x")  # one line: nbgrader comments it out
    assert settings["Autograde"]["pre_convert_hook"] is tool.pre_convert_hook
    assert f"wrote {config}" in capsys.readouterr().out
    config.write_text("c = get_config()\nc.CourseDirectory.course_id = 'mine'\n")
    assert main([str(tmp_path), "01"]) == 0
    out = capsys.readouterr().out
    assert f"kept {config}" in out and "add_missing_cells = True" in out
    assert config.read_text() == "c = get_config()\nc.CourseDirectory.course_id = 'mine'\n"
    with pytest.raises(SystemExit):
        main([str(tmp_path), "99"])
    assert "no exercise '99'" in capsys.readouterr().err
