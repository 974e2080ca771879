"""The course as an nbgrader course: ``python -m mhalib.grade.nbgrader COURSE_DIR [NN ...]``.

For each exercise (all by default) it writes ``COURSE_DIR/source/<key>/<key>.ipynb``: the
solution with, after its title, a locked cell that names the notebook to submit and, after
each answer cell, one locked test cell per graded check (``grade: true``, the grader's
points) running :func:`mhalib.check.score`, which grades the answer on fresh inputs as the
grader does and returns the points earned: nbgrader's partial credit (less than the cell's
points fails ``nbgrader validate``). Answer cells lose their ``points`` (nbgrader counts
those of grade cells only). It also writes ``COURSE_DIR/nbgrader_config.py`` (unless one is
there) with two settings for submissions that are not the notebook nbgrader released:

* ``OverwriteCells.add_missing_cells``: a notebook without the test cells (the copy in the
  course's ``exercises/`` folder has none) gets them back from ``source/`` and is graded;
  each cell put back says so in the feedback, and what to submit instead;
* ``Autograde.pre_convert_hook`` = :func:`pre_convert_hook`: before a student's notebooks are
  autograded, every problem :func:`check_folder` finds (a notebook under another name,
  another exercise's notebook, answer or test cells missing) is logged by name, with what
  to submit instead.

Then, in ``COURSE_DIR``::

    nbgrader generate_assignment <key> --create   # release/<key>/<key>.ipynb, the blank exercise
    nbgrader validate release/<key>/<key>.ipynb
    nbgrader autograde <key>                      # submitted/<student>/<key>/<key>.ipynb

``python -m mhalib.grade.nbgrader --check COURSE_DIR NN`` lists the same problems for every
student folder under ``submitted/``, before or after autograding (exit status 1 when any).

The same ``nbgrader_config.py`` sets ``Autograde.autograde_preprocessors`` to nbgrader's own
list with its ``Execute`` step (which runs the notebook in a Jupyter kernel, as the
instructor, with ``gradebook.db`` writable) replaced by :func:`sandbox_grade`: the course's
grader (``.venv/bin/python -m mhalib.grade``, bubblewrap) grades a copy of the notebook in its
sandbox, and each test cell gets, as its output, the points the sandbox gave its check, which
nbgrader's ``SaveAutoGrades`` records. No code of the submission runs in nbgrader's process
or in a kernel; without a sandbox nothing is graded. nbgrader's default, the notebook in a
kernel, lets a submission set anyone's grade: fine for practice, never for marks.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from mhalib.grade import exercises as registry

ROOT = Path(__file__).resolve().parents[2]

# One line: nbgrader turns it into a comment in a code cell by putting "# " before it, and a
# second line would be code. {cell_id} is the one field nbgrader fills in.
MISSING_CELL_NOTE = ("This test cell ({cell_id}) was missing from the submission and nbgrader put it back: "
                     "the notebook to submit is the one nbgrader released for this assignment, with its test "
                     "cells (the copy in the course's exercises/ folder has none).\n\n")

CONFIG = f'''\
# nbgrader's settings for the course "Multi-Head Attention, from one head to GQA", written by
# python -m mhalib.grade.nbgrader (docs/instructors.md, "Grading with nbgrader").
c = get_config()  # noqa: F821 - nbgrader defines it

# A submission without its test cells (the copy in the course's exercises/ folder has none)
# gets them back from source/ and is graded; each cell put back says so in the feedback.
c.OverwriteCells.add_missing_cells = True
c.OverwriteCells.missing_cell_notification = {MISSING_CELL_NOTE!r}

# Before a student's notebooks are autograded, each one that is not the notebook nbgrader
# released (another name, another exercise, answer or test cells missing) is named in
# autograde's log, with what to submit instead.
from mhalib.grade.nbgrader import pre_convert_hook  # noqa: E402

c.Autograde.pre_convert_hook = pre_convert_hook

# Scores come from the course's grader, which runs each notebook in its sandbox (bubblewrap), never
# in a Jupyter kernel: nbgrader's own list of autograde steps (nbgrader 0.9.6) with its Execute step
# replaced by sandbox_grade, which writes each check's points into its test cell for SaveAutoGrades
# to record. Without this setting nbgrader runs every submission in a kernel as you, where it can
# set any student's grade in gradebook.db (docs/instructors.md, "Grading with nbgrader").
from mhalib.grade.nbgrader import sandbox_grade  # noqa: E402

c.Autograde.autograde_preprocessors = [
    sandbox_grade,
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
'''


def _slug(name):
    return re.sub(r"\W+", "_", name).strip("_")


def score_grade_id(graded):
    """The ``grade_id`` of the nbgrader test cell that scores ``graded`` (``test_causal_mask_n_1``)."""
    return f"test_{_slug(graded.name)}"


def test_cell(graded):
    """The locked nbgrader test cell that scores ``graded`` with ``mhalib.check.score``."""
    import nbformat

    cell = nbformat.v4.new_code_cell(f"from mhalib.check import score\n\nscore({graded.name!r}, {graded.lookup})")
    cell.id = score_grade_id(graded).replace("_", "-")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "points": graded.points,
                                 "grade_id": score_grade_id(graded), "schema_version": 3}
    return cell


def submit_cell(ex):
    """The locked markdown cell, after the title, that names the notebook to submit."""
    import nbformat

    tests = ", ".join(f"`{g.name}`" for g in ex.graded)
    cell = nbformat.v4.new_markdown_cell(
        f"**Submit this notebook**, `{ex.key}.ipynb`, under this name and with its test cells: the locked "
        f"cells that call `score` ({tests}), one after each function you write. nbgrader grades this file "
        f"alone, through those cells; the copy of exercise {ex.number} in the course's `exercises/` folder "
        f"has none.")
    cell.id = "submit-this-notebook"
    cell.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": True,
                                 "grade_id": "submit_this_notebook", "schema_version": 3}
    return cell


def source_notebook(solution):
    """``(exercise, notebook)``: the nbgrader source notebook made from one solution notebook."""
    import nbformat

    nb = nbformat.read(solution, as_version=4)
    ex, _ = registry.recognise(nb.metadata, solution)
    if ex is None:
        raise SystemExit(f"{solution}: no grader spec for this notebook")
    cells, tested = [], set()
    for cell in nb.cells:
        cells.append(cell)
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            meta.pop("points", None)
            for graded in ex.graded:
                if graded.lookup == meta.get("grade_id"):
                    cells.append(test_cell(graded))
                    tested.add(graded.name)
    missing = {g.name for g in ex.graded} - tested
    if missing:
        raise SystemExit(f"{solution}: no answer cell with grade_id for {', '.join(sorted(missing))}")
    # After the title and before any cell of nbgrader's, so that nbgrader can put missing test
    # cells back (it places each after the answer or test cell that precedes it in source/).
    cells.insert(1, submit_cell(ex))
    nb.cells = cells
    return ex, nb


# ----------------------------------------------------------------------------- submissions
def _dict(value):
    return value if isinstance(value, dict) else {}


def _grade_ids(nb):
    """The nbgrader ``grade_id`` of every cell of ``nb`` (a parsed notebook, however malformed)."""
    return {_dict(_dict(_dict(c).get("metadata")).get("nbgrader")).get("grade_id") for c in nb["cells"]}


def check_notebook(path, ex):
    """Problems that keep nbgrader from grading ``path`` as exercise ``ex`` (empty when none).

    Each is a sentence about the notebook; :func:`check_folder` adds the file and what to submit.
    """
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
            raise ValueError("no list of cells")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return [f"it is not a notebook nbgrader can read ({type(exc).__name__}: {str(exc)[:80]})"]
    said = _dict(_dict(nb.get("metadata")).get("mhalib")).get("exercise")
    ids = _grade_ids(nb)
    answers = [g.lookup for g in ex.graded if g.lookup not in ids]
    answers = list(dict.fromkeys(answers))
    if isinstance(said, str) and said != ex.key:
        other = registry.get(said)
        return [f"it is exercise {other.number if other else '?'}'s notebook ({said}), not exercise {ex.number}'s "
                f"(nbgrader cannot grade it as {ex.key}: it has no answer cell for "
                f"{', '.join(answers) or 'the same functions'})"]
    if answers:
        return [f"its answer cells for {', '.join(answers)} are missing (cells with nbgrader grade_id "
                f"{', '.join(repr(a) for a in answers)}): nbgrader cannot grade it"]
    tests = [score_grade_id(g) for g in ex.graded if score_grade_id(g) not in ids]
    if len(tests) == len(ex.graded):
        return [f"it has none of the {len(tests)} test cells (it is not the notebook nbgrader released: the copy in "
                f"the course's exercises/ folder has none); with this course's nbgrader_config.py nbgrader "
                f"puts them back and grades it"]
    if tests:
        return [f"its test cells {', '.join(tests)} are missing; with this course's nbgrader_config.py nbgrader "
                f"puts them back and grades it"]
    return []


def check_folder(folder, ex, student=None):
    """Problems with one student's submission of exercise ``ex``, the folder
    ``submitted/<student>/<key>/``: one line each, naming the file and what to submit instead."""
    folder = Path(folder)
    student = student or folder.parent.name
    expected = f"{ex.key}.ipynb"
    instead = (f"ask {student} to submit release/{ex.key}/{expected}, the notebook nbgrader released for "
               f"{ex.key}, under that name and with its test cells")
    notebooks = sorted(p.name for p in folder.glob("*.ipynb") if p.is_file())
    problems = []
    if expected not in notebooks:
        found = f"found {', '.join(notebooks)}" if notebooks else "no notebook at all"
        problems.append(f"{folder}: no {expected}, the one notebook nbgrader grades for {ex.key} ({found}): it "
                        f"scores 0; {instead}" + (f" (e.g. rename {notebooks[0]} to {expected})" if notebooks else ""))
    else:
        problems += [f"{folder / expected}: {why}; {instead}" for why in check_notebook(folder / expected, ex)]
        others = [n for n in notebooks if n != expected]
        if others:
            problems.append(f"{folder}: {', '.join(others)} {'is' if len(others) == 1 else 'are'} not graded "
                            f"(nbgrader grades {expected} alone)")
    return problems


def check_submitted(course_dir, ex):
    """Every problem :func:`check_folder` finds under ``course_dir/submitted/*/<key>/``."""
    problems = []
    for folder in sorted(Path(course_dir, "submitted").glob(f"*/{ex.key}")):
        if folder.is_dir():
            problems += check_folder(folder, ex)
    return problems


def _log():
    """The running nbgrader application's log (lines like ``[AutogradeApp | WARNING] ...``)."""
    try:
        from traitlets.config import Application

        if Application.initialized():
            return Application.instance().log
    except ImportError:
        pass
    import logging

    return logging.getLogger("mhalib.grade.nbgrader")


def pre_convert_hook(assignment=None, student=None, notebooks=(), **_):
    """nbgrader's ``Autograde.pre_convert_hook``: before one student's notebooks of ``assignment``
    (paths ``submitted/<student>/<assignment>/*.ipynb``) are autograded, log each problem
    :func:`check_folder` finds. Assignments that are not one of the course's exercises pass."""
    ex = registry.get(assignment) if assignment else None
    if ex is None or not notebooks:
        return
    folder = Path(notebooks[0]).parent
    try:  # named as in the course folder, where nbgrader runs: submitted/<student>/<assignment>
        folder = folder.relative_to(Path.cwd())
    except ValueError:
        pass
    log = _log()
    for problem in check_folder(folder, ex):
        log.warning("%s", problem)


# ----------------------------------------------------------------------------- scores from the sandbox
class SandboxGradingError(RuntimeError):
    """The course's grader did not grade a submission: nbgrader records no score for it."""


def course_python():
    """The course's Python (``.venv/bin/python`` of the course folder), which runs the grader."""
    return ROOT / ".venv" / "bin" / "python"


def _isolation(output):
    found = re.search(r"^Isolation: (.*)$", output or "", re.M)
    return found.group(1) if found else ""


def grade_in_sandbox(nb, ex, python=None, timeout=600):
    """Grade notebook ``nb`` (a parsed notebook) as exercise ``ex`` with the course's grader, in
    its sandbox: ``python -m mhalib.grade FILE --exercise KEY --results R`` in a subprocess, on a
    copy whose test cells are tagged ``grader-skip`` (they call ``score``, which has no place
    there). Returns ``(isolation, notes, {check name: gradescope test dict})``, ``notes`` being
    what the grader said about the whole notebook (a syntax error, errors while it ran). Raises
    :class:`SandboxGradingError` when the grader graded nothing (no sandbox, an error); it never
    falls back to running the code elsewhere."""
    python = Path(python or course_python())
    if not python.exists():
        raise SandboxGradingError(f"no course Python at {python}: run `make install` in the course folder "
                                  f"({ROOT}); the course's grader runs with it")
    tests = {score_grade_id(g) for g in ex.graded}
    sent = copy.deepcopy(nb)
    for cell in sent["cells"]:  # skipped, not removed: the grader names cells by their number
        meta = _dict(_dict(cell).get("metadata"))
        if _dict(meta.get("nbgrader")).get("grade_id") in tests:
            meta["tags"] = [*(meta.get("tags") if isinstance(meta.get("tags"), list) else []), "grader-skip"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    with tempfile.TemporaryDirectory(prefix="mhalib-nbgrader-") as tmp:
        submission, results = Path(tmp, f"{ex.key}.ipynb"), Path(tmp, "results.json")
        submission.write_text(json.dumps(sent), encoding="utf-8")
        command = [str(python), "-m", "mhalib.grade", str(submission), "--exercise", ex.key, "--results",
                   str(results), "--quiet"]
        try:
            proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SandboxGradingError(f"the course's grader did not finish in {timeout} s") from None
        said = (proc.stderr.strip() or proc.stdout.strip())[-600:]
        if proc.returncode == 3:
            raise SandboxGradingError(f"the course's grader refused to run student code: no sandbox ({said}). "
                                      f"Nothing was graded; install bubblewrap (docs/instructors.md, \"Grading "
                                      f"a class in one command\")")
        try:
            result = json.loads(results.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise SandboxGradingError(f"the course's grader wrote no results (exit status {proc.returncode}): "
                                      f"{said}") from None
    isolation = _isolation(result.get("output"))
    if not isolation.startswith("bubblewrap"):
        raise SandboxGradingError(f"the course's grader did not grade in its sandbox (isolation: "
                                  f"{isolation or 'not said'}): no score recorded")
    checks = {t.get("name"): t for t in result.get("tests", [])}
    missing = [g.name for g in ex.graded if g.name not in checks]
    if missing or "(NOT GRADED)" in result.get("output", ""):
        raise SandboxGradingError(f"the course's grader did not grade {', '.join(missing) or 'the notebook'}: "
                                  f"{result.get('output', said)[:600]}")
    notes = [line for line in result.get("output", "").splitlines()[1:] if not line.startswith("Isolation: ")]
    return isolation, notes, checks


def fill_test_cells(nb, ex, isolation, notes, checks):
    """Give each test cell of ``nb`` the sandbox's result for its check as its output: what the
    grader said (stdout; the first test cell also gets ``notes``, about the whole notebook) and
    the points (an ``execute_result``, nbgrader's partial credit). Every other output a test
    cell had is dropped. Returns ``{grade_id: points}``."""
    import nbformat

    points = {}
    for i, graded in enumerate(ex.graded):
        check = checks[graded.name]
        earned = min(max(float(check["score"]), 0.0), float(graded.points))
        points[score_grade_id(graded)] = earned
        mark = "\u2714" if earned == graded.points else "\u2718"
        text = (f"{mark} {graded.name}: {earned:g} of {graded.points:g} points from the course's grader, which ran "
                f"this notebook in its {isolation.split(' (')[0]} (this cell did not run)\n"
                f"{check.get('output', '')}\n" + "".join(f"{note}\n" for note in (notes if i == 0 else ())))
        for cell in nb.cells:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == score_grade_id(graded):
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text),
                                nbformat.v4.new_output("execute_result", data={"text/plain": repr(earned)},
                                                       execution_count=None)]
                cell.execution_count = None
    return points


def gradebook_triggers(db_url):
    """The names of the triggers in an SQLite gradebook (``sqlite:///PATH``; other databases: ``[]``).

    nbgrader makes none: one in ``gradebook.db`` was put there by code that could write it, such
    as a submission run in nbgrader's kernel, and it can rewrite any grade recorded later."""
    import sqlite3

    if not str(db_url).startswith("sqlite:///"):
        return []
    path = Path(str(db_url)[len("sqlite:///"):])
    if not path.is_file():
        return []
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")]
    finally:
        db.close()


def sandbox_grade(nb, resources):
    """An nbgrader autograde step, in place of its ``Execute``: grade one student's notebook of
    ``resources["nbgrader"]["assignment"]`` with :func:`grade_in_sandbox` and put each check's
    points into its test cell (:func:`fill_test_cells`), for ``SaveAutoGrades`` to record.
    Nothing of the notebook runs in this process or in a kernel. Raises (nbgrader then reports
    an error for that student and records no score) for an assignment that is not one of the
    course's exercises, or when the sandbox graded nothing."""
    info = resources.get("nbgrader", {})
    ex = registry.get(info.get("assignment") or "")
    if ex is None:
        raise SandboxGradingError(f"assignment {info.get('assignment')!r} is not one of the course's exercises "
                                  f"({', '.join(registry.all_exercises())}): the course's grader cannot grade it")
    planted = gradebook_triggers(info.get("db_url", ""))
    if planted:
        raise SandboxGradingError(
            f"the gradebook has triggers ({', '.join(planted)}), which nbgrader never makes: code that could write "
            f"it put them there (a submission run in nbgrader's kernel can), and they can rewrite every grade "
            f"recorded from now on. No score recorded; start from a new gradebook (docs/instructors.md, "
            f"\"Grading with nbgrader\")")
    isolation, notes, checks = grade_in_sandbox(nb, ex)
    points = fill_test_cells(nb, ex, isolation, notes, checks)
    _log().info("%s/%s: %g / %g from the course's grader (%s)", info.get("student"), ex.key, sum(points.values()),
                ex.max_score, isolation.split(" (")[0])
    return nb, resources


def _write_config(course_dir):
    """Write ``nbgrader_config.py`` unless the course has one; returns what was done, in words."""
    path = Path(course_dir) / "nbgrader_config.py"
    if path.exists():
        text = path.read_text(encoding="utf-8")
        if text == CONFIG:
            return f"{path} is this course's"
        unsafe = "" if "sandbox_grade" in text else (
            "; as it is, nbgrader autograde runs each submission in a Jupyter kernel as you, where a submission "
            "can set any student's grade (docs/instructors.md, \"Grading with nbgrader\")")
        return (f"kept {path} (not written by this tool){unsafe}: for scores from the course's grader in its "
                f"sandbox, and for submissions that are not the released notebook to be named and graded, add "
                f"these settings to it:\n\n{CONFIG}")
    path.write_text(CONFIG, encoding="utf-8")
    return (f"wrote {path}: at autograde, the course's grader gives the scores from its sandbox, missing test "
            f"cells are put back, and misfiled submissions named")


def main(argv=None):
    """Write the nbgrader source notebooks of the chosen exercises (default: all) under ``course_dir``,
    or, with ``--check``, list the submissions under ``course_dir/submitted`` nbgrader cannot grade."""
    import nbformat

    parser = argparse.ArgumentParser(prog="python -m mhalib.grade.nbgrader",
                                     description="Write the course's exercises as nbgrader source notebooks, "
                                                 "or check the submissions of an nbgrader course.")
    parser.add_argument("course_dir", help="the nbgrader course folder (source/ and nbgrader_config.py are "
                                           "written there)")
    parser.add_argument("exercises", nargs="*", help="exercise numbers or keys (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing: name every notebook under COURSE_DIR/submitted/*/<key>/ that is not "
                             "the released notebook of the exercise (exit status 1 when any)")
    args = parser.parse_args(argv)
    chosen = []
    for name in args.exercises:
        ex = registry.get(name)
        if ex is None:
            parser.error(f"no exercise {name!r}; the exercises are {', '.join(registry.all_exercises())}")
        chosen.append(ex)
    if args.check:
        course = Path(args.course_dir)
        if not (course / "submitted").is_dir():
            parser.error(f"{course / 'submitted'} is not a folder: name the nbgrader course folder")
        problems = [p for ex in chosen or registry.all_exercises().values() for p in check_submitted(course, ex)]
        for problem in problems:
            print(problem)
        print(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found under {course / 'submitted'}")
        return 1 if problems else 0
    wanted = {ex.key for ex in chosen}
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    if not solutions:
        parser.error(f"no solutions/*.ipynb under {ROOT}: the nbgrader notebooks are made from the worked "
                     f"solutions, which the course's repository has (the student release does not)")
    for solution in solutions:
        ex, _ = registry.recognise(None, solution)
        if ex is None or (wanted and ex.key not in wanted):
            continue
        ex, nb = source_notebook(solution)
        out = Path(args.course_dir) / "source" / ex.key / f"{ex.key}.ipynb"
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
        print(f"wrote {out}: {len(ex.graded)} test cells, {ex.max_score:g} points")
    print(_write_config(args.course_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
