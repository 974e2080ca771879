"""Build the Gradescope autograder zip for one exercise (reproducible, byte for byte).

    python tools/build_autograder.py --exercise 01 [--out dist/autograder_01_single_head_attention.zip]
    make autograder EXERCISE=01

For Gradescope's Ubuntu images (22.04 or 24.04: Python 3.10 or 3.12): ``setup.sh`` installs
Python, bubblewrap, and CPU-only torch, NumPy, nbformat and IPython at the versions of
``requirements/lock.txt``, and makes the course readable by root only; ``run_autograder``
grades the uploaded notebook as this exercise (:mod:`mhalib.grade.gradescope`).
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EPOCH = (2024, 1, 1, 0, 0, 0)

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


def package_files():
    files = [p for p in sorted((ROOT / "mhalib").rglob("*")) if p.is_file() and "__pycache__" not in p.parts
             and not any(part.startswith(".") for part in p.relative_to(ROOT).parts) and p.suffix != ".pyc"]
    return files + [ROOT / name for name in ("requirements/lock.txt", "LICENSE") if (ROOT / name).exists()]


def _add(zf, name, data, executable=False):
    info = zipfile.ZipInfo(name, date_time=EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    zf.writestr(info, data)


def build(out, exercise):
    """Write the zip for ``exercise`` (``"01"`` or its key) to ``out``; returns its names."""
    sys.path.insert(0, str(ROOT))
    from mhalib.grade import exercises as registry

    ex = registry.get(exercise)
    if ex is None:
        raise SystemExit(f"unknown exercise {exercise!r}; known: {', '.join(registry.all_exercises())}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = ["setup.sh", "run_autograder"]
    with zipfile.ZipFile(out, "w") as zf:
        _add(zf, "setup.sh", SETUP_SH, executable=True)
        _add(zf, "run_autograder", RUN_AUTOGRADER.format(exercise=ex.key), executable=True)
        for path in package_files():
            names.append(path.relative_to(ROOT).as_posix())
            _add(zf, names[-1], path.read_bytes())
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
    print(f"wrote {out} ({len(names)} files), the autograder for exercise {key}")
    print("Upload it in Gradescope: Assignment > Configure Autograder > Zip file upload.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
