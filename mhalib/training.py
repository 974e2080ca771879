"""Training and evaluating the toy transformer on a copy task.

Loss and accuracy are measured on the copy positions only (``mask`` from
:meth:`mhalib.tasks.CopyTask.sample`): the other positions hold fresh random tokens
that no model can predict, and averaging them in would hide the phase change.

Reproducibility: :func:`train` draws its data from a generator seeded with ``seed``
and :func:`new_model` seeds the initial weights, so the same seed on the same
machine gives the same numbers. Training runs on ``num_threads`` CPU threads
(default 1: for a model this small one thread is as fast as two, and a fixed thread
count keeps floating-point sums in the same order on every machine).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from mhalib.tasks import CopyTask, make_generator, variable_offset_task
from mhalib.transformer import ToyConfig, ToyTransformer

__all__ = [
    "copy_loss",
    "new_model",
    "train",
    "evaluate",
    "steps_to",
    "num_threads",
]


@contextlib.contextmanager
def progress_bar(total, desc, enabled=True):
    """A tqdm progress bar: a widget in Jupyter, text in a terminal.

    In Jupyter the bar is shown with a display id and shown again in its final state
    when the block ends, so a saved notebook's text form reads ``100%|...| 1500/1500``
    rather than the ``0%`` the bar started with.
    """
    notebook = enabled and any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__)
    bar = tqdm(total=total, desc=desc, disable=not enabled, mininterval=0.5,
               **({"display": False} if notebook else {}))
    handle = None
    if notebook:
        from IPython.display import display

        handle = display(bar.container, display_id=True)
    failed = False
    try:
        yield bar
    except BaseException:
        failed = True  # the bar turns red
        raise
    finally:
        if bar.n < total and not failed:
            bar.total = bar.n  # stopped early on purpose (a callback said so): not a failure
        bar.close()
        if handle is not None:
            handle.update(bar.container)


@contextlib.contextmanager
def num_threads(n):
    """Run the block with ``torch.set_num_threads(n)`` (``None``: leave it), then restore."""
    if n is None:
        yield
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"num_threads must be a positive int or None; got {n!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def copy_loss(logits, tokens, mask):
    """Cross-entropy and accuracy of next-token predictions at the masked positions.

    Args:
        logits: ``(B, N, V)``; position i predicts token i + 1.
        tokens: ``(B, N)`` int64.
        mask: ``(B, N)`` bool, True where ``tokens[b, i]`` is to be predicted.

    Returns:
        ``(loss, accuracy)``: a scalar tensor (differentiable) and a float.
    """
    pred = logits[:, :-1]  # (B, N-1, V): predictions for tokens 1..N-1
    target = tokens[:, 1:]  # (B, N-1)
    keep = mask[:, 1:]  # (B, N-1)
    if not bool(keep.any()):
        raise ValueError("mask selects no position to score")
    sel = pred[keep]  # (M, V)
    tgt = target[keep]  # (M,)
    loss = F.cross_entropy(sel, tgt)
    accuracy = (sel.argmax(dim=-1) == tgt).float().mean().item()
    return loss, accuracy


def new_model(seed=0, **config):
    """A freshly initialised :class:`ToyTransformer`, weights drawn with ``torch.manual_seed(seed)``.

    ``config`` overrides :class:`~mhalib.transformer.ToyConfig` fields (e.g. ``num_layers=1``).
    """
    torch.manual_seed(seed)
    return ToyTransformer(ToyConfig(**config))


def train(model, task=None, steps=3000, *, batch_size=64, lr=3e-3, seed=0, threads=1,
          progress=True, desc="training", callback=None):
    """Train ``model`` with Adam on fresh batches of ``task``; returns the history.

    Args:
        model: a :class:`ToyTransformer` (trained in place).
        task: a :class:`~mhalib.tasks.CopyTask` (default: the variable-offset task).
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
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = {"loss": [], "accuracy": []}
    model.train()
    with num_threads(threads), progress_bar(steps, desc, enabled=progress) as bar:
        for step in range(steps):
            tokens, mask = task.sample(batch_size, generator)  # (B, N), (B, N)
            loss, accuracy = copy_loss(model(tokens), tokens, mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            history["loss"].append(loss.item())
            history["accuracy"].append(accuracy)
            if callback is not None:
                stop = callback(step + 1, model)
                model.train()
                if stop is True:
                    break
            if step % 50 == 0 or step == steps - 1:
                bar.set_postfix(loss=f"{loss.item():.2f}", acc=f"{accuracy:.2f}", refresh=False)
            bar.update(1)
    model.eval()
    return history


@torch.no_grad()
def evaluate(model, task=None, *, batch_size=1024, seed=12345, z_hook=None, threads=1):
    """Loss and accuracy at the copy positions of one fixed, seeded evaluation batch.

    Args:
        model: a :class:`ToyTransformer`.
        task: the task (default: variable offset).
        batch_size: sequences in the evaluation batch.
        seed: seeds the batch, so every call with the same seed sees the same data.
        z_hook: passed to the model (e.g. an ablation, see :mod:`mhalib.interpret`).

    Returns:
        dict ``{"loss": float, "accuracy": float}``.
    """
    task = variable_offset_task() if task is None else task
    tokens, mask = task.sample(batch_size, make_generator(seed))  # (B, N), (B, N)
    was_training = model.training
    model.eval()
    with num_threads(threads):
        loss, accuracy = copy_loss(model(tokens, z_hook=z_hook), tokens, mask)
    model.train(was_training)
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
