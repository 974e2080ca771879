"""The one-source tool: exercises/ is generated from solutions/ and must not drift."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mhalib.grade import release

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def _cell(kind, source, **meta):
    cell = {"cell_type": kind, "metadata": meta, "source": source}
    if kind == "code":
        cell.update(execution_count=3, outputs=[{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}])
    return cell


def _solution_nb():
    graded = {"nbgrader": {"grade": False, "solution": True, "locked": False,
                           "grade_id": "causal_mask", "points": 2, "schema_version": 3}}
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"mhalib": {"exercise": "01_single_head_attention"},
                     "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                     "widgets": {"state": {}}},
        "cells": [
            _cell("markdown", "# Title\n\nExplain why.\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION\n"),
            _cell("code", "import numpy as np"),
            _cell("code",
                  "def causal_mask(n):\n"
                  "    \"\"\"Doc.\"\"\"\n"
                  "    ### BEGIN SOLUTION\n"
                  "    upper = np.triu(np.ones((n, n), bool), 1)\n"
                  "    return np.where(upper, -np.inf, 0.0)\n"
                  "    ### END SOLUTION",
                  nbgrader=graded["nbgrader"], execution={"iopub.status.busy": "x"}),
            _cell("code", "check('causal_mask', causal_mask)", tags=["self-check"]),
            _cell("code",
                  "class M:\n"
                  "    def forward(self, x):\n"
                  "        ### BEGIN SOLUTION\n"
                  "        return x\n"
                  "        ### END SOLUTION\n"
                  "\n"
                  "x = 1\n"
                  "### BEGIN HIDDEN TESTS\n"
                  "assert x == 1\n"
                  "### END HIDDEN TESTS\n"),
        ],
    }


def test_solution_region_becomes_stub_with_same_indentation():
    ex = release.release_notebook(_solution_nb())
    src = "".join(ex["cells"][2]["source"])
    assert "np.triu" not in src and "BEGIN SOLUTION" not in src
    assert "    # YOUR CODE HERE\n    raise NotImplementedError(" in src
    assert "causal_mask is not written yet" in src
    assert src.startswith("def causal_mask(n):\n")
    compile(src, "cell", "exec")  # still valid Python


def test_method_stub_names_class_and_method_and_hidden_tests_removed():
    ex = release.release_notebook(_solution_nb())
    src = "".join(ex["cells"][4]["source"])
    assert "        raise NotImplementedError('M.forward is not written yet" in src
    assert "assert x == 1" not in src and "HIDDEN" not in src
    assert src.rstrip().endswith("x = 1")
    compile(src, "cell", "exec")


def test_markdown_answer_replaced():
    ex = release.release_notebook(_solution_nb())
    src = "".join(ex["cells"][0]["source"])
    assert "Because." not in src and "YOUR ANSWER HERE" in src and src.startswith("# Title")


def test_outputs_cleared_tags_and_metadata():
    sol = _solution_nb()
    ex = release.release_notebook(sol)
    for cell in ex["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None
    tags = [c["metadata"].get("tags", []) for c in ex["cells"]]
    assert tags[1] == []  # plain cell untouched
    assert tags[2] == ["raises-exception"]  # held a solution
    assert tags[3] == ["self-check", "raises-exception"]  # self-check
    assert ex["metadata"]["mhalib"] == {"exercise": "01_single_head_attention"}
    assert "widgets" not in ex["metadata"]
    assert ex["cells"][2]["metadata"]["nbgrader"]["grade_id"] == "causal_mask"
    assert "execution" not in ex["cells"][2]["metadata"]
    assert sol["cells"][2]["outputs"], "the input notebook must not be modified"


def test_release_is_idempotent_on_tags():
    once = release.release_notebook(_solution_nb())
    twice = release.release_notebook(once)
    assert release.dumps(once) == release.dumps(twice)


def test_unbalanced_markers_are_refused():
    with pytest.raises(release.ReleaseError, match="no matching"):
        release.release_text("### BEGIN SOLUTION\nx = 1\n")
    with pytest.raises(release.ReleaseError, match="no opening"):
        release.release_text("x = 1\n### END SOLUTION\n")


def test_cli_is_deterministic_and_check_detects_drift(tmp_path):
    sol_dir = tmp_path / "solutions"
    sol_dir.mkdir()
    (sol_dir / "01_single_head_attention.ipynb").write_text(json.dumps(_solution_nb()))
    cmd = [sys.executable, "-m", "mhalib.grade.release", "--root", str(tmp_path)]
    assert subprocess.run(cmd + ["--check"], capture_output=True).returncode == 1  # missing
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    out = tmp_path / "exercises" / "01_single_head_attention.ipynb"
    first = out.read_bytes()
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    assert out.read_bytes() == first
    assert subprocess.run(cmd + ["--check"], capture_output=True).returncode == 0
    out.write_text(first.decode().replace("YOUR CODE HERE", "edited by hand"))
    res = subprocess.run(cmd + ["--check"], capture_output=True, text=True)
    assert res.returncode == 1 and "differs" in res.stdout
    out.write_bytes(first)
    (tmp_path / "exercises" / "99_orphan.ipynb").write_text("{}")
    res = subprocess.run(cmd + ["--check"], capture_output=True, text=True)
    assert res.returncode == 1 and "no solution notebook" in res.stdout


def test_generated_exercise_parses_as_a_valid_notebook(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.reads(release.dumps(release.release_notebook(_solution_nb())), as_version=4)
    nbformat.validate(nb)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_exercise_matches_its_solution(solution):
    """exercises/NN.ipynb is exactly what the release tool makes of solutions/NN.ipynb."""
    exercise = ROOT / "exercises" / solution.name
    assert exercise.exists(), f"{exercise.name} missing: run `make exercises`"
    assert exercise.read_text(encoding="utf-8") == release.render(solution), (
        f"exercises/{solution.name} has drifted from solutions/{solution.name}: run `make exercises`"
    )


# ----------------------------------------------------------------------------- minutes per lab
def _first_cell(path):
    cell = json.loads(path.read_text(encoding="utf-8"))["cells"][0]
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _time_paragraph(path):
    """The paragraph of the first cell that starts with **Time** (or **Time:**)."""
    match = re.search(r"\*\*Time(?::\*\*|\*\*:?)(.*?)(?:\n\s*\n|\Z)", _first_cell(path), re.S)
    assert match, f"{path.relative_to(ROOT)}: the first cell has no **Time** line"
    return " ".join(match.group(1).split())


def _notebook_minutes(path):
    """``(notebook minutes, exercise minutes)`` from a lesson's Time line."""
    text = _time_paragraph(path)
    notebook = re.search(r"(\d+) minutes for this notebook", text)
    exercise = re.search(r"about (\d+) for exercise (\d\d)", text)
    assert notebook and exercise, (
        f"{path.relative_to(ROOT)}: the Time line should read '... N minutes for this notebook, ... about M "
        f"for exercise NN'; it reads {text!r}")
    assert exercise.group(2) == path.name[:2], f"{path.name}: its Time line names exercise {exercise.group(2)}"
    return int(notebook.group(1)), int(exercise.group(1))


def _guide_minutes():
    """``{number: (notebook minutes, exercise minutes)}`` from the instructors' guide's lab table."""
    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d\d) \| `(\d\d_\w+)` \| (\d+) \+ (\d+) \|", guide, re.M)
    return {number: (int(nb), int(ex)) for number, name, nb, ex in rows if name.startswith(number)}


LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_instructors_guide_and_notebooks_agree_on_the_minutes_per_lab():
    """docs/instructors.md repeats each notebook's Time line: notebook + exercise minutes."""
    guide = _guide_minutes()
    assert set(guide) == {p.name[:2] for p in LESSONS}, (
        f"docs/instructors.md has a minutes column for labs {sorted(guide)}; the notebooks are "
        f"{[p.name[:2] for p in LESSONS]}")
    for path in LESSONS:
        minutes = _notebook_minutes(path)
        assert guide[path.name[:2]] == minutes, (
            f"docs/instructors.md gives lab {path.name[:2]} {guide[path.name[:2]][0]} + {guide[path.name[:2]][1]} "
            f"minutes; the first cell of notebooks/{path.name} says {minutes[0]} + {minutes[1]}")
        assert sum(minutes) <= 90, f"{path.name}: {minutes[0]} + {minutes[1]} minutes do not fit a 90-minute lab"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_exercise_time_matches_its_notebook(solution):
    """The exercise's own Time line gives the minutes its notebook sets aside for it."""
    lesson = ROOT / "notebooks" / solution.name
    if not lesson.exists():
        pytest.skip(f"no notebook {solution.name}")
    stated = re.match(r"\s*about (\d+) minutes", _time_paragraph(solution))
    assert stated, f"solutions/{solution.name}: the Time line should start 'about N minutes'"
    assert int(stated.group(1)) == _notebook_minutes(lesson)[1], (
        f"solutions/{solution.name} says about {stated.group(1)} minutes; notebooks/{solution.name} sets "
        f"aside {_notebook_minutes(lesson)[1]} for its exercise")


# ----------------------------------------------------------------------------- protecting a learner's work
def _course_copy(tmp_path):
    for folder in ("solutions", "exercises"):
        (tmp_path / folder).mkdir()
    name = "01_single_head_attention.ipynb"
    (tmp_path / "solutions" / name).write_bytes((ROOT / "solutions" / name).read_bytes())
    (tmp_path / "exercises" / name).write_bytes((ROOT / "exercises" / name).read_bytes())
    return tmp_path / "solutions" / name, tmp_path / "exercises" / name


def test_make_exercises_never_overwrites_a_changed_exercise(tmp_path, capsys):
    solution, exercise = _course_copy(tmp_path)
    work = exercise.read_text(encoding="utf-8").replace("raise NotImplementedError", "return 42  # my work", 1)
    exercise.write_text(work, encoding="utf-8")
    assert release.main(["--root", str(tmp_path)]) == 1
    assert exercise.read_text(encoding="utf-8") == work
    err = capsys.readouterr().err
    assert f"kept {exercise}" in err and "--force" in err
    assert release.main(["--root", str(tmp_path), "--force"]) == 0
    assert exercise.read_text(encoding="utf-8") == release.render(solution)


def test_an_untouched_exercise_follows_its_changed_solution(tmp_path):
    """In a git checkout: the exercise is what the committed solution generates, then the
    solution changes: the exercise is regenerated (nobody changed it)."""
    solution, exercise = _course_copy(tmp_path)
    git = ["git", "-c", "user.name=course", "-c", "user.email=course@example.org"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "course"]):
        subprocess.run(git + args, cwd=tmp_path, check=True, capture_output=True)
    nb = json.loads(solution.read_text(encoding="utf-8"))
    nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": "A new first cell."})
    solution.write_text(json.dumps(nb), encoding="utf-8")
    assert release.main(["--root", str(tmp_path)]) == 0
    assert exercise.read_text(encoding="utf-8") == release.render(solution)


# ----------------------------------------------------------------------------- the learners' copy
def test_student_release_has_no_solutions_and_fresh_exercises(tmp_path):
    import zipfile

    out = [tmp_path / "a.zip", tmp_path / "b.zip"]
    for path in out:
        proc = subprocess.run([sys.executable, str(ROOT / "tools" / "student_release.py"), "--out", str(path)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert out[0].read_bytes() == out[1].read_bytes()  # reproducible
    with zipfile.ZipFile(out[0]) as zf:
        names = zf.namelist()
        assert names and all(n.startswith("mha-course/") for n in names)
        assert not [n for n in names if n.startswith(("mha-course/solutions/", "mha-course/tests/"))]
        for solution in sorted((ROOT / "solutions").glob("*.ipynb")):
            text = zf.read(f"mha-course/exercises/{solution.name}").decode("utf-8")
            assert text == release.render(solution)
        for name in names:
            if name.endswith(".ipynb"):
                text = zf.read(name).decode("utf-8")
                assert "### BEGIN SOLUTION" not in text and "### BEGIN HIDDEN TESTS" not in text, name
        assert "mha-course/Makefile" in names and "mha-course/mhalib/grade/grader.py" in names
        # for learners: nothing of the maintainers' or instructors', and a README of their own
        assert not {"mha-course/CONTRIBUTING.md", "mha-course/docs/instructors.md"} & set(names)
        readme = zf.read("mha-course/README.md").decode("utf-8")
    for advertised in ("make test", "solutions/", "worked solution", "instructors", "make exercises",
                       "make notebooks", "CONTRIBUTING"):
        assert advertised not in readme, f"the learners' README advertises {advertised!r}"
    assert "make grade NB=exercises/01_single_head_attention.ipynb" in readme and "make lab" in readme
    assert "## Course map" in readme and "notebooks/09_beyond_gqa.ipynb" in readme  # from the course's README
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "student_release.py"), "--out", "x.tar"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "--out must name a .zip file" in proc.stderr


def test_the_student_readme_commands_run_in_the_release(tmp_path):
    """Unpacked, with the course's packages borrowed for its .venv: every command of the
    learners' README runs there as written (make lab starts JupyterLab and is stopped once it
    serves); make help offers only targets that run there; the course's make test says what to
    run instead."""
    import signal
    import zipfile

    from test_documented_commands import assert_ran, bash_lines, borrow_venv, clean_env, run_lines

    out = tmp_path / "student.zip"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "student_release.py"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(out) as zf:
        zf.extractall(tmp_path)
    course = tmp_path / "mha-course"
    borrow_venv(course)
    lines = bash_lines((course / "README.md").read_text(encoding="utf-8"))
    assert lines[0] == "make lab" and lines[-1].startswith("make clean"), lines
    env = clean_env(BROWSER="true")  # JupyterLab opens no browser window here
    # make lab serves until stopped: started as written, stopped once it says where it serves
    lab = subprocess.Popen(["bash", "-c", lines[0]], cwd=course, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    try:
        for line in lab.stdout:
            seen.append(line)
            if re.search(r"https?://(127\.0\.0\.1|localhost):\d+/lab", line):
                break
        else:
            pytest.fail("make lab ended without serving:\n" + "".join(seen[-40:]))
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=60)
    results = run_lines(lines[1:], course, env=env)
    assert_ran(results)
    grades = [out for line, _, out in results if "grade" in line]
    assert len(grades) == 2 and all("TOTAL 0 / 8" in out for out in grades), grades
    assert not (course / ".venv").exists()  # make clean, the last line
    borrow_venv(course)
    # make help: only targets that exist here and are not the left-out ones
    help_text = subprocess.run(["make", "help"], cwd=course, env=env, capture_output=True, text=True).stdout
    offered = re.findall(r"^make ([\w-]+)", help_text, re.M)
    assert set(offered) == {"lab", "grade", "bench", "clean"}, help_text
    for target in offered:
        dry = subprocess.run(["make", "-n", target, "NB=exercises/01_single_head_attention.ipynb"], cwd=course,
                             env=env, capture_output=True, text=True)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        for path in re.findall(r"(?:benchmarks|notebooks|tools|tests)/[\w/.]+", dry.stdout):
            assert (course / path).exists(), f"make {target} runs {path}, which the release does not hold"
    for target in ("test", "unit", "notebooks", "exercises", "nbgrader", "autograder"):
        said = subprocess.run(["make", target], cwd=course, env=env, capture_output=True, text=True)
        assert said.returncode == 2 and "not in the learners' copy" in said.stderr, said.stdout + said.stderr
        assert "make grade NB=exercises/01_single_head_attention.ipynb" in said.stderr


def test_the_learners_makefile_keeps_what_learners_run_and_drops_the_rest():
    """tools/student_release.py's Makefile: the rules of the left-out targets and what only
    they used are gone, the set-up, lab and grade are the course's own lines."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import student_release
    finally:
        sys.path.remove(str(ROOT / "tools"))
    course = (ROOT / "Makefile").read_text(encoding="utf-8")
    learners = student_release.student_makefile(course)
    assert learners.rstrip("\n").endswith(student_release.LEFT_OUT_RULE.rstrip("\n"))
    rules = learners.replace(student_release.LEFT_OUT_RULE.rstrip("\n"), "")
    for gone in ("define LOCK_PY", "define NBGRADER_PTH_PY", "define stage", "PORTABLE :=", "tools/",
                 "tests", "solutions", "$(UNIT)"):
        assert gone not in rules, gone
    for kept in ("define CHECK_PY", "define PROBE_PY", "define TORCH_BUILD_PY", "$(STAMP): pyproject.toml $(LOCK)",
                 "\nlab: $(STAMP)", "\ngrade: $(STAMP)", "\nclean:", "ROOT_FLAG :="):
        assert kept in learners, kept
    assert learners.split("\n\n")[1:] and learners.index("\nhelp:") < learners.index("\ninstall:")  # the default
    for paragraph in course.split("\n\n"):  # the set-up is the course's, line for line
        if paragraph.startswith(("# (Re)create the environment", "lab: ")):
            assert paragraph in learners


def test_nbgrader_is_installed_by_one_documented_command():
    proc = subprocess.run(["make", "-n", "nbgrader"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "pip install" in proc.stdout and "nbgrader==0.9.6" in proc.stdout
    guide = (ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    assert "make nbgrader" in guide and "../.venv/nbgrader/bin/nbgrader generate_assignment" in guide
