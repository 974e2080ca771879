"""Command line: ``python -m mhalib.grade SUBMISSION.ipynb [more ...] [--results FILE] [--csv FILE] [--jobs N]``.

Prints one line per graded check and the total for each submission, then, for several,
the mean score. A file that is none of the course's exercises is not graded: it is
listed apart and left out of the mean. ``--results`` writes Gradescope's results.json
(for several submissions: ``{"submissions": [...], "not_graded": [...], "mean_score": ...}``);
``--csv`` appends one row per file (a file not graded has empty scores and the reason).
Exit status 0 whenever it graded, whatever the scores; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mhalib.grade.grader import grade_notebook
from mhalib.grade.sandbox import Limits

CSV_HEADER = ["submission", "exercise", "score", "max_score", "checks", "seed", "seconds"]


def _write_atomic(path, text):
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _why_not_graded(result):
    return "; ".join(result.notes) or "not one of the course's exercises"


def mean_score(results):
    """The mean score of the graded submissions (``None`` when none was graded)."""
    graded = [r for r in results if r.graded]
    return round(sum(r.score for r in graded) / len(graded), 2) if graded else None


def write_results(path, results):
    if len(results) == 1:
        data = results[0].gradescope()
    else:
        data = {
            "submissions": [dict(r.gradescope(), submission=r.path) for r in results if r.graded],
            "not_graded": [{"submission": r.path, "reason": _why_not_graded(r)} for r in results
                           if not r.graded],
            "mean_score": mean_score(results),
        }
    _write_atomic(path, json.dumps(data, indent=2) + "\n")


def read_existing(path):
    """The CSV as it was before grading (read first, so nothing a submission writes survives)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def append_csv(path, results, before=""):
    """Rewrite ``path`` as ``before`` plus one row per submission (header when new)."""
    import io

    buf = io.StringIO()
    writer = csv.writer(buf)
    if not before.strip():
        before = ""
        writer.writerow(CSV_HEADER)
    elif not before.endswith("\n"):
        before += "\n"
    for r in results:
        if not r.graded:  # no score, so that a spreadsheet's mean leaves it out
            writer.writerow([r.path, "", "", "", f"not graded: {_why_not_graded(r)}", r.seed,
                             f"{r.seconds:.2f}"])
            continue
        checks = "; ".join(f"{c.name}={c.score:g}/{c.max_score:g}" for c in r.checks)
        writer.writerow([r.path, r.exercise, f"{r.score:g}", f"{r.max_score:g}", checks,
                         r.seed, f"{r.seconds:.2f}"])
    _write_atomic(path, before + buf.getvalue())


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m mhalib.grade",
        description="Grade exercise notebooks. Student code runs in a separate, limited process.",
    )
    parser.add_argument("submissions", nargs="+", help="notebook files (.ipynb)")
    parser.add_argument("--results", help="write Gradescope's results JSON here")
    parser.add_argument("--csv", help="append one row per submission to this CSV file")
    parser.add_argument("--jobs", type=int, default=1, help="submissions graded in parallel (default 1)")
    parser.add_argument("--exercise", help="grade as this exercise (default: from metadata, then file name)")
    parser.add_argument("--seed", type=int, help="seed for the grading inputs (default: fresh each run)")
    parser.add_argument("--timeout", type=float, default=Limits.call_timeout_s,
                        help=f"seconds per graded call (default {Limits.call_timeout_s:g})")
    parser.add_argument("--cell-timeout", type=float, default=Limits.cell_timeout_s,
                        help=f"seconds per notebook cell (default {Limits.cell_timeout_s:g})")
    parser.add_argument("--memory-mb", type=int, default=Limits.memory_mb,
                        help=f"address-space limit of the student process (default {Limits.memory_mb})")
    parser.add_argument("--quiet", action="store_true", help="print only the totals")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1; got {args.jobs}")
    csv_before = read_existing(args.csv) if args.csv else ""
    limits = Limits(memory_mb=args.memory_mb, call_timeout_s=args.timeout, cell_timeout_s=args.cell_timeout)

    def one(path):
        return grade_notebook(path, seed=args.seed, limits=limits, exercise=args.exercise)

    if args.jobs == 1 or len(args.submissions) == 1:
        results = [one(p) for p in args.submissions]
    else:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(one, args.submissions))
    for r in results:
        if args.quiet:
            print(f"{r.path}: {r.score:g} / {r.max_score:g}" if r.graded else f"{r.path}: not graded")
        else:
            print(r.text())
    if len(results) > 1:
        graded = [r for r in results if r.graded]
        mean = mean_score(results)
        print(f"graded {len(graded)} submission{'' if len(graded) == 1 else 's'}"
              + (f"; mean score {mean:.2f}" if graded else ""))
        not_graded = [r for r in results if not r.graded]
        if not_graded:
            print(f"not graded, left out of the mean ({len(not_graded)}): "
                  + ", ".join(r.path for r in not_graded))
    if args.results:
        write_results(args.results, results)
    if args.csv:
        append_csv(args.csv, results, csv_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
