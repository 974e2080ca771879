"""Greedy generation with and without a KV cache, for every model of the course.

Decoding is a loop: run the model, take the most likely next token, append it, run
again. Without a cache each step runs the model over the whole sequence so far; with one
(a :class:`~mhalib.kv_cache.KVCache` per layer) the prompt goes through once (*prefill*)
and then each step runs the model on the one new token, whose queries attend to the
cached keys and values (*decode*). Both give the same tokens and, to float rounding, the
same logits (``tests/test_generate.py``); notebook 06 shows it on the trained language model.

Works for every model of the course, a :class:`~mhalib.decoder.Decoder` of either family
(any ``num_kv_heads``): its forward takes ``kv_caches=``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from mhalib.kv_cache import KVCache
from mhalib.runtime import measuring

__all__ = ["Generation", "generate", "new_caches"]


def new_caches(model, capacity=None):
    """One empty :class:`KVCache` per layer of ``model`` (room for its whole ``seq_len``)."""
    return [KVCache(capacity or model.config.seq_len) for _ in range(model.config.num_layers)]


@dataclass
class Generation:
    """What :func:`generate` returns.

    Attributes:
        tokens: ``(B, N + new)`` int64, the prompt and the generated tokens.
        logits: ``(B, new, vocab_size)``, the logits each generated token was chosen from.
        kv_rows: how many positions' keys and values each layer computed (projected).
        caches: the per-layer caches at the end (``None`` without a cache).
    """

    tokens: torch.Tensor
    logits: torch.Tensor
    kv_rows: int
    caches: list | None

    @property
    def cache_bytes(self):
        """Bytes held by all the layers' caches (0 without a cache)."""
        return sum(cache.nbytes for cache in self.caches or [])


def generate(model, prompt, max_new_tokens, *, use_cache=True):
    """Greedy decoding: ``max_new_tokens`` tokens after ``prompt``.

    Args:
        model: a course model (``model(tokens, kv_caches=...)`` gives logits); it runs in eval
            mode (no dropout) and is left in the mode it had.
        prompt: ``(B, N)`` int64 tensor, ``N >= 1``.
        max_new_tokens: how many tokens to add (``N + max_new_tokens - 1 <= seq_len``: the
            last one chosen is never run through the model).
        use_cache: prefill once and decode one token a step, or recompute the whole
            sequence at every step.

    Returns:
        a :class:`Generation`.
    """
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.dtype != torch.long \
            or prompt.shape[1] < 1:
        got = f"shape {tuple(prompt.shape)}, dtype {prompt.dtype}" if isinstance(prompt, torch.Tensor) \
            else type(prompt).__name__
        raise ValueError(f"prompt must be an int64 tensor (B, N) with N >= 1; got {got}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int; got {max_new_tokens!r}")
    max_new_tokens = int(max_new_tokens)
    n, limit = prompt.shape[1], model.config.seq_len
    if n + max_new_tokens - 1 > limit:
        raise ValueError(f"a prompt of {n} tokens leaves room for at most {limit - n + 1} new tokens "
                         f"(seq_len={limit}); got max_new_tokens={max_new_tokens}")
    caches = new_caches(model) if use_cache else None
    tokens, chosen_from, kv_rows = prompt, [], 0
    with measuring(model):  # no dropout while generating; the model's mode is given back
        step_input = prompt  # prefill: the whole prompt once
        for _ in range(max_new_tokens):
            if not use_cache:
                step_input = tokens  # recompute: the whole sequence so far, every step
            logits = model(step_input, kv_caches=caches)  # (B, N_step, vocab_size)
            kv_rows += step_input.shape[1]
            last = logits[:, -1]  # (B, vocab_size): the prediction for the next position
            chosen_from.append(last)
            next_token = last.argmax(dim=-1, keepdim=True)  # (B, 1)
            tokens = torch.cat([tokens, next_token], dim=1)  # (B, N + steps)
            step_input = next_token  # decode: one token a step
    return Generation(tokens, torch.stack(chosen_from, dim=1), kv_rows, caches)
