"""The course as learners get it: a zip without the worked solutions.

    python tools/student_release.py                  # dist/mha-course-student.zip
    python tools/student_release.py --out FILE.zip

It holds the files git tracks in this checkout, except ``solutions/`` (the worked
answers), ``tests/`` and ``tools/`` (they need the solutions), with ``exercises/``
generated afresh from the solutions, so a learner's edits in this checkout never leak
into it. Inside, ``make lab`` opens the course and ``make grade NB=...`` grades a
learner's own notebook. The zip is reproducible: the same checkout gives the same bytes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mhalib.grade import release  # noqa: E402

TOP = "mha-course"  # the folder the zip unpacks to
LEFT_OUT = ("solutions/", "tests/", "tools/", "exercises/", ".ci/", ".github/")
EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed time stamps: the same bytes every time


def tracked_files(root):
    """The files git tracks under ``root`` and that exist (a clear error outside a checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(f"student release: git is needed to list the course's files ({exc})") from None
    if out.returncode != 0:
        raise SystemExit(f"student release: {root} is not a git checkout of the course; run it in one "
                         f"({out.stderr.decode(errors='replace').strip()[:200]})")
    names = sorted(n for n in out.stdout.decode().split("\0") if n)
    return [n for n in names if (root / n).is_file() and not (root / n).is_symlink()]


def build(root, out):
    """Write the zip; returns the list of its members (without the top folder)."""
    members = {}
    for name in tracked_files(root):
        if not name.startswith(LEFT_OUT):
            members[name] = (root / name).read_bytes()
    solutions = sorted((root / "solutions").glob("*.ipynb"))
    if not solutions:
        raise SystemExit(f"student release: no solutions/*.ipynb under {root}: the exercises are made from them")
    for solution in solutions:
        members[f"exercises/{solution.name}"] = release.render(solution).encode("utf-8")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members):
            info = zipfile.ZipInfo(f"{TOP}/{name}", date_time=EPOCH)
            mode = 0o755 if (root / name).is_file() and (root / name).stat().st_mode & 0o111 else 0o644
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, members[name])
    tmp.replace(out)
    return sorted(members)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build the learners' copy of the course (no solutions).")
    parser.add_argument("--out", default=str(ROOT / "dist" / "mha-course-student.zip"),
                        help="the zip to write (default: dist/mha-course-student.zip)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.suffix != ".zip":
        parser.error(f"--out must name a .zip file; got {args.out}")
    members = build(ROOT, out)
    exercises = sum(m.startswith("exercises/") for m in members)
    print(f"wrote {out}: {len(members)} files, {exercises} exercises, no solutions "
          f"(unpacks to {TOP}/; learners run make lab, and make grade NB=exercises/NN_topic.ipynb)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
