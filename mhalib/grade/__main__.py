"""Command line: ``python -m mhalib.grade SUBMISSION.ipynb [more ...] [options]``.

Prints one line per graded check and the total for each submission, then, for several,
the mean score (a file that is none of the course's exercises is listed apart, left out).
``--results`` writes Gradescope's results.json (for several submissions:
``{"submissions": [...], "not_graded": [...], "mean_score": ...}``); ``--csv`` appends one
row per file. The isolation is decided once, before the first submission, and printed
with every result; where none can be had nothing is graded and the exit status is 3.
Otherwise it is 0 whatever the scores; 2 for a usage error or results not written.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import queue
import stat
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mhalib.grade.grader import clean, grade_notebook
from mhalib.grade.sandbox import Limits, decide

CSV_HEADER = ["submission", "exercise", "score", "max_score", "checks", "seed", "seconds", "isolation"]


def write_file(path, text):
    """Write ``text`` to ``path`` through a private temporary file in the same folder
    (random name, created exclusively, links not followed), renamed over ``path``: a link,
    a FIFO or a planted temporary file there can neither redirect nor block it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchmod(f.fileno(), 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def read_existing(path):
    """The CSV as it was before grading: a regular file only (never a link or a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return f.read(64 << 20).decode("utf-8", "replace")


def _why_not_graded(result):
    return "; ".join(result.notes) or "not one of the course's exercises"


def mean_score(results):
    """The mean score of the graded submissions (``None`` when none was graded)."""
    graded = [r for r in results if r.graded]
    return round(sum(r.score for r in graded) / len(graded), 2) if graded else None


def results_json(results):
    """The results JSON: Gradescope's format for one submission.

    For several: the graded submissions, those not graded (with the reason) and the mean score.
    """
    if len(results) == 1:
        return results[0].gradescope()
    return {"submissions": [dict(r.gradescope(), submission=r.path) for r in results if r.graded],
            "not_graded": [{"submission": r.path, "reason": _why_not_graded(r)} for r in results if not r.graded],
            "mean_score": mean_score(results)}


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """``value`` as a CSV cell a spreadsheet never reads as a formula: text starting with
    ``= + - @``, a tab or a carriage return gets a leading apostrophe (numbers stay numbers)."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def csv_text(results, before=""):
    """``before`` plus one row per submission (and the header when ``before`` is empty)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    if not before.strip():
        before = ""
        writer.writerow(CSV_HEADER)
    elif not before.endswith("\n"):
        before += "\n"
    for r in results:  # a file not graded has no score, so that a spreadsheet's mean leaves it out
        checks = "; ".join(f"{c.name}={c.score:g}/{c.max_score:g}" for c in r.checks)
        scores = [r.exercise, f"{r.score:g}", f"{r.max_score:g}", checks] if r.graded else \
            ["", "", "", f"not graded: {_why_not_graded(r)}"]
        writer.writerow([csv_cell(v) for v in (r.path, *scores, r.seed, f"{r.seconds:.2f}", r.isolation)])
    return before + buf.getvalue()


def main(argv=None):
    """Grade the notebooks named on the command line; returns the exit status (3 when grading was refused)."""
    parser = argparse.ArgumentParser(
        prog="python -m mhalib.grade",
        description="Grade exercise notebooks. Student code runs in a sandbox (bubblewrap), never in the grader.")
    add = parser.add_argument
    add("submissions", nargs="+", help="notebook files (.ipynb)")
    add("--results", help="write Gradescope's results JSON here")
    add("--csv", help="append one row per submission to this CSV file")
    add("--jobs", type=int, default=1, help="submissions graded in parallel (default 1)")
    add("--exercise", help="grade every file as this exercise (default: from metadata, then file name)")
    add("--seed", type=int, help="seed for the grading inputs (default: fresh each run)")
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
    csv_before = read_existing(args.csv) if args.csv else ""
    limits = Limits(memory_mb=args.memory_mb, call_timeout_s=args.timeout, cell_timeout_s=args.cell_timeout,
                    submission_s=args.submission_timeout)
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
            return grade_notebook(path, seed=args.seed, limits=limits, exercise=args.exercise,
                                  isolation=isolation, slot=slot)
        finally:
            slots.put(slot)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, args.submissions))
    for r in results:
        print(r.text() if not args.quiet else f"{clean(r.path, 200)}: " +
              (f"{r.score:g} / {r.max_score:g}" if r.graded else "not graded"))
    graded = [r for r in results if r.graded]
    if len(results) > 1:
        print(f"graded {len(graded)} submission{'' if len(graded) == 1 else 's'}"
              + (f"; mean score {mean_score(results):.2f}" if graded else ""))
        if len(graded) < len(results):
            print(f"not graded, left out of the mean ({len(results) - len(graded)}): "
                  + ", ".join(clean(r.path, 200) for r in results if not r.graded))
    try:
        if args.results:
            write_file(args.results, json.dumps(results_json(results), indent=2) + "\n")
        if args.csv:
            write_file(args.csv, csv_text(results, csv_before))
    except OSError as exc:
        print(f"could not write the results: {exc}", file=sys.stderr)
        return 2
    return 0 if isolation.ok else 3


if __name__ == "__main__":
    sys.exit(main())
