"""Small timing helpers shared by the benchmarks: medians of repeated runs, ratios."""

from __future__ import annotations

import statistics
import time


def median_time(fn, *, repeat=7, warmup=2, setup=None):
    """Median wall-clock seconds of ``fn()`` over ``repeat`` runs after ``warmup`` runs.

    ``setup``, if given, runs before every call and is not timed (e.g. to flush caches).
    """
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    times = []
    for _ in range(repeat):
        if setup:
            setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def print_table(header, rows):
    """Print rows (lists of str) under header, columns aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    line = "  ".join(f"{{:>{w}}}" for w in widths)
    print(line.format(*header))
    print(line.format(*("-" * w for w in widths)))
    for row in rows:
        print(line.format(*map(str, row)))
