"""Build the Gradescope autograder zip for one exercise (reproducible, byte for byte).

    python tools/build_autograder.py --exercise 01 [--out dist/autograder_01_single_head_attention.zip]
    make autograder EXERCISE=01

For Gradescope's Ubuntu images (22.04 or 24.04: Python 3.10 or 3.12): ``setup.sh`` installs
Python, bubblewrap, and CPU-only torch, NumPy, nbformat and IPython at the versions of
``requirements/lock.txt``, and makes the course readable by root only; ``run_autograder``
grades the uploaded notebook as this exercise (:mod:`mhalib.grade.gradescope`). ``README.md``
tells the instructor what the zip holds and how to upload and try it.

The zip holds only the modules of ``mhalib`` that the grader and this exercise's references
import (followed through every ``import`` statement, those inside functions too, from
``mhalib.grade.gradescope`` and the exercise's spec module), and only the data files those
modules name: no trained weights unless a reference loads them.
``tests/test_grader_gradescope.py`` grades each exercise's solution with nothing but the
zip's files and gets full marks.
"""

from __future__ import annotations

import argparse
import ast
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EPOCH = (2024, 1, 1, 0, 0, 0)
ENTRY = "mhalib.grade.gradescope"  # what run_autograder runs

SETUP_SH = r"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
src=/autograder/source
lock=$src/requirements/lock.txt
apt-get update -q
apt-get install -y -q --no-install-recommends python3 python3-venv python3-pip bubblewrap ca-certificates
python3 -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v <= (3, 13) else
  "the course needs Python 3.10 to 3.13; this image has %d.%d" % v)'
python3 -m venv /autograder/venv
pip="/autograder/venv/bin/python -m pip --disable-pip-version-check"
$pip install -q --upgrade pip
# torch, the CPU build from PyTorch's index (PyPI's Linux wheel is the CUDA build, gigabytes
# that grading never uses); from PyPI when that index does not answer.
torch=$(sed -n 's/^torch==\([^;]*\).*/\1/p' "$lock")
$pip install -q --no-deps --index-url https://download.pytorch.org/whl/cpu "torch==$torch" \
  || echo "PyTorch's CPU index did not answer: torch comes from PyPI"
$pip install -q -c "$lock" "torch==$torch" numpy nbformat ipython  # ipython: magics read as Jupyter reads them
/autograder/venv/bin/python -c 'import numpy, torch, nbformat, IPython'
# Only root (the grader) reads the course: student code never runs as root, and cannot import it.
chmod -R go-rwx "$src"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission. The grader runs student code in a sandbox
# (bubblewrap; else as user nobody in this one-submission container; else not at all).
cd /autograder/source
exec /autograder/venv/bin/python -m mhalib.grade.gradescope {exercise} \\
    /autograder/submission /autograder/results/results.json
"""

README = """\
# Gradescope autograder: exercise {number}, {title}

This zip grades exercise {number} (`{key}`) of the course "Multi-Head Attention, from
one head to GQA", and only that exercise: a notebook of another exercise uploaded to this
assignment is graded as exercise {number} (and scores 0). It was built from the course by
`make autograder EXERCISE={number}` (`tools/build_autograder.py`); the same course gives
the same zip, byte for byte.

## Upload it

1. In Gradescope, create a *Programming Assignment* worth {max_score:g} points.
2. *Configure Autograder*: choose *Zip file upload*, pick an Ubuntu 22.04 or 24.04 base
   image (Python 3.10 or 3.12; the course supports 3.10 to 3.13), and upload this zip.
   Gradescope then runs `setup.sh` once to build the image (a few minutes).
3. *Test Autograder*: upload the worked solution, `solutions/{key}.ipynb` of the course:
   it scores {max_score:g} / {max_score:g}. The blank exercise, `exercises/{key}.ipynb`, scores 0.

Students upload their notebook of the exercise (`exercises/{key}.ipynb`, done), under
any name. Of several notebooks, each one of this exercise is graded (at most 6) and the
best score is kept; the output names every notebook and its score.

## What it grades ({max_score:g} points)

| check | points |
| --- | --- |
{checks}

Each check calls the student's function on inputs drawn at grading time, compares with
the course's reference, and explains each lost point; a function right on some cases
earns that share of its points.

## What is inside

- `setup.sh`: installs Python, bubblewrap and CPU-only torch, NumPy, nbformat and IPython
  at the versions of `requirements/lock.txt` into `/autograder/venv`, then makes the
  course's files readable by root only.
- `run_autograder`: runs `python -m mhalib.grade.gradescope {key}` for each submission;
  it writes `/autograder/results/results.json`.
- `mhalib/`: the grader and exercise {number}'s references, {modules} modules, found by
  following their imports; {data}.
- `requirements/lock.txt` (the pinned versions) and `LICENSE`.

## Isolation

Gradescope runs each submission in a container of its own, as root. The grader runs the
student's code in a bubblewrap sandbox where the container allows it, else as the user
`nobody` (who cannot read the course's files); if neither works it writes no results, so
Gradescope shows the run as failed, and the log (`/autograder/results/stdout`) says why.
Every result names the isolation that graded it.

## Files

{files}
"""


# ----------------------------------------------------------------------------- what the zip needs
def module_file(name, root=ROOT):
    """The source file of module ``name`` (``"mhalib.grade.spec"``) under ``root``, or None."""
    path = root.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def imported(name, root=ROOT):
    """The ``mhalib`` modules that module ``name`` imports anywhere in its source (inside
    functions too): ``import a.b``, ``from a import b`` (``a.b`` when it is a module) and
    relative imports."""
    path = module_file(name, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] == "mhalib" and module_file(m, root)}


def needed_modules(entries, root=ROOT):
    """Every ``mhalib`` module reachable from ``entries`` by imports, with the packages that
    hold them, sorted."""
    seen, todo = set(), list(entries)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages above it
        todo += sorted(imported(name, root))
    return sorted(seen)


def needed_data(modules, root=ROOT):
    """The files of ``mhalib/data/`` that ``modules`` name in their source (a string that is a
    file's name, e.g. ``read_json("model_configs.json")``, or its stem, e.g. a model's name)."""
    data = root / "mhalib" / "data"
    files = {p.name: p for p in data.iterdir() if p.is_file() and p.suffix != ".py"}
    strings = set()
    for name in modules:
        tree = ast.parse(module_file(name, root).read_text(encoding="utf-8"))
        strings.update(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return sorted(p for n, p in files.items() if n in strings or p.stem in strings)


def exercise_module(ex):
    """The module that defines exercise ``ex``'s spec (``mhalib.grade.exercises.ex01_...``)."""
    from mhalib.grade import exercises as registry

    registry.all_exercises()  # imports every spec module
    for name, module in sorted(sys.modules.items()):
        if name.startswith(f"{registry.__name__}.") and getattr(module, "EXERCISE", None) is ex:
            return name
    raise SystemExit(f"no spec module defines exercise {ex.key}")


def package_files(ex, root=ROOT):
    """``[(name in the zip, path)]`` of the course files the zip carries for exercise ``ex``."""
    modules = needed_modules([ENTRY, exercise_module(ex)], root)
    files = [module_file(m, root) for m in modules] + needed_data(modules, root)
    files += [root / name for name in ("requirements/lock.txt", "LICENSE") if (root / name).exists()]
    return [(p.relative_to(root).as_posix(), p) for p in sorted(set(files))]


# ----------------------------------------------------------------------------- the zip
def readme(ex, names):
    modules = sum(n.startswith("mhalib/") and n.endswith(".py") for n in names)
    data = [n for n in names if n.startswith("mhalib/data/") and not n.endswith(".py")]
    return README.format(
        number=ex.number, key=ex.key, title=ex.title, max_score=ex.max_score, modules=modules,
        checks="\n".join(f"| `{g.name}` | {g.points:g} |" for g in ex.graded),
        data=("no data files and no trained weights (the references need none)" if not data else
              f"and the data files they read: {', '.join(f'`{n}`' for n in data)}"),
        files="\n".join(f"- `{n}`" for n in names))


def _add(zf, name, data, executable=False):
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    zf.writestr(info, data)


def build(out, exercise):
    """Write the zip for ``exercise`` (``"01"`` or its key) to ``out``; returns ``(key, names)``."""
    sys.path.insert(0, str(ROOT))
    from mhalib.grade import exercises as registry

    ex = registry.get(exercise)
    if ex is None:
        raise SystemExit(f"unknown exercise {exercise!r}; known: {', '.join(registry.all_exercises())}")
    files = package_files(ex)
    names = ["README.md", "setup.sh", "run_autograder"] + [name for name, _ in files]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w") as zf:
        _add(zf, "README.md", readme(ex, names))
        _add(zf, "setup.sh", SETUP_SH, executable=True)
        _add(zf, "run_autograder", RUN_AUTOGRADER.format(exercise=ex.key), executable=True)
        for name, path in files:
            _add(zf, name, path.read_bytes())
    return ex.key, names


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build the Gradescope autograder zip for one exercise.")
    parser.add_argument("--exercise", required=True, help="the assignment's exercise, e.g. 01")
    parser.add_argument("--out", help="where to write the zip (default dist/autograder_<exercise>.zip)")
    args = parser.parse_args(argv)
    out = Path(args.out or ROOT / "dist" / "autograder.zip")
    key, names = build(out, args.exercise)
    if not args.out:
        out = out.rename(out.with_name(f"autograder_{key}.zip"))
    print(f"wrote {out} ({len(names)} files), the autograder for exercise {key}; README.md inside says how to "
          f"upload and try it")
    print("Upload it in Gradescope: Assignment > Configure Autograder > Zip file upload.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
