"""Submissions written by the tests: a notebook of one code cell, for one exercise."""

from __future__ import annotations

import nbformat


def one_cell_notebook(path, key, source):
    """Write a notebook at ``path`` for exercise ``key`` whose one code cell is ``source``; returns ``path``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["mhalib"] = {"exercise": key}
    nb.cells = [nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, path)
    return path
