"""The course as an nbgrader course (``python -m mhalib.grade.nbgrader``).

The source notebooks carry one locked test cell per graded check, worth the grader's
points, whose ``mhalib.check.score`` returns the points earned (nbgrader's partial
credit). With nbgrader 0.9.6 itself: ``generate_assignment`` makes the blank exercise,
``validate`` fails on it and passes on the solution, ``autograde`` gives the solution the
course's points, the blank zero and a half-right answer what lies between; a notebook that
is not the released one is named with what to submit instead (the course's
``nbgrader_config.py``: missing test cells put back, and a hook before each student).
Under that file's autograde steps the scores come from the course's grader in its sandbox,
never from the notebook run in a kernel: a submission that rewrites the scoring function
and the gradebook gets what its answers earn, while under nbgrader's own autograde the same
submission sets everyone's grade (the docs' warning, shown).

nbgrader is not one of the course's packages: these tests use the one that the documented
``make nbgrader`` installs in a copy of the course (``tests/test_documented_commands.py``,
which runs the documented flow first), and run it as the docs do, with no virtual
environment on PATH.
"""

from __future__ import annotations

import csv
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from mhalib.check import score
from mhalib.grade import exercises as registry
from mhalib.grade.nbgrader import SandboxGradingError, check_folder, main, sandbox_grade, source_notebook
from test_documented_commands import clean_env, nbgrader_program, needs_sandbox

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
# Wrong answers, and an answer cell that, run in nbgrader's kernel, makes mhalib.check.score give
# full marks and writes manual_score = 0 for every other student into gradebook.db (with triggers
# for those graded after it).
ATTACK = ROOT / "tests" / "fixtures" / "nbgrader" / "01_gradebook_attack.ipynb"


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
    needs_sandbox()  # autograde's scores come from the course's grader, in its sandbox
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


def _exported(nbgrader, course):
    """``{student: score}`` as ``nbgrader export`` writes them."""
    proc = _run(nbgrader, "export", cwd=course)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {row["student_id"]: float(row["score"]) for row in csv.DictReader((course / "grades.csv").open())}


def _gradebook(course, query):
    db = sqlite3.connect(course / "gradebook.db")
    try:
        return db.execute(query).fetchall()
    finally:
        db.close()


@pytest.mark.slow
@pytest.mark.network  # the nbgrader that make nbgrader installs
def test_a_submission_cannot_set_grades_through_the_gradebook(nbgrader, tmp_path):
    """ada and cy submit the worked solution; bea, graded between them, wrong answers and an
    answer cell that replaces mhalib.check.score and writes manual_score = 0 for the others
    into gradebook.db (ada's directly, cy's through a trigger). Under nbgrader's own autograde
    (the course's autograde setting deleted, as the docs describe it) the attack works; with
    the setting, on that gradebook, nothing is recorded; on a new gradebook, as the docs say,
    each gets what its answers earn, and the gradebook is clean."""
    needs_sandbox()
    key, course = "01_single_head_attention", tmp_path / "mycourse"
    assert main([str(course), key]) == 0
    proc = _run(nbgrader, "generate_assignment", key, "--create", cwd=course)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, done = source_notebook(ROOT / "solutions" / f"{key}.ipynb")
    for student in ("ada", "cy"):
        _submit(course, student, f"{key}.ipynb", nbformat.writes(done))
    _submit(course, "bea", f"{key}.ipynb", ATTACK.read_text(encoding="utf-8"))
    config = course / "nbgrader_config.py"
    trusted = config.read_text(encoding="utf-8")
    in_kernel = re.sub(r"\nc\.Autograde\.autograde_preprocessors = \[.*?\]\n", "\n", trusted, flags=re.S)
    assert in_kernel != trusted and "autograde_preprocessors =" not in in_kernel

    # nbgrader's own autograde, the notebook in a kernel: bea sets every grade
    config.write_text(in_kernel, encoding="utf-8")
    proc = _run(nbgrader, "autograde", key, cwd=course)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = proc.stdout + proc.stderr
    assert log.index(f"autograded/ada/{key}") < log.index(f"autograded/bea/{key}") < log.index(f"autograded/cy/{key}")
    assert _exported(nbgrader, course) == {"ada": 0.0, "bea": 8.0, "cy": 0.0}
    assert _gradebook(course, "SELECT count(*) FROM grade WHERE manual_score = 0")[0][0] == 6  # 3 checks each
    planted = sorted(n for (n,) in _gradebook(course, "SELECT name FROM sqlite_master WHERE type = 'trigger'"))
    assert planted == ["zero_when_added", "zero_when_graded"]

    # the course's setting on that gradebook: refused for every student, and said why
    config.write_text(trusted, encoding="utf-8")
    proc = _run(nbgrader, "autograde", key, "--force", cwd=course)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-3000:]
    assert "the gradebook has triggers (zero_when_added, zero_when_graded)" in log, log[-3000:]
    assert "from the course's grader" not in log

    # a new gradebook, as the docs say: the scores the answers earn, from the sandbox alone
    (tmp_path / "old").mkdir()
    for name in ("gradebook.db", "autograded"):
        shutil.move(str(course / name), str(tmp_path / "old" / name))
    for args in (("generate_assignment", key, "--create", "--force"), ("autograde", key)):
        proc = _run(nbgrader, *args, cwd=course)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    log = proc.stdout + proc.stderr
    for student, points in (("ada", 8), ("bea", 0), ("cy", 8)):
        assert f"{student}/{key}: {points} / 8 from the course's grader (bubblewrap sandbox)" in log, log[-3000:]
    assert _exported(nbgrader, course) == {"ada": 8.0, "bea": 0.0, "cy": 8.0}
    assert _gradebook(course, "SELECT count(*) FROM grade WHERE manual_score IS NOT NULL")[0][0] == 0
    assert _gradebook(course, "SELECT name FROM sqlite_master WHERE type = 'trigger'") == []
    graded = nbformat.read(course / "autograded" / "bea" / key / f"{key}.ipynb", as_version=4)
    tests = [c for c in graded.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert [c.outputs[-1]["data"]["text/plain"] for c in tests] == ["0.0", "0.0", "0.0"]
    assert all("from the course's grader, which ran this notebook in its bubblewrap sandbox" in c.outputs[0]["text"]
               for c in tests)


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
    # nbgrader 0.9.6's autograde steps, with Execute (the notebook in a kernel) replaced by the sandbox
    assert settings["Autograde"]["autograde_preprocessors"] == [
        tool.sandbox_grade, "nbgrader.preprocessors.IgnorePattern", "nbconvert.preprocessors.ClearMetadataPreprocessor",
        "nbgrader.preprocessors.LimitOutput", "nbgrader.preprocessors.SaveAutoGrades",
        "nbgrader.preprocessors.AssignLatePenalties", "nbgrader.preprocessors.CheckCellMetadata"]
    assert f"wrote {config}" in capsys.readouterr().out
    config.write_text("c = get_config()\nc.CourseDirectory.course_id = 'mine'\n")
    assert main([str(tmp_path), "01"]) == 0
    out = capsys.readouterr().out
    assert f"kept {config}" in out and "add_missing_cells = True" in out
    assert "as it is, nbgrader autograde runs each submission in a Jupyter kernel as you" in out
    assert "c.Autograde.autograde_preprocessors = [\n    sandbox_grade," in out
    assert config.read_text() == "c = get_config()\nc.CourseDirectory.course_id = 'mine'\n"
    with pytest.raises(SystemExit):
        main([str(tmp_path), "99"])
    assert "no exercise '99'" in capsys.readouterr().err


def _autograde_resources(db_url="", assignment="01_single_head_attention"):
    return {"nbgrader": {"assignment": assignment, "student": "bea", "notebook": assignment, "db_url": db_url}}


def test_sandbox_grade_takes_every_score_from_the_sandbox():
    """The autograde step of the course's nbgrader_config.py, on its own: the test cells'
    outputs (nbgrader's scores) come from the course's grader in its sandbox, whatever the
    notebook brings; the attack's wrong answers get 0, the worked solution every point."""
    needs_sandbox()
    import nbformat as nbf

    ex = registry.get("01_single_head_attention")
    attack = nbf.read(ATTACK, as_version=4)
    for cell in attack.cells:  # forged outputs: full marks already in every test cell
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.outputs = [nbf.v4.new_output("execute_result", data={"text/plain": str(cell.metadata.nbgrader.points)},
                                              execution_count=1)]
    _, done = source_notebook(ROOT / "solutions" / f"{ex.key}.ipynb")
    for nb, want in ((attack, [0.0, 0.0, 0.0]), (done, [g.points for g in ex.graded])):
        nb, _ = sandbox_grade(nb, _autograde_resources())
        tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        assert [float(c.outputs[-1]["data"]["text/plain"]) for c in tests] == want
        for cell, graded in zip(tests, ex.graded):
            assert [o.output_type for o in cell.outputs] == ["stream", "execute_result"]
            assert f"{graded.name}: " in cell.outputs[0]["text"] and "bubblewrap sandbox" in cell.outputs[0]["text"]
    assert "allowed positions must be 0.0" in attack.cells[4].outputs[0]["text"]  # the grader's reason


def test_sandbox_grade_refuses_a_planted_gradebook_and_other_assignments(tmp_path):
    """No score is recorded on a gradebook with a trigger (nbgrader makes none), nor for an
    assignment that is not one of the course's exercises: each says why, before any grading."""
    import nbformat as nbf

    attack = nbf.read(ATTACK, as_version=4)
    db = sqlite3.connect(tmp_path / "gradebook.db")
    db.executescript("CREATE TABLE grade (id TEXT, manual_score REAL);"
                     "CREATE TRIGGER zero_when_added AFTER INSERT ON grade BEGIN UPDATE grade SET manual_score = 0; END;")
    db.close()
    with pytest.raises(SandboxGradingError, match=r"the gradebook has triggers \(zero_when_added\)"):
        sandbox_grade(attack, _autograde_resources(f"sqlite:///{tmp_path / 'gradebook.db'}"))
    with pytest.raises(SandboxGradingError, match="assignment 'homework_1' is not one of the course's exercises"):
        sandbox_grade(attack, _autograde_resources(assignment="homework_1"))
    assert not any(c.get("outputs") for c in attack.cells)  # nothing was filled in
