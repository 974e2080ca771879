"""Training and evaluating the copy-task model on a copy task.

Loss and accuracy are measured on the copy positions only (``mask`` from
:meth:`mhalib.copytask.tasks.CopyTask.sample`): the other positions hold fresh random tokens
that no model can predict, and averaging them in would hide the phase change.

Reproducibility: :func:`train` draws its data from a generator seeded with ``seed``
and :func:`new_model` seeds the initial weights, so the same seed on the same
machine gives the same numbers. Training runs on ``num_threads`` CPU threads
(default 1: for a model this small one thread is as fast as two, and a fixed thread
count keeps floating-point sums in the same order on every machine).
"""

from __future__ import annotations

import torch

from mhalib.decoder import Decoder
from mhalib.fit import fit, next_token_loss
from mhalib.runtime import measuring
from mhalib.copytask.model import copy_task_config
from mhalib.copytask.tasks import CopyTask, make_generator, variable_offset_task

__all__ = [
    "new_model",
    "train",
    "evaluate",
    "steps_to",
]


def new_model(seed=0, **config):
    """A freshly initialised copy-task :class:`~mhalib.decoder.Decoder`, drawn after ``torch.manual_seed(seed)``.

    ``config`` overrides fields of :func:`~mhalib.copytask.model.copy_task_config` (e.g. ``num_layers=1``).
    """
    torch.manual_seed(seed)
    return Decoder(copy_task_config(**config))


def train(model, task=None, steps=3000, *, batch_size=64, lr=3e-3, seed=0, threads=1,
          progress=True, desc="training", callback=None):
    """Train ``model`` with Adam on fresh batches of ``task``; returns the history.

    Args:
        model: a copy-task :class:`~mhalib.decoder.Decoder` (trained in place, by :func:`mhalib.fit.fit`).
        task: a :class:`~mhalib.copytask.tasks.CopyTask` (default: the variable-offset task).
        steps: optimiser steps (one fresh batch each).
        batch_size, lr: Adam's batch size and learning rate (defaults 64, 3e-3).
        seed: seeds the data generator.
        threads: CPU threads while training (``None`` keeps torch's setting).
        progress: show a tqdm progress bar (a widget in Jupyter, text in a terminal).
        callback: optional ``fn(step, model)`` called after every step (step counts
            from 1), e.g. to evaluate along the way; it must not touch the optimiser.
            If it returns True, training stops there (the history is shorter).

    Returns:
        dict with ``"loss"`` and ``"accuracy"``: lists of floats, one per step, measured
        on that step's training batch at the copy positions.
    """
    task = variable_offset_task() if task is None else task
    if not isinstance(task, CopyTask):
        raise ValueError(f"task must be a CopyTask; got {type(task).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int; got {steps!r}")
    if task.vocab_size > model.config.vocab_size or task.seq_len > model.config.seq_len:
        raise ValueError(
            f"task (vocab_size={task.vocab_size}, seq_len={task.seq_len}) does not fit the model "
            f"(vocab_size={model.config.vocab_size}, seq_len={model.config.seq_len})"
        )
    generator = make_generator(seed)
    return fit(model, lambda step: task.sample(batch_size, generator), steps, lr=lr, threads=threads,
               progress=progress, desc=desc, callback=callback)


def evaluate(model, task=None, *, batch_size=1024, seed=12345, ablate=None, z_hook=None, replace_z=None,
             threads=1):
    """Loss and accuracy at the copy positions of one fixed, seeded evaluation batch.

    Args:
        model: a copy-task :class:`~mhalib.decoder.Decoder`.
        task: the task (default: variable offset).
        batch_size: sequences in the evaluation batch.
        seed: seeds the batch, so every call with the same seed sees the same data.
        ablate: ``(layer, head)`` pairs to zero (see :meth:`~mhalib.decoder.Decoder.forward`).
        z_hook: passed to the model, ``fn(layer, z) -> z`` (e.g. :func:`mhalib.interpret.ablation_hook`).
        replace_z: passed to the model: ``(layer, head) -> (batch_size, N, d_head)`` outputs put in
            place of those heads' (a mean or resample ablation, :func:`mhalib.interpret.ablation_kwargs`).

    Returns:
        dict ``{"loss": float, "accuracy": float}``.
    """
    task = variable_offset_task() if task is None else task
    tokens, mask = task.sample(batch_size, make_generator(seed))  # (B, N), (B, N)
    with measuring(model, threads):
        logits = model(tokens, ablate=ablate, z_hook=z_hook, replace_z=replace_z)  # (B, N, V)
        loss, accuracy = next_token_loss(logits, tokens, mask)
    return {"loss": loss.item(), "accuracy": accuracy}


def steps_to(history, threshold=0.9, key="accuracy", window=20):
    """First step at which the ``window``-step running mean of ``history[key]`` reaches ``threshold``.

    Returns the step number (1-based: steps taken), or ``None`` if it never does.
    For ``key="loss"`` the running mean must fall to ``threshold`` or below.
    """
    values = history[key] if isinstance(history, dict) else history
    values = torch.as_tensor(values, dtype=torch.float64)
    if len(values) < window:
        return None
    running = values.unfold(0, window, 1).mean(dim=1)  # (steps - window + 1,)
    hit = running <= threshold if key == "loss" else running >= threshold
    idx = torch.nonzero(hit)
    return None if len(idx) == 0 else int(idx[0]) + window
