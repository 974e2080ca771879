"""The multiply-add peak a Numba loop reaches on this processor: the yardstick of compute-bound kernels.

A fused multiply-add (FMA) does ``s += a * x`` in one instruction: 2 FLOPs per lane. A core
issues a few of them per cycle, each on 8 (AVX2) or 16 (AVX-512) float32 lanes, if it has
enough *independent* sums to work on: one sum waits for its previous FMA to finish (about
4 cycles), so a loop needs about 8 sums in flight to keep the units busy. :func:`fma_loop`
is that loop, written the way the decode kernel's loops are written (plain Numba, compiled
with ``fastmath`` for the host CPU): 8 running sums over an array small enough to stay in
the L1 cache, so it waits neither on memory nor on a dependency. Its rate is what the
kernel's arithmetic could reach at best, and ``bench_decode.py`` times it in the same rounds
as the kernel, at the same thread count.

Usage: python benchmarks/fma_peak.py [--threads T]   (prints the peak at 1 thread and at T)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

#: Floats in the array the sums run over: 8 KiB, in every L1 cache.
LANES = 2048

prange = range  # numba.prange once the loop is compiled (see fma_loop)


def fma_loop_python(a, x, reps, out):
    """For each worker w (shared out over the cores): 8 sums ``s_i += a[c] * x[w, i]`` over ``a``, ``reps`` times.

    Args:
        a: ``(LANES,)`` float32.
        x: ``(workers, 8)`` float32, each worker's 8 factors.
        reps: passes over ``a``.
        out: ``(workers, 8)`` float32, filled with the 8 sums of each worker.
    """
    for w in prange(x.shape[0]):  # one worker per thread
        x0, x1, x2, x3, x4, x5, x6, x7 = x[w, 0], x[w, 1], x[w, 2], x[w, 3], x[w, 4], x[w, 5], x[w, 6], x[w, 7]
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
        for _ in range(reps):
            for c in range(a.shape[0]):  # vectorised: 8 independent FMAs per vector of a
                y = a[c]
                s0 += y * x0
                s1 += y * x1
                s2 += y * x2
                s3 += y * x3
                s4 += y * x4
                s5 += y * x5
                s6 += y * x6
                s7 += y * x7
        out[w, 0], out[w, 1], out[w, 2], out[w, 3] = s0, s1, s2, s3
        out[w, 4], out[w, 5], out[w, 6], out[w, 7] = s4, s5, s6, s7


_compiled = {}


def fma_loop():
    """:func:`fma_loop_python` compiled by Numba (``parallel``, ``fastmath``, for the host CPU)."""
    if not _compiled:
        import numba

        global prange
        prange = numba.prange  # read by Numba when it compiles the loop
        _compiled["loop"] = numba.njit(parallel=True, fastmath=True, nogil=True)(fma_loop_python)
    return _compiled["loop"]


def flops(workers, reps, lanes=LANES):
    """FLOPs of one call of :func:`fma_loop`: 8 multiply-adds (2 FLOPs each) per number of ``a`` per pass."""
    return 2 * 8 * lanes * reps * workers


def make_timed(threads, reps=10_000, lanes=LANES, seed=0):
    """A call that runs the loop once on ``threads`` workers; returns ``(call, flops per call)``.

    The caller sets Numba's thread count (``numba.set_num_threads``) to ``threads``; one
    worker per thread. 10,000 passes over 2,048 floats are 328 MFLOP per worker, a few
    milliseconds: the length of a decode step, so that both meet the same interruptions
    on a shared machine.
    """
    rng = np.random.default_rng(seed)
    a = rng.random(lanes, dtype=np.float32)
    x = rng.random((threads, 8), dtype=np.float32)
    out = np.empty((threads, 8), np.float32)
    loop = fma_loop()
    loop(a, x, 1, out)  # compile
    return (lambda: loop(a, x, reps, out)), flops(threads, reps, lanes)


def peak(threads, rounds=20, reps=10_000):
    """The best of ``rounds`` timed calls on ``threads`` threads, in FLOP/s."""
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        call, work = make_timed(threads, reps)
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - start)
    finally:
        numba.set_num_threads(before)
    return work / best


def main(argv=None):
    import numba

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    args = parser.parse_args(argv)
    for threads in sorted({1, args.threads}):
        print(f"FMA peak, {threads} thread(s): {peak(threads) / 1e9:.1f} GFLOP/s (float32, best of 20)")


if __name__ == "__main__":
    main()
