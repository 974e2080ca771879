"""How long grading takes: one submission, and a class of 40 with --jobs 2.

Goals (from the course's requirements): under 3 s per submission, a class of 40 in
under 60 s on 2 cores. The class is made of copies of the solution notebooks and of
the exercises generated from them (half full marks, half zero), graded through the
command line exactly as an instructor would, each submission in its own sandbox (the
isolation the grader chooses here is printed). Times are wall clock on a shared
machine: read the ratios to the goals, not the last digit.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from common import print_table  # noqa: E402

from mhalib.grade import release  # noqa: E402

ONE_GOAL_S = 3.0
CLASS_GOAL_S = 60.0
CLASS_SIZE = 40


def _grade(paths, jobs=1):
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mhalib.grade", *map(str, paths), "--jobs", str(jobs), "--quiet"],
        cwd=ROOT, capture_output=True, text=True,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"grader failed:\n{proc.stdout}\n{proc.stderr}")
    return elapsed, proc.stdout


def main():
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    if not solutions:
        print("no solution notebooks to grade yet")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="bench-grader-"))
    try:
        exercises = []
        for sol in solutions:
            ex = tmp / f"exercise_{sol.name}"
            ex.write_text(release.render(sol), encoding="utf-8")
            exercises.append(ex)
        rows = []
        per_submission = []
        for sol in solutions:
            times = [_grade([sol])[0] for _ in range(2)]
            t = min(times)
            per_submission.append(t)
            rows.append([f"one submission: {sol.stem}", f"{t:.2f}", f"{ONE_GOAL_S:.0f}", f"{t / ONE_GOAL_S:.2f}"])
        pool = [p for pair in zip(solutions, exercises) for p in pair]
        klass = []
        for i in range(CLASS_SIZE):
            src = pool[i % len(pool)]
            dest = tmp / f"student{i:02d}_{src.name.replace('exercise_', '')}"
            shutil.copy(src, dest)
            klass.append(dest)
        t_class, out = _grade(klass, jobs=2)
        rows.append([f"class of {CLASS_SIZE}, --jobs 2", f"{t_class:.2f}", f"{CLASS_GOAL_S:.0f}",
                     f"{t_class / CLASS_GOAL_S:.2f}"])
        rows.append([f"  per submission in the class", f"{t_class / CLASS_SIZE:.2f}", f"{ONE_GOAL_S:.0f}",
                     f"{t_class / CLASS_SIZE / ONE_GOAL_S:.2f}"])
        print_table(["what", "seconds", "goal (s)", "time / goal"], rows)
        print(f"\nmedian single submission: {statistics.median(per_submission):.2f} s "
              f"(goal < {ONE_GOAL_S:.0f} s); class of {CLASS_SIZE}: {t_class:.1f} s (goal < {CLASS_GOAL_S:.0f} s)")
        print("time / goal below 1 meets the goal.")
        from mhalib.grade.sandbox import decide

        print(f"isolation: {decide().kind or decide().problem}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
