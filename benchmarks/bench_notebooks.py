"""Execution time of every notebook (a fresh kernel each), next to its budget.

The budgets: 30 s for notebook 01, 60 s for the others, on 2 cores. This reports the
measured times and the fraction of the budget used; nothing here is a pass/fail test.
Nothing is written back: the notebooks run in memory.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = {"01": 30.0}
DEFAULT_BUDGET_S = 60.0


def run(path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def main():
    rows = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        budget = BUDGET_S.get(path.name[:2], DEFAULT_BUDGET_S)
        seconds = run(path)
        rows.append([path.name, f"{seconds:.1f}", f"{budget:.0f}", f"{seconds / budget:.2f}"])
        print(f"  {path.name}: {seconds:.1f} s", flush=True)
    print()
    print_table(["notebook", "seconds", "budget", "fraction of budget"], rows)


if __name__ == "__main__":
    main()
