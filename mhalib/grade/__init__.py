"""The course grader and its tools.

* ``python -m mhalib.grade SUBMISSION.ipynb [...]`` grades submissions; student code
  runs only in a separate, resource-limited child process.
* ``python -m mhalib.grade.release`` generates ``exercises/`` from ``solutions/``.

Importing this package is cheap: nothing heavy is loaded until it is used.
"""
