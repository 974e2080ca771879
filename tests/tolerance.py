"""Tolerances derived from the dtype and the length of the sums, never from habit.

Two correct computations of the same value round differently: PyTorch picks its kernels
by the processor (``ATEN_CPU_CAPABILITY``: default, avx2, avx512) and the thread count,
and each kernel sums in its own order and with its own vector width. A sum of ``n`` terms
computed in floating point is within ``gamma_n * sum |x_i|`` of the exact sum, with
``gamma_n = n u / (1 - n u)`` and ``u = eps / 2`` the unit roundoff (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., 2002, section 3.1). Two orders of the same
sum are each within that bound of the exact value, so they differ by at most twice it.

``float_tol(dtype, terms)`` gives that bound for a chain of sums whose lengths add up to
``terms``, relative to the size of the values (``rtol``) and, for values near zero, to
``scale`` (``atol``: ``sum |x_i|`` of the terms that were summed). It is a worst-case bound:
far from a loose habit like ``1e-5`` in one direction (float64 gets 1e-13, not 1e-5) and
safe on every CPU in the other. A wrong answer (a missing scale, a wrong mask, heads in
the wrong order) is off by a quantity of the order of the values themselves, which no
such bound hides; every test that uses it also says what it checks.
"""

from __future__ import annotations

import numpy as np
import torch


def unit_roundoff(dtype) -> float:
    """``u = eps / 2`` of a torch or NumPy floating dtype."""
    if isinstance(dtype, torch.dtype):
        return torch.finfo(dtype).eps / 2
    return float(np.finfo(dtype).eps) / 2


def float_tol(dtype, terms: int, scale: float = 1.0) -> dict:
    """``{"atol": ..., "rtol": ...}`` for two computations of the same values in ``dtype``.

    terms: the summed lengths of the reductions the values went through (a projection over
        d_model, the scores over d_head, the weighted sum over the keys, ...); 16 at least, for
        the elementwise steps (exp, division) around them.
    scale: ``sum |x_i|`` of the sums, which the absolute error is relative to, for values that
        cancel to near zero; 1 suits what attention outputs (averages of values of size about 1).
    Returns keyword arguments for ``torch.testing.assert_close`` and ``np.testing.assert_allclose``.
    """
    if terms < 1:
        raise ValueError(f"terms={terms}: the length of a sum is at least 1")
    u = unit_roundoff(dtype)
    n = max(int(terms), 16)
    gamma = n * u / (1 - n * u)
    return {"atol": 2 * gamma * scale, "rtol": 2 * gamma}
