"""Gradescope: ``python -m mhalib.grade.gradescope EXERCISE [SUBMISSION_DIR] [RESULTS_JSON]``.

Run by the autograder zip (``make autograder EXERCISE=NN``) for every submission, with
``/autograder/submission`` and ``/autograder/results/results.json`` by default. The
exercise is the zip's: a notebook's metadata or name never changes it. Of several
uploaded notebooks the one the student meant is graded, and the output says which and
why: the one named as the exercise's notebook, then one whose name starts with its
number, then one whose metadata names it; a copy (``-Copy1``, ``(1)``, ``copy``,
``Untitled``) last. Where no isolation can be had nothing runs and no results are written:
Gradescope shows the run as failed, and its log, which instructors see, says why.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from mhalib.grade import exercises as registry
from mhalib.grade.__main__ import write_file
from mhalib.grade.grader import CheckResult, SubmissionResult, clean, grade_notebook, load_notebook
from mhalib.grade.sandbox import decide

COPY = re.compile(r"(-copy\d*|\bcopy\b|\(\d+\)|^untitled)", re.IGNORECASE)


def candidates(folder):
    """The uploaded notebooks (checkpoints and hidden files left out), shallowest first."""
    return sorted((p for p in Path(folder).rglob("*.ipynb") if p.is_file() and not any(
        part.startswith(".") or part == "__MACOSX" for part in p.relative_to(folder).parts)),
        key=lambda p: (len(p.relative_to(folder).parts), p.name))


def choose(notebooks, exercise):
    """``(notebook, why)``: the notebook the student meant for ``exercise``."""
    def rank(path):
        copy = bool(COPY.search(path.stem))
        try:
            meta = (load_notebook(path).get("metadata") or {}).get("mhalib") or {}
        except Exception:  # noqa: BLE001 - an unreadable notebook ranks by its name only
            meta = {}
        return ((0, "it is named as the exercise's notebook") if path.name == f"{exercise.key}.ipynb" else
                (1, f"its name starts with the exercise's number, {exercise.number}")
                if path.name.startswith(exercise.number) and not copy else
                (2, "its metadata names this exercise") if meta.get("exercise") == exercise.key and not copy else
                (3, "it is the first that is not a copy") if not copy else (4, "only copies were uploaded"))
    (_, why), _, chosen = min((rank(p), i, p) for i, p in enumerate(notebooks))
    return chosen, why


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    exercise = registry.get(argv[0]) if argv else None
    if exercise is None:
        print("usage: python -m mhalib.grade.gradescope EXERCISE [SUBMISSION_DIR] [RESULTS_JSON]", file=sys.stderr)
        return 2
    folder, results = (Path(a) for a in (argv + ["/autograder/submission", "/autograder/results/results.json"])[1:3])
    isolation = decide(container=True)
    if not isolation.ok:
        print(f"NOT GRADED: the grader refuses to run student code without isolation: {isolation.problem}")
        return 3
    notebooks = candidates(folder)
    if notebooks:
        chosen, why = choose(notebooks, exercise)
        result = grade_notebook(chosen, exercise=exercise.key, isolation=isolation)
        result.path = str(chosen.relative_to(folder))
        if len(notebooks) > 1:
            names = ", ".join(clean(p.relative_to(folder), 80) for p in notebooks[:10])
            result.notes.insert(0, f"Graded {clean(result.path, 120)} of the {len(notebooks)} notebooks uploaded "
                                   f"({names}): {why}. Upload only the notebook you want graded.")
    else:
        result = SubmissionResult(path="(nothing)", exercise=exercise.key, isolation=isolation.describe(),
                                  notes=[f"No notebook (.ipynb) was uploaded: upload your {exercise.key}.ipynb."],
                                  checks=[CheckResult(g.name, 0.0, float(g.points), "no notebook was uploaded")
                                          for g in exercise.graded])
    write_file(results, json.dumps(result.gradescope(), indent=2) + "\n")
    print(result.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
