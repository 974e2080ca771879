"""The one training loop of the course's models, and their next-token loss.

:func:`fit` trains any :class:`~mhalib.decoder.Decoder` with Adam on fresh batches that a
family supplies (``next_batch(step) -> (tokens, mask)``): the copy task
(:func:`mhalib.copytask.training.train`) and the grammar (:func:`mhalib.language.train_language`)
differ only in their batches, learning-rate schedule and gradient clipping.

Reproducibility: the same batches, seed and thread count give the same weights on the
same machine (a fixed thread count keeps floating-point sums in the same order).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mhalib.runtime import num_threads, progress_bar

__all__ = ["next_token_loss", "warmup_cosine", "fit"]


def next_token_loss(logits, tokens, mask=None):
    """Cross-entropy and accuracy of next-token predictions.

    Args:
        logits: ``(B, N, V)``; position i predicts token i + 1.
        tokens: ``(B, N)`` int64.
        mask: optional ``(B, N)`` bool, True where ``tokens[b, i]`` is to be predicted
            (None: every token after the first).

    Returns:
        ``(loss, accuracy)``: a scalar tensor (differentiable) and a float.
    """
    pred = logits[:, :-1]  # (B, N-1, V): predictions for tokens 1..N-1
    target = tokens[:, 1:]  # (B, N-1)
    if mask is None:
        sel, tgt = pred.reshape(-1, pred.shape[-1]), target.reshape(-1)  # (M, V), (M,)
    else:
        keep = mask[:, 1:]  # (B, N-1)
        if not bool(keep.any()):
            raise ValueError("mask selects no position to score")
        sel, tgt = pred[keep], target[keep]  # (M, V), (M,)
    loss = F.cross_entropy(sel, tgt)
    accuracy = (sel.argmax(dim=-1) == tgt).float().mean().item()
    return loss, accuracy


def warmup_cosine(step, steps, lr, warmup):
    """Learning rate at ``step`` (0-based): linear warm-up, then cosine from ``lr`` to ``lr / 10``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def fit(model, next_batch, steps, *, lr, schedule=None, clip_norm=None, dropout_seed=None, threads=1,
        progress=True, desc="training", callback=None, stop_after=None):
    """Train ``model`` in place with Adam, one fresh batch a step; returns the history.

    Args:
        model: a :class:`~mhalib.decoder.Decoder` (left in eval mode).
        next_batch: ``fn(step) -> (tokens (B, N), mask (B, N) bool or None)``; the loss is
            :func:`next_token_loss` at the masked positions.
        steps: optimiser steps (a non-negative int).
        lr: the learning rate, or the peak of ``schedule``.
        schedule: optional ``fn(step, steps, lr) -> lr`` (e.g. :func:`warmup_cosine`).
        clip_norm: clip the gradients' global norm to this (None: no clipping).
        dropout_seed: ``torch.manual_seed`` for dropout's masks (None: leave torch's generator).
        threads: CPU threads while training (``None`` keeps torch's setting).
        progress: show a progress bar (a widget in Jupyter, text in a terminal).
        callback: optional ``fn(step, model)`` after every step (step counts from 1); it must
            not touch the optimiser. If it returns True, training stops there.
        stop_after: stop after this many steps, keeping the schedule of ``steps``.

    Returns:
        dict with ``"loss"`` and ``"accuracy"``: one float per step, on that step's batch.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int; got {steps!r}")
    if dropout_seed is not None:
        torch.manual_seed(dropout_seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = {"loss": [], "accuracy": []}
    run = steps if stop_after is None else min(steps, stop_after)
    model.train()
    with num_threads(threads), progress_bar(run, desc, enabled=progress) as bar:
        for step in range(run):
            if schedule is not None:
                for group in optimizer.param_groups:
                    group["lr"] = schedule(step, steps, lr)
            tokens, mask = next_batch(step)  # (B, N), (B, N) or None
            loss, accuracy = next_token_loss(model(tokens), tokens, mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            history["loss"].append(loss.item())
            history["accuracy"].append(accuracy)
            if callback is not None:
                stop = callback(step + 1, model)
                model.train()
                if stop is True:
                    break
            if step % 50 == 0 or step == run - 1:
                bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{accuracy:.2f}", refresh=False)
            bar.update(1)
    model.eval()
    return history
