"""Gradescope: ``python -m mhalib.grade.gradescope EXERCISE [SUBMISSION_DIR] [RESULTS_JSON]``.

Run by the autograder zip (``make autograder EXERCISE=NN``) for every submission, with
``/autograder/submission`` and ``/autograder/results/results.json`` by default. The
exercise is the zip's: a notebook's metadata or name never changes it. Of several
uploaded notebooks the one the student meant is graded, and the output says which and
why: the one named as the exercise's notebook, then one whose name starts with its
number, then one whose metadata names it; a copy (``-Copy1``, ``(1)``, ``copy``,
``Untitled``) last. With several notebooks of the exercise, each is graded (the likeliest
first, at most ``MAX_GRADED``) and the best score is kept: JupyterLab's ``-Copy1`` may be
the finished work beside an older draft. The output names every notebook and its score. Where no isolation can be had nothing runs and no results are written:
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


MAX_GRADED = 6  # notebooks of the exercise graded from one upload, the likeliest first


def rank(path, exercise):
    """``(rank, why)``: how likely ``path`` is the notebook the student meant (0 likeliest)."""
    copy = bool(COPY.search(path.stem))
    try:
        meta = (load_notebook(path).get("metadata") or {}).get("mhalib") or {}
    except Exception:  # noqa: BLE001 - an unreadable notebook ranks by its name only
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    return ((0, "it is named as the exercise's notebook") if path.name == f"{exercise.key}.ipynb" else
            (1, f"its name starts with the exercise's number, {exercise.number}")
            if path.name.startswith(exercise.number) and not copy else
            (2, "its metadata names this exercise") if meta.get("exercise") == exercise.key and not copy else
            (3, "it is the first that is not a copy") if not copy else (4, "only copies were uploaded"))


def choose(notebooks, exercise):
    """``(notebook, why)``: by name and metadata alone, the notebook the student meant."""
    (_, why), _, chosen = min((rank(p, exercise), i, p) for i, p in enumerate(notebooks))
    return chosen, why


def of_exercise(notebooks, exercise):
    """The uploaded notebooks that are this exercise's by name or metadata (all of them
    when none is): every one of them is graded, since any may be the finished work."""
    def named(path):
        try:
            meta = (load_notebook(path).get("metadata") or {}).get("mhalib") or {}
        except Exception:  # noqa: BLE001
            meta = {}
        return (path.name.startswith((exercise.number, exercise.key))
                or (isinstance(meta, dict) and meta.get("exercise") == exercise.key))
    return [p for p in notebooks if named(p)] or list(notebooks)


def grade_upload(folder, notebooks, exercise, isolation):
    """Grade every notebook of the exercise uploaded (at most :data:`MAX_GRADED`, the
    likeliest first) and keep the best score; the output names each and its score, so an
    older draft is never graded silently in place of the finished work."""
    pool = of_exercise(notebooks, exercise)
    ranked = sorted(((rank(p, exercise), i, p) for i, p in enumerate(pool)), key=lambda t: (t[0][0], t[1]))
    graded = []
    for _, _, path in ranked[:MAX_GRADED]:
        result = grade_notebook(path, exercise=exercise.key, isolation=isolation)
        result.path = str(path.relative_to(folder))
        graded.append(result)
    best = max(graded, key=lambda r: (r.graded, r.score))  # on a tie, the likeliest (max keeps the first)
    if len(notebooks) > 1:
        names = ", ".join(clean(p.relative_to(folder), 80) for p in notebooks[:10])
        scores = "; ".join(f"{clean(r.path, 80)}: " + (f"{r.score:g} / {r.max_score:g}" if r.graded else "not graded")
                           for r in graded)
        left = len(ranked) - len(graded)
        best.notes.insert(0, f"{len(notebooks)} notebooks were uploaded ({names}). Graded "
                             f"{len(graded)} of them as {exercise.key} ({scores})"
                             + (f", and not the {left} least likely" if left else "")
                             + f"; kept the best: {clean(best.path, 120)}. Upload only the notebook you want graded.")
    return best


def main(argv=None):
    """Grade a Gradescope upload as exercise ``argv[0]`` and write results.json.

    Returns the exit status: 0, 2 for a wrong usage, 3 when no isolation could be had.
    """
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
        result = grade_upload(folder, notebooks, exercise, isolation)
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
