"""The repository keeps its promises: pins agree everywhere, the README's commands are
the ones CI runs, notebooks are committed executed, nothing machine-specific leaks in."""

import json
import re
import subprocess
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIRS = ("notebooks", "solutions", "exercises")


def lock_pins():
    pins = {}
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonical(name)] = version
    return pins


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirement_name(req):
    return canonical(re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0])


def environment_pins():
    """Pins of environment.yml's pip section (a small parser: the file is flat YAML)."""
    pins, in_pip = {}, False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("- pip:"):
            in_pip = True
            continue
        if in_pip and stripped.startswith("- ") and "==" in stripped:
            name, version = stripped[2:].split("==")
            pins[canonical(name)] = version.strip()
    return pins


def test_every_dependency_is_pinned_in_the_lock_file():
    project = pyproject()["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    pins = lock_pins()
    missing = sorted({requirement_name(r) for r in requirements} - set(pins))
    assert not missing, f"add exact pins to requirements/lock.txt for: {missing}"


def test_package_metadata_keeps_ranges_not_pins():
    for req in pyproject()["project"]["dependencies"]:
        assert "==" not in req, f"pyproject.toml should keep a range, not a pin: {req}"
    assert any(r.replace(" ", "").startswith("torch>=2.5") for r in pyproject()["project"]["dependencies"])


def test_environment_yml_agrees_with_the_lock_file():
    pins, env = lock_pins(), environment_pins()
    assert env, "environment.yml has no pinned pip packages"
    disagree = {name: (version, pins.get(name)) for name, version in env.items() if pins.get(name) != version}
    assert not disagree, f"environment.yml vs requirements/lock.txt: {disagree}"
    project = pyproject()["project"]
    direct = {requirement_name(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    assert direct <= set(env), f"environment.yml lacks {sorted(direct - set(env))}"


def test_lock_pins_satisfy_the_package_ranges():
    from packaging.requirements import Requirement

    pins = lock_pins()
    project = pyproject()["project"]
    for req in project["dependencies"] + project["optional-dependencies"]["dev"]:
        r = Requirement(req)
        assert r.specifier.contains(pins[canonical(r.name)], prereleases=True), f"{r.name}=={pins[canonical(r.name)]} is outside {r}"


def test_torch_pin_is_the_cpu_release():
    assert lock_pins()["torch"] == "2.13.0"


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert "make test" in commands, "`.ci/run` must call the README's test command, `make test`"


def test_makefile_test_target_runs_every_notebook_folder():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    for folder in NOTEBOOK_DIRS:
        assert folder in recipe, f"make test does not run {folder}/"
    assert "--nbval " in recipe and "--nbval-lax" in recipe


def tracked_notebooks(folder):
    return sorted((ROOT / folder).glob("*.ipynb"))


@pytest.mark.parametrize("folder", ["notebooks", "solutions"])
def test_notebooks_are_committed_executed_top_to_bottom(folder):
    for path in tracked_notebooks(folder):
        nb = json.loads(path.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        counts = [c.get("execution_count") for c in code]
        assert counts == list(range(1, len(code) + 1)), f"{path.name}: not one clean top-to-bottom run"
        assert any(c.get("outputs") for c in code), f"{path.name}: no outputs stored"


def test_every_notebook_starts_with_goals_and_ends_with_a_summary():
    for path in tracked_notebooks("notebooks"):
        cells = json.loads(path.read_text())["cells"]
        first = "".join(cells[0]["source"]).lower()
        last = "".join(cells[-1]["source"]).lower()
        assert cells[0]["cell_type"] == "markdown" and first.startswith("#"), f"{path.name}: first cell is not a title"
        assert "prerequisite" in first and "minutes" in first, f"{path.name}: first cell lacks time or prerequisites"
        assert cells[-1]["cell_type"] == "markdown" and "next" in last, f"{path.name}: last cell lacks what comes next"


def test_every_exercise_has_its_solution():
    exercises = {p.name for p in tracked_notebooks("exercises")}
    solutions = {p.name for p in tracked_notebooks("solutions")}
    assert exercises == solutions


def test_no_machine_paths_in_tracked_files():
    """The course works from any clone: no file may name the folder it was written in."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    places = {str(ROOT.parent) + "/", str(Path.home()) + "/"} - {"/"}
    offenders = []
    for name in files:
        path = ROOT / name
        if path.suffix in {".pt", ".png", ".zip"} or not path.is_file():
            continue
        text = path.read_text(errors="ignore")
        offenders += [f"{name}: {place}" for place in places if place in text]
    assert not offenders, f"machine paths in tracked files: {offenders}"
