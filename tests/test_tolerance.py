"""The tolerance the tests derive from a dtype: the bound it states, and what it still catches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tolerance import float_tol, unit_roundoff


def test_the_bound_is_twice_gamma_n_of_the_dtype():
    u = 2.0 ** -24  # float32's unit roundoff
    tol = float_tol(torch.float32, 100)
    assert unit_roundoff(torch.float32) == unit_roundoff(np.float32) == u
    assert tol["rtol"] == pytest.approx(2 * 100 * u / (1 - 100 * u))
    assert float_tol(torch.float64, 100)["rtol"] < 1e-13 < tol["rtol"] < 2e-5
    assert float_tol(torch.float32, 100, scale=10.0)["atol"] == pytest.approx(10 * tol["atol"])
    assert float_tol(torch.float32, 1) == float_tol(torch.float32, 16)  # the elementwise steps' floor
    with pytest.raises(ValueError, match="terms=0"):
        float_tol(torch.float32, 0)


def test_two_orders_of_a_float32_sum_stay_within_it_and_a_missing_term_does_not():
    x = torch.randn(64, 5000, generator=torch.Generator().manual_seed(0))  # 64 sums of 5,000 terms
    exact = x.double().sum(1)
    forward = x.sum(1)
    pairwise = x.view(64, 50, 100).sum(2).sum(1)  # another order, as a vectorised kernel sums
    bound = float_tol(torch.float32, 5000, scale=x.abs().sum(1).max().item())  # sum |x_i|, as the bound reads
    torch.testing.assert_close(forward.double(), exact, **bound)
    torch.testing.assert_close(forward, pairwise, **bound)
    with pytest.raises(AssertionError):  # one term of 5,000 left out is far outside it
        torch.testing.assert_close(x[:, 1:].sum(1), forward, **float_tol(torch.float32, 5000))
