"""The Gradescope autograder: the zip `make autograder EXERCISE=NN` builds, and results.json.

The zip is unpacked here as Gradescope unpacks it (``/autograder/source``) and its grader
is run from there on uploaded notebooks. results.json is checked against Gradescope's
autograder specification (top-level ``score``, ``output``, ``tests`` with ``name``,
``score``, ``max_score``, ``status``, ``output``, ``visibility``; formats and visibilities
from the lists the specification allows).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "tools" / "build_autograder.py"
FORMATS = {"text", "html", "simple_format", "md", "ansi"}
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
NUMBER = (int, float)


def check_results(data):
    """Problems with a results.json by Gradescope's specification (empty when none)."""
    problems = []
    top = {"score": NUMBER, "execution_time": NUMBER, "output": str, "output_format": str, "test_output_format": str,
           "test_name_format": str, "visibility": str, "stdout_visibility": str, "extra_data": dict, "tests": list,
           "leaderboard": list}
    test = {"score": NUMBER, "max_score": NUMBER, "status": str, "name": str, "name_format": str, "number": str,
            "output": str, "output_format": str, "tags": list, "visibility": str, "extra_data": dict}
    for where, value, allowed in [("results", data, top), *((f"tests[{i}]", t, test) for i, t in
                                                             enumerate(data.get("tests", [])))]:
        for key, item in value.items():
            if key not in allowed or not isinstance(item, allowed[key]) or isinstance(item, bool):
                problems.append(f"{where}.{key} = {item!r}")
        for key in ("output_format", "test_output_format", "name_format", "test_name_format"):
            if key in value and value[key] not in FORMATS:
                problems.append(f"{where}.{key} = {value[key]!r}")
        if value.get("visibility", "visible") not in VISIBILITY:
            problems.append(f"{where}.visibility = {value['visibility']!r}")
        if where != "results" and value.get("status", "passed") not in ("passed", "failed"):
            problems.append(f"{where}.status = {value['status']!r}")
    if "score" not in data and not all("score" in t for t in data.get("tests", [])):
        problems.append("no score: neither at the top nor on every test")
    return problems


def build(out, exercise="01"):
    return subprocess.run([sys.executable, str(BUILD), "--exercise", exercise, "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("autograder")
    assert build(folder / "autograder.zip").returncode == 0
    with zipfile.ZipFile(folder / "autograder.zip") as zf:
        zf.extractall(folder / "source")
    return folder / "source"


def run(source, submission, results, env=None):
    return subprocess.run([sys.executable, "-m", "mhalib.grade.gradescope", "01", str(submission), str(results)],
                          cwd=source, capture_output=True, text=True, timeout=300, env=env)


def test_zip_is_reproducible_and_for_one_exercise(tmp_path):
    assert build(tmp_path / "a.zip").returncode == 0 and build(tmp_path / "b.zip").returncode == 0
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        names = zf.namelist()
        run_autograder = zf.read("run_autograder").decode()
        setup = zf.read("setup.sh").decode()
        modes = {i.filename: i.external_attr >> 16 for i in zf.infolist()}
    assert {"setup.sh", "run_autograder", "requirements/lock.txt", "mhalib/grade/gradescope.py"} <= set(names)
    assert not any("__pycache__" in n or n.startswith(("tests/", "solutions/")) for n in names)
    assert modes["setup.sh"] & stat.S_IXUSR and modes["run_autograder"] & stat.S_IXUSR
    assert "-m mhalib.grade.gradescope 01_single_head_attention" in run_autograder
    assert "bubblewrap" in setup and 'chmod -R go-rwx "$src"' in setup
    for script in (setup, run_autograder):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    refused = subprocess.run([sys.executable, str(BUILD)], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 2 and "--exercise" in refused.stderr
    made = subprocess.run(["make", "-n", "autograder"], capture_output=True, text=True, cwd=ROOT)
    assert "EXERCISE" in made.stdout + made.stderr


def test_solution_gets_full_marks_and_results_meet_the_spec(tmp_path, source):
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "my_work.ipynb").write_bytes((ROOT / "solutions" / "01_single_head_attention.ipynb").read_bytes())
    proc = run(source, submission, tmp_path / "results.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert check_results(data) == []
    assert data["score"] == 8 and {t["status"] for t in data["tests"]} == {"passed"}
    assert "Isolation: bubblewrap" in data["output"] or "Isolation: user nobody" in data["output"]


def test_no_notebook_is_a_result_that_says_so(tmp_path, source):
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "answers.py").write_text("print('hi')\n")
    run(source, tmp_path / "submission", tmp_path / "results.json")
    data = json.loads((tmp_path / "results.json").read_text())
    assert check_results(data) == [] and data["score"] == 0 and len(data["tests"]) == 3
    assert "No notebook (.ipynb) was uploaded" in data["output"]


def test_without_isolation_nothing_is_graded(tmp_path, source):
    """No bubblewrap and no usable user nobody: no results file (Gradescope shows the run
    failed, with no score) and a reason in the log instructors see."""
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "a.ipynb").write_bytes((ROOT / "solutions" / "01_single_head_attention.ipynb").read_bytes())
    proc = run(source, submission, tmp_path / "results.json", env=dict(os.environ, PATH="/nonexistent"))
    if proc.returncode == 0:  # user nobody could run it: a one-submission container
        assert "user nobody" in json.loads((tmp_path / "results.json").read_text())["output"]
    else:
        assert proc.returncode == 3 and "NOT GRADED" in proc.stdout and "bubblewrap" in proc.stdout
        assert not (tmp_path / "results.json").exists()


def test_cli_results_meet_the_spec(tmp_path):
    broken = tmp_path / "01_broken.ipynb"
    broken.write_text("{ not json")
    proc = subprocess.run([sys.executable, "-m", "mhalib.grade", str(broken), "--results", str(tmp_path / "r.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr  # scored 0, and the exit status says it was not readable
    data = json.loads((tmp_path / "r.json").read_text())
    assert check_results(data) == [] and data["score"] == 0 and len(data["tests"]) == 3
    assert check_results({"tests": [{"name": "x", "status": "ok"}]}) != []  # the checker can fail


def test_the_finished_copy_beats_an_older_draft(tmp_path, source):
    """JupyterLab's duplicate (-Copy1) holds the finished work, beside an older draft under
    another name: both are graded, the best is kept, and the output names both."""
    from mhalib.grade.sandbox import decide

    if not decide(container=True).ok:
        pytest.skip("no isolation here")
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "my_work.ipynb").write_bytes((ROOT / "exercises" / "01_single_head_attention.ipynb").read_bytes())
    (submission / "01_single_head_attention-Copy1.ipynb").write_bytes(
        (ROOT / "solutions" / "01_single_head_attention.ipynb").read_bytes())
    proc = run(source, submission, tmp_path / "results.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["score"] == sum(t["max_score"] for t in data["tests"]) == 8, data["output"]
    assert "kept the best: 01_single_head_attention-Copy1.ipynb" in data["output"]
    assert "my_work.ipynb: 0 / 8" in data["output"] and "01_single_head_attention-Copy1.ipynb: 8 / 8" in data["output"]


# ----------------------------------------------------------------------------- what a zip carries
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python with this environment's packages (NumPy, torch, nbformat) but not the course:
    a virtual environment whose one addition is this one's site-packages as a plain path, so
    the editable install of ``mhalib`` there is not active."""
    import sysconfig

    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run([str(python), "-c", "import numpy, nbformat\ntry:\n import mhalib\nexcept ImportError:\n"
                            " print('no course')\nelse:\n print(mhalib.__file__)"],
                           cwd=tmp_path_factory.getbasetemp(), capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "no course", probe.stdout + probe.stderr
    return python


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem[:2] for p in SOLUTIONS])
def test_each_zip_alone_grades_its_solution_with_full_marks(tmp_path, bare_python, solution):
    """The zip's files are all the grader needs: unpacked alone and run by a Python without
    the course, it gives the exercise's solution full marks."""
    from mhalib.grade.sandbox import decide

    if not decide(container=True).ok:
        pytest.skip("no isolation here")
    number = solution.name[:2]
    assert build(tmp_path / "a.zip", number).returncode == 0
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        zf.extractall(tmp_path / "source")
    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / solution.name).write_bytes(solution.read_bytes())
    proc = subprocess.run([str(bare_python), "-m", "mhalib.grade.gradescope", number, str(tmp_path / "submission"),
                           str(tmp_path / "results.json")], cwd=tmp_path / "source", capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["tests"] and data["score"] == sum(t["max_score"] for t in data["tests"]), data["output"]


def test_the_zip_carries_a_readme_and_only_what_its_exercise_needs(tmp_path):
    from mhalib.grade import exercises as registry

    ex = registry.get("08")
    assert build(tmp_path / "a.zip", "08").returncode == 0
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        names = zf.namelist()
        readme = zf.read("README.md").decode()
    assert (tmp_path / "a.zip").stat().st_size < 150_000  # docs/instructors.md, Gradescope
    modules = [n for n in names if n.startswith("mhalib/") and n.endswith(".py")]
    specs = [n for n in modules if n.startswith("mhalib/grade/exercises/ex")]
    assert specs == ["mhalib/grade/exercises/ex08_mha_to_gqa.py"]
    assert "mhalib/convert.py" in modules and "mhalib/grade/gradescope.py" in modules
    assert not [n for n in names if n.endswith(".pt")], "no trained weights: exercise 08's references load none"
    assert not [n for n in modules if n.startswith(("mhalib/language/", "mhalib/copytask/", "mhalib/widgets/"))
                or n in ("mhalib/grade/nbgrader.py", "mhalib/grade/release.py", "mhalib/plots.py")]
    assert ex.key in readme and f"{ex.max_score:g} points" in readme
    for graded in ex.graded:
        assert f"| `{graded.name}` | {graded.points:g} |" in readme
    for name in names:
        assert f"- `{name}`" in readme, f"README.md does not list {name}"
    assert "solutions/08_mha_to_gqa.ipynb" in readme  # how to test it in Gradescope


def test_tracing_follows_imports_inside_functions(tmp_path):
    """The zip's module list comes from every import statement, those in function bodies too
    (exercise references import ``mhalib`` where they run), and a data file goes with the
    module that names it."""
    spec = __import__("importlib.util").util.spec_from_file_location("build_autograder", BUILD)
    tool = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    (tmp_path / "mhalib" / "data").mkdir(parents=True)
    (tmp_path / "mhalib" / "__init__.py").write_text("")
    (tmp_path / "mhalib" / "a.py").write_text("def f():\n    from mhalib import b\n    return b\n")
    (tmp_path / "mhalib" / "b.py").write_text("from .data import read\nX = read('table.json')\n")
    (tmp_path / "mhalib" / "c.py").write_text("import mhalib.a\n")
    (tmp_path / "mhalib" / "data" / "__init__.py").write_text("def read(name):\n    return name\n")
    for name in ("table.json", "weights.pt", "weights.json"):
        (tmp_path / "mhalib" / "data" / name).write_text("{}")
    modules = tool.needed_modules(["mhalib.a"], tmp_path)
    assert modules == ["mhalib", "mhalib.a", "mhalib.b", "mhalib.data"]
    assert [p.name for p in tool.needed_data(modules, tmp_path)] == ["table.json"]
