"""Plumbing shared by every training and measuring loop: CPU threads, measuring mode, progress bars.

Importing it loads neither torch nor tqdm (each is imported on first use), so NumPy-only
modules such as :mod:`mhalib.interpret` stay quick to import.
"""

from __future__ import annotations

import contextlib

__all__ = ["num_threads", "measuring", "progress_bar"]


@contextlib.contextmanager
def progress_bar(total, desc, enabled=True):
    """A tqdm progress bar: a widget in Jupyter, text in a terminal.

    In Jupyter the bar is shown with a display id and shown again in its final state
    when the block ends, so a saved notebook's text form reads ``100%|...| 1500/1500``
    rather than the ``0%`` the bar started with.
    """
    from tqdm.auto import tqdm

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
    import torch

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


@contextlib.contextmanager
def measuring(model, threads=None):
    """Run the block with ``model`` in eval mode (no dropout) and without gradients.

    ``threads``: CPU threads for the block (``None`` leaves torch's setting). The model's mode
    and the thread count are given back when the block ends, also when it raises. Every
    measurement of a model in the course (evaluation, losses, probes, head scores, generation)
    runs inside one.
    """
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), num_threads(threads):
            yield model
    finally:
        model.train(was_training)
