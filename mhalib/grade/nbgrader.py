"""The course as an nbgrader course: ``python -m mhalib.grade.nbgrader COURSE_DIR [NN ...]``.

For each exercise (all by default) it writes ``COURSE_DIR/source/<key>/<key>.ipynb``: the
solution with, after each answer cell, one locked test cell per graded check (``grade:
true``, the grader's points) running :func:`mhalib.check.score`, which grades the answer
on fresh inputs as the grader does and returns the points earned: nbgrader's partial
credit (less than the cell's points fails ``nbgrader validate``). Answer cells lose their
``points`` (nbgrader counts those of grade cells only). Then, in ``COURSE_DIR``::

    nbgrader generate_assignment <key>        # release/<key>/<key>.ipynb, the blank exercise
    nbgrader validate release/<key>/<key>.ipynb
    nbgrader autograde <key>                  # submitted/<student>/<key>/<key>.ipynb

nbgrader runs the notebook in a plain kernel, with no sandbox: use the course grader
(``python -m mhalib.grade``) for submissions you do not trust.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from mhalib.grade import exercises as registry

ROOT = Path(__file__).resolve().parents[2]


def test_cell(graded):
    """The locked nbgrader test cell that scores ``graded`` with ``mhalib.check.score``."""
    import nbformat

    slug = re.sub(r"\W+", "_", graded.name).strip("_")
    cell = nbformat.v4.new_code_cell(f"from mhalib.check import score\n\nscore({graded.name!r}, {graded.lookup})")
    cell.id = f"test-{slug}".replace("_", "-")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "points": graded.points,
                                 "grade_id": f"test_{slug}", "schema_version": 3}
    return cell


def source_notebook(solution):
    """The nbgrader source notebook made from one solution notebook (a ``NotebookNode``)."""
    import nbformat

    nb = nbformat.read(solution, as_version=4)
    ex, _ = registry.recognise(nb.metadata, solution)
    if ex is None:
        raise SystemExit(f"{solution}: no grader spec for this notebook")
    cells, tested = [], set()
    for cell in nb.cells:
        cells.append(cell)
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            meta.pop("points", None)
            for graded in ex.graded:
                if graded.lookup == meta.get("grade_id"):
                    cells.append(test_cell(graded))
                    tested.add(graded.name)
    missing = {g.name for g in ex.graded} - tested
    if missing:
        raise SystemExit(f"{solution}: no answer cell with grade_id for {', '.join(sorted(missing))}")
    nb.cells = cells
    return ex, nb


def main(argv=None):
    """Write the nbgrader source notebooks of the chosen exercises (default: all) under ``course_dir``."""
    import nbformat

    parser = argparse.ArgumentParser(prog="python -m mhalib.grade.nbgrader",
                                     description="Write the course's exercises as nbgrader source notebooks.")
    parser.add_argument("course_dir", help="the nbgrader course folder (source/ is written there)")
    parser.add_argument("exercises", nargs="*", help="exercise numbers or keys (default: all)")
    args = parser.parse_args(argv)
    wanted = {getattr(registry.get(e), "key", e) for e in args.exercises}
    for solution in sorted((ROOT / "solutions").glob("*.ipynb")):
        ex, _ = registry.recognise(None, solution)
        if ex is None or (wanted and ex.key not in wanted):
            continue
        ex, nb = source_notebook(solution)
        out = Path(args.course_dir) / "source" / ex.key / f"{ex.key}.ipynb"
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
        print(f"wrote {out}: {len(ex.graded)} test cells, {ex.max_score:g} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
