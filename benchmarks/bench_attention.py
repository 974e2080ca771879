"""mhalib's MultiHeadAttention against torch.nn.MultiheadAttention, same weights.

CPU, fp32, eval mode, no autograd, need_weights=False: the set-up of inference.
The two modules hold identical weights (``in_proj_weight`` = the stacked ``q_proj``,
``k_proj``, ``v_proj`` weights; ``out_proj.weight`` = ``o_proj.weight``) and their
outputs are checked equal before anything is timed.

The report is the ratio mhalib / torch per size (below 1 means mhalib is faster),
taken as the median of per-round ratios where the two calls alternate, so that load
from other processes hits both sides alike. Goal: within 1.10x.

Usage: python benchmarks/bench_attention.py [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import print_table

from mhalib.attention import MultiHeadAttention, to_nn_multihead_attention

# (B, N, d_model, H)
SIZES = [(8, 512, 512, 8), (1, 128, 256, 4), (2, 1024, 768, 12)]


def paired_times(fn_a, fn_b, *, repeat=9, warmup=2):
    """Time ``fn_a`` and ``fn_b`` in alternating rounds (ABBA order).

    Returns:
        ``(median_a, median_b, median_ratio)`` in seconds; ``median_ratio`` is the
        median over rounds of ``time_a / time_b`` measured next to each other.
    """
    for _ in range(warmup):
        fn_a()
        fn_b()
    times_a, times_b = [], []
    for i in range(repeat):
        order = ((fn_a, times_a), (fn_b, times_b))
        for fn, times in order if i % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    ratio = statistics.median(a / b for a, b in zip(times_a, times_b))
    return statistics.median(times_a), statistics.median(times_b), ratio


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: steadier ratios on a shared machine)")
    torch.set_num_threads(parser.parse_args(argv).threads)
    torch.manual_seed(0)
    rows = []
    for b, n, d_model, h in SIZES:
        ours = MultiHeadAttention(d_model, h).eval()
        ref = to_nn_multihead_attention(ours)
        x = torch.randn(b, n, d_model)  # (B, N, d_model)
        with torch.inference_mode():
            diff = (ours(x) - ref(x, x, x, need_weights=False)[0]).abs().max().item()
            if diff > 1e-4:
                raise SystemExit(f"outputs differ by {diff:.2e} at B={b}, N={n}, d_model={d_model}, H={h}")
            t_ours, t_ref, ratio = paired_times(lambda: ours(x), lambda: ref(x, x, x, need_weights=False))
        rows.append([f"B {b}, N {n}, d_model {d_model}, H {h}", f"{t_ours * 1e3:.1f}",
                     f"{t_ref * 1e3:.1f}", f"{ratio:.2f}x", "yes" if ratio <= 1.10 else "NO"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), fp32, eval, no grad")
    print_table(["size", "mhalib ms", "torch ms", "mhalib / torch", "within 1.10x"], rows)


if __name__ == "__main__":
    main()
