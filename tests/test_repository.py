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


def lock_lines():
    """(name, version, marker) for every line of requirements/lock.txt; marker is a
    packaging Marker, or None for a pin that holds on every Python."""
    rows = []
    for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            rows.append(parse_pin(line))
    return rows


def parse_pin(line):
    from packaging.markers import Marker

    pin, _, marker = line.partition(";")
    name, version = pin.split("==")
    return canonical(name.strip()), version.strip(), Marker(marker) if marker.strip() else None


def python_environment(version):
    """Marker variables for Python `version` ("3.10" or "3.11.4")."""
    full = version if version.count(".") == 2 else version + ".0"
    return {"python_version": ".".join(full.split(".")[:2]), "python_full_version": full}


def lock_pins(python=None):
    """{name: version} that the lock gives Python `python` (default: the newest supported)."""
    environment = python_environment(python or supported_pythons()[-1])
    return {name: version for name, version, marker in lock_lines() if marker is None or marker.evaluate(environment)}


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def supported_pythons():
    """The Python versions requires-python admits, e.g. ["3.10", "3.11", "3.12", "3.13"]."""
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(pyproject()["project"]["requires-python"])
    return [f"3.{minor}" for minor in range(40) if spec.contains(f"3.{minor}.0")]


def requirement_name(req):
    return canonical(re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0])


def environment_yml():
    """(python spec, pip lines) of environment.yml (a small parser: the file is flat YAML)."""
    python, pins, in_pip = None, [], False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("- python") and not in_pip:
            python = stripped[len("- python"):].strip()
        elif stripped.startswith("- pip:"):
            in_pip = True
        elif in_pip and stripped.startswith("- ") and "==" in stripped:
            pins.append(parse_pin(stripped[2:]))
    return python, pins


def direct_requirements():
    project = pyproject()["project"]
    return project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]


def test_every_dependency_is_pinned_in_the_lock_file_for_every_supported_python():
    for python in supported_pythons():
        missing = sorted({requirement_name(r) for r in direct_requirements()} - set(lock_pins(python)))
        assert not missing, f"add exact pins for Python {python} to requirements/lock.txt: {missing}"


def test_the_lock_gives_at_most_one_pin_per_package_to_every_python():
    for python in supported_pythons():
        for full in (f"{python}.0", f"{python}.99"):
            environment = python_environment(full)
            seen = {}
            for name, version, marker in lock_lines():
                if marker is None or marker.evaluate(environment):
                    assert name not in seen, f"Python {full}: {name} pinned twice ({seen[name]}, {version})"
                    seen[name] = version


def test_package_metadata_keeps_ranges_not_pins():
    for req in pyproject()["project"]["dependencies"]:
        assert "==" not in req, f"pyproject.toml should keep a range, not a pin: {req}"
    assert any(r.replace(" ", "").startswith("torch>=2.5") for r in pyproject()["project"]["dependencies"])


def test_supported_pythons_agree_everywhere():
    """requires-python, the README, the Makefile's check, the lock and environment.yml name
    the same Pythons."""
    pythons = supported_pythons()
    oldest, newest = pythons[0], pythons[-1]
    assert pythons and newest != "3.39", "requires-python needs a floor and a ceiling (>=3.N,<3.M)"
    readme = (ROOT / "README.md").read_text()
    start_here = readme.split("## Start here", 1)[1].split("\n## ", 1)[0]
    assert f"Python {oldest} to {newest}" in start_here, f"README's Start here should say: Python {oldest} to {newest}"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^PY_OLDEST\s*:?=\s*{re.escape(oldest)}\s*$", makefile, re.M), f"Makefile: PY_OLDEST := {oldest}"
    assert re.search(rf"^PY_NEWEST\s*:?=\s*{re.escape(newest)}\s*$", makefile, re.M), f"Makefile: PY_NEWEST := {newest}"
    lock_header = (ROOT / "requirements" / "lock.txt").read_text().splitlines()[0]
    assert f"Python {oldest} to {newest}" in lock_header, f"requirements/lock.txt's first line should say Python {oldest} to {newest}"
    python, _ = environment_yml()
    assert python and python.lstrip("=") in pythons, f"environment.yml: python{python} is not one of {pythons}"
    env_comment = (ROOT / "environment.yml").read_text().split("dependencies:", 1)[0]
    assert f"{oldest} to {newest}" in env_comment, f"environment.yml's comment should say Python {oldest} to {newest}"


def test_environment_yml_agrees_with_the_lock_file():
    _, env = environment_yml()
    assert env, "environment.yml has no pinned pip packages"
    lock = {(name, version, str(marker)) for name, version, marker in lock_lines()}
    disagree = [f"{n}=={v}" + (f"; {m}" if m else "") for n, v, m in env if (n, v, str(m)) not in lock]
    assert not disagree, f"environment.yml lines that are not lines of requirements/lock.txt: {disagree}"
    project = pyproject()["project"]
    direct = {requirement_name(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    for python in supported_pythons():
        environment = python_environment(python)
        named = [n for n, v, m in env if m is None or m.evaluate(environment)]
        assert direct <= set(named), f"environment.yml lacks, for Python {python}: {sorted(direct - set(named))}"
        assert len(named) == len(set(named)), f"environment.yml pins a package twice for Python {python}"


def test_lock_pins_satisfy_the_package_ranges():
    from packaging.requirements import Requirement

    project = pyproject()["project"]
    for python in supported_pythons():
        pins = lock_pins(python)
        for req in project["dependencies"] + project["optional-dependencies"]["dev"]:
            r = Requirement(req)
            pin = pins[canonical(r.name)]
            assert r.specifier.contains(pin, prereleases=True), f"Python {python}: {r.name}=={pin} is outside {r}"


def test_torch_pin_is_the_cpu_release():
    assert lock_pins()["torch"] == "2.13.0"


def test_torch_pin_holds_on_every_supported_python():
    assert {lock_pins(python)["torch"] for python in supported_pythons()} == {"2.13.0"}


def install_recipe():
    makefile = (ROOT / "Makefile").read_text()
    return makefile.split("\n$(STAMP):", 1)[1].split("\n\n", 1)[0]


def test_install_takes_torch_from_the_cpu_index_and_says_what_it_does():
    makefile = (ROOT / "Makefile").read_text()
    recipe = install_recipe()
    assert "https://download.pytorch.org/whl/cpu" in makefile
    assert recipe.index("--index-url") < recipe.index("-e '.[dev]'"), "torch must come first, from the CPU index"
    assert not re.search(r"\s-q\b|--quiet", recipe), "the install must show pip's progress (no -q)"
    assert recipe.count("echo") >= 3, "the install should say what each step does"


def test_readme_says_what_the_first_run_downloads():
    start_here = (ROOT / "README.md").read_text().split("## Start here", 1)[1].split("\n## ", 1)[0]
    assert "CPU" in start_here and "MB" in start_here and "GB" in start_here


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
    # the unit tests are split by the network and under_load markers: every part runs, each in a timed stage
    assert '-m "not network and not under_load"' in recipe and "-m network" in recipe and "-m under_load" in recipe
    assert recipe.count("$(call stage,") >= 7


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


def _mhalib_imports():
    """``{top-level module of mhalib: {top-level modules of mhalib it imports}}``, from the code."""
    import ast

    found = {}
    for path in sorted((ROOT / "mhalib").rglob("*.py")):
        parts = path.relative_to(ROOT / "mhalib").with_suffix("").parts
        if parts == ("__init__",):
            continue  # the package's front door re-exports the core
        own = parts[0]
        deps = found.setdefault(own, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            deps.update(n.split(".")[1] for n in names if n.startswith("mhalib.") and n.split(".")[1] != own)
    return found


def test_contributing_layers_match_the_imports():
    """CONTRIBUTING.md's layer list names every module of mhalib once, and no module
    imports from its own layer or a later one."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    block = text.split("dependencies flow one way", 1)[1].split("- Where things go", 1)[0]
    layer_of = {}
    for number, names in re.findall(r"^\s+(\d+)\. (.+)$", block, re.M):
        for name in re.findall(r"`(\w+)`", names):
            assert name not in layer_of, f"{name} is listed twice"
            layer_of[name] = int(number)
    imports = _mhalib_imports()
    assert set(layer_of) == set(imports), (sorted(set(imports) - set(layer_of)), sorted(set(layer_of) - set(imports)))
    upward = [f"{module} (layer {layer_of[module]}) imports {dep} (layer {layer_of[dep]})"
              for module, deps in imports.items() for dep in deps if layer_of[dep] >= layer_of[module]]
    assert not upward, upward


def test_every_public_definition_in_mhalib_has_a_docstring():
    """Functions, classes and methods whose names do not start with an underscore."""
    import ast

    missing = []
    for path in sorted((ROOT / "mhalib").rglob("*.py")):
        def visit(node, prefix=""):
            for child in node.body:
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    if not child.name.startswith("_") and ast.get_docstring(child) is None:
                        missing.append(f"{path.relative_to(ROOT)}: {prefix}{child.name}")
                    if isinstance(child, ast.ClassDef):
                        visit(child, f"{child.name}.")

        visit(ast.parse(path.read_text(encoding="utf-8")))
    assert not missing, missing


def test_no_exercise_module_imports_another():
    """Exercise specs share helpers through mhalib/grade/exercises/_*.py, never through each other."""
    folder = ROOT / "mhalib" / "grade" / "exercises"
    for path in sorted(folder.glob("ex[0-9][0-9]_*.py")):
        imports = re.findall(r"^from mhalib\.grade\.exercises\.(\w+) import", path.read_text(encoding="utf-8"), re.M)
        assert all(name.startswith("_") for name in imports), (path.name, imports)


def test_a_kernel_that_dies_starting_is_started_again_and_nothing_else_is_retried():
    """conftest.py: nbval's kernel start is wrapped; a kernel that dies starting gets up to
    three starts, any other error none."""
    import nbval.kernel

    from conftest import retry_kernel_start

    assert hasattr(nbval.kernel.start_new_kernel, "__wrapped__")  # the wrapper is in place for nbval
    tries = []

    def flaky(fail_times, message):
        def start():
            tries.append(1)
            if len(tries) <= fail_times:
                raise RuntimeError(message)
            return "kernel"
        return start

    with pytest.warns(RuntimeWarning, match="died while starting"):
        assert retry_kernel_start(flaky(2, "Kernel died before replying to kernel_info"))() == "kernel"
    assert len(tries) == 3
    tries.clear()
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="Kernel died"):
        retry_kernel_start(flaky(3, "Kernel died before replying to kernel_info"))()
    tries.clear()
    with pytest.raises(RuntimeError, match="didn't respond"):  # not a death: no second start
        retry_kernel_start(flaky(1, "Kernel didn't respond in 60 seconds"))()
    assert len(tries) == 1
