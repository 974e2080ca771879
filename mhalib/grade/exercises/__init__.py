"""Every graded exercise, one module each: ``exNN_topic.py`` defines ``EXERCISE``.

Adding an exercise means adding one module here (its graded functions, their cases,
references and feedback); the grader, ``check()`` and the tests find it by itself.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import lru_cache
from pathlib import Path

__all__ = ["all_exercises", "get", "recognise", "find_graded"]


@lru_cache(maxsize=None)
def all_exercises():
    """``{key: Exercise}`` for every ``exNN_*`` module of this package, sorted by key."""
    modules = sorted(m.name for m in pkgutil.iter_modules(__path__) if re.match(r"ex\d\d_", m.name))
    found = [importlib.import_module(f"{__name__}.{name}").EXERCISE for name in modules]
    return dict(sorted((ex.key, ex) for ex in found))


def get(key):
    """The exercise for ``key`` (``"01_single_head_attention"``, ``"01"`` or ``"1"``), or None."""
    exercises, key = all_exercises(), str(key)
    if key in exercises or not key.isdigit():
        return exercises.get(key)
    return next((ex for k, ex in exercises.items() if int(k[:2]) == int(key)), None)


def recognise(metadata, filename):
    """Which exercise a notebook is: its metadata first, then its file name.

    Returns ``(exercise or None, how)`` where ``how`` says what it was recognised by.
    """
    exercises = all_exercises()
    mh = metadata.get("mhalib") if isinstance(metadata, dict) else None
    key = mh.get("exercise") if isinstance(mh, dict) else None
    if isinstance(key, str) and get(key) is not None:
        return get(key), f"notebook metadata ({key})"
    stem = Path(str(filename)).stem.lower()
    for k, ex in exercises.items():
        if k in stem:
            return ex, f"file name ({k})"
    m = re.match(r"^(?:ex(?:ercise)?[_ -]?)?(\d{1,2})(?:\D|$)", stem)
    if m:
        ex = get(m.group(1))
        if ex is not None:
            return ex, f"file name ({ex.key})"
    return None, ""


def find_graded(name):
    """``[(exercise, graded), ...]`` whose learner-side name is ``name``."""
    return [(ex, g) for ex in all_exercises().values() for g in ex.graded if g.lookup == name]
