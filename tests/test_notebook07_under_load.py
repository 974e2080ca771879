"""Notebook 07's explorer cannot leave a notebook runner waiting.

The hang: nbclient (behind nbconvert and ``tools/run_notebooks.py``) mirrors an ipywidgets
``Output`` widget. When a cell displayed a figure inside ``with out:``, as the explorers
did, nbclient sent the captured output back to the kernel on the shell socket in the
middle of that cell, while it was waiting on the same socket for the cell's reply.
pyzmq wakes that wait through the socket's edge-triggered file descriptor, and the
send can use the wake-up up: the reply then sat unread until the wait timed out, for
ever under nbconvert's default (kernel idle, nbconvert waiting). ipykernel 7.3 (the
pin for Python 3.10) has the same race on its side: a request that arrives while it
sends a reply can stay unread, and the next cell never starts.

Measured on 2 shared cores, with ipykernel 7.4 unless said: cells that redraw a figure
the old way, 300 in one kernel under nbclient, left a reply unread until the cell
timeout after 6 of them (with no timeout, the wait after cell 69 never ended); with
ipykernel 7.4's reply sent raw as 7.3 sends it, the run stopped for good after cell 50,
197 or 262. The same 400 redraws setting the figure as the widget's value: no reply
left unread, with either kernel.

What is checked:

* the explorers send nothing to the kernel while a cell runs (only the cells' own
  execute requests go out), and their figure still reaches the saved widget state;
* ``show_view`` sets the figure as the ``Output`` widget's value, and a message clears it;
* ``tools/run_notebooks.py`` polls the shell socket again in slices, so a lost wake-up
  costs a slice, not the timeout, and is reported;
* (marker ``under_load``) notebook 07 runs to the end three times beside a busy process,
  each run within a bound taken from an unloaded run of the same test.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from queue import Empty

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_07 = ROOT / "notebooks" / "07_mqa_gqa.ipynb"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: Loaded runs of notebook 07, and how much longer than the unloaded run each may take.
LOADED_RUNS, SLOWDOWN, MARGIN_S = 3, 5, 60


def run_notebooks():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import run_notebooks as module
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return module


class RecordingClient(NotebookClient):
    """nbclient as nbconvert runs it, noting the type of every message it sends the kernel."""

    def __init__(self, nb, **kwargs):
        super().__init__(nb, **kwargs)
        self.sent: list[str] = []

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        send = kc.shell_channel.send

        def recording_send(msg):
            self.sent.append(msg["msg_type"])
            return send(msg)

        kc.shell_channel.send = recording_send
        return kc


def explorer_cell_of_notebook_07() -> str:
    nb = nbformat.read(NOTEBOOK_07, as_version=4)
    (source,) = [c.source for c in nb.cells if c.cell_type == "code" and "gqa_explorer(" in c.source]
    return source


def output_models(nb) -> dict:
    """Model id -> state of every explorer's figure area in a run notebook's widget state."""
    state = nb.metadata["widgets"][WIDGET_STATE]["state"]
    return {key: model["state"] for key, model in state.items()
            if model["model_name"] == "OutputModel"
            and "mhalib-explorer-output" in model["state"].get("_dom_classes", ())}


def test_explorers_send_nothing_to_the_kernel_while_a_cell_runs():
    cells = [
        explorer_cell_of_notebook_07(),
        "from mhalib.widgets.kv import cache_kinds_explorer, kv_explorer\n"
        "from mhalib.widgets.mha import mha_explorer, step_explorer\n\n"
        "display(mha_explorer(), step_explorer(), kv_explorer(), cache_kinds_explorer())",
    ]
    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    client = RecordingClient(nb, timeout=120, kernel_name="python3",
                             resources={"metadata": {"path": str(NOTEBOOK_07.parent)}})
    client.execute()
    # nbclient asks for the kernel's info once, then sends the cells and nothing else: the
    # old explorers made it send a comm_msg (the figure the Output widget captured) while
    # the cell was running.
    assert client.sent == ["kernel_info_request"] + ["execute_request"] * len(cells), client.sent
    # Each explorer's figure reaches the saved notebook, as the Output widget's value ...
    figures = output_models(nb)
    assert len(figures) == 5
    for state in figures.values():
        (output,) = state["outputs"]
        assert output["output_type"] == "display_data"
        assert base64.b64decode(output["data"]["image/png"]).startswith(PNG_MAGIC)
    # ... and not as a stray image in the cell: the cell shows the widget, nothing else.
    for cell in nb.cells:
        assert all("image/png" not in out.get("data", {}) for out in cell.outputs)


def test_show_view_sets_the_figure_and_a_message_clears_it():
    import ipywidgets as w

    from mhalib.widgets.common import explorer_box, figure_png, show_view
    from mhalib.widgets.gqa import render_gqa

    box, msg, out = explorer_box([], title="GQA")
    assert isinstance(out, w.Output)
    figure = render_gqa(8, 2)
    png = figure_png(figure.figure)  # the same Figure, encoded again: the same bytes
    show_view(figure, msg, out)
    (output,) = out.outputs
    assert base64.b64decode(output["data"]["image/png"]) == png
    assert "GQA-2" in msg.value and out.msg_id == ""  # nothing was captured
    impossible = render_gqa(8, 3)
    show_view(impossible, msg, out)
    assert not impossible.ok and out.outputs == () and "cannot be split" in msg.value


class SlowChannel:
    """A shell channel whose message, sent at ``sent_at``, is found only at ``ready_at``:
    before that a wait ends empty at its timeout, as with a lost wake-up."""

    def __init__(self, sent_at, ready_at):
        self.sent_at, self.ready_at, self.waits = sent_at, ready_at, []

    async def get_msg(self, timeout=None):
        self.waits.append(timeout)
        await asyncio.sleep(timeout)
        if time.monotonic() < self.ready_at:
            raise Empty
        return {"msg_type": "execute_reply", "header": {"date": self.sent_at}}


def test_the_runner_polls_the_shell_socket_again_in_slices_and_reports_a_late_reply():
    rn = run_notebooks()
    late = []
    now = time.monotonic()
    # A reply sent 3 s ago and visible from now on: the first slice finds it at its end.
    channel = SlowChannel(datetime.now(timezone.utc) - timedelta(seconds=3), now)
    rn.poll_in_slices(channel, lambda msg, seconds: late.append(seconds), slice_s=0.05)
    assert asyncio.run(channel.get_msg(timeout=10))["msg_type"] == "execute_reply"
    assert channel.waits == [0.05] and len(late) == 1 and late[0] >= 3
    # A reply that never comes: slices until the caller's own timeout, then Empty.
    channel = SlowChannel(datetime.now(timezone.utc), now + 3600)
    rn.poll_in_slices(channel, lambda msg, seconds: late.append(seconds), slice_s=0.05)
    start = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(channel.get_msg(timeout=0.2))
    assert 0.2 <= time.monotonic() - start < 5 and 3 <= len(channel.waits) and max(channel.waits) <= 0.05
    assert len(late) == 1


def test_the_runner_refuses_a_cell_timeout_that_is_not_positive():
    rn = run_notebooks()
    with pytest.raises(ValueError, match="cell_timeout must be a positive number of seconds; got 0"):
        rn.run(new_notebook(), NOTEBOOK_07, cell_timeout=0)


def test_the_runner_stops_a_cell_that_outruns_its_timeout_and_names_it(tmp_path):
    rn = run_notebooks()
    path = tmp_path / "stuck.ipynb"
    nb = new_notebook(cells=[new_code_cell("x = 1"), new_code_cell("import time\ntime.sleep(600)")])
    start = time.monotonic()
    with pytest.raises(rn.NotebookRunError) as stopped:
        rn.run(nb, path, cell_timeout=2)
    assert time.monotonic() - start < 120  # stopped at the timeout, not at the sleep's end
    message = str(stopped.value)
    assert message.startswith(f"{path}, cell 1: A cell timed out") and "after 2 seconds" in message
    assert "the notebook was not saved" in message and not path.exists()


@pytest.mark.under_load
def test_notebook_07_finishes_beside_a_busy_process(request):
    # Four runs of the notebook and a busy process: about 1.5 minutes on 2 cores, so
    # only when asked for by its marker (pytest -m under_load), never in a plain run.
    selected = request.config.getoption("markexpr") or ""
    if "under_load" not in selected or "not under_load" in selected:
        pytest.skip("runs only when selected with -m under_load")
    rn = run_notebooks()

    def run_once(cell_timeout):
        nb = nbformat.read(NOTEBOOK_07, as_version=4)
        start = time.perf_counter()
        client = rn.run(nb, NOTEBOOK_07, cell_timeout)  # NotebookRunError names a stuck cell
        return time.perf_counter() - start, client.late_replies

    unloaded, late = run_once(rn.CELL_TIMEOUT)
    assert late == []
    # A bound for liveness, not a speed claim: no cell may wait longer than SLOWDOWN times
    # the whole unloaded run of this machine plus a margin (the per-cell timeout; a cell
    # past it stops the run with NotebookRunError, naming the cell). A reply left unread
    # until a timeout (the hang) trips it, and a late reply is named below; a slow machine does not.
    bound = SLOWDOWN * unloaded + MARGIN_S
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for attempt in range(LOADED_RUNS):
            _, late = run_once(bound)
            assert late == [], f"run {attempt + 1}: replies read only by polling again: {late}"
    finally:
        hog.kill()
        hog.wait()
