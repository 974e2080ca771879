"""The grader's command line as instructors and learners meet it: its exit status, the class
CSV (one row per submission, the student's ID, the feedback), the files an LMS gradebook
imports, the one learner command (``make grade NB=...``) from any folder and from a Python
without the course's packages, and errors located as JupyterLab shows the notebook.

The sandbox is not what these tests test: they grade with ``--no-isolation``
(``Isolation("none")``); tests/test_grader_attacks.py grades under bubblewrap."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mhalib.grade.__main__ import CSV_HEADER, load_roster, student_of, wrong_python
from mhalib.grade.grader import code_cell_labels, grade_notebook, relocate
from mhalib.grade.sandbox import Isolation, Limits

ROOT = Path(__file__).resolve().parents[1]
SOLUTION_01 = ROOT / "solutions" / "01_single_head_attention.ipynb"
EXERCISE_01 = ROOT / "exercises" / "01_single_head_attention.ipynb"
NONE = Isolation("none")


def grade(*args, cwd, timeout=180):
    """``python -m mhalib.grade ARGS --no-isolation`` run from ``cwd``."""
    return subprocess.run([sys.executable, "-m", "mhalib.grade", *map(str, args), "--no-isolation"], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def truncated(path):
    path.write_text(SOLUTION_01.read_text(encoding="utf-8")[:400], encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- exit status
def test_exit_status_is_1_when_a_file_is_missing_or_truncated(tmp_path):
    good = tmp_path / "good.ipynb"
    shutil.copy(SOLUTION_01, good)
    cut = truncated(tmp_path / "cut.ipynb")
    proc = grade(good, tmp_path / "missing.ipynb", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not graded, left out of the mean (1)" in proc.stdout and "No such file" in proc.stdout
    proc = grade(good, cut, cwd=tmp_path)
    assert proc.returncode == 1 and "was it truncated?" in proc.stdout, proc.stdout + proc.stderr
    # as one exercise, each file scores 0 with its reason, and the exit status still says to look
    proc = grade(good, cut, "missing.ipynb", "--exercise", "01", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not readable as a notebook, scored 0 (2): " in proc.stdout
    assert grade(good, "--exercise", "01", cwd=tmp_path).returncode == 0


def test_exit_status_is_1_when_the_grader_itself_failed(tmp_path, monkeypatch, capsys):
    from mhalib.grade import __main__ as cli
    from mhalib.grade import grader

    def broken(*args, **kwargs):
        raise RuntimeError("a fault of the grader's own")

    shutil.copy(SOLUTION_01, tmp_path / "ada.ipynb")
    monkeypatch.setattr(grader, "grade_function", broken)
    assert cli.main([str(tmp_path / "ada.ipynb"), "--no-isolation", "--quiet"]) == 1
    assert "the grader itself failed (1): " in capsys.readouterr().out


def test_help_documents_the_exit_status():
    proc = subprocess.run([sys.executable, "-m", "mhalib.grade", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0
    text = proc.stdout[proc.stdout.index("exit status:"):]
    for code in "0123":
        assert f"\n  {code}  " in text, text
    assert "--gradebook LMS FILE" in proc.stdout and "--roster FILE" in proc.stdout


# ----------------------------------------------------------------------------- the class CSV
def test_a_rerun_replaces_its_rows_and_keeps_the_others(tmp_path):
    for name in ("ada", "bob", "cy"):
        shutil.copy(SOLUTION_01 if name != "bob" else EXERCISE_01, tmp_path / f"{name}.ipynb")
    table = tmp_path / "grades.csv"
    for _ in range(2):
        proc = grade("ada.ipynb", "bob.ipynb", "cy.ipynb", "--exercise", "01", "--csv", table, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    first = rows(table)
    assert [r["submission"] for r in first] == ["ada.ipynb", "bob.ipynb", "cy.ipynb"]
    assert list(first[0]) == CSV_HEADER and len(table.read_text().splitlines()) == 4
    # bob's work, graded again alone: his row changes in place, the others stay as they were
    shutil.copy(SOLUTION_01, tmp_path / "bob.ipynb")
    assert grade("bob.ipynb", "--csv", table, cwd=tmp_path).returncode == 0
    second = rows(table)
    assert [r["submission"] for r in second] == ["ada.ipynb", "bob.ipynb", "cy.ipynb"]
    assert (first[1]["score"], second[1]["score"]) == ("0", "8") and second[0] == first[0] and second[2] == first[2]


def test_a_table_appended_twice_by_an_older_grader_gets_one_row_each(tmp_path):
    shutil.copy(SOLUTION_01, tmp_path / "ada.ipynb")
    table = tmp_path / "grades.csv"
    old = "submission,exercise,score,max_score,checks,seed,seconds,isolation,comment\n"
    table.write_text(old + "ada.ipynb,01,3,8,x,1,0.5,none,late\nold.ipynb,01,5,8,y,2,0.5,none,\n"
                     + "ada.ipynb,01,4,8,x,1,0.5,none,late\n", encoding="utf-8")
    assert grade("ada.ipynb", "--csv", table, cwd=tmp_path).returncode == 0
    got = rows(table)
    assert [r["submission"] for r in got] == ["ada.ipynb", "old.ipynb"]
    assert got[0]["score"] == "8" and got[0]["comment"] == "late", "a column of the instructor's is kept"
    assert got[1]["score"] == "5" and list(got[0])[:len(CSV_HEADER)] == CSV_HEADER


def test_a_csv_that_is_not_a_grades_table_is_refused_before_grading(tmp_path):
    shutil.copy(SOLUTION_01, tmp_path / "ada.ipynb")
    other = tmp_path / "class_list.csv"
    other.write_text("name,email\nAda,ada@example.org\n", encoding="utf-8")
    proc = grade("ada.ipynb", "--csv", other, cwd=tmp_path)
    assert proc.returncode == 2 and "not a grades table" in proc.stderr and "TOTAL" not in proc.stdout
    assert other.read_text(encoding="utf-8") == "name,email\nAda,ada@example.org\n"


def test_feedback_gives_the_reason_for_every_lost_point(tmp_path):
    nb = json.loads(SOLUTION_01.read_text(encoding="utf-8"))
    for cell in nb["cells"]:  # the scale left out: every case of the attention is wrong
        if cell["cell_type"] == "code" and "def scaled_dot_product_attention" in "".join(cell["source"]):
            cell["source"] = "".join(cell["source"]).replace("np.sqrt(d_k)", "1.0")
            assert "1.0" in cell["source"]
    (tmp_path / "noscale.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    shutil.copy(SOLUTION_01, tmp_path / "ada.ipynb")
    table = tmp_path / "grades.csv"
    proc = grade("ada.ipynb", "noscale.ipynb", "nothing.ipynb", "--exercise", "01", "--csv", table, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # nothing.ipynb is missing
    got = {r["submission"]: r for r in rows(table)}
    assert got["ada.ipynb"]["feedback"] == "all checks passed"
    lost = got["noscale.ipynb"]["feedback"]
    # the function below its points, how many cases passed, and the first wrong case with its reason
    assert re.fullmatch(r"scaled_dot_product_attention [\d.]+/5: \d+ of 11 cases correct; case \d+ \(.+\): "
                        r"the scores are not divided by sqrt\(d_k\)", lost), lost
    assert got["nothing.ipynb"]["feedback"].startswith("not a readable notebook: it cannot be opened")


# ----------------------------------------------------------------------------- student IDs
@pytest.mark.parametrize("path, student", [
    # Canvas, "Download Submissions": sortable name, [late,] user ID, file ID, the file's own name
    ("submissions/lovelaceada_12345_67890_01_single_head_attention.ipynb", ("12345", "lovelaceada", "canvas")),
    ("submissions/babbagecharles_late_222_333_ex01-1.ipynb", ("222", "babbagecharles", "canvas")),
    # Moodle, "Download all submissions": a folder per participant, or a prefix in the flat layout
    ("all/Grace Hopper_4242_assignsubmission_file/notebook.ipynb", ("4242", "Grace Hopper", "moodle")),
    ("all/Alan Turing_77_assignsubmission_file_ex01.ipynb", ("77", "Alan Turing", "moodle")),
    ("submissions/01_single_head_attention.ipynb", ("", "", "")),
    ("submissions/2024_notes.ipynb", ("", "", "")),
])
def test_student_id_from_the_names_canvas_and_moodle_give_downloads(path, student):
    who = student_of(path)
    assert (who.id, who.name, who.source) == student
    assert bool(who.problem) == (not who.id)


def test_student_id_from_a_roster(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("submission,student_id,name\nada.ipynb,s1001,Ada Lovelace\n*bob*,s1002,Bob\n"
                      "lovelaceada_12345_67890_x.ipynb,s1003,\n", encoding="utf-8")
    table = load_roster(roster)
    assert (student_of("sub/ada.ipynb", table).id, student_of("sub/ada.ipynb", table).name) == ("s1001", "Ada Lovelace")
    assert student_of("2_bob_final.ipynb", table).id == "s1002"
    assert student_of("lovelaceada_12345_67890_x.ipynb", table).id == "s1003", "the roster comes first"
    assert student_of("lovelaceada_1_2_y.ipynb", table).id == "1", "then the LMS's download names"
    assert "not in the roster" in student_of("cy.ipynb", table).problem
    both = student_of("bob_ada.ipynb", table + [("bob_ada.ipynb", "s9", "")])
    assert not both.id and "2 students" in both.problem
    bad = tmp_path / "bad.csv"
    bad.write_text("file,id\nada.ipynb,1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs submission and student_id"):
        load_roster(bad)
    bad.write_text("submission,student_id\nada.ipynb,\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: a row needs both"):
        load_roster(bad)


def test_the_class_csv_names_each_student_and_says_who_has_no_id(tmp_path):
    for name in ("ada.ipynb", "lovelaceada_12345_67890_01.ipynb", "cy.ipynb"):
        shutil.copy(SOLUTION_01, tmp_path / name)
    (tmp_path / "roster.csv").write_text("submission,student_id,name\nada.ipynb,s1001,Ada\n", encoding="utf-8")
    table = tmp_path / "grades.csv"
    proc = grade("ada.ipynb", "lovelaceada_12345_67890_01.ipynb", "cy.ipynb", "--roster", "roster.csv", "--csv", table,
                 cwd=tmp_path)
    assert proc.returncode == 1 and "no student ID (1): cy.ipynb" in proc.stdout, proc.stdout + proc.stderr
    got = {r["submission"]: (r["student_id"], r["student_name"]) for r in rows(table)}
    assert got == {"ada.ipynb": ("s1001", "Ada"), "lovelaceada_12345_67890_01.ipynb": ("12345", "lovelaceada"),
                   "cy.ipynb": ("", "")}
    proc = grade("ada.ipynb", "--roster", "missing_roster.csv", cwd=tmp_path)
    assert proc.returncode == 2 and "--roster missing_roster.csv" in proc.stderr and "TOTAL" not in proc.stdout


# ----------------------------------------------------------------------------- LMS gradebooks
def _class(tmp_path):
    """A Canvas download: two students graded, a third whose file is truncated, one file no LMS named."""
    shutil.copy(SOLUTION_01, tmp_path / "lovelaceada_12345_67890_ex01.ipynb")
    shutil.copy(EXERCISE_01, tmp_path / "babbagecharles_late_222_333_ex01.ipynb")
    truncated(tmp_path / "hoppergrace_4242_555_ex01.ipynb")
    shutil.copy(SOLUTION_01, tmp_path / "stray.ipynb")
    return sorted(p.name for p in tmp_path.glob("*.ipynb"))


def test_canvas_gradebook_has_the_columns_canvas_imports(tmp_path):
    files = _class(tmp_path)
    proc = grade(*files, "--exercise", "01", "--gradebook", "canvas", "canvas.csv", "--assignment",
                 "Exercise 01 (4321)", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a truncated file, a file without a student ID
    assert "gradebook for Canvas: 2 grades in canvas.csv; left out (2): " in proc.stdout
    with open(tmp_path / "canvas.csv", newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    assert table[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Exercise 01 (4321)"]
    assert sorted(table[1:]) == [["babbagecharles", "222", "", "", "", "0"], ["lovelaceada", "12345", "", "", "", "8"]]


def test_moodle_grading_worksheet_has_the_columns_moodle_reads(tmp_path):
    folder = tmp_path / "Ada Lovelace_1001_assignsubmission_file"
    folder.mkdir()
    shutil.copy(SOLUTION_01, folder / "attention.ipynb")
    shutil.copy(EXERCISE_01, tmp_path / "Charles Babbage_1002_assignsubmission_file_ex.ipynb")
    proc = grade(folder / "attention.ipynb", "Charles Babbage_1002_assignsubmission_file_ex.ipynb", "--exercise", "01",
                 "--gradebook", "moodle", "worksheet.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = rows(tmp_path / "worksheet.csv")
    assert list(got[0]) == ["Identifier", "Full name", "Grade", "Maximum Grade", "Last modified (grade)",
                            "Feedback comments"]
    by_id = {r["Identifier"]: r for r in got}
    assert set(by_id) == {"Participant 1001", "Participant 1002"}
    assert (by_id["Participant 1001"]["Grade"], by_id["Participant 1001"]["Full name"]) == ("8", "Ada Lovelace")
    blank = by_id["Participant 1002"]
    assert blank["Grade"] == "0" and "not written yet" in blank["Feedback comments"]
    assert by_id["Participant 1001"]["Last modified (grade)"].endswith("Z")


def test_gradebook_options_are_checked(tmp_path):
    shutil.copy(SOLUTION_01, tmp_path / "ada.ipynb")
    proc = grade("ada.ipynb", "--gradebook", "blackboard", "out.csv", cwd=tmp_path)
    assert proc.returncode == 2 and "the LMS is one of canvas, moodle" in proc.stderr
    proc = grade("ada.ipynb", "--gradebook", "moodle", "out.csv", "--assignment", "Ex 1", cwd=tmp_path)
    assert proc.returncode == 2 and "--gradebook canvas" in proc.stderr
    assert not (tmp_path / "out.csv").exists()


def test_every_new_cell_is_kept_from_reading_as_a_formula(tmp_path):
    shutil.copy(SOLUTION_01, tmp_path / "ada.ipynb")
    (tmp_path / "roster.csv").write_text('submission,student_id,name\nada.ipynb,@1,"=HYPERLINK(""x"")"\n',
                                         encoding="utf-8")
    proc = grade("ada.ipynb", "--roster", "roster.csv", "--csv", "grades.csv", "--gradebook", "canvas", "c.csv",
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("grades.csv", "c.csv"):
        with open(tmp_path / name, newline="", encoding="utf-8") as f:
            cells = [cell for row in csv.reader(f) for cell in row]
        assert "'@1" in cells and "'=HYPERLINK(\"x\")" in cells, cells
        assert not any(cell.startswith(("=", "+", "-", "@", "\t", "\r")) for cell in cells)


# ----------------------------------------------------------------------------- the learner's command
def _python_without_nbformat():
    """The system python3 when it has NumPy but not nbformat (a learner's shell), else ``None``."""
    python = shutil.which("python3")
    if not python or Path(python).resolve() == Path(sys.executable).resolve():
        return None
    probe = subprocess.run([python, "-c", "import sys, numpy; from importlib.util import find_spec; "
                            "sys.exit(0 if sys.version_info >= (3, 10) and find_spec('nbformat') is None else 1)"],
                           capture_output=True, cwd="/")
    return python if probe.returncode == 0 else None


def test_outside_the_venv_the_grader_names_the_one_command():
    """A Python without the course's packages grades nothing: it names the command that does,
    and exits with status 2 (never an 'internal grader error' with status 0)."""
    hide = ("import runpy, sys; sys.modules['nbformat'] = None; sys.argv[0] = 'mhalib.grade'; "
            "runpy.run_module('mhalib.grade', run_name='__main__', alter_sys=True)")
    runs = [[sys.executable, "-c", hide]]
    system = _python_without_nbformat()
    if system:
        runs.append([system, "-m", "mhalib.grade"])
    for command in runs:
        proc = subprocess.run(command + ["exercises/01_single_head_attention.ipynb"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "has no nbformat" in proc.stderr
        assert "make grade NB=exercises/01_single_head_attention.ipynb" in proc.stderr
        assert "internal grader error" not in proc.stdout + proc.stderr and "NOT GRADED" not in proc.stdout


def test_outside_the_course_folder_the_message_names_the_course_folder(tmp_path):
    message = wrong_python(["nbformat"], ["my work.ipynb"], cwd=tmp_path)
    course = os.path.relpath(ROOT, tmp_path)
    assert f"make -C {course} grade NB='my work.ipynb'" in message
    assert "make grade NB=exercises/x.ipynb" in wrong_python(["nbformat"], ["exercises/x.ipynb"], cwd=ROOT)


needs_make = pytest.mark.skipif(shutil.which("make") is None or shutil.which("bash") is None, reason="no make")


def _make_from(folder, *args):
    """``make -C COURSE ARGS`` typed in a shell standing in ``folder`` (which sets PWD as a shell does);
    ``-o .venv/.installed``: the environment as it is, never rebuilt by a test."""
    script = 'cd "$1" && shift && make -C "$@" -o .venv/.installed'
    return subprocess.run(["bash", "-c", script, "bash", str(folder), str(ROOT), *args], capture_output=True,
                          text=True, timeout=180)


@needs_make
def test_make_grade_reads_nb_from_the_folder_make_was_started_in(tmp_path):
    shutil.copy(SOLUTION_01, tmp_path / "my.ipynb")
    proc = _make_from(tmp_path, "grade", "NB=my.ipynb")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{tmp_path}/my.ipynb: exercise 01_single_head_attention" in proc.stdout and "TOTAL 8 / 8" in proc.stdout
    # a path that is not there is read from the course folder, as README's commands are typed
    proc = _make_from(ROOT / "exercises", "grade", "NB=exercises/01_single_head_attention.ipynb")
    assert proc.returncode == 0 and "TOTAL 0 / 8" in proc.stdout, proc.stdout + proc.stderr
    proc = _make_from(tmp_path, "grade", "NB=nope.ipynb")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"no notebook NB=nope.ipynb in {tmp_path} (where make was started), nor in {ROOT}" in proc.stderr


def top_level_make_env():
    """The environment of a make started by a program, not by another make: under make test,
    MAKEFLAGS carries the outer make's -w (which a make below another always gets) and would
    read as a -C that was never given."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}


@needs_make
def test_without_dash_c_make_grade_ignores_a_stale_pwd(tmp_path):
    """A program that starts make in the course folder without a shell may pass on its own PWD:
    without -C, make was started in the course folder, whatever PWD says."""
    (tmp_path / "exercises").mkdir()
    shutil.copy(SOLUTION_01, tmp_path / "exercises" / EXERCISE_01.name)  # the same name, elsewhere
    proc = subprocess.run(["make", "grade", f"NB=exercises/{EXERCISE_01.name}", "-o", ".venv/.installed"], cwd=ROOT,
                          env=dict(top_level_make_env(), PWD=str(tmp_path)), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "TOTAL 0 / 8" in proc.stdout, proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- cells as JupyterLab shows them
def _notebook(tmp_path, cells):
    nb = {"cells": [{"cell_type": kind, "metadata": {}, "source": source,
                     **({"outputs": [], "execution_count": None} if kind == "code" else {})} for kind, source in cells],
          "metadata": {"mhalib": {"exercise": "01_single_head_attention"}}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "located.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path, nb


def test_a_syntax_error_names_the_code_cell_as_the_learner_counts_them(tmp_path):
    path, nb = _notebook(tmp_path, [
        ("markdown", "# My work"), ("code", "import numpy as np"), ("markdown", "## The mask"),
        ("code", ""), ("markdown", "More prose"),
        ("code", "\n\ndef causal_mask(n):\n    return np.triu(np.full((n, n), -np.inf), k=1\n"),
    ])
    assert code_cell_labels(nb) == {1: "code cell 1 (the one starting `import numpy as np`)",
                                    3: "code cell 2 (an empty one)",
                                    5: "code cell 3 (the one starting `def causal_mask(n):`)"}
    result = grade_notebook(path, seed=1, isolation=NONE)
    expected = "code cell 3 (the one starting `def causal_mask(n):`), line 4"
    assert result.text().splitlines()[1].startswith(f"  SYNTAX ERROR in {expected}: SyntaxError"), result.text()
    assert result.checks[0].output.startswith(f"causal_mask was not defined: {expected} has a syntax error")
    assert "cell 5" not in result.text()


def test_errors_while_running_name_the_code_cell_too(tmp_path):
    path, _ = _notebook(tmp_path, [
        ("markdown", "# My work"), ("code", "import numpy as np"), ("markdown", "prose"),
        ("code", "def causal_mask(n):\n    raise RuntimeError('not yet')\n"),
        ("code", "x = 1\ny = x / 0\n"),
        ("code", "while True:\n    pass\n"),
    ])
    result = grade_notebook(path, seed=2, isolation=NONE, limits=Limits(cell_timeout_s=1, call_timeout_s=5))
    text = result.text()
    assert "causal_mask raised RuntimeError: not yet at code cell 2 (the one starting `def causal_mask(n):`), line 2" \
        in text, text
    assert "code cell 4 (the one starting `while True:`) did not finish within 1 s; it was skipped" in text, text
    assert "errors while running the notebook: code cell 3 (the one starting `x = 1`), line 2: ZeroDivisionError" \
        in text, text


@pytest.mark.parametrize("text, expected", [
    ("cell 7, line 3: SyntaxError: x", "code cell 4 (the one starting `def f(x):`), line 3: SyntaxError: x"),
    ("line 3 of cell 7: ValueError: x", "code cell 4 (the one starting `def f(x):`), line 3: ValueError: x"),
    ("cell 7 did not finish within 4 s", "code cell 4 (the one starting `def f(x):`) did not finish within 4 s"),
    ("cell 70 did not finish", "cell 70 did not finish"),  # no such cell: left as it is
    ("the submission printed cell 7", "the submission printed cell 7"),  # only a reference at the start
])
def test_relocate_rewrites_the_sandbox_cell_references(text, expected):
    assert relocate(text, {7: "code cell 4 (the one starting `def f(x):`)"}) == expected
