"""What the docs tell a person to type runs as typed, from a copy of the course.

The command blocks of docs/instructors.md's sections on the exercises and the learners'
copy, on grading a class, on Gradescope and on nbgrader, the learner's grading command of
README.md and the one each exercise notebook names are taken from the docs as they are and
run line by line, as written, by one bash shell (``cd`` carries over, as in a terminal):
in a copy of the course's files (what git tracks, plus new files git does not ignore, as
they are in this checkout, committed in a repository of their own), with a PATH that holds
no virtual environment and no ``VIRTUAL_ENV``. A doc line that stops working fails its test.

The copy's ``.venv`` borrows this checkout's packages: its entries are links to those of
``.venv`` (so ``.venv/bin/python`` is the same interpreter with the same packages) and its
stamp is fresh, so ``make`` does not set it up again. Nothing else is shared: ``make
nbgrader`` installs nbgrader into the copy's own ``.venv/nbgrader`` (that needs the package
index, hence the ``network`` marker), which ``tests/test_grader_nbgrader.py`` then uses too.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "instructors.md"
KEY = "01_single_head_attention"
NO_VENV_VARS = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")


# ----------------------------------------------------------------------------- reading the docs
def section(markdown, heading):
    """The text of the ``## heading`` section of ``markdown`` (a clear failure when it is gone)."""
    found = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown, re.S | re.M)
    assert found, f"no section '## {heading}'"
    return found.group(1)


def bash_lines(markdown):
    """The command lines of the ```bash blocks of ``markdown``, in order (blank lines and
    whole-line comments left out; a trailing comment stays: bash reads it as one)."""
    lines = []
    for block in re.findall(r"^\s*```bash\n(.*?)^\s*```", markdown, re.S | re.M):
        lines += [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    return lines


# ----------------------------------------------------------------------------- running them
def _in_a_venv(folder):
    return ".venv" in Path(folder).parts or (Path(folder).parent / "pyvenv.cfg").exists()


def clean_env(**extra):
    """This process's environment without any virtual environment: none on PATH, no
    ``VIRTUAL_ENV`` (nor PYTHONPATH, or make's variables of a make test run)."""
    env = {k: v for k, v in os.environ.items() if k not in NO_VENV_VARS}
    env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not _in_a_venv(p))
    env.update(extra)
    return env


def run_lines(lines, cwd, timeout=900, env=None):
    """Run ``lines`` one after another in one bash shell started in ``cwd``, each exactly as
    written; returns ``[(line, exit status, output)]``, stdout and stderr together."""
    script = []
    for i, line in enumerate(lines):
        script += [f"printf '\\n@@start {i}@@\\n'", line, f"printf '\\n@@end {i} %d@@\\n' $?"]
    proc = subprocess.run(["bash", "--noprofile", "--norc"], input="\n".join(script) + "\n", cwd=cwd,
                          env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    results = []
    for i, line in enumerate(lines):
        found = re.search(rf"\n@@start {i}@@\n(.*)\n@@end {i} (\d+)@@\n", proc.stdout, re.S)
        assert found, f"the shell stopped before `{line}` ended:\n{proc.stdout[-3000:]}"
        results.append((line, int(found.group(2)), found.group(1)))
    return results


def assert_ran(results, expected=None):
    """Every line exited 0, except those containing a key of ``expected``, which exit with its value."""
    for line, status, output in results:
        want = next((rc for key, rc in (expected or {}).items() if key in line), 0)
        assert status == want, f"`{line}` exited with status {status} (expected {want}):\n{output[-4000:]}"


# ----------------------------------------------------------------------------- a copy of the course
def borrow_venv(folder):
    """``folder/.venv``: this checkout's packages, under links, with a fresh stamp (make does
    not set it up again) and no ``nbgrader`` (``make nbgrader`` makes the copy's own)."""
    venv = ROOT / ".venv"
    if not (venv / ".installed").exists():
        pytest.skip("no .venv here to borrow: run make install first")
    (folder / ".venv").mkdir()
    for entry in venv.iterdir():
        if entry.name not in ("nbgrader", ".installed", ".test-start"):
            (folder / ".venv" / entry.name).symlink_to(entry)
    (folder / ".venv" / ".installed").touch()


def course_copy(folder):
    """The course's files as they are in this checkout, in a git repository of their own at
    ``folder``, with a borrowed ``.venv``; returns ``folder``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in sorted(set(filter(None, listed))):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    git = ["git", "-c", "user.name=course", "-c", "user.email=course@example.org", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the course"]):
        subprocess.run(git + args, cwd=folder, check=True, capture_output=True)
    borrow_venv(folder)
    return folder


_SHARED = {}


def shared_course(tmp_path_factory):
    """One copy of the course per test process, shared by the tests that only read it or
    write where the docs say (dist/, submissions/, mycourse/)."""
    key = ("course", str(tmp_path_factory.getbasetemp()))
    if key not in _SHARED:
        _SHARED[key] = course_copy(tmp_path_factory.mktemp("course"))
    return _SHARED[key]


def nbgrader_flow(tmp_path_factory):
    """The nbgrader block of docs/instructors.md, run as written in the shared copy, on a class
    of three put in ``mycourse/submitted/`` first: ada, the released notebook done (the
    source notebook: the release with the answers); bob, the copy of ``exercises/`` with the
    same work (the solution notebook, which has no test cells either); eve, the blank copy of
    ``exercises/``. Returns ``(course, results)``; run once per test process."""
    key = ("nbgrader", str(tmp_path_factory.getbasetemp()))
    if key not in _SHARED:
        from mhalib.grade.nbgrader import source_notebook

        course = shared_course(tmp_path_factory)
        lines = bash_lines(section(GUIDE.read_text(encoding="utf-8"), "Grading with nbgrader"))
        _, done = source_notebook(ROOT / "solutions" / f"{KEY}.ipynb")
        for student, text in (("ada", nbformat.writes(done)),
                              ("bob", (ROOT / "solutions" / f"{KEY}.ipynb").read_text(encoding="utf-8")),
                              ("eve", (ROOT / "exercises" / f"{KEY}.ipynb").read_text(encoding="utf-8"))):
            folder = course / "mycourse" / "submitted" / student / KEY
            folder.mkdir(parents=True)
            (folder / f"{KEY}.ipynb").write_text(text, encoding="utf-8")
        _SHARED[key] = course, run_lines(lines, course, timeout=1500)
    return _SHARED[key]


def nbgrader_program(tmp_path_factory):
    """The ``nbgrader`` that the documented ``make nbgrader`` installed in the shared copy."""
    course, results = nbgrader_flow(tmp_path_factory)
    line, status, output = results[0]
    assert line.startswith("make nbgrader") and status == 0, output[-3000:]
    return course / ".venv" / "nbgrader" / "bin" / "nbgrader"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return shared_course(tmp_path_factory)


def needs_sandbox():
    from mhalib.grade.sandbox import decide

    isolation = decide()
    if not isolation.ok:
        pytest.skip(f"grading a class needs a sandbox: {isolation.problem}")


# ----------------------------------------------------------------------------- the tests
def test_the_docs_blocks_are_found():
    """The extraction itself: each section this file runs has command lines, and a line
    written in the guide comes out as written."""
    guide = GUIDE.read_text(encoding="utf-8")
    for heading in ("Exercises: one source", "Grading a class in one command", "Gradescope", "Grading with nbgrader"):
        assert bash_lines(section(guide, heading)), f"no ```bash block in '## {heading}'"
    assert "make student-release" in " ".join(bash_lines(section(guide, "Exercises: one source")))
    assert bash_lines("```bash\nmake a   # b\n\n# c\n```\n") == ["make a   # b"]
    assert "/.venv" not in clean_env()["PATH"] + os.pathsep and "VIRTUAL_ENV" not in clean_env()


def test_the_exercises_and_release_commands_run_as_documented(course):
    """make exercises, one exercise, --check, and make student-release (the learners' zip)."""
    lines = bash_lines(section(GUIDE.read_text(encoding="utf-8"), "Exercises: one source"))
    assert_ran(run_lines(lines, course))
    assert (course / "dist" / "mha-course-student.zip").is_file()


def test_grading_a_class_runs_as_documented(course):
    """The class-grading line, on a folder of two submissions: the solution and the blank exercise."""
    needs_sandbox()
    lines = bash_lines(section(GUIDE.read_text(encoding="utf-8"), "Grading a class in one command"))
    (course / "submissions").mkdir(exist_ok=True)
    for name, source in (("ada.ipynb", ROOT / "solutions" / f"{KEY}.ipynb"),
                         ("bob.ipynb", ROOT / "exercises" / f"{KEY}.ipynb")):
        shutil.copy(source, course / "submissions" / name)
    results = run_lines(lines, course)
    assert_ran(results)
    assert "TOTAL 8 / 8" in results[-1][2] and "TOTAL 0 / 8" in results[-1][2], results[-1][2][-3000:]
    assert (course / "grades.csv").is_file()


def test_the_learners_grading_command_runs_as_documented(course):
    """README's make grade line, and the one each exercise notebook names (its own file)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = [line for line in bash_lines(readme) if line.startswith("make grade")]
    assert lines, "README.md shows no make grade command"
    for exercise in sorted((ROOT / "exercises").glob("*.ipynb")):
        text = "".join("".join(cell["source"]) for cell in nbformat.read(exercise, as_version=4).cells)
        named = sorted(set(re.findall(r"`(make grade NB=[^`]+)`", text)))
        assert named == [f"make grade NB=exercises/{exercise.name}"], f"{exercise.name} names {named}"
        lines += named
    results = run_lines(list({line.split("#")[0].strip(): line for line in lines}.values()), course)
    assert_ran(results)
    for line, _, output in results:
        assert re.search(r"TOTAL [\d.]+ / [\d.]+", output), f"`{line}` printed no total:\n{output[-2000:]}"


def test_the_gradescope_build_runs_as_documented(course):
    import zipfile

    lines = bash_lines(section(GUIDE.read_text(encoding="utf-8"), "Gradescope"))
    assert_ran(run_lines(lines, course))
    built = course / "dist" / f"autograder_{KEY}.zip"
    with zipfile.ZipFile(built) as zf:
        assert {"README.md", "setup.sh", "run_autograder"} <= set(zf.namelist())


@pytest.mark.slow
@pytest.mark.network  # make nbgrader installs nbgrader 0.9.6 from the package index
def test_the_nbgrader_flow_runs_as_documented(tmp_path_factory):
    """make nbgrader, the source notebooks, generate_assignment, validate, the course's check,
    autograde, export and feedback, as written, with no .venv on PATH: nbgrader finds its own
    programs (alembic), the copy of exercises/ with the work in it gets its test cells back
    and full marks, and the two copies of exercises/ are named with what to submit instead.
    autograde's scores come from the course's grader, in its sandbox, as the guide says."""
    needs_sandbox()
    course, results = nbgrader_flow(tmp_path_factory)
    assert_ran(results, {"--check": 1})
    by_line = {line.split("#")[0].strip(): output for line, _, output in results}
    assert not any("No such file or directory: 'alembic'" in out for out in by_line.values())
    mycourse = course / "mycourse"
    validate = next(out for line, out in by_line.items() if " validate release/" in line)
    assert "VALIDATION FAILED" in validate, validate[-2000:]
    check = next(out for line, out in by_line.items() if "--check" in line)
    named = {m.group(1) for m in re.finditer(rf"^submitted/(\w+)/{KEY}/{KEY}\.ipynb: .*release/{KEY}/{KEY}\.ipynb",
                                                check, re.M)}
    assert named == {"bob", "eve"}, check
    autograde = next(out for line, out in by_line.items() if " autograde " in line)
    assert re.search(rf"WARNING\] submitted/bob/{KEY}/{KEY}\.ipynb: it has none of the 3 test cells", autograde), \
        autograde[-3000:]
    for student, points in (("ada", 8), ("bob", 8), ("eve", 0)):
        assert f"{student}/{KEY}: {points} / 8 from the course's grader (bubblewrap sandbox)" in autograde, \
            autograde[-3000:]
    scores = {row["student_id"]: (float(row["score"]), float(row["max_score"]))
              for row in csv.DictReader((mycourse / "grades.csv").open())}
    assert scores == {"ada": (8.0, 8.0), "bob": (8.0, 8.0), "eve": (0.0, 8.0)}
    feedback = (mycourse / "feedback" / "bob" / KEY / f"{KEY}.html").read_text(encoding="utf-8")
    assert "was missing from the submission and nbgrader put it back" in feedback
    released = nbformat.read(mycourse / "release" / KEY / f"{KEY}.ipynb", as_version=4)
    assert f"**Submit this notebook**, `{KEY}.ipynb`" in released.cells[1].source
    assert released.cells[1].metadata.nbgrader["locked"]
