"""Build a Gradescope autograder zip from the course.

Usage::

    python tools/build_autograder.py [--exercise 01] [--out dist/autograder.zip]

The zip holds what Gradescope runs on its Ubuntu image:

* ``setup.sh``: installs Python, the pinned NumPy and CPU-only torch, and the course
  package ``mhalib`` (copied into the zip);
* ``run_autograder``: grades the notebook in ``/autograder/submission`` with
  ``python -m mhalib.grade`` and writes ``/autograder/results/results.json``;
* ``grade_submission.py``: picks the notebook to grade (with ``--exercise``, the one
  for that exercise) and always writes a results file, also when none was submitted.

Without ``--exercise`` one zip serves every exercise: the grader recognises each
notebook by its metadata, then its file name. The zip is byte-for-byte reproducible.
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EPOCH = (2024, 1, 1, 0, 0, 0)

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when the autograder image is built.
set -euo pipefail
apt-get update
apt-get install -y --no-install-recommends python3 python3-pip python3-venv
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --upgrade pip
# CPU-only torch: the GPU build would download gigabytes that grading never uses.
/autograder/venv/bin/pip install --extra-index-url https://download.pytorch.org/whl/cpu \\
    -c /autograder/source/requirements/lock.txt /autograder/source
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission. Student code runs in a child process of
# the grader (as user nobody, with memory, CPU and time limits); the grader writes the
# results file itself, after the student's process has ended.
cd /autograder/source
exec /autograder/venv/bin/python grade_submission.py \\
    /autograder/submission /autograder/results/results.json {exercise_arg}
"""

GRADE_SUBMISSION = '''"""Grade the submitted notebook for Gradescope; always write results.json."""

import json
import sys
from pathlib import Path


def main(argv):
    submission_dir, results = Path(argv[1]), Path(argv[2])
    exercise = argv[3] if len(argv) > 3 else None
    results.parent.mkdir(parents=True, exist_ok=True)
    notebooks = sorted(p for p in submission_dir.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not notebooks:
        results.write_text(json.dumps({"score": 0, "output": "No notebook (.ipynb) was submitted.", "tests": []}))
        return 0
    from mhalib.grade import exercises as registry
    from mhalib.grade.grader import grade_notebook, load_notebook

    chosen = notebooks[0]
    if exercise is not None or len(notebooks) > 1:
        for path in notebooks:
            try:
                meta = load_notebook(path).get("metadata")
            except Exception:
                meta = None
            ex, _ = registry.recognise(meta, path)
            if ex is not None and (exercise is None or registry.get(exercise) is ex):
                chosen = path
                break
    result = grade_notebook(chosen, exercise=exercise)
    data = result.gradescope()
    if len(notebooks) > 1:
        data["output"] = f"Graded {chosen.name} (of {len(notebooks)} notebooks submitted).\\n" + data["output"]
    results.write_text(json.dumps(data, indent=2))
    print(result.text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
'''


def _package_files():
    files = []
    for path in sorted((ROOT / "mhalib").rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts or path.suffix in (".pyc",):
            continue
        if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
            continue
        files.append(path)
    for extra in ("pyproject.toml", "requirements/lock.txt", "README.md", "LICENSE"):
        if (ROOT / extra).exists():
            files.append(ROOT / extra)
    return files


def _add(zf, name, data, executable=False):
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    zf.writestr(info, data)


def build(out, exercise=None):
    """Write the zip to ``out``; returns the list of names in it."""
    if exercise is not None:
        sys.path.insert(0, str(ROOT))
        from mhalib.grade import exercises as registry

        ex = registry.get(exercise)
        if ex is None:
            known = ", ".join(registry.all_exercises())
            raise SystemExit(f"unknown exercise {exercise!r}; known: {known}")
        exercise = ex.key
    if exercise is not None and not re.fullmatch(r"[0-9A-Za-z_]+", exercise):
        raise SystemExit(f"bad exercise name {exercise!r}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = []
    with zipfile.ZipFile(out, "w") as zf:
        _add(zf, "setup.sh", SETUP_SH, executable=True)
        _add(zf, "run_autograder", RUN_AUTOGRADER.format(exercise_arg=exercise or "").rstrip() + "\n",
             executable=True)
        _add(zf, "grade_submission.py", GRADE_SUBMISSION)
        names += ["setup.sh", "run_autograder", "grade_submission.py"]
        for path in _package_files():
            name = path.relative_to(ROOT).as_posix()
            _add(zf, name, path.read_bytes())
            names.append(name)
    return names


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build a Gradescope autograder zip from the course.")
    parser.add_argument("--exercise", help="grade only this exercise (e.g. 01); default: recognise each notebook")
    parser.add_argument("--out", default=str(ROOT / "dist" / "autograder.zip"), help="where to write the zip")
    args = parser.parse_args(argv)
    names = build(args.out, args.exercise)
    print(f"wrote {args.out} ({len(names)} files)" + (f" for exercise {args.exercise}" if args.exercise else ""))
    print("Upload it in Gradescope: Assignment > Configure Autograder > Zip file upload.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
