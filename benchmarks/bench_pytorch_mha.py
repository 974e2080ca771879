"""Notebook 03's speed comparison, at more sizes: one multi-head attention, five ways.

* loop: one head at a time, each with its own slice of the weights (notebook 02's first version);
* vectorised: one product per projection, split into heads, explicit (B, H, N, N) scores;
* fused SDPA: one Q/K/V product and ``F.scaled_dot_product_attention``;
* ``nn.MultiheadAttention`` (eval, ``need_weights=False``);
* ``mhalib.MultiHeadAttention``.

All five hold the same weights and are checked equal before timing. CPU, fp32, no
autograd. In every round each variant runs once, in turn, so machine load hits all of
them alike; the report is each variant's median time divided by fused SDPA's (1.00 = as
fast, above 1 = slower).

Usage: python benchmarks/bench_pytorch_mha.py [--threads N]
"""

from __future__ import annotations

import math
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from common import print_table

from mhalib.attention import MultiHeadAttention, to_nn_multihead_attention

# (B, N, d_model, H): tiny (overhead), a medium batch, a long sequence
SIZES = [(1, 16, 64, 8), (8, 128, 256, 8), (4, 512, 512, 8), (1, 2048, 256, 8)]


def mha_loop(x, w_qkv, w_o, num_heads):
    """One head at a time; weights as ``nn.Linear`` stores them, ``(d_out, d_in)``."""
    b, n, d_model = x.shape  # (B, N, d_model)
    d_head = d_model // num_heads
    w_q, w_k, w_v = w_qkv.chunk(3)  # each (d_model, d_model)
    heads = []
    for h in range(num_heads):
        rows = slice(h * d_head, (h + 1) * d_head)
        q, k, v = x @ w_q[rows].T, x @ w_k[rows].T, x @ w_v[rows].T  # each (B, N, d_head)
        weights = (q @ k.transpose(-2, -1) / math.sqrt(d_head)).softmax(dim=-1)  # (B, N, N)
        heads.append(weights @ v)  # (B, N, d_head)
    return torch.cat(heads, dim=-1) @ w_o.T  # (B, N, d_model)


def mha_vectorised(x, w_qkv, w_o, num_heads):
    """All heads at once with explicit scores ``(B, H, N, N)``."""
    b, n, d_model = x.shape  # (B, N, d_model)
    d_head = d_model // num_heads
    q, k, v = (x @ w.T for w in w_qkv.chunk(3))  # each (B, N, d_model)
    q, k, v = (t.view(b, n, num_heads, d_head).transpose(1, 2) for t in (q, k, v))  # each (B, H, N, d_head)
    weights = (q @ k.transpose(-2, -1) / math.sqrt(d_head)).softmax(dim=-1)  # (B, H, N, N)
    out = weights @ v  # (B, H, N, d_head)
    return out.transpose(1, 2).reshape(b, n, d_model) @ w_o.T  # (B, N, d_model)


def mha_fused(x, w_qkv, w_o, num_heads):
    """One fused Q/K/V product, then ``F.scaled_dot_product_attention``."""
    b, n, d_model = x.shape  # (B, N, d_model)
    qkv = (x @ w_qkv.T).view(b, n, 3, num_heads, d_model // num_heads)  # (B, N, 3, H, d_head)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, N, d_head)
    out = F.scaled_dot_product_attention(q, k, v)  # (B, H, N, d_head)
    return out.transpose(1, 2).reshape(b, n, d_model) @ w_o.T  # (B, N, d_model)


def time_in_turns(fns, *, repeat=5, warmup=1):
    """Median seconds of each function; in every round each function runs once, in turn."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def variants(b, n, d_model, num_heads):
    """The five callables for one size, sharing one set of weights, checked equal."""
    ours = MultiHeadAttention(d_model, num_heads).eval()
    w_qkv = torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])  # (3 d_model, d_model)
    w_o = ours.o_proj.weight  # (d_model, d_model)
    ref = to_nn_multihead_attention(ours)
    x = torch.randn(b, n, d_model)  # (B, N, d_model)
    fns = {
        "loop": lambda: mha_loop(x, w_qkv, w_o, num_heads),
        "vectorised": lambda: mha_vectorised(x, w_qkv, w_o, num_heads),
        "fused SDPA": lambda: mha_fused(x, w_qkv, w_o, num_heads),
        "nn.MHA": lambda: ref(x, x, x, need_weights=False)[0],
        "mhalib": lambda: ours(x),
    }
    with torch.inference_mode():
        expected = fns["fused SDPA"]()
        diffs = {name: (fn() - expected).abs().max().item() for name, fn in fns.items()}
    for name, diff in diffs.items():
        if diff > 1e-4:
            raise SystemExit(f"{name} differs from fused SDPA by {diff:.2e} at B={b}, N={n}, "
                             f"d_model={d_model}, H={num_heads}")
    return fns


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: steadier ratios on a shared machine)")
    torch.set_num_threads(parser.parse_args(argv).threads)
    torch.manual_seed(0)
    rows = []
    for b, n, d_model, num_heads in SIZES:
        # Modules are built outside inference mode: parameters created inside it become
        # inference tensors, which slowed nn.MultiheadAttention's forward 1.7x (torch 2.13, CPU).
        fns = variants(b, n, d_model, num_heads)
        with torch.inference_mode():
            t = time_in_turns(fns)
        base = t["fused SDPA"]
        rows.append([f"B {b}, N {n}, d_model {d_model}, H {num_heads}",
                     *(f"{t[k] / base:.2f}" for k in t), f"{base * 1e3:.2f}"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), fp32, no grad; "
          "time / fused SDPA's time (1.00 = as fast)")
    print_table(["size", "loop", "vectorised", "fused SDPA", "nn.MHA", "mhalib", "fused SDPA ms"], rows)


if __name__ == "__main__":
    main()
