"""The course as learners get it: a zip without the worked solutions.

    python tools/student_release.py                  # dist/mha-course-student.zip
    python tools/student_release.py --out FILE.zip

It holds the files git tracks in this checkout, except the worked answers (``solutions/``),
what needs them or is for the course's maintainers and instructors (``tests/``, ``tools/``,
``CONTRIBUTING.md``, ``docs/instructors.md``, CI), with ``exercises/`` generated afresh from
the solutions, so a learner's edits in this checkout never leak into it. Two files are the
learners' own:

* ``README.md``, from ``tools/student_README.md`` with the course map of the course's
  README: how to set up, do, check and grade an exercise, and hand it in;
* ``Makefile``, the course's without the targets that need what the copy leaves out
  (:data:`LEFT_OUT_TARGETS`): typed anyway, each says so and what to run instead.

Inside, ``make lab`` opens the course and ``make grade NB=...`` grades a learner's own
notebook. The zip is reproducible: the same checkout gives the same bytes.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mhalib.grade import release  # noqa: E402

TOP = "mha-course"  # the folder the zip unpacks to
LEFT_OUT = ("solutions/", "tests/", "tools/", "exercises/", ".ci/", ".github/", "CONTRIBUTING.md",
            "docs/instructors.md")
EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed time stamps: the same bytes every time
README_TEMPLATE = ROOT / "tools" / "student_README.md"
COURSE_MAP = "<!-- course map -->"  # where the course map of the course's README goes

#: The Makefile's targets the learners' copy has no use for, or cannot run: the tests, the
#: notebooks' re-execution and the exercises' generation need solutions/, tests/ or tools/;
#: the rest are for the course's maintainers and instructors.
LEFT_OUT_TARGETS = ("test", "unit", "notebooks", "exercises", "student-release", "nbgrader", "autograder", "lock")

MAKEFILE_HEADER = """\
# The course, for learners:
#   make lab     set up .venv with the tested versions and open the course in JupyterLab
#   make grade NB=exercises/01_single_head_attention.ipynb   grade your exercise
#   make help    every command of this folder
#
# Everything runs from a local virtual environment; nothing is installed system-wide."""

LEFT_OUT_RULE = f"""\
# The course's own tests and tools, which this copy leaves out: each says what to run instead.
{" ".join(LEFT_OUT_TARGETS)}:
\t@echo "make $@ is not in the learners' copy of the course: it needs the course's tests, tools or" >&2
\t@echo "worked solutions. To check an exercise, grade it (with your exercise's file):" >&2
\t@echo "  make grade NB=exercises/01_single_head_attention.ipynb" >&2
\t@echo "make help lists the commands of this folder." >&2
\t@exit 2
"""


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


# ----------------------------------------------------------------------------- the learners' README
def student_readme(course_readme, template):
    """The learners' README: ``template`` with the course map section of ``course_readme``."""
    found = re.search(r"^## Course map\n.*?(?=^## )", course_readme, re.S | re.M)
    if not found:
        raise SystemExit("student release: README.md has no '## Course map' section to copy into the learners' README")
    if COURSE_MAP not in template:
        raise SystemExit(f"student release: {README_TEMPLATE.name} has no {COURSE_MAP} line for the course map")
    return template.replace(COURSE_MAP, found.group(0).rstrip("\n"))


# ----------------------------------------------------------------------------- the learners' Makefile
_RULE = re.compile(r"^([^\s#=:][^=:]*?)\s*::?(?!=)")  # "lab: $(STAMP)", "$(STAMP): ...", not "X := 1"
_DEFINES = re.compile(r"^(?:define\s+(\w+)|(\w+)\s*(?:::?=|\?=|\+=|=))", re.M)
_REFERS = re.compile(r"\$[({](?:call\s+)?(\w+)|\$\$\{?(\w+)")


def _paragraphs(text):
    """The Makefile's paragraphs (separated by blank lines; a define ... endef is never split)."""
    def open_defines(paragraph):
        lines = paragraph.splitlines()
        return sum(line.startswith("define ") for line in lines) - sum(line.startswith("endef") for line in lines)

    out = []
    for chunk in text.rstrip("\n").split("\n\n"):
        if out and open_defines(out[-1]) > 0:
            out[-1] += "\n\n" + chunk
        else:
            out.append(chunk)
    return out


def _targets(paragraph):
    names, in_define = [], False
    for line in paragraph.splitlines():
        if line.startswith("define "):
            in_define = True
        elif line.startswith("endef"):
            in_define = False
        elif not in_define and not line.startswith("\t"):
            rule = _RULE.match(line)
            if rule:
                names += rule.group(1).split()
    return names


def student_makefile(text):
    """The learners' Makefile made from the course's ``text``: without the rules of
    :data:`LEFT_OUT_TARGETS` (one rule that explains instead), without the variables and
    programs only they used, with a ``help`` that lists what is left and a header of its own."""
    kept, help_at = [], None
    paragraphs = _paragraphs(text)
    for i, paragraph in enumerate(paragraphs):
        targets = _targets(paragraph)
        if i == 0 and not targets and all(line.startswith("#") for line in paragraph.splitlines()):
            kept.append(MAKEFILE_HEADER)
        elif "help" in targets:
            lines = [line for line in paragraph.splitlines() if not any(
                re.search(rf'echo "make {re.escape(t)}\b', line) for t in LEFT_OUT_TARGETS)]
            lines.append('\t@echo "make clean      remove .venv (make lab sets it up again)"')
            help_at = len(kept)
            kept.append("\n".join(lines))
        elif not set(targets) & set(LEFT_OUT_TARGETS):
            kept.append(paragraph)
    if help_at is None:
        raise SystemExit("student release: the Makefile has no help target")
    kept.append(LEFT_OUT_RULE.rstrip("\n"))
    # drop what nothing left refers to: variables and programs only the left-out rules used
    while True:
        unused = []
        for i, paragraph in enumerate(kept):
            defined = {a or b for a, b in _DEFINES.findall(paragraph)}
            if not defined or _targets(paragraph):
                continue
            rest = "\n".join(p for j, p in enumerate(kept) if j != i)
            if not any(name in {a or b for a, b in _REFERS.findall(rest)} for name in defined):
                unused.append(i)
        if not unused:
            break
        kept = [p for i, p in enumerate(kept) if i not in unused]
    return "\n\n".join(kept) + "\n"


# ----------------------------------------------------------------------------- the zip
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
    members["README.md"] = student_readme((root / "README.md").read_text(encoding="utf-8"),
                                          README_TEMPLATE.read_text(encoding="utf-8")).encode("utf-8")
    members["Makefile"] = student_makefile((root / "Makefile").read_text(encoding="utf-8")).encode("utf-8")
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
          f"(unpacks to {TOP}/; its README.md is the learners': make lab, then make grade NB=exercises/NN_topic.ipynb)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
