"""A fused grouped-query decode kernel in Numba: one pass over the KV cache, all queries at once.

Decoding adds one query token per sequence and attends to the whole cache, so the step is
a read of K and V with little arithmetic per byte. With g key/value heads shared by H
query heads, each K/V head must be read **once** for the R = H/g queries of its group,
and the arithmetic must happen *while* the rows stream in, not after. This module does
exactly that, in plain loops a reader can follow:

1. :func:`block_partials`: the keys of every (sequence, K/V head) pair are cut into
   blocks, and the blocks are shared out over the cores (``prange``). A block's rows of K
   and V are read once; each row meets all R queries of the group while it is in the
   core's L1 cache. A running maximum and a running sum per query (the *online
   softmax*) mean no score is ever stored. The row ``AHEAD`` places further on is
   asked for early (a software prefetch), so the arithmetic on one row and the read of
   the next happen at the same time instead of taking turns.
2. :func:`merge_blocks`: the blocks' partial results are merged by their log-sum-exp
   (rescaled to the largest maximum), which gives the exact softmax over all keys.

:func:`fused_decode` checks the inputs and runs both on torch tensors; it equals
``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` for one query token
(``tests/test_fused_decode.py``). ``benchmarks/bench_decode.py`` measures it against a
streaming read of the same bytes.

Numba is imported on the first call, not with this module: ``import mhalib`` stays fast,
and without Numba only this kernel is unavailable. The two functions are also plain
Python (``prange`` is ``range`` until they are compiled), so the same code runs,
slowly, without Numba.

Shapes: B batch, H query heads, g key/value heads, R = H/g queries per K/V head,
n cached tokens, d = head_dim.
"""

from __future__ import annotations

import math

import numpy as np

from mhalib.validation import check_divisible

__all__ = ["KEY_BLOCK", "AHEAD", "block_partials", "merge_blocks", "fused_decode", "compile_kernels", "streaming_read"]

#: Keys per block: the unit of work one core takes. Measured (``benchmarks/bench_decode.py
#: --fused-blocks``): from 256 to 4,096 keys it makes little difference; much smaller blocks
#: add merge work, much larger ones leave a core idle at the end of a short cache.
KEY_BLOCK = 512

#: Rows of K and V asked for ahead of the one being used (a software prefetch). Measured
#: (``benchmarks/bench_decode.py``, Intel Xeon, 2 threads, 32,768 tokens): without it the
#: arithmetic on a row and the read of the next take turns, and the kernel read the cache at
#: about 82% of the streaming read for MHA and 62% for GQA-8; with it, about 100% and 89%
#: (with the four-queries-at-a-time loop). From 2 to 8 rows ahead measured alike, within
#: the noise of the machine; 4 is kept.
AHEAD = 4

#: A finite stand-in for minus infinity: the compiled kernel assumes no infinities (fastmath).
_LOWEST = np.float32(-3.0e38)

prange = range  # numba.prange once the kernels are compiled (see compile_kernels)


def python_prefetch(address):
    """Ask the memory system for the 64-byte line at ``address`` now, to be used soon.

    A hint that changes no value: in plain Python it does nothing; compiled,
    :func:`block_partials` calls LLVM's ``llvm.prefetch`` instead (:func:`_compiled_prefetch`).
    """
    return None


prefetch = python_prefetch  # the compiled hint once the kernels are compiled (see compile_kernels)


def block_partials(q, k, v, block, m, l, acc):
    """Each key block's softmax statistics and unnormalised output, for every query of its group.

    Args:
        q: ``(B, g, R, d)`` float32, the queries already multiplied by ``1 / sqrt(d)``.
        k, v: ``(B, g, n, d)`` float32, the cache (rows contiguous).
        block: keys per block.
        m, l: ``(B, g, blocks, R)`` float32, filled with each block's maximum score and
            its sum of ``exp(score - maximum)``.
        acc: ``(B, g, blocks, R, d)`` float32, filled with each block's
            ``sum_t exp(score_t - maximum) * v_t``.
    """
    batch, groups, rep, d = q.shape
    n = k.shape[2]
    blocks = m.shape[2]
    row = d * 4  # bytes in a row of K (or V)
    for task in prange(batch * groups * blocks):  # (sequence, K/V head, key block): shared out over the cores
        b, h, j = task // (groups * blocks), task // blocks % groups, task % blocks
        qh, kh, vh = q[b, h], k[b, h], v[b, h]  # (R, d), (n, d), (n, d)
        mj, lj, accj = m[b, h, j], l[b, h, j], acc[b, h, j]  # (R,), (R,), (R, d): this block's results
        mj[:] = _LOWEST
        lj[:] = 0.0
        accj[:] = 0.0
        end = min((j + 1) * block, n)
        k_at, v_at = kh.ctypes.data, vh.ctypes.data  # where the rows start in memory
        for t in range(j * block, end):  # each row of K and V is read once ...
            if t + AHEAD < end:  # ... and the row AHEAD further on is asked for now, to arrive meanwhile
                for line in range(0, row, 64):
                    prefetch(k_at + (t + AHEAD) * row + line)
                    prefetch(v_at + (t + AHEAD) * row + line)
            kt, vt = kh[t], vh[t]  # (d,), (d,): this row of K and of V
            if rep % 4 == 0:  # the group's queries four at a time: each number of the row loaded once for four
                for r in range(0, rep, 4):
                    q0, q1, q2, q3 = qh[r], qh[r + 1], qh[r + 2], qh[r + 3]  # (d,) each
                    s0 = s1 = s2 = s3 = np.float32(0.0)
                    for c in range(d):  # the loop the compiler vectorises: 8 or 16 floats per instruction
                        x = kt[c]
                        s0 += q0[c] * x
                        s1 += q1[c] * x
                        s2 += q2[c] * x
                        s3 += q3[c] * x
                    p0, p1 = weigh(mj, lj, accj, r, s0), weigh(mj, lj, accj, r + 1, s1)
                    p2, p3 = weigh(mj, lj, accj, r + 2, s2), weigh(mj, lj, accj, r + 3, s3)
                    a0, a1, a2, a3 = accj[r], accj[r + 1], accj[r + 2], accj[r + 3]  # (d,) each
                    for c in range(d):
                        y = vt[c]
                        a0[c] += p0 * y
                        a1[c] += p1 * y
                        a2[c] += p2 * y
                        a3[c] += p3 * y
            else:
                for r in range(rep):  # ... and meets every query of the group while it is in L1
                    s = np.float32(0.0)
                    for c in range(d):
                        s += qh[r, c] * kh[t, c]
                    p = weigh(mj, lj, accj, r, s)
                    for c in range(d):
                        accj[r, c] += p * vh[t, c]


def python_weigh(m, l, acc, r, s):
    """The online softmax's step for query ``r`` and a key of score ``s``: returns the key's
    weight ``exp(s - m[r])``, having added it to ``l[r]``; first, if ``s`` is a new running
    maximum, rescales what was summed so far (``l[r]``, ``acc[r]``) to it.

    ``m, l``: ``(R,)``; ``acc``: ``(R, d)``. Compiled with the kernel (see compile_kernels).
    """
    if s > m[r]:  # a new running maximum: rescale what was summed so far
        shrink = math.exp(m[r] - s)
        l[r] *= shrink
        for c in range(acc.shape[1]):
            acc[r, c] *= shrink
        m[r] = s
    p = math.exp(s - m[r])  # this key's weight, relative to the running maximum
    l[r] += p
    return p


weigh = python_weigh  # compiled into the kernel once the kernels are compiled (see compile_kernels)


def merge_blocks(m, l, acc, out):
    """Merge the blocks' partial results by their log-sum-exp into the attention output.

    Block j holds ``l_j = sum exp(s - m_j)`` and ``acc_j = sum exp(s - m_j) v`` over its
    keys. With ``M = max_j m_j``, ``w_j = exp(m_j - M)``, the softmax over all keys gives
    ``out = sum_j w_j acc_j / sum_j w_j l_j``: exact, and no ``exp`` can overflow.

    Args:
        m, l: ``(B, g, blocks, R)``; acc: ``(B, g, blocks, R, d)`` from :func:`block_partials`.
        out: ``(B, g, R, d)`` float32, filled with the output.
    """
    batch, groups, blocks, rep = m.shape
    for task in prange(batch * groups):  # (sequence, K/V head)
        b, h = task // groups, task % groups
        for r in range(rep):
            top = m[b, h, 0, r]
            for j in range(1, blocks):
                top = max(top, m[b, h, j, r])  # M: the largest block maximum
            total = np.float32(0.0)
            out[b, h, r, :] = 0.0
            for j in range(blocks):
                w = math.exp(m[b, h, j, r] - top)  # w_j <= 1
                total += w * l[b, h, j, r]
                for c in range(out.shape[3]):
                    out[b, h, r, c] += w * acc[b, h, j, r, c]
            for c in range(out.shape[3]):
                out[b, h, r, c] /= total


def read_rows(k, v):
    """A streaming read of K and V as the kernel reads them: row by row, both at once.

    The yardstick for the kernel: its time is the least a pass over these bytes costs on
    this machine. Each block of rows is summed into ``d`` lanes (independent sums that
    the compiler keeps in vector registers), so the loop waits on memory, not on additions.

    Args:
        k, v: ``(rows, d)`` float32.

    Returns:
        The sum of all their numbers (only so that the read cannot be skipped).
    """
    rows, d = k.shape
    chunk = 512
    total = 0.0
    for part in prange(-(-rows // chunk)):  # blocks of rows, shared out over the cores
        lanes = np.zeros(d, np.float32)  # (d,)
        for t in range(part * chunk, min((part + 1) * chunk, rows)):
            for c in range(d):
                lanes[c] += k[t, c] + v[t, c]
        total += lanes.sum()
    return total


_compiled = {}


def compile_kernels():
    """Compile :func:`block_partials` and :func:`merge_blocks` with Numba (once per process).

    Returns the two compiled functions (:func:`read_rows` is compiled too, for
    :func:`streaming_read`). Numba keeps the machine code on disk
    (``cache=True``), so a later process loads it instead of compiling again. Raises
    ``ImportError`` naming ``pip install numba`` when Numba is missing.
    """
    if not _compiled:
        try:
            import numba
        except ImportError as error:
            raise ImportError("mhalib.fused_decode needs Numba: pip install numba "
                              "(the course pins it in requirements/lock.txt)") from error
        global prange, prefetch, weigh
        prange = numba.prange  # read by Numba when it compiles the loops below
        prefetch = _compiled_prefetch()
        weigh = numba.njit(fastmath=True, cache=True, inline="always")(python_weigh)
        jit = numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
        _compiled["partials"] = jit(block_partials)
        _compiled["merge"] = jit(merge_blocks)
        _compiled["read"] = jit(read_rows)
    return _compiled["partials"], _compiled["merge"]


def _compiled_prefetch():
    """:func:`prefetch` for compiled code: LLVM's ``llvm.prefetch`` on the address (a read,
    kept in every cache level), through Numba's ``intrinsic``."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def prefetch_line(typingctx, address):
        def codegen(context, builder, signature, args):
            pointer = builder.inttoptr(args[0], ir.IntType(8).as_pointer())
            i32 = ir.IntType(32)
            hint = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [pointer.type, i32, i32, i32]), "llvm.prefetch.p0")
            builder.call(hint, [pointer, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])  # read, keep, data
            return context.get_dummy_value()

        return types.void(types.intp), codegen

    return prefetch_line


def _check(q, k, v, block):
    """Raise ValueError unless q (B, H, 1, d), k and v (B, g, n, d) are float32 on the CPU."""
    import torch

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"fused_decode works on float32 CPU tensors; got {name} of dtype {x.dtype} "
                             f"on {x.device} (use .float().cpu())")
        if x.dim() != 4:
            raise ValueError(f"fused_decode needs 4-D q (B, H, 1, d) and k, v (B, g, n, d); "
                             f"got {name} of shape {tuple(x.shape)}")
    b, h, n_q, d = q.shape
    if n_q != 1:
        raise ValueError(f"fused_decode attends one decoding query per head: q must be (B, H, 1, d); "
                         f"got N_q = {n_q} (use grouped_attention or SDPA for several queries)")
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d or k.shape[2] < 1:
        raise ValueError(f"k and v must both be (B={b}, g, n >= 1, d={d}); got k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    check_divisible(h, k.shape[1], "num_heads", "num_kv_heads")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive integer number of keys; got {block!r}")


def fused_decode(q, k, v, *, block=KEY_BLOCK, num_threads=None):
    """One decoding step of grouped-query attention, fused: each K/V head read once.

    Equivalent to ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` with one
    query token (no mask: a decoding query sees the whole cache), to float32 rounding.

    Args:
        q: ``(B, H, 1, d)`` float32.
        k, v: ``(B, g, n, d)`` float32 with g dividing H (a cache that is not contiguous
            is copied first).
        block: keys per block (the unit of work of one core).
        num_threads: Numba threads for this call (default: Numba's current setting).

    Returns:
        ``(B, H, 1, d)`` float32 tensor.
    """
    import torch

    _check(q, k, v, block)
    partials, merge = compile_kernels()
    b, h, _, d = q.shape
    g, n = k.shape[1], k.shape[2]
    rep, blocks = h // g, -(-n // block)
    qg = (q.detach() * (1.0 / math.sqrt(d))).reshape(b, g, rep, d).numpy()  # (B, g, R, d): the group's queries
    kc = np.ascontiguousarray(k.detach().numpy())  # (B, g, n, d): no copy when contiguous
    vc = np.ascontiguousarray(v.detach().numpy())  # (B, g, n, d)
    m = np.empty((b, g, blocks, rep), np.float32)  # (B, g, blocks, R): each block's maximum
    l = np.empty((b, g, blocks, rep), np.float32)  # (B, g, blocks, R): each block's sum of weights
    acc = np.empty((b, g, blocks, rep, d), np.float32)  # (B, g, blocks, R, d): each block's weighted V
    out = np.empty((b, g, rep, d), np.float32)  # (B, g, R, d)
    if num_threads is not None:
        import numba

        before = numba.get_num_threads()
        numba.set_num_threads(num_threads)
    try:
        partials(qg, kc, vc, block, m, l, acc)
        merge(m, l, acc, out)
    finally:
        if num_threads is not None:
            numba.set_num_threads(before)
    return torch.from_numpy(out).view(b, h, 1, d)  # (B, H, 1, d)


def streaming_read(k, v):
    """Read every number of two equal float32 CPU tensors ``(..., d)`` once (compiled :func:`read_rows`)."""
    compile_kernels()
    d = k.shape[-1]
    return _compiled["read"](k.detach().numpy().reshape(-1, d), v.detach().numpy().reshape(-1, d))  # (rows, d) each
