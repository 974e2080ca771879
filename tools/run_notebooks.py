"""Re-execute notebooks in place, top to bottom, in a fresh kernel each.

Usage: python tools/run_notebooks.py [PATH ...]   (folders or .ipynb files;
default: notebooks/ and solutions/)

Each notebook runs with its own folder as the working directory, as nbval runs it,
so the stored outputs are the ones the tests compare against.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def notebooks_under(paths):
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(q for q in p.glob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        elif p.suffix == ".ipynb":
            yield p
        else:
            raise SystemExit(f"not a notebook or folder: {p}")


def execute(path: Path, timeout: int = 600) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
        allow_errors=False,
    )
    client.execute()
    elapsed = time.perf_counter() - start
    # nbclient stores the widgets' final state in the metadata, so that a saved notebook
    # shows its widgets (sliders, progress bars) before it is run.
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nbformat.write(nb, path)
    return elapsed


def main(argv):
    paths = argv or ["notebooks", "solutions"]
    for path in notebooks_under(paths):
        print(f"{path} ...", end=" ", flush=True)
        print(f"{execute(path):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
