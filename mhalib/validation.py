"""Input checks shared by the NumPy and torch code: clear ValueErrors, nothing else.

Every message names what was given and what is allowed, so a learner who passes
``num_heads=7`` with ``d_model=64`` reads what to do instead of a reshape error.
"""

from __future__ import annotations

__all__ = ["divisors", "check_positive_int", "check_divisible", "check_mask_shape"]


def divisors(n):
    """All positive divisors of ``n`` in increasing order (``divisors(12) == [1, 2, 3, 4, 6, 12]``)."""
    n = int(n)
    if n < 1:
        return []
    return [d for d in range(1, n + 1) if n % d == 0]


def check_positive_int(value, name):
    """Return ``value`` as an ``int``; raise ``ValueError`` naming ``name`` unless it is an integer >= 1.

    Python and NumPy integers pass; ``True``, floats and strings do not (``2.0`` is refused
    rather than silently truncated).
    """
    if isinstance(value, bool) or not hasattr(value, "__index__") or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {name}={value!r}")
    return int(value)


def check_divisible(total, parts, total_name, parts_name):
    """Raise ``ValueError`` unless ``parts`` is a positive integer dividing ``total``."""
    if isinstance(parts, bool) or not isinstance(parts, int) and not hasattr(parts, "__index__"):
        raise ValueError(f"{parts_name} must be a positive integer; got {parts!r}")
    if isinstance(total, bool) or not isinstance(total, int) and not hasattr(total, "__index__"):
        raise ValueError(f"{total_name} must be a positive integer; got {total!r}")
    total, parts = int(total), int(parts)
    if total < 1:
        raise ValueError(f"{total_name} must be a positive integer; got {total_name}={total}")
    if parts < 1:
        raise ValueError(
            f"{parts_name} must be a positive integer; got {parts_name}={parts}; "
            f"choose one of {', '.join(map(str, divisors(total)))}"
        )
    if total % parts:
        raise ValueError(
            f"{total_name}={total} is not divisible by {parts_name}={parts}; "
            f"choose one of {', '.join(map(str, divisors(total)))}"
        )


def check_mask_shape(mask_shape, target_shape, *, allow_ambiguous_3d=True):
    """Check that a mask of ``mask_shape`` broadcasts to ``target_shape``.

    Broadcasting follows NumPy's rules, aligned from the right. Raises ``ValueError``
    naming both shapes and the allowed forms when it does not.
    """
    mask_shape, target_shape = tuple(mask_shape), tuple(target_shape)
    ok = len(mask_shape) <= len(target_shape) and all(
        m in (1, t) for m, t in zip(reversed(mask_shape), reversed(target_shape))
    )
    if not ok:
        n_q, n_k = target_shape[-2:]
        raise ValueError(
            f"mask of shape {mask_shape} does not broadcast to the scores of shape "
            f"{target_shape}; allowed: ({n_q}, {n_k}) for every batch element and head, "
            f"or a shape that broadcasts to {target_shape} such as (B, 1, {n_q}, {n_k})"
        )
