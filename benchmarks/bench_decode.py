"""Decode benchmark: one new query token against a long KV cache, MHA vs GQA vs MQA.

Decoding reads the whole KV cache for every new token. The bytes shrink with the number g
of key/value heads; the arithmetic does not: every one of the H query heads still scores
all n keys and mixes all n values, 4 H n d FLOPs. So the step is bound by memory while
H / g is small and by arithmetic once enough queries share each K/V row, and a kernel
must be fast at both ends for fewer K/V heads to keep paying.

Two reports, each at every thread count asked for:

1. **The sweep** of the fused kernel (``mhalib.fused_decode``, Numba): g = 32, 16, 8, 4, 2, 1
   at H = 32, d_head 128, and real models' shapes (:data:`REAL_SHAPES`, each with the MHA
   of the same H and d_head beside it). Each row: the time; the fraction of a streaming
   read of the same K and V bytes timed in the same rounds ("of read": 100% is a step that
   costs no more than reading the cache); the GFLOP/s reached, against the multiply-add
   peak of a Numba loop timed in the same rounds (``benchmarks/fma_peak.py``); which of
   the two limits binds at those rates; and the speedup over the MHA row. Then the goals:
   the time never grows as g falls (within 5%), MQA at least 5x faster than MHA, MHA at
   90% and GQA-8 at 75% of the read, and every real shape at 75% of the read or 40% of
   the peak, whichever limit binds.
2. **Four ways** to attend with g < H key/value heads, at g = 32, 8, 1:

   * ``grouped_attention`` (mhalib): the H / g query heads of a group stacked as rows,
     multiplied against the group's un-repeated K and V;
   * ``fused_decode`` (mhalib, Numba): the kernel of the sweep;
   * ``F.scaled_dot_product_attention(..., enable_gqa=True)`` (PyTorch >= 2.5);
   * ``repeat_kv`` then SDPA: materialise H key/value heads first (copies the cache).

Reported with them: the processor and the BLAS torch uses; each time is the best of several
interleaved rounds (the least disturbed on a shared machine); the streaming read is the
faster of NumPy's ``sum`` and a Numba read that sums K and V row by row, as the fused
kernel reads them. Caches are flushed between calls by writing a buffer larger than the
last-level cache. Numba's first-call compilation (or loading of its cached machine code) is
timed apart and kept out of the rounds.

``--variants`` times other ways to write the shared-K/V product (one product per block of
``KEY_BLOCK`` keys, keys as rows, every block in one batched product, per-block softmaxes
merged by their log-sum-exp, one matrix-vector product per query head) against mhalib's
plain formula (one product over all keys), each checked against SDPA first, so that a
choice of formulation is a measurement on the machine at hand.
``--fused-blocks`` times ``fused_decode`` with several key-block sizes instead.
``--passes`` times each pass of ``fused_decode`` (scores, softmax, values) alone, on one thread, on
a block of keys held in the core's caches: the kernel's arithmetic without its reads, for every R
and d_head of the sweep (the default run prints the same table at its end).
``--device cuda`` runs the four ways on a GPU, where SDPA's fused kernels are the reference.

Usage: python benchmarks/bench_decode.py [--tokens N] [--repeat R] [--threads T]
       [--no-sweep] [--variants] [--fused-blocks] [--passes] [--device cpu|cuda]
(without --threads: once with every thread torch uses, then once with one thread; the
thread count applies to torch and to Numba alike)
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, print_table  # noqa: E402
import fma_peak  # noqa: E402  (the multiply-add peak of a Numba loop)

from mhalib import fused_decode  # noqa: E402  (imports NumPy only; Numba on first call)
from mhalib.attention import grouped_attention, repeat_kv  # noqa: E402

#: Keys per block in the blocked variants (1,024 keys of d_head 128 in fp32 are 512 KiB: they
#: fit a core's L2 cache).
KEY_BLOCK = 1024
FLUSH_BYTES = 256 * 2**20  # larger than any last-level cache this runs on
#: The reference: a streaming read of the same K and V bytes, timed in the same rounds
#: (the faster of the two reads below, per g and thread count).
READ = "streaming read of K and V"
NUMPY_READ = "read: NumPy sum"
NUMBA_READ = "read: Numba rows"
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
FUSED = "mhalib fused_decode (Numba)"

#: The sweep's numbers of K/V heads at H = 32: MHA, GQA-16 ... GQA-2, MQA.
SWEEP_KV_HEADS = (32, 16, 8, 4, 2, 1)
#: Real models' attention shapes, as their published configurations give them:
#: (name, H, g, d_head, source). d_head = hidden_size / num_attention_heads in each.
REAL_SHAPES = (
    ("Qwen2-7B", 28, 4, 128, "Qwen/Qwen2-7B config.json: num_attention_heads 28, num_key_value_heads 4, "
                             "hidden_size 3584"),
    ("Qwen2.5-14B", 40, 8, 128, "Qwen/Qwen2.5-14B config.json: num_attention_heads 40, num_key_value_heads 8, "
                                "hidden_size 5120"),
    ("Llama-2-70B", 64, 8, 128, "meta-llama/Llama-2-70b-hf config.json: num_attention_heads 64, "
                                "num_key_value_heads 8, hidden_size 8192"),
    ("Falcon-40B", 128, 8, 64, "tiiuae/falcon-40b config.json: num_attention_heads 128, num_kv_heads 8, "
                               "hidden_size 8192"),
    ("Falcon-7B", 71, 1, 64, "tiiuae/falcon-7b config.json: n_head 71, multi_query true (one K/V head), "
                             "hidden_size 4544"),
)
#: The sweep's goals: a memory-bound shape reads its cache at this fraction of the streaming read
#: at least, a compute-bound one reaches this fraction of the multiply-add peak.
GOAL_OF_READ, GOAL_OF_PEAK = 0.75, 0.40


def processor():
    """The processor's name, from /proc/cpuinfo where there is one."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas():
    """The BLAS torch was built with, as its build configuration names it."""
    config = torch.__config__.show()
    names = [name for name in ("MKL", "OpenBLAS", "Accelerate", "BLIS") if f"BLAS_INFO={name.lower()}" in config
             or f"BLAS_INFO={name}" in config]
    mkl = torch.backends.mkl.is_available()
    dnn = torch.backends.mkldnn.is_available()
    return (f"{names[0] if names else 'BLAS unnamed in torch.__config__'}; MKL available: {mkl}, "
            f"oneDNN (mkldnn) available: {dnn}")


def set_threads(threads):
    """Use ``threads`` threads in torch and in Numba (as many as Numba has, at most)."""
    torch.set_num_threads(threads)
    if HAVE_NUMBA:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


def compile_seconds():
    """Seconds of Numba's first call: compiling the kernels, or loading them from its cache."""
    start = time.perf_counter()
    q, k = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 3, 8)
    fused_decode.fused_decode(q, k, k)
    fused_decode.streaming_read(k, k)
    return time.perf_counter() - start


def make_flush(nbytes=FLUSH_BYTES, device="cpu"):
    """Return a function that evicts the caches by writing ``nbytes`` of fresh memory."""
    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)

    def flush():
        buf.add_(1.0)

    return flush


def make_sync(device):
    """What waits for the device to finish: nothing on a CPU, the stream on a GPU."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


def methods():
    fused = {FUSED: lambda q, k, v: fused_decode.fused_decode(q, k, v)} if HAVE_NUMBA else {}
    return {
        "mhalib grouped_attention": lambda q, k, v: grouped_attention(q, k, v),
        **fused,
        "SDPA enable_gqa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "repeat_kv + SDPA": lambda q, k, v: F.scaled_dot_product_attention(
            q, repeat_kv(k, q.shape[1] // k.shape[1]), repeat_kv(v, q.shape[1] // k.shape[1])),
    }


# Other ways to write one decoding query against g shared K/V heads (``--variants``).
# Each takes q (B, H, 1, d) and k, v (B, g, n, d) and returns (B, H, 1, d).

def _grouped_queries(q, g):
    """``(B, H, 1, d) -> (B, g, H/g, d)``, scaled by ``1 / sqrt(d)``."""
    b, h, _, d = q.shape
    return (q * (1.0 / math.sqrt(d))).reshape(b, g, h // g, d)


def key_blocks(q, k, v, block=KEY_BLOCK):
    """One score product per block of ``block`` keys, so the block being read stays in the core's
    cache while every query row of the group meets it; then softmax, then one product with V."""
    qg = _grouped_queries(q, k.shape[1])  # (B, g, H/g, d)
    scores = torch.cat([qg @ kb.transpose(-1, -2) for kb in k.split(block, dim=2)], dim=-1)  # (B, g, H/g, n)
    return (torch.softmax(scores, dim=-1) @ v).view(q.shape)


def keys_as_rows(q, k, v):
    """The group's queries as the columns of one product, ``K @ Q^T`` (keys as rows)."""
    scores = (k @ _grouped_queries(q, k.shape[1]).transpose(-1, -2)).transpose(-1, -2)  # (B, g, H/g, n)
    return (torch.softmax(scores, dim=-1) @ v).view(q.shape)


def _block_scores(q, k, block):
    """Scores of every key block of every group in one batched product: ``(B*g, n/block, H/g, block)``.

    Needs n to be a multiple of ``block``: otherwise the blocks of one group and the
    next cannot share one batch stride, and ``reshape`` would copy the whole cache.
    """
    b, g, n, d = k.shape
    if n % block:
        raise ValueError(f"n = {n} is not a multiple of the block of {block} keys")
    blocks, rep = n // block, q.shape[1] // g
    qb = _grouped_queries(q, g).reshape(b * g, 1, rep, d).expand(b * g, blocks, rep, d)
    qb = qb.reshape(b * g * blocks, rep, d)  # (B*g*blocks, H/g, d): a small copy of q
    scores = torch.bmm(qb, k.reshape(b * g * blocks, block, d).transpose(1, 2))  # (B*g*blocks, H/g, block)
    return scores.view(b * g, blocks, rep, block)


def batched_blocks(q, k, v, block=KEY_BLOCK):
    """Like :func:`key_blocks`, but every block of every group in one batched product."""
    b, g, n, _ = k.shape
    scores = _block_scores(q, k, block).transpose(1, 2).reshape(b, g, q.shape[1] // g, n)  # (B, g, H/g, n)
    return (torch.softmax(scores, dim=-1) @ v).view(q.shape)


def flash_decoding(q, k, v, block=KEY_BLOCK):
    """A softmax per key block, merged by each block's maximum and sum (its log-sum-exp)."""
    b, g, n, d = k.shape
    scores = _block_scores(q, k, block)  # (B*g, blocks, H/g, block)
    blocks, rep = scores.shape[1], scores.shape[2]
    m = scores.amax(dim=-1, keepdim=True)  # (B*g, blocks, H/g, 1): each block's maximum
    p = torch.exp(scores - m)
    partial = torch.bmm(p.view(-1, rep, block), v.reshape(b * g * blocks, block, d))
    partial = partial.view(b * g, blocks, rep, d)  # each block's unnormalised output
    scale = torch.exp(m - m.amax(dim=1, keepdim=True))  # (B*g, blocks, H/g, 1): to the global maximum
    out = (scale * partial).sum(dim=1) / (scale[..., 0] * p.sum(dim=-1)).sum(dim=1)[..., None]
    return out.view(q.shape)


def per_head_vectors(q, k, v):
    """One matrix-vector product per query head: K and V read once per query head."""
    rep = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    outs = []
    for head in range(q.shape[1]):
        kh, vh = k[:, head // rep], v[:, head // rep]  # (B, n, d)
        weights = torch.softmax((q[:, head] * scale) @ kh.transpose(-1, -2), dim=-1)  # (B, 1, n)
        outs.append(weights @ vh)  # (B, 1, d)
    return torch.stack(outs, dim=1)  # (B, H, 1, d)


def fused_blocks(sizes=(128, 512, 2048, 8192)):
    """``fused_decode`` with several key-block sizes (``--fused-blocks``)."""
    return {f"fused_decode, block {size}": (lambda size: lambda q, k, v: fused_decode.fused_decode(
        q, k, v, block=size))(size) for size in sizes}


def variants():
    return {
        "mhalib grouped_attention": lambda q, k, v: grouped_attention(q, k, v),
        "a product per block of keys": key_blocks,
        "keys as rows (K @ Q^T)": keys_as_rows,
        "all blocks in one bmm": batched_blocks,
        "flash-decoding (block softmax + LSE)": flash_decoding,
        "one matrix-vector product per head": per_head_vectors,
    }


def run(num_tokens=32_768, num_heads=32, head_dim=128, kv_heads=(32, 8, 1), repeat=7, warmup=1,
        fns=None, device="cpu"):
    """Time every method for every g; return rows ``(method, g, seconds)``.

    ``fns`` maps names to ``fn(q, k, v)`` (default :func:`methods`); each is checked
    against SDPA on ``repeat_kv`` before it is timed, and the streaming read is added.

    The calls are interleaved (one call of every method and g per round, ``repeat``
    rounds), so a change in the machine's load during the run moves all of them
    together. Each pair reports its best round: on a shared machine the least
    disturbed run is the closest to what the hardware does.
    """
    fns = methods() if fns is None else fns
    torch.manual_seed(0)
    flush, sync = make_flush(device=device), make_sync(device)
    q = torch.randn(1, num_heads, 1, head_dim, device=device)  # (B, H, 1, d_head): one new token
    caches = {}
    for g in kv_heads:
        k = torch.randn(1, g, num_tokens, head_dim, device=device)  # (B, g, n, d_head)
        v = torch.randn(1, g, num_tokens, head_dim, device=device)  # (B, g, n, d_head)
        ref = F.scaled_dot_product_attention(q, repeat_kv(k, num_heads // g), repeat_kv(v, num_heads // g))
        for name, fn in fns.items():
            torch.testing.assert_close(fn(q, k, v), ref, atol=1e-4, rtol=1e-4,
                                       msg=lambda m, name=name, g=g: f"{name}, g = {g}: {m}")
        caches[g] = (k, v)
    reads = {NUMPY_READ: lambda q, k, v: (k.sum(), v.sum())}
    if HAVE_NUMBA and torch.device(device).type == "cpu":
        reads[NUMBA_READ] = lambda q, k, v: fused_decode.streaming_read(k, v)
    fns = {**fns, **reads}
    pairs = [(name, g) for g in kv_heads for name in fns]
    times = {pair: [] for pair in pairs}
    for round_ in range(warmup + repeat):
        for name, g in pairs:
            k, v = caches[g]
            flush()
            sync()
            start = time.perf_counter()
            fns[name](q, k, v)
            sync()
            if round_ >= warmup:
                times[(name, g)].append(time.perf_counter() - start)
    rows = [(name, g, min(times[(name, g)])) for name, g in pairs]
    return rows + [(READ, g, min(min(times[(name, g)]) for name in reads)) for g in kv_heads]


# The sweep of the fused kernel over g and over real models' shapes.

def sweep_kv_heads(num_heads):
    """g = H, H/2, H/4, ... while H/g stays a whole number, then 1: ``(32, 16, 8, 4, 2, 1)`` for H = 32."""
    kv = [num_heads]
    while kv[-1] % 2 == 0:
        kv.append(kv[-1] // 2)
    return tuple(kv) if kv[-1] == 1 else (*kv, 1)


def sweep_groups(num_heads=32, head_dim=128, kv_heads=SWEEP_KV_HEADS, shapes=REAL_SHAPES):
    """The sweep's shapes in groups: ``[(name, [(row label, H, g, d_head), ...]), ...]``.

    The first group is every g of ``kv_heads`` at ``num_heads``; then each real model, its
    own shape after the MHA of the same H and d_head (the group's first row: what the model
    would read with g = H).
    """
    groups = [(f"H = {num_heads}", [(label(g, num_heads), num_heads, g, head_dim) for g in kv_heads])]
    for name, h, g, d, _ in shapes:
        groups.append((name, [(f"{name} as MHA", h, h, d), (f"{name} ({label(g, h)})", h, g, d)]))
    return groups


def decode_flops(num_heads, num_tokens, head_dim):
    """FLOPs of one decoding step: every query head scores n keys and mixes n values, 2 FLOPs per multiply-add."""
    return 4 * num_heads * num_tokens * head_dim


def cache_bytes(num_kv_heads, num_tokens, head_dim):
    """Bytes of K and V in fp32."""
    return 2 * num_kv_heads * num_tokens * head_dim * 4


def run_sweep(groups, num_tokens=32_768, repeat=9, warmup=1):
    """Time ``fused_decode``, the streaming read of the same K and V, and the FMA loop, in rounds.

    Each group's shapes are timed in interleaved rounds (one call of each per round, the
    caches flushed before each call), so that a change in the machine's load moves them
    together; each round also times the multiply-add loop of ``fma_peak`` once, at the same
    thread count. Every shape is first checked against SDPA with ``enable_gqa``. K and V are
    separate tensors, as a KV cache holds them (one group's at a time in memory).

    Returns:
        ``(rows, peak)``: rows ``(group, row label, H, g, d_head, seconds, read seconds)``, each
        the best of its rounds (the read: the faster of the two reads); ``peak``, the best
        rate of the FMA loop over all rounds, in FLOP/s.
    """
    import numba

    fma_call, fma_work = fma_peak.make_timed(numba.get_num_threads())
    flush = make_flush()
    torch.manual_seed(0)
    reads = {NUMPY_READ: lambda q, k, v: (k.sum(), v.sum()),
             NUMBA_READ: lambda q, k, v: fused_decode.streaming_read(k, v)}
    fns = {FUSED: lambda q, k, v: fused_decode.fused_decode(q, k, v), **reads}
    rows, fma_best = [], float("inf")
    for group, shapes in groups:
        caches = []
        for _, h, g, d in shapes:
            q = torch.randn(1, h, 1, d)  # (1, H, 1, d): one new token
            k, v = torch.randn(1, g, num_tokens, d), torch.randn(1, g, num_tokens, d)  # (1, g, n, d) each
            torch.testing.assert_close(fns[FUSED](q, k, v), F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                                       atol=1e-4, rtol=1e-4, msg=lambda m, h=h, g=g, d=d: f"H {h}, g {g}, d {d}: {m}")
            caches.append((q, k, v))
        times = {(i, name): [] for i in range(len(shapes)) for name in fns}
        for round_ in range(warmup + repeat):
            start = time.perf_counter()
            fma_call()
            if round_ >= warmup:
                fma_best = min(fma_best, time.perf_counter() - start)
            for i, (q, k, v) in enumerate(caches):
                for name, fn in fns.items():
                    flush()
                    start = time.perf_counter()
                    fn(q, k, v)
                    if round_ >= warmup:
                        times[(i, name)].append(time.perf_counter() - start)
        for i, (row, h, g, d) in enumerate(shapes):
            read = min(min(times[(i, name)]) for name in reads)
            rows.append((group, row, h, g, d, min(times[(i, FUSED)]), read))
    return rows, fma_work / fma_best


def bound(h, g, d, n, read_seconds, peak):
    """Which limit binds a shape at the measured rates: ``"memory"`` when reading its cache takes
    longer than its arithmetic at the FMA peak, else ``"compute"``."""
    return "memory" if read_seconds >= decode_flops(h, n, d) / peak else "compute"


def sweep_table(rows, peak, n):
    """The sweep's rows as table lines (str), and each row's numbers by label."""
    mha = {group: seconds for group, _, h, g, _, seconds, _ in rows if g == h}
    table, numbers = [], {}
    for group, row, h, g, d, seconds, read in rows:
        rate = decode_flops(h, n, d) / seconds
        numbers[row] = dict(group=group, h=h, g=g, d=d, seconds=seconds, of_read=read / seconds, rate=rate,
                            of_peak=rate / peak, bound=bound(h, g, d, n, read, peak), speedup=mha[group] / seconds)
        x = numbers[row]
        table.append([row, h, g, d, f"{h / g:g}", f"{cache_bytes(g, n, d) / 2**20:,.0f}", f"{seconds * 1e3:.2f}",
                      f"{x['of_read']:.0%}", f"{rate / 1e9:.1f}", f"{x['of_peak']:.0%}", x["bound"],
                      f"{x['speedup']:.2f}x"])
    return table, numbers


def sweep_goals(rows, peak, n, num_heads=32):
    """The sweep's goals as ``[(sentence, met), ...]`` (the first group is the g sweep at ``num_heads``)."""
    _, numbers = sweep_table(rows, peak, n)
    first = rows[0][0]
    t = {x["g"]: x["seconds"] for x in numbers.values() if x["group"] == first}
    goals = []
    for g in sorted(t, reverse=True):
        if 2 * g in t:
            ratio = t[g] / t[2 * g]
            goals.append((f"g = {g} takes {ratio:.2f} of the time of g = {2 * g} (goal <= 1.05)", ratio <= 1.05))
    if num_heads in t and 1 in t and num_heads > 1:
        speedup = t[num_heads] / t[1]
        goals.append((f"MQA is {speedup:.2f}x faster than MHA (goal >= 5x; bytes {num_heads}x)", speedup >= 5))
    of_read = {x["g"]: x["of_read"] for x in numbers.values() if x["group"] == first}
    if num_heads in of_read:
        goals.append((f"MHA reads K and V at {of_read[num_heads]:.0%} of the streaming read (goal >= 90%)",
                      of_read[num_heads] >= 0.90))
    if 8 in of_read and num_heads > 8:
        goals.append((f"GQA-8 reads K and V at {of_read[8]:.0%} of the streaming read (goal >= 75%)",
                      of_read[8] >= 0.75))
    for row, x in numbers.items():
        if x["group"] == first or x["g"] == x["h"]:
            continue
        if x["bound"] == "memory":
            goals.append((f"{row}, memory-bound: {x['of_read']:.0%} of the streaming read "
                          f"(goal >= {GOAL_OF_READ:.0%})", x["of_read"] >= GOAL_OF_READ))
        else:
            goals.append((f"{row}, compute-bound: {x['of_peak']:.0%} of the FMA peak "
                          f"(goal >= {GOAL_OF_PEAK:.0%})", x["of_peak"] >= GOAL_OF_PEAK))
    return goals


def report_sweep(n, repeat, num_heads=32, head_dim=128, real=True):
    """Run the sweep at the current thread count and print its table and its goals."""
    import numba

    kv = sweep_kv_heads(num_heads)
    groups = sweep_groups(num_heads, head_dim, kv, REAL_SHAPES if real else ())
    rows, peak = run_sweep(groups, n, repeat=repeat)
    print(f"\nfused_decode sweep: B 1, one query token, cache n {n:,}, fp32, {numba.get_num_threads()} Numba "
          f"thread(s); caches flushed between calls; best of {repeat} rounds")
    print(f"multiply-add peak of a Numba loop (benchmarks/fma_peak.py), timed in the same rounds: "
          f"{peak / 1e9:.1f} GFLOP/s")
    table, _ = sweep_table(rows, peak, n)
    print_table(["shape", "H", "g", "d_head", "H/g", "K+V MiB", "ms", "of read", "GFLOP/s", "of FMA peak", "bound",
                 "speedup vs MHA"], table)
    print("bound: memory when reading the cache at the streaming rate takes longer than the arithmetic "
          "at the FMA peak, else compute")
    for sentence, met in sweep_goals(rows, peak, n, num_heads):
        print(f"  {'met   ' if met else 'MISSED'} {sentence}")
    return rows, peak


def report_passes(num_heads=32, head_dim=128, repeat=5, real=True):
    """Time each pass of the fused kernel on a block of keys held in the core's caches, one thread.

    For every group size of the sweep and every real shape (one row per distinct R = H/g and
    d_head): nanoseconds per key of the scores, the softmax and the values passes
    (``mhalib.fused_decode.time_passes``), and the FLOP rate of the scores and values passes
    (2 R d FLOPs per key each) against the multiply-add peak of a Numba loop timed on one
    thread just before. With the memory out of the way this is the kernel's arithmetic alone:
    a step bound by arithmetic cannot beat it, and a memory-bound step comes within it of its
    read only if the arithmetic hides behind the reads.
    """
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        peak = fma_peak.peak(1, rounds=repeat)
        shapes = [(label(g, num_heads), num_heads // g, head_dim) for g in sweep_kv_heads(num_heads)]
        shapes += [(name, h // g, d) for name, h, g, d, _ in (REAL_SHAPES if real else ())]
        seen, table = set(), []
        for name, rep, d in shapes:
            if (rep, d) in seen:
                continue
            seen.add((rep, d))
            ns = {key: x * 1e9 for key, x in fused_decode.time_passes(rep, d, rounds=repeat).items()}
            flops = 2 * rep * d  # per key, in each of the two product passes
            table.append([name, rep, fused_decode.padded_group(rep), d, f"{ns['scores']:.1f}", f"{ns['softmax']:.1f}",
                          f"{ns['values']:.1f}", f"{ns['all three']:.1f}",
                          f"{flops / ns['scores'] / (peak / 1e9):.0%}", f"{flops / ns['values'] / (peak / 1e9):.0%}",
                          f"{2 * flops / ns['all three'] / (peak / 1e9):.0%}"])
    finally:
        numba.set_num_threads(before)
    print(f"\nfused_decode, pass by pass: one thread, a block of {fused_decode.KEY_BLOCK} keys held in the core's "
          f"caches (no main-memory traffic: a best case); ns per key, best of {repeat}; FMA peak, one thread: {peak / 1e9:.1f} GFLOP/s")
    print_table(["shape", "R = H/g", "rows run", "d_head", "scores ns", "softmax ns", "values ns", "all three ns",
                 "scores of peak", "values of peak", "all three of peak"], table)
    print("of peak: the pass's 2 R d FLOPs per key (4 R d for all three) at its measured rate, over the peak; "
          "padded rows (rows run > R) count as no FLOPs")
    return table, peak


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


def where(device):
    """The device in words, for a report's heading."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU, {torch.get_num_threads()} thread(s)"


def label(g, h):
    return "MHA" if g == h else ("MQA" if g == 1 else f"GQA-{g}")


def report_variants(n, h, d, kv_heads, repeat, device="cpu", fns=None):
    """Time the ways of writing the shared-K/V product; print each against the read and mhalib."""
    print(f"\ndecode variants: B 1, one query token, cache n {n:,}, H {h}, d_head {d}, fp32, "
          f"{where(device)}; best of {repeat} rounds")
    fns = {"mhalib grouped_attention": variants()["mhalib grouped_attention"], **fns} if fns else variants()
    rows = run(n, h, d, kv_heads, repeat=repeat, fns=fns, device=device)
    times = {(name, g): s for name, g, s in rows}
    ours = "mhalib grouped_attention"
    table = [[name, f"g = {g}", f"{s * 1e3:.2f}", f"{times[(READ, g)] / s:.0%}", f"{times[(ours, g)] / s:.2f}x",
              f"{times[(name, h)] / s:.2f}x"]
             for name, g, s in rows if name not in (READ, NUMPY_READ, NUMBA_READ)]
    print_table(["method", "K/V heads", "ms", "of read", "speed vs mhalib", "speedup vs its MHA"], table)


def report(n, h, d, kv_heads, repeat, device="cpu"):
    """Run the decode benchmark at the current thread count and print its table."""
    print(f"\ndecode: B 1, one query token, cache n {n:,}, H {h}, d_head {d}, fp32, "
          f"{where(device)}; caches flushed between calls; best of {repeat} rounds")
    rows = run(n, h, d, kv_heads, repeat=repeat, device=device)
    times = {(name, g): s for name, g, s in rows}
    table = []
    for name, g, s in rows:
        nbytes = 2 * g * n * d * 4
        table.append([name, label(g, h), f"{nbytes / 2**20:,.0f}", f"{s * 1e3:.2f}", f"{nbytes / s / 1e9:.1f}",
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
    if (FUSED, h) in times:
        print(f"fused_decode MHA / mhalib MHA time: {times[(FUSED, h)] / times[(ours, h)]:.2f}; "
              f"MQA: {times[(FUSED, 1)] / times[(ours, 1)]:.2f} (the sweep above measures the fused kernel "
              f"over every g)" if (FUSED, 1) in times else "")

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's choice, then 1 as well)")
    parser.add_argument("--variants", action="store_true",
                        help="time other ways to write the shared-K/V product instead")
    parser.add_argument("--fused-blocks", action="store_true",
                        help="time fused_decode with several key-block sizes instead")
    parser.add_argument("--no-sweep", action="store_true",
                        help="leave out the sweep of fused_decode over g and real models' shapes")
    parser.add_argument("--no-real", action="store_true",
                        help="sweep g alone, without the real models' shapes (they hold up to 2 GiB of cache)")
    parser.add_argument("--passes", action="store_true",
                        help="time each pass of fused_decode alone, in the core's caches, on one thread, and stop")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    h, n, d = args.heads, args.tokens, args.head_dim
    kv_heads = [g for g in (h, 8, 1) if h % g == 0]
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    if args.variants and n % KEY_BLOCK:
        parser.error(f"--variants: --tokens must be a multiple of {KEY_BLOCK} (the block of the batched variants)")
    if (args.fused_blocks or args.passes) and not HAVE_NUMBA:
        parser.error(f"{'--passes' if args.passes else '--fused-blocks'} needs Numba: pip install numba")
    if args.device == "cuda":
        (report_variants if args.variants else report)(n, h, d, kv_heads, args.repeat, device="cuda")
        return
    print(f"processor: {processor()}; torch {torch.__version__}, BLAS: {blas()}")
    if HAVE_NUMBA:
        import numba

        print(f"Numba {numba.__version__}: first call (compiling the kernels, or loading them from Numba's "
              f"cache) {compile_seconds():.1f} s, kept out of the timings")
    else:
        print("Numba is not installed (pip install numba): fused_decode and the Numba read are left out")
    if args.passes:
        report_passes(h, d, real=not args.no_real)
        return
    # All threads first, then one: on a machine shared with other work a second thread
    # often waits for the first to be scheduled, and the one-thread ratios are steadier.
    counts = [args.threads] if args.threads else sorted({torch.get_num_threads(), 1}, reverse=True)
    for threads in counts:
        set_threads(threads)
        if args.fused_blocks:
            report_variants(n, h, d, kv_heads, args.repeat, fns=fused_blocks())
        elif args.variants:
            report_variants(n, h, d, kv_heads, args.repeat)
        else:
            if HAVE_NUMBA and not args.no_sweep:
                report_sweep(n, args.repeat, h, d, real=not args.no_real)
            report(n, h, d, kv_heads, args.repeat)
    if args.variants or args.fused_blocks:
        return
    if HAVE_NUMBA and not args.no_sweep:
        report_passes(h, d, real=not args.no_real)
    ours_p, sdpa_p = run_prefill()
    print(f"\nprefill (N_q = N_k = 1,024, H 8, g 2, d_head 64, causal, {torch.get_num_threads()} thread(s)): "
          f"grouped_attention / SDPA enable_gqa time {ours_p / sdpa_p:.2f} (why GroupedQueryAttention "
          f"sends several queries to SDPA and one decoding query to grouped_attention)")


if __name__ == "__main__":
    main()
