"""Gradescope: ``python -m mhalib.grade.gradescope EXERCISE [SUBMISSION_DIR] [RESULTS_JSON] [options]``.

Run by the autograder zip (``make autograder EXERCISE=NN``) for every submission, with
``/autograder/submission`` and ``/autograder/results/results.json`` by default. The
exercise is the zip's: a notebook's metadata or name never changes it. Of several
uploaded notebooks the one the student meant is graded, and the output says which and
why: the one named as the exercise's notebook, then one whose name starts with its
number, then one whose metadata names it; a copy (``-Copy1``, ``(1)``, ``copy``,
``Untitled``) last. With several notebooks of the exercise, each is graded (the likeliest
first, at most ``MAX_GRADED``) and the best score is kept: JupyterLab's ``-Copy1`` may be
the finished work beside an older draft. The output names every notebook and its score.
Every notebook of one upload is graded on the same inputs. With the instructor's secret
(``grading_secret`` at the zip's root, or ``--secret FILE``) they are fixed for the student of
the submission metadata; ``grading.json`` ``{"variants": true}`` (or ``--variants``) grades
their variant; ``--add-to ZIP`` puts both in a zip. Where no isolation can be had nothing runs and no results are written:
Gradescope shows the run as failed, and its log, which instructors see, says why.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
import zipfile
from pathlib import Path

from mhalib.grade import exercises as registry
from mhalib.grade.__main__ import read_secret, write_file
from mhalib.grade.grader import CheckResult, SubmissionResult, clean, grade_notebook, load_notebook
from mhalib.grade.sandbox import decide
from mhalib.grade.spec import Draws

METADATA = Path("/autograder/submission_metadata.json")
ZIP_ROOT = Path(__file__).resolve().parents[2]  # /autograder/source on Gradescope
SECRET_FILE, SETTINGS_FILE = "grading_secret", "grading.json"  # at the zip's root, beside run_autograder

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


def student_from_metadata(path=METADATA):
    """The student ID in a submission's metadata: a user's ``sid`` (the roster's Student ID), else
    ``id`` (the documented user ID); the smallest of a group's; ``""`` when none can be read."""
    try:
        users = json.loads(Path(path).read_text(encoding="utf-8")).get("users") or []
    except (OSError, ValueError, AttributeError):
        return ""
    ids = []
    for user in users if isinstance(users, list) else []:
        if isinstance(user, dict):
            for key in ("sid", "id"):
                if isinstance(user.get(key), (str, int)) and not isinstance(user.get(key), bool) \
                        and str(user[key]).strip():
                    ids.append(str(user[key]).strip())
                    break
    return min(ids) if ids else ""


def grade_upload(folder, notebooks, exercise, isolation, draws=None):
    """Grade every notebook of the exercise uploaded (at most :data:`MAX_GRADED`, the
    likeliest first) and keep the best score; the output names each and its score, so an
    older draft is never graded silently in place of the finished work. All are graded on one
    draw (``draws``, a :class:`mhalib.grade.spec.Draws`, may fix it for the student)."""
    pool = of_exercise(notebooks, exercise)
    ranked = sorted(((rank(p, exercise), i, p) for i, p in enumerate(pool)), key=lambda t: (t[0][0], t[1]))
    graded, seed = [], secrets.randbits(63)  # one draw for the whole upload
    for _, _, path in ranked[:MAX_GRADED]:
        result = grade_notebook(path, seed=seed, exercise=exercise.key, isolation=isolation, student=draws or Draws())
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
                             + f"; kept the best: {clean(best.path, 120)}, all on the same inputs. Upload only the "
                             "notebook you want graded.")
    return best


def add_to_zip(zip_path, secret_path=None, variants=False):
    """Put the instructor's secret (as ``grading_secret``) and the variants setting (``grading.json``)
    at the root of an autograder zip; ``ValueError`` says what is wrong."""
    secret = read_secret(secret_path) if secret_path else None
    with zipfile.ZipFile(zip_path, "a") as zf:
        have = set(zf.namelist())
        for name in (SECRET_FILE if secret else None, SETTINGS_FILE):
            if name in have:
                raise ValueError(f"{zip_path} already holds {name}: build it again (make autograder) and add to that")
        if secret:
            info = zipfile.ZipInfo(SECRET_FILE, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o600 << 16
            zf.writestr(info, secret + b"\n")
        info = zipfile.ZipInfo(SETTINGS_FILE, date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        zf.writestr(info, json.dumps({"variants": bool(variants)}) + "\n")


def _settings(root=ZIP_ROOT):
    """``(secret or None, variants)`` from the zip's root (files absent: no secret, no variants)."""
    secret = read_secret(root / SECRET_FILE) if (root / SECRET_FILE).is_file() else None
    try:
        variants = bool(json.loads((root / SETTINGS_FILE).read_text(encoding="utf-8")).get("variants"))
    except (OSError, ValueError, AttributeError):
        variants = False
    return secret, variants


USAGE = ("usage: python -m mhalib.grade.gradescope EXERCISE [SUBMISSION_DIR] [RESULTS_JSON] [--secret FILE] "
         "[--variants] [--metadata FILE]\n       python -m mhalib.grade.gradescope --add-to ZIP [--secret FILE] "
         "[--variants]")


def _options(argv):
    """``(positional, {option: value})`` of ``argv``; ``ValueError`` for an unknown option."""
    positional, options, args = [], {}, list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("--secret", "--metadata", "--add-to"):
            if not args:
                raise ValueError(f"{arg} needs a file")
            options[arg] = args.pop(0)
        elif arg == "--variants":
            options[arg] = True
        elif arg.startswith("--"):
            raise ValueError(f"unknown option {arg}")
        else:
            positional.append(arg)
    return positional, options


def main(argv=None):
    """Grade a Gradescope upload as exercise ``argv[0]`` and write results.json (or, with
    ``--add-to ZIP``, put the secret and the variants setting in an autograder zip).

    Returns the exit status: 0, 2 for a wrong usage, 3 when no isolation could be had.
    """
    argv = sys.argv[1:] if argv is None else argv
    try:
        argv, options = _options(argv)
        if "--add-to" in options:
            add_to_zip(options["--add-to"], options.get("--secret"), options.get("--variants", False))
            print(f"{options['--add-to']}: " + ("the secret and " if options.get("--secret") else "")
                  + f"variants {'on' if options.get('--variants') else 'off'} added")
            return 0
        secret, variants = _settings()
        secret = read_secret(options["--secret"]) if "--secret" in options else secret
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        print(f"{exc}\n{USAGE}", file=sys.stderr)
        return 2
    variants = variants or bool(options.get("--variants"))
    exercise = registry.get(argv[0]) if argv else None
    if exercise is None:
        print(USAGE, file=sys.stderr)
        return 2
    folder, results = (Path(a) for a in (argv + ["/autograder/submission", "/autograder/results/results.json"])[1:3])
    draws = Draws(student_from_metadata(options.get("--metadata", METADATA)), "gradescope", secret, variants)
    isolation = decide(container=True)
    if not isolation.ok:
        print(f"NOT GRADED: the grader refuses to run student code without isolation: {isolation.problem}")
        return 3
    notebooks = candidates(folder)
    if notebooks:
        result = grade_upload(folder, notebooks, exercise, isolation, draws)
    else:
        result = SubmissionResult(path="(nothing)", exercise=exercise.key, isolation=isolation.describe(),
                                  notes=[f"No notebook (.ipynb) was uploaded: upload your {exercise.key}.ipynb."],
                                  checks=[CheckResult(g.name, 0.0, float(g.points), "no notebook was uploaded")
                                          for g in exercise.graded])
    data = result.gradescope()
    if secret and draws.student_id:  # the seed of fixed draws stays with the instructor (it gives the inputs)
        data["extra_data"].pop("seed", None)
    write_file(results, json.dumps(data, indent=2) + "\n")
    print(result.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
