"""The learner's import, kept: ``from mhalib.check import check`` (and ``score`` for nbgrader).

The self-checks live with the grader they share their cases and judges with:
:mod:`mhalib.grade.check`.
"""

from mhalib.grade.check import check, graded_names, score

__all__ = ["check", "graded_names", "score"]
