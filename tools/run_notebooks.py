"""Re-execute notebooks in place, top to bottom, in a fresh kernel each.

Usage: python tools/run_notebooks.py [--cell-timeout S] [PATH ...]
(folders or .ipynb files; default: notebooks/ and solutions/)

Each notebook runs with its own folder as the working directory, as nbval runs it,
so the stored outputs are the ones the tests compare against.

Every wait is bounded, and a run that cannot finish stops saying where:

* a cell may run for ``--cell-timeout`` seconds (default 300, as nbval's in the
  Makefile); past that the run stops, naming the notebook and the cell;
* a cell's outputs must arrive within ``IOPUB_TIMEOUT`` seconds of its reply, or the run
  stops (nbclient's default is to warn and save the notebook without them);
* the wait for a cell's reply polls the shell socket again every
  ``POLL_SLICE`` seconds. pyzmq wakes an asyncio wait on a socket through the socket's
  edge-triggered file descriptor, and a send on the same socket while the wait is
  pending can use up that wake-up: the reply then sits unread until the wait times out,
  or for ever with nbconvert's default of no timeout (kernel idle, client waiting).
  nbclient sends on that socket in the middle of a cell when it mirrors an ``Output``
  widget that captured a display; the course's explorers no longer capture (see
  ``show_view`` in ``mhalib/widgets/common.py``), and a reply picked up late all the same
  is reported.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from queue import Empty

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError

#: Longest a cell may run, in seconds (the Makefile gives nbval the same).
CELL_TIMEOUT = 300
#: Longest wait, in seconds, for a cell's outputs once its reply has come.
IOPUB_TIMEOUT = 30
#: Seconds one wait on the shell socket lasts before the socket is polled again.
POLL_SLICE = 1.0


class NotebookRunError(RuntimeError):
    """A notebook could not be run to the end: which notebook, which cell, and why."""


def poll_in_slices(channel, on_late_reply, slice_s: float = POLL_SLICE) -> None:
    """Make ``channel.get_msg`` wait in slices of ``slice_s`` seconds, up to its timeout.

    Each slice ends with a plain poll of the socket, which finds a message that is
    already there even when the wake-up for it was lost. ``on_late_reply(msg, seconds)``
    is called for a message that was found that way after waiting unread for at least
    half a slice (its sender's timestamp says how long).
    """
    get_msg = channel.get_msg

    async def get_msg_in_slices(timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = slice_s if deadline is None else max(0.0, min(slice_s, deadline - time.monotonic()))
            started = time.monotonic()
            try:
                msg = await get_msg(timeout=wait)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                continue
            sent = msg.get("header", {}).get("date")
            if isinstance(sent, datetime) and sent.tzinfo is not None and time.monotonic() - started >= wait:
                unread = (datetime.now(timezone.utc) - sent).total_seconds()
                if unread >= slice_s / 2:
                    on_late_reply(msg, unread)
            return msg

    channel.get_msg = get_msg_in_slices


class GuardedClient(NotebookClient):
    """nbclient's ``NotebookClient`` whose wait for a reply survives a lost wake-up.

    ``late_replies`` lists ``(cell index, message type, seconds unread)`` for every reply
    that was read only by polling the socket again; ``cell_index`` is the cell running.
    """

    def __init__(self, nb, **kwargs):
        super().__init__(nb, **kwargs)
        self.late_replies: list[tuple[int, str, float]] = []
        self.cell_index = -1

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        poll_in_slices(kc.shell_channel, self._note_late_reply)
        return kc

    def _note_late_reply(self, msg, seconds):
        self.late_replies.append((self.cell_index, msg.get("msg_type", "?"), seconds))

    async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
        self.cell_index = cell_index
        return await super().async_execute_cell(cell, cell_index, *args, **kwargs)


def notebooks_under(paths):
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(q for q in p.glob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        elif p.suffix == ".ipynb":
            yield p
        else:
            raise SystemExit(f"not a notebook or folder: {p}")


def run(nb, path: Path, cell_timeout: float = CELL_TIMEOUT) -> GuardedClient:
    """Execute the notebook ``nb`` (read from ``path``) in place; return its client.

    Raises:
        NotebookRunError: a cell outran ``cell_timeout`` or its outputs never came,
            or the kernel died; the message names the notebook and the cell.
    """
    if not cell_timeout > 0:
        raise ValueError(f"cell_timeout must be a positive number of seconds; got {cell_timeout!r}")
    client = GuardedClient(
        nb,
        timeout=math.ceil(cell_timeout),  # nbclient takes whole seconds
        iopub_timeout=IOPUB_TIMEOUT,
        raise_on_iopub_timeout=True,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
        allow_errors=False,
    )
    try:
        client.execute()
    except (CellTimeoutError, DeadKernelError) as exc:
        # nbclient's first two lines: what timed out and after how long (or "Kernel died")
        what = " ".join(str(exc).strip().splitlines()[:2]) or type(exc).__name__
        raise NotebookRunError(f"{path}, cell {client.cell_index}: {what} The run stopped there "
                               f"and the notebook was not saved (a cell may run {cell_timeout:g} s; "
                               f"its outputs may come up to {IOPUB_TIMEOUT} s after it ends).") from exc
    return client


def execute(path: Path, cell_timeout: float = CELL_TIMEOUT) -> float:
    """Run the notebook at ``path`` and save it with its outputs; return the seconds taken."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = run(nb, path, cell_timeout)
    elapsed = time.perf_counter() - start
    for index, msg_type, seconds in client.late_replies:
        print(f"\n{path}, cell {index}: its {msg_type} waited {seconds:.1f} s unread on the shell "
              f"socket (a lost wake-up) and was picked up by polling again", file=sys.stderr)
    # nbclient stores the widgets' final state in the metadata, so that a saved notebook
    # shows its widgets (sliders, progress bars) before it is run.
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nbformat.write(nb, path)
    return elapsed


def main(argv):
    parser = argparse.ArgumentParser(description="Re-execute notebooks in place, in a fresh kernel each.")
    parser.add_argument("paths", nargs="*", default=["notebooks", "solutions"],
                        help="notebooks or folders of notebooks (default: notebooks solutions)")
    parser.add_argument("--cell-timeout", type=int, default=CELL_TIMEOUT, metavar="S",
                        help=f"seconds a cell may run before the run stops (default {CELL_TIMEOUT})")
    args = parser.parse_args(argv)
    if not args.cell_timeout > 0:
        parser.error(f"--cell-timeout must be a positive number of seconds; got {args.cell_timeout}")
    for path in notebooks_under(args.paths):
        print(f"{path} ...", end=" ", flush=True)
        try:
            print(f"{execute(path, args.cell_timeout):.1f} s", flush=True)
        except NotebookRunError as exc:
            print("FAILED", flush=True)
            raise SystemExit(str(exc)) from None


if __name__ == "__main__":
    main(sys.argv[1:])
