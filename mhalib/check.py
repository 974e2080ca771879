"""The learner's import, kept: ``from mhalib.check import check`` (``score`` for nbgrader, and
``variant`` for the per-student variants of exercises 06, 07 and 09).

The self-checks live with the grader they share their cases and judges with:
:mod:`mhalib.grade.check`.
"""

from mhalib.grade.check import check, graded_names, score, variant

__all__ = ["check", "graded_names", "score", "variant"]
