"""Decode benchmark: one new query token against a long KV cache, MHA vs GQA vs MQA.

Decoding reads the whole KV cache for every new token, so with few FLOPs per byte its
speed is set by how many bytes the cache holds: g key/value heads instead of H should
make a step about H / g times faster, until compute becomes the limit (on a CPU, MQA
reaches that floor well before H / g = 32).

Three ways to attend with g < H key/value heads:

* ``grouped_attention`` (mhalib): the H / g query heads of a group stacked as rows,
  multiplied against the group's un-repeated K and V;
* ``F.scaled_dot_product_attention(..., enable_gqa=True)`` (PyTorch >= 2.5);
* ``repeat_kv`` then SDPA: materialise H key/value heads first (copies the cache).

Reported: the best of several interleaved rounds for each; the bandwidth it reaches, as
a fraction of a streaming read (a sum) of the same K and V bytes timed in the same
rounds; its speedup over the same method's MHA; and the byte ratio H / g (the ideal
speedup of a memory-bound step). Caches are flushed between calls by writing a buffer
larger than the last-level cache.

Usage: python benchmarks/bench_decode.py [--tokens N] [--repeat R] [--threads T]
(without --threads: once with every thread torch uses, then once with one thread)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, print_table  # noqa: E402

from mhalib.attention import grouped_attention, repeat_kv  # noqa: E402

FLUSH_BYTES = 256 * 2**20  # larger than any last-level cache this runs on
#: The reference: a streaming read (a sum) of the same K and V bytes, timed in the same rounds.
READ = "streaming read of K and V"


def make_flush(nbytes=FLUSH_BYTES):
    """Return a function that evicts the caches by writing ``nbytes`` of fresh memory."""
    buf = torch.empty(nbytes // 4, dtype=torch.float32)

    def flush():
        buf.add_(1.0)

    return flush


def methods():
    return {
        "mhalib grouped_attention": lambda q, k, v: grouped_attention(q, k, v),
        "SDPA enable_gqa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "repeat_kv + SDPA": lambda q, k, v: F.scaled_dot_product_attention(
            q, repeat_kv(k, q.shape[1] // k.shape[1]), repeat_kv(v, q.shape[1] // k.shape[1])),
    }


def run(num_tokens=32_768, num_heads=32, head_dim=128, kv_heads=(32, 8, 1), repeat=7, warmup=1):
    """Time every method for every g; return rows ``(method, g, seconds)``.

    The calls are interleaved (one call of every method and g per round, ``repeat``
    rounds), so a change in the machine's load during the run moves all of them
    together. Each pair reports its best round: on a shared machine the least
    disturbed run is the closest to what the hardware does.
    """
    torch.manual_seed(0)
    flush = make_flush()
    q = torch.randn(1, num_heads, 1, head_dim)  # (B, H, 1, d_head): one new token
    caches = {}
    for g in kv_heads:
        k = torch.randn(1, g, num_tokens, head_dim)  # (B, g, n, d_head)
        v = torch.randn(1, g, num_tokens, head_dim)  # (B, g, n, d_head)
        ref = F.scaled_dot_product_attention(q, repeat_kv(k, num_heads // g), repeat_kv(v, num_heads // g))
        for fn in methods().values():
            torch.testing.assert_close(fn(q, k, v), ref, atol=1e-4, rtol=1e-4)
        caches[g] = (k, v)
    fns = {**methods(), READ: lambda q, k, v: (k.sum(), v.sum())}
    pairs = [(name, g) for g in kv_heads for name in fns]
    times = {pair: [] for pair in pairs}
    for round_ in range(warmup + repeat):
        for name, g in pairs:
            k, v = caches[g]
            flush()
            start = time.perf_counter()
            fns[name](q, k, v)
            if round_ >= warmup:
                times[(name, g)].append(time.perf_counter() - start)
    return [(name, g, min(times[(name, g)])) for name, g in pairs]


def run_prefill(n=1024, num_heads=8, num_kv_heads=2, head_dim=64, repeat=3):
    """Many queries at once (a prompt): grouped_attention vs the fused SDPA; returns seconds."""
    torch.manual_seed(0)
    q = torch.randn(1, num_heads, n, head_dim)  # (B, H, N, d_head)
    k = torch.randn(1, num_kv_heads, n, head_dim)  # (B, g, N, d_head)
    v = torch.randn(1, num_kv_heads, n, head_dim)  # (B, g, N, d_head)
    ours = median_time(lambda: grouped_attention(q, k, v, causal=True), repeat=repeat)
    sdpa = median_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                       repeat=repeat)
    return ours, sdpa


def report(n, h, d, kv_heads, repeat):
    """Run the decode benchmark at the current thread count and print its table."""
    print(f"\ndecode: B 1, one query token, cache n {n:,}, H {h}, d_head {d}, fp32, "
          f"{torch.get_num_threads()} thread(s); caches flushed between calls; best of {repeat} rounds")
    rows = run(n, h, d, kv_heads, repeat=repeat)
    times = {(name, g): s for name, g, s in rows}
    table = []
    for name, g, s in rows:
        label = "MHA" if g == h else ("MQA" if g == 1 else f"GQA-{g}")
        nbytes = 2 * g * n * d * 4
        table.append([name, label, f"{nbytes / 2**20:,.0f}", f"{s * 1e3:.2f}", f"{nbytes / s / 1e9:.1f}",
                      f"{times[(READ, g)] / s:.0%}", f"{times[(name, h)] / s:.2f}x", f"{h / g:.0f}x"])
    print_table(["method", "attention", "K+V MiB", "ms", "GB/s", "of read", "speedup vs its MHA",
                 "bytes H/g"], table)
    ours, sdpa, rep = "mhalib grouped_attention", "SDPA enable_gqa", "repeat_kv + SDPA"
    print(f"mhalib MHA / SDPA MHA time: {times[(ours, h)] / times[(sdpa, h)]:.2f} (goal <= 1.0)")
    print(f"mhalib MHA reads K and V at {times[(READ, h)] / times[(ours, h)]:.0%} of the streaming read "
          f"(goal >= 75%)")
    if (ours, 8) in times and h > 8:
        print(f"mhalib GQA-8 reads K and V at {times[(READ, 8)] / times[(ours, 8)]:.0%} of the streaming read "
              f"(goal >= 65%)")
        print(f"mhalib GQA-8 speedup over its MHA: {times[(ours, h)] / times[(ours, 8)]:.2f}x "
              f"(goal >= 3.3x, ideal {h // 8}x)")
        print(f"repeat_kv + SDPA at GQA-8: {times[(rep, 8)] / times[(rep, h)]:.1f}x slower than its MHA, "
              f"{times[(rep, 8)] / times[(ours, 8)]:.1f}x slower than mhalib")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's choice, then 1 as well)")
    args = parser.parse_args(argv)
    h, n, d = args.heads, args.tokens, args.head_dim
    kv_heads = [g for g in (h, 8, 1) if h % g == 0]
    # All threads first, then one: on a machine shared with other work a second thread
    # often waits for the first to be scheduled, and the one-thread ratios are steadier.
    counts = [args.threads] if args.threads else sorted({torch.get_num_threads(), 1}, reverse=True)
    for threads in counts:
        torch.set_num_threads(threads)
        report(n, h, d, kv_heads, args.repeat)
    ours_p, sdpa_p = run_prefill()
    print(f"\nprefill (N_q = N_k = 1,024, H 8, g 2, d_head 64, causal, {torch.get_num_threads()} thread(s)): "
          f"grouped_attention / SDPA enable_gqa time {ours_p / sdpa_p:.2f} (why GroupedQueryAttention "
          f"sends several queries to SDPA and one decoding query to grouped_attention)")


if __name__ == "__main__":
    main()
