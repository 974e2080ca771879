"""Reading the variants' measurements: spread over seeds, paired comparisons, the frontier.

* :func:`summarize`: mean, standard deviation, lowest and highest value over seeds.
* :func:`paired_against`: seed s of every variant trained on the same batches from the same
  seed, so each seed is a pair; how many seeds a variant is worse than the baseline in, and
  the chance of that many or more if the two did not differ (each seed a coin toss:
  :func:`mhalib.interpret.count_null` with p = 1/2).
* :func:`pareto_front`: the points no other point beats on both axes (cheaper or as cheap,
  and better or as good).
"""

from __future__ import annotations

import numpy as np

from mhalib.interpret import count_null

__all__ = ["summarize", "paired_against", "pareto_front", "metric_values", "LOWER_IS_BETTER"]

#: Metrics where a lower number is better; for every other one higher is better.
LOWER_IS_BETTER = ("loss",)


def metric_values(runs, variant, metric):
    """``{seed: value}`` of one metric (``"recall"``, or ``"recall_by_pairs/24"`` for a nested one)."""
    if variant not in runs:
        raise ValueError(f"no runs of {variant!r}; measured: {', '.join(runs)}")
    out = {}
    for seed, row in runs[variant].items():
        value = row
        for part in metric.split("/"):
            if not isinstance(value, dict) or part not in value:
                raise ValueError(f"{variant} seed {seed} has no {metric!r}")
            value = value[part]
        out[int(seed)] = float(value)
    return out


def summarize(runs, metric):
    """``{variant: {"mean", "sd", "min", "max", "n"}}`` over the seeds (``sd`` with n - 1; 0 for one seed)."""
    table = {}
    for variant in runs:
        v = np.array(list(metric_values(runs, variant, metric).values()))
        table[variant] = {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                          "min": float(v.min()), "max": float(v.max()), "n": len(v)}
    return table


def paired_against(runs, metric, baseline="MHA"):
    """Each variant against ``baseline``, seed by seed.

    Returns:
        ``{variant: {"worse", "better", "n", "p_worse", "p_better", "mean_difference"}}``: the seeds
        in which the variant is worse (better) than the baseline's same seed, the seeds both
        have, the chance of at least that many worse (better) seeds if each were a coin toss,
        and the mean of variant minus baseline.
    """
    base = metric_values(runs, baseline, metric)
    sign = -1.0 if metric.split("/")[0] in LOWER_IS_BETTER else 1.0
    out = {}
    for variant in runs:
        if variant == baseline:
            continue
        values = metric_values(runs, variant, metric)
        seeds = sorted(set(values) & set(base))
        if not seeds:
            continue
        diff = np.array([values[s] - base[s] for s in seeds])
        worse, better = int((sign * diff < 0).sum()), int((sign * diff > 0).sum())
        out[variant] = {"worse": worse, "better": better, "n": len(seeds), "mean_difference": float(diff.mean()),
                        "p_worse": count_null(worse, len(seeds), 0.5)["p_value"],
                        "p_better": count_null(better, len(seeds), 0.5)["p_value"]}
    return out


def pareto_front(costs, qualities):
    """Which points are on the frontier: no other point costs no more, is at least as good, and is
    strictly better in one of the two.

    Args:
        costs, qualities: ``(n,)`` numbers (lower cost is better, higher quality is better).

    Returns:
        ``(n,)`` bool, True on the frontier. Two identical points are both on it (neither beats the other).
    """
    c = np.asarray(costs, dtype=np.float64)
    q = np.asarray(qualities, dtype=np.float64)
    if c.ndim != 1 or c.shape != q.shape or c.size == 0:
        raise ValueError(f"costs and qualities must be 1-D arrays of one length >= 1; got shapes "
                         f"{c.shape} and {q.shape}")
    if not (np.isfinite(c).all() and np.isfinite(q).all()):
        raise ValueError("costs and qualities must be finite numbers")
    no_more, as_good = c[None, :] <= c[:, None], q[None, :] >= q[:, None]  # [i, j]: j against i
    strictly = (c[None, :] < c[:, None]) | (q[None, :] > q[:, None])
    return ~(no_more & as_good & strictly).any(axis=1)
