"""Command line: ``python -m mhalib.grade SUBMISSION.ipynb [more ...] [options]``.

Prints one line per graded check and the total for each submission, then, for several,
the mean score (a file that is none of the course's exercises is listed apart, left out).
``--results`` writes Gradescope's results.json (for several submissions:
``{"submissions": [...], "not_graded": [...], "mean_score": ...}``). ``--csv`` keeps one row
per submission: a rerun replaces the rows of the submissions it grades and keeps the
others. Both are written again as each submission finishes, so a run that is stopped
(killed, out of memory) keeps every result it had. Each row names its student, from
``--roster`` or from the file names Canvas and Moodle give downloaded submissions;
``--gradebook canvas|moodle FILE`` writes the grades as that LMS imports them. The
isolation is decided once, before the first submission, and printed with every result.

Exit status (``EXIT_STATUS``): 0 every submission was graded; 1 some submission needs a
look (not graded, not readable as a notebook, or without a student ID that --roster or
--gradebook needs); 2 a usage error, a Python without the course's packages, or results
not written; 3 no sandbox, nothing graded.
"""

from __future__ import annotations

import argparse
import csv
import errno
import fnmatch
import io
import json
import os
import queue
import re
import shlex
import stat
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from mhalib.grade.grader import clean, grade_notebook
from mhalib.grade.sandbox import Limits, decide
from mhalib.grade.spec import Draws

EXIT_STATUS = """exit status:
  0  every submission was graded (whatever the scores)
  1  some submission needs a look: not graded (missing, a link or special file, not one of
     the course's exercises, an internal error), not readable as a notebook (it scores 0),
     or without a student ID while --roster or --gradebook asks for one
  2  a usage error (an option, a --csv or --roster file that cannot be used, a Python
     without the course's packages) or results that could not be written
  3  no sandbox could be had: nothing was graded"""

CSV_HEADER = ["submission", "exercise", "score", "max_score", "student_id", "student_name", "feedback", "checks",
              "seed", "seconds", "isolation", "graded_at", "variant", "inputs"]
# What the grader needs beyond the standard library; a Python without them is not the course's.
NEEDED = ("numpy", "nbformat", "torch")
COURSE = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- the Python
def missing_packages():
    """The packages of ``NEEDED`` this Python cannot import (found without importing them)."""
    return [name for name in NEEDED if find_spec(name) is None]


def wrong_python(missing, argv, cwd=None):
    """The message for a Python that lacks ``missing``: the one command that grades, as typed
    from ``cwd`` (the folder the learner is in) for the notebooks named in ``argv``."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    notebooks = [a for a in argv if a.endswith(".ipynb")] or ["your_notebook.ipynb"]
    try:
        course = os.path.relpath(COURSE, cwd)
    except ValueError:  # another drive
        course = str(COURSE)
    make = "make grade" if course == "." else f"make -C {shlex.quote(course)} grade"
    venv = os.path.join(course, ".venv", "bin", "python") if course != "." else ".venv/bin/python"
    names = " and ".join([", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing)
    return (f"python -m mhalib.grade: this Python ({sys.executable}) has no {names}, which the "
            "grader needs: the course's packages live in its own environment, .venv.\n"
            "Grade a notebook with the course's one command (it sets up .venv first, and reads NB from the "
            "folder you are in):\n"
            + "".join(f"    {make} NB={shlex.quote(nb)}\n" for nb in notebooks)
            + f"A class (instructors): {shlex.quote(venv)} -m mhalib.grade SUBMISSIONS... (see docs/instructors.md)")


# ----------------------------------------------------------------------------- files
def write_file(path, text):
    """Write ``text`` to ``path`` through a private temporary file in the same folder
    (random name, created exclusively, links not followed), renamed over ``path``: a link,
    a FIFO or a planted temporary file there can neither redirect nor block it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            os.fchmod(f.fileno(), 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def read_existing(path):
    """The text of the file at ``path`` as it was before grading: a regular file only. A
    missing file, a link or a FIFO reads as empty (it is replaced, never followed); a regular
    file that cannot be read raises ``OSError``, so that rewriting it never loses its rows."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP) or os.path.islink(path):
            return ""
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return f.read(64 << 20).decode("utf-8-sig", "replace")


# ----------------------------------------------------------------------------- reports
def _why_not_graded(result):
    return "; ".join(result.notes) or "not one of the course's exercises"


def mean_score(results):
    """The mean score of the graded submissions (``None`` when none was graded)."""
    graded = [r for r in results if r.graded]
    return round(sum(r.score for r in graded) / len(graded), 2) if graded else None


def results_json(results, single=None):
    """The results JSON: Gradescope's format for one submission (``single``: the run grades
    one; by default, when ``results`` holds one).

    For several: the graded submissions, those not graded (with the reason) and the mean score.
    """
    if (len(results) == 1) if single is None else single and len(results) == 1:
        return results[0].gradescope()
    return {"submissions": [dict(r.gradescope(), submission=r.path) for r in results if r.graded],
            "not_graded": [{"submission": r.path, "reason": _why_not_graded(r)} for r in results if not r.graded],
            "mean_score": mean_score(results)}


_SUMMARY = re.compile(r"(all \d+|\d+ of \d+) cases? correct")


def feedback(result, limit=1000):
    """One line for the learner: why each point was lost (a syntax error, then each check
    below its points with its first reason), ``"all checks passed"``, or why nothing was graded."""
    if not result.graded:
        return clean(f"not graded: {_why_not_graded(result)}", limit)
    if result.unreadable:
        return clean(f"not a readable notebook: {result.unreadable}", limit)
    parts = [f"syntax error in {e}" for e in result.syntax_errors]
    for c in result.checks:
        if c.status == "passed":
            continue
        lines = [line.strip() for line in c.output.splitlines() if line.strip()]
        reasons = [line for line in lines if not _SUMMARY.fullmatch(line)]
        counted = [line for line in lines if _SUMMARY.fullmatch(line)]
        parts.append(f"{c.name} {c.score:g}/{c.max_score:g}: " + "; ".join(counted[:1] + reasons[:1]))
    return clean(" | ".join(parts), limit) if parts else "all checks passed"


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """``value`` as a CSV cell a spreadsheet never reads as a formula: text starting with
    ``= + - @``, a tab or a carriage return gets a leading apostrophe (numbers stay numbers)."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def _csv(header, rows):
    buf = io.StringIO()
    writer = csv.writer(buf)
    for row in [header, *rows]:
        writer.writerow([csv_cell(v) for v in row])
    return buf.getvalue()


def read_table(text, what="--csv"):
    """``(header, rows as dicts)`` of a grades CSV this command wrote (any older version:
    columns are read by name); ``ValueError`` when it lacks the ``submission`` and ``score`` columns."""
    lines = list(csv.reader(io.StringIO(text)))
    lines = [line for line in lines if any(cell.strip() for cell in line)]
    if not lines:
        return list(CSV_HEADER), []
    header = [h.strip() for h in lines[0]]
    if "submission" not in header or "score" not in header:
        raise ValueError(f"{what}: the file is there but is not a grades table of this grader (its first line "
                         f"has no 'submission' and 'score' columns: {clean(','.join(header), 120)}); name a new "
                         "file, or move that one away")
    return header, [dict(zip(header, line)) for line in lines[1:]]


@dataclass
class Student:
    """Whose a submission is: ``id`` ("" when unknown), ``name``, ``source`` (roster, canvas,
    moodle) or ``problem`` (why no ID could be given)."""
    id: str = ""
    name: str = ""
    source: str = ""
    problem: str = ""


# Canvas, "Download Submissions": NAME_[LATE_]USERID_ATTACHMENTID_FILENAME, NAME being the
# student's sortable name lower-cased without punctuation and USERID the Canvas user ID.
CANVAS_NAME = re.compile(r"(?P<name>\w+?)_(?:late_|LATE_)?(?P<id>\d+)_\d+_.+")
# Moodle, "Download all submissions": a folder (or, in the flat layout, a file name prefix)
# FULL NAME_PARTICIPANTID_assignsubmission_file, the ID the assignment's grading worksheet names.
MOODLE_NAME = re.compile(r"(?P<name>[^_]+)_(?P<id>\d+)_assignsubmission_file(?:_.*)?")


def read_secret(path):
    """The bytes of the instructor's secret file (surrounding white space left out); ``ValueError``
    when it cannot be read or holds fewer than 16 bytes (too easy to guess)."""
    try:
        with open(path, "rb") as f:
            secret = f.read(1 << 16).strip()
    except OSError as exc:
        raise ValueError(f"--secret {path}: it cannot be read ({exc.strerror or exc})") from None
    if len(secret) < 16:
        raise ValueError(f"--secret {path}: it holds {len(secret)} bytes; a secret needs at least 16 (e.g. "
                         "python3 -c 'import secrets; print(secrets.token_hex(32))' > grading_secret)")
    return secret


def load_roster(path):
    """The roster file: ``[(pattern, student_id, name)]``. A CSV with a header naming the
    columns ``submission`` (a file name; ``*`` and ``?`` match any text) and ``student_id``,
    optionally ``name``; ``ValueError`` names what is wrong."""
    try:
        text = read_existing(path)
    except OSError as exc:
        raise ValueError(f"--roster {path}: it cannot be read ({exc.strerror or exc})") from None
    if not Path(path).is_file() or not text.strip():
        raise ValueError(f"--roster {path}: no such file, or it is empty; it should be a CSV with the columns "
                         "submission,student_id (and optionally name)")
    lines = [line for line in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in line)]
    header = [h.strip().lower() for h in lines[0]]
    if "submission" not in header or "student_id" not in header:
        raise ValueError(f"--roster {path}: its first line names the columns {clean(','.join(lines[0]), 120)}; it "
                         "needs submission and student_id (and may have name), e.g.\n"
                         "submission,student_id,name\nada.ipynb,s1001,Ada Lovelace")
    roster = []
    for number, line in enumerate(lines[1:], start=2):
        row = {h: (line[i].strip() if i < len(line) else "") for i, h in enumerate(header)}
        if not row["submission"] or not row["student_id"]:
            raise ValueError(f"--roster {path}, line {number}: a row needs both a submission and a student_id; got "
                             f"{clean(','.join(line), 120)}")
        roster.append((row["submission"], row["student_id"], row.get("name", "")))
    return roster


def student_of(path, roster=()):
    """The :class:`Student` of the submission ``path`` (as named on the command line): the
    roster's rows whose ``submission`` matches its file name or its path, else the name
    Canvas or Moodle gave the file (or, for Moodle, its folder) when it downloaded it."""
    name, given = os.path.basename(path), str(path)
    rows = [(sid, full) for pattern, sid, full in roster
            if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(given, pattern)]
    ids = sorted({sid for sid, _ in rows})
    if len(ids) == 1:
        return Student(ids[0], next(full for sid, full in rows if full) if any(f for _, f in rows) else "", "roster")
    if len(ids) > 1:
        return Student(problem=f"the roster gives it {len(ids)} students ({', '.join(ids[:4])})")
    found = CANVAS_NAME.fullmatch(name)
    if found:
        return Student(found["id"], found["name"], "canvas")
    for part in (name, os.path.basename(os.path.dirname(os.path.abspath(given)))):
        found = MOODLE_NAME.fullmatch(part)
        if found:
            return Student(found["id"], found["name"], "moodle")
    return Student(problem="not in the roster, and not named as Canvas or Moodle name downloaded submissions"
                   if roster else "not named as Canvas or Moodle name downloaded submissions")


def csv_text(results, before="", students=None, graded_at=""):
    """The grades table: the rows of ``before`` (a CSV this command wrote), each submission of
    ``results`` replacing its own row (matched by the ``submission`` column) or added at the
    end. Columns of ``before`` this command does not write are kept, also in a replaced row."""
    header, old = read_table(before)
    header = CSV_HEADER + [h for h in header if h and h not in CSV_HEADER]
    rows = {}
    for row in old:  # a file written by older versions, appended twice, keeps one row per submission
        rows[row.get("submission", "")] = row
    for r in results:  # a file not graded has no score, so that a spreadsheet's mean leaves it out
        who = (students or {}).get(r.path) or Student()
        checks = "; ".join(f"{c.name}={c.score:g}/{c.max_score:g}" for c in r.checks)
        scores = [r.exercise, f"{r.score:g}", f"{r.max_score:g}"] if r.graded else ["", "", ""]
        values = [r.path, *scores, who.id, who.name, feedback(r),
                  checks if r.graded else f"not graded: {_why_not_graded(r)}", r.seed, f"{r.seconds:.2f}",
                  r.isolation, graded_at, r.variant, r.draws]
        key = csv_cell(r.path)  # as the file holds it
        rows[key] = {**rows.get(key, {}), **dict(zip(CSV_HEADER, values))}
    return _csv(header, [[row.get(h, "") for h in header] for row in rows.values()])


# ----------------------------------------------------------------------------- gradebooks
GRADEBOOKS = ("canvas", "moodle")


def gradebook_text(lms, entries, assignment, graded_at):
    """The grades as ``lms`` imports them; ``entries``: ``[(result, student)]``, one per student.

    canvas: Canvas's gradebook import (Grades, Import): the columns of its own export,
    ``Student, ID, SIS User ID, SIS Login ID, Section`` (ID: the Canvas user ID), then one
    column named ``assignment`` ("Title (id)" as in Canvas's export, or a title). Canvas does
    not import comments: the feedback stays in the --csv file.
    moodle: an assignment's offline grading worksheet (Assignment, View all submissions,
    Upload grading worksheet): ``Identifier`` ("Participant N"), ``Grade``, ``Last modified
    (grade)`` and ``Feedback comments``, the column names of an English Moodle.
    """
    if lms == "canvas":
        header = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", assignment]
        rows = [[who.name, who.id, "", "", "", f"{r.score:g}"] for r, who in entries]
    else:
        header = ["Identifier", "Full name", "Grade", "Maximum Grade", "Last modified (grade)", "Feedback comments"]
        rows = [[who.id if who.id.startswith("Participant ") else f"Participant {who.id}", who.name,
                 f"{r.score:g}", f"{r.max_score:g}", graded_at, feedback(r)] for r, who in entries]
    return _csv(header, rows)


def gradebook_entries(results, students):
    """``(entries, left_out, repeated)``: one ``(result, student)`` per student ID, from the
    submissions graded and readable (the last one named for a student ID given twice);
    ``left_out``: ``[(path, why)]``; ``repeated``: ``{student_id: [paths]}``."""
    by_id, left_out, paths = {}, [], {}
    for r in results:
        who = students[r.path]
        if not r.graded:
            left_out.append((r.path, "not graded"))
        elif r.unreadable:
            left_out.append((r.path, "not readable as a notebook"))
        elif not who.id:
            left_out.append((r.path, f"no student ID: {who.problem}"))
        else:
            by_id[who.id] = (r, who)
            paths.setdefault(who.id, []).append(r.path)
    return list(by_id.values()), left_out, {sid: p for sid, p in paths.items() if len(p) > 1}


# ----------------------------------------------------------------------------- main
def _names(paths, limit=20):
    paths = [clean(p, 200) for p in paths]
    return ", ".join(paths[:limit]) + (f", ... ({len(paths) - limit} more)" if len(paths) > limit else "")


def main(argv=None):
    """Grade the notebooks named on the command line; returns the exit status (see ``EXIT_STATUS``)."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    missing = missing_packages()
    if missing:
        print(wrong_python(missing, argv), file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(
        prog="python -m mhalib.grade", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_STATUS,
        description="Grade exercise notebooks. Student code runs in a sandbox (bubblewrap), never in the grader. "
                    "A learner grades their own notebook with: make grade NB=NOTEBOOK.ipynb")
    add = parser.add_argument
    add("submissions", nargs="+", help="notebook files (.ipynb)")
    add("--results", help="write Gradescope's results JSON here")
    add("--csv", help="keep one row per submission in this CSV file: a rerun replaces the rows of the "
                      "submissions it grades and keeps the others")
    add("--roster", metavar="FILE", help="a CSV naming each submission's student: columns submission (a file name; "
                                         "* and ? match any text), student_id and, optionally, name")
    add("--gradebook", nargs=2, metavar=("LMS", "FILE"),
        help="also write the grades as an LMS imports them: canvas (its gradebook import) or moodle (an "
             "assignment's grading worksheet)")
    add("--assignment", help="with --gradebook canvas: the assignment's column as Canvas's own export names it, "
                             "'Title (id)' (default: the exercise)")
    add("--jobs", type=int, default=1, help="submissions graded in parallel (default 1)")
    add("--exercise", help="grade every file as this exercise (default: from metadata, then file name)")
    add("--seed", type=int, help="seed for the grading inputs (default: fresh each run)")
    add("--secret", metavar="FILE", help="the instructor's secret (any bytes, kept private): each student's inputs "
                                         "are drawn from it, their ID and the exercise, the same at every rerun")
    add("--variants", action="store_true", help="grade each student's own variant of exercises 06, 07 and 09, "
                                                "from their student ID (see docs/instructors.md)")
    add("--timeout", type=float, default=Limits.call_timeout_s, help="seconds per graded call (default %(default)g)")
    add("--cell-timeout", type=float, default=Limits.cell_timeout_s, help="seconds per cell (default %(default)g)")
    add("--submission-timeout", type=float, default=Limits.submission_s,
        help="seconds of wall clock for a whole submission: start, cells and calls (default %(default)g)")
    add("--memory-mb", type=int, default=Limits.memory_mb, help="address space of the child (default %(default)s)")
    add("--no-isolation", action="store_true",
        help="run the code as yourself, without a sandbox: only for your own notebook (make grade NB=...)")
    add("--quiet", action="store_true", help="print only the totals")
    args = parser.parse_args(argv)
    if not 1 <= args.jobs <= 64:
        parser.error(f"--jobs must be from 1 to 64; got {args.jobs}")
    for option in ("timeout", "cell_timeout", "submission_timeout"):
        value = getattr(args, option)
        if not 0 < value <= 3600:
            parser.error(f"--{option.replace('_', '-')} must be more than 0 and at most 3600 seconds; got {value:g}")
    if not 256 <= args.memory_mb <= 1 << 20:
        parser.error(f"--memory-mb must be from 256 to {1 << 20}; got {args.memory_mb}")
    lms, book = args.gradebook or (None, None)
    if lms is not None and lms not in GRADEBOOKS:
        parser.error(f"--gradebook {lms} {book}: the LMS is one of {', '.join(GRADEBOOKS)}")
    if args.assignment is not None and lms != "canvas":
        parser.error("--assignment names the column of a Canvas gradebook: use it with --gradebook canvas FILE")
    try:  # everything that can refuse the run is checked before anything is graded
        secret = read_secret(args.secret) if args.secret else None
        roster = load_roster(args.roster) if args.roster else []
        csv_before = read_existing(args.csv) if args.csv else ""
        read_table(csv_before, f"--csv {args.csv}")
    except ValueError as exc:
        parser.error(str(exc))
    except OSError as exc:
        parser.error(f"--csv {args.csv}: it cannot be read ({exc.strerror or exc}), so its rows could not be kept")
    limits = Limits(memory_mb=args.memory_mb, call_timeout_s=args.timeout, cell_timeout_s=args.cell_timeout,
                    submission_s=args.submission_timeout)
    graded_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    isolation = decide(unisolated=args.no_isolation)
    if not isolation.ok:
        print(f"grading refused: {isolation.problem}\n(grading a class needs bubblewrap; to grade your own "
              "notebook without it: make grade NB=your_notebook.ipynb, or add --no-isolation)", file=sys.stderr)
    slots = queue.Queue()
    for slot in range(args.jobs):
        slots.put(slot)

    def one(path):
        slot = slots.get()
        try:
            who = student_of(path, roster)  # the student's ID fixes their draws (--secret) and variant (--variants)
            draws = Draws(who.id, who.source, secret, args.variants, args.seed is not None)
            return grade_notebook(path, seed=args.seed, limits=limits, exercise=args.exercise,
                                  isolation=isolation, slot=slot, student=draws)
        finally:
            slots.put(slot)

    done, shown, unsaved = [None] * len(args.submissions), 0, None

    def save(results):
        """The results and the CSV rows of the submissions graded so far, in the order named."""
        students = {r.path: student_of(r.path, roster) for r in results}
        if args.results:
            write_file(args.results, json.dumps(results_json(results, len(args.submissions) == 1), indent=2) + "\n")
        if args.csv:
            write_file(args.csv, csv_text(results, csv_before, students, graded_at))

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(one, path): i for i, path in enumerate(args.submissions)}
        for future in as_completed(futures):  # each result is printed and written as soon as it is known
            done[futures[future]] = future.result()
            while shown < len(done) and done[shown] is not None:
                r = done[shown]
                print(r.text() if not args.quiet else f"{clean(r.path, 200)}: " +
                      (f"{r.score:g} / {r.max_score:g}" if r.graded else "not graded"), flush=True)
                shown += 1
            try:
                save([r for r in done if r is not None])
            except OSError as exc:  # tried again at the end, where a failure is the exit status
                unsaved = exc
    results = done
    students = {r.path: student_of(r.path, roster) for r in results}
    graded = [r for r in results if r.graded]
    unreadable = [r.path for r in graded if r.unreadable]
    if len(results) > 1:
        print(f"graded {len(graded)} submission{'' if len(graded) == 1 else 's'}"
              + (f"; mean score {mean_score(results):.2f}" if graded else ""))
        if len(graded) < len(results):
            print(f"not graded, left out of the mean ({len(results) - len(graded)}): "
                  + _names(r.path for r in results if not r.graded))
        if unreadable:
            print(f"not readable as a notebook, scored 0 ({len(unreadable)}): {_names(unreadable)}")
    broke = [r.path for r in results if any(text.startswith("internal grader error")
                                            for text in r.notes + [c.output for c in r.checks])]
    if broke:
        print(f"the grader itself failed ({len(broke)}): {_names(broke)}; each report above says where")
    status = 1 if unreadable or broke or len(graded) < len(results) else 0
    if roster or lms:
        nameless = [r.path for r in results if not students[r.path].id]
        if nameless:
            status = 1
            print(f"no student ID ({len(nameless)}): {_names(nameless)}; name them in the --roster file "
                  "(columns submission,student_id)")
    book_text = None
    if lms:
        entries, left_out, repeated = gradebook_entries(results, students)
        exercises = sorted({r.exercise for r, _ in entries})
        if len(exercises) > 1:
            print(f"--gradebook {lms}: not written: a gradebook file holds one assignment, and these submissions "
                  f"are exercises {', '.join(exercises)}; grade each exercise on its own (--exercise NN)",
                  file=sys.stderr)
            status = 2
        else:
            assignment = args.assignment or (exercises[0] if exercises else "exercise")
            book_text = gradebook_text(lms, entries, assignment, graded_at)
            print(f"gradebook for {lms.capitalize()}: {len(entries)} grade{'' if len(entries) == 1 else 's'} "
                  f"in {clean(book, 200)}" + (f"; left out ({len(left_out)}): " + "; ".join(
                      f"{clean(p, 200)} ({why})" for p, why in left_out[:20]) if left_out else ""))
            for sid, paths in repeated.items():
                print(f"student {clean(sid, 60)} has {len(paths)} submissions ({_names(paths)}); the gradebook "
                      f"has the last one's grade")
            status = 1 if left_out or repeated else status
    try:
        if unsaved is not None or not args.submissions:
            save(results)
        if book_text is not None:
            write_file(book, book_text)
    except OSError as exc:
        print(f"could not write the results: {exc}", file=sys.stderr)
        return 2
    return status if isolation.ok else 3


if __name__ == "__main__":
    sys.exit(main())
