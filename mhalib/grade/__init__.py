"""The course grader and its tools.

* ``python -m mhalib.grade SUBMISSION.ipynb [...]`` grades submissions; student code
  runs only in a sandboxed child process (:mod:`mhalib.grade.sandbox`).
* ``python -m mhalib.grade.gradescope`` and ``python -m mhalib.grade.nbgrader``: the same
  on Gradescope, and the course as an nbgrader course.
* ``python -m mhalib.grade.release`` generates ``exercises/`` from ``solutions/``.

Importing this package is cheap: nothing heavy is loaded until it is used.
"""
